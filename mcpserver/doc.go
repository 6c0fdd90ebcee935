// Package mcpserver is the bridge's upstream side: it re-exports the tools of
// every connected board as one MCP server that LLM hosts reach over
// Streamable HTTP on /mcp (and, through package stdioproxy, over stdio).
//
// It owns:
//
//   - the upstream catalogue: which board tools are visible, the host-safe
//     names they get (alias + tool, at most 64 characters of
//     [A-Za-z0-9_-], collisions resolved with a stable hash suffix), their
//     descriptions and input schemas, and keeping it in step with the
//     device Hub's events (list_changed for subscribed clients);
//   - compact mode, a fixed set of three tools (list_devices,
//     describe_device, call_device_tool) for hosts that cap tool counts;
//   - argument validation against the board's input schema before a call
//     reaches the board, with errors that say what to change;
//   - mapping device results and failures (offline, busy, timeout, board
//     errors) to MCP tool results;
//   - through its sub-package mcphttp, the HTTP front of /mcp (Handler),
//     behind the front door that checks Host, Origin and credentials. A
//     request passes, in order: rateLimit (ratelimit.go), bodyLimit
//     (bodylimit.go), bindLifetime (lifetime.go), stripCaller (caller.go),
//     then route (route.go) by protocol era: modern requests get their
//     caller identity (setCaller) and the stateless go-sdk handler; legacy
//     ones get the SSE retry field on their streams (sseretry.go), pass
//     session admission (sessions.go: caps, idle timeout) and
//     cancellation tracking (tracker.go: the result of a call the client
//     cancelled is withheld) to the stateful, resumable handler.
//
// It calls package device and nothing below it; the MCP protocol itself is
// the official go-sdk's.
//
// Lock order: Server.syncMu before Server.tombMu; syncMu is also held while
// sync reads the device Hub and adds or removes the go-sdk server's tools.
// mcphttp's mutexes are leaves.
package mcpserver
