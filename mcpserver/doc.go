// Package mcpserver is the bridge's upstream side: it re-exports the tools of
// every connected board as one MCP server that LLM hosts reach over
// Streamable HTTP on /mcp (and, through package stdioproxy, over stdio).
//
// It owns:
//
//   - the upstream catalogue: which board tools are visible, the host-safe
//     names they get (alias + tool, at most 64 characters of
//     [A-Za-z0-9_-]; a board keeps its names while it is connected, and a
//     newcomer whose names would clash gets them moved aside with a hash
//     of its id: names.go), their descriptions and input schemas, and
//     keeping it in step with the device Hub's events (list_changed for
//     subscribed clients);
//   - compact mode, a fixed set of three tools (list_devices,
//     describe_device, call_device_tool) for hosts that cap tool counts;
//   - argument validation against the board's input schema before a call
//     reaches the board, with errors that say what to change;
//   - mapping device results and failures (offline, busy, timeout, board
//     errors) to MCP tool results;
//   - each board's state as a resource (devicebridge://boards/<MAC>, with
//     the template devicebridge://boards/{board}), subscriptions to them,
//     the last result of each board's status tool, two prompts (board,
//     board_tool) and completion of their arguments (resources.go,
//     prompts.go, complete.go);
//   - through its sub-package mcphttp, the HTTP front of /mcp (Handler),
//     behind the front door that checks Host, Origin and credentials. A
//     request passes, in order: rateLimit (ratelimit.go), bodyLimit
//     (bodylimit.go), bindLifetime (lifetime.go), stripCaller (caller.go),
//     markTask (task.go), then route (route.go) by protocol era: modern
//     requests get their caller identity (setCaller) and the stateless
//     go-sdk handler; legacy ones get the SSE retry field on their streams
//     (sseretry.go), pass session admission (sessions.go: caps, idle timeout) and
//     cancellation tracking (tracker.go: the result of a call the client
//     cancelled is withheld) to the stateful, resumable handler;
//   - long calls as MCP tasks in both eras (tasks.go, tasks_wire.go,
//     tasks_fleet.go; the store is the sub-package taskstore).
//
// It calls package device and nothing below it; the MCP protocol itself is
// the official go-sdk's.
//
// It also tells callers what happens to their calls (notes.go: progress
// notifications and log messages for each step) and, on legacy sessions
// that set a log level, when boards come and go (clientlog.go,
// boardnews.go).
//
// Lock order: Server.syncMu before Server.tombMu, before aliasBook.mu
// (names.go: which alias each board holds; a leaf), before applyMu (held
// while the go-sdk server's tools change, and read by tools/list) and before
// boardResources.mu (resources.go: subscriptions, marked URIs, each board's
// last status); syncMu is also held while sync reads the device Hub and adds
// or removes the go-sdk server's tools and resources. boardResources.mu is
// held while it asks the go-sdk server for its sessions (pruning the
// subscriptions of ended ones), and never while it calls anything else.
// logSessions.mu, callNotes.mu, boardNews.mu, taskstore.Store.mu and
// mcphttp's mutexes are leaves (logSessions.mu is held while the go-sdk
// server lists its sessions). Each task runs on a goroutine of the task
// store, which Server.Close cancels and waits for.
package mcpserver
