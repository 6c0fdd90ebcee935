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
//   - the HTTP front of /mcp: Origin allowlist, bearer tokens, body limits,
//     per-session rate limits, session caps and the idle timeout
//     (sessions.go), routing between the legacy (stateful,
//     resumable) and modern (stateless) protocol eras over one go-sdk
//     server, and withholding the result of a call the client cancelled.
//
// It calls package device and nothing below it; the MCP protocol itself is
// the official go-sdk's.
//
// Lock order: Server.syncMu before Server.tombMu. Every other mutex (the
// rate limiter's, the cancellation tracker's, the session limits') is a
// leaf: nothing else is locked, and the go-sdk is not called, while it is
// held.
package mcpserver
