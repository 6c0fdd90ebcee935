// Package device owns the bridge's view of its boards: one [Session] per
// board, with a visible lifecycle (connected → initializing → ready →
// closed, with a reason), and the [Hub] that finds sessions by device id,
// replaces a session when the same board connects again, routes tool calls,
// and publishes events (online, tools changed, offline).
//
// Transports hand the Hub a [Link] per board once its handshake is done; the
// session wraps it in an envelope stream and an MCP client. Nothing here
// knows which transport a board uses, and no transport library is imported.
//
// Lock order: Hub.mu, then Session.mu, then Subscription.mu. The Hub
// publishes events while holding its lock (so events stay in order with
// Attach), which takes each Subscription's lock; a Session never takes the
// Hub's lock while holding its own. LinkBase.mu is a leaf: a Session reads
// its link's Err under Session.mu. LOCKS.md has the whole bridge.
package device
