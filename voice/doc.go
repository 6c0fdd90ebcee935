// Package voice relays a board's conversation to the user's own voice
// server (xiaozhi-esp32-server, its ports, or another devicebridge), so a
// board driven through the bridge keeps its voice assistant.
//
// For each conversation the relay opens one WebSocket toward the upstream
// with the board's identity, forwards the board's hello, and builds the
// board's server hello from the upstream's. From then on conversation
// messages (listen, stt, tts, llm, ...) and audio frames pass unchanged and
// in order in each direction, through bounded queues: audio past a full
// queue is dropped and counted (a board drops late audio itself), a text
// message that cannot be queued in time ends the conversation.
//
// The upstream is an MCP client of the board too. Its "mcp" messages never
// reach the board directly: the transport's BoardSide serves them through
// the board's one MCP client (device.Session.ServePeer), which picks its own
// request ids and queues the call behind the bridge's own; the reply goes
// back with the upstream's id.
//
// The package owns the upstream socket, its credentials (a static token or
// the HMAC token format xiaozhi-esp32-server checks for gateways) and the
// bounds on what the upstream can make the bridge hold. It knows nothing of
// how a board is reached: transports (ws, mqtt) implement BoardSide.
//
// # Goroutines
//
// Each Conversation owns three goroutines, all started by Open and waited
// for by Close: the reader (upstream → board), the writer (board →
// upstream) and the MCP worker (the upstream's requests, one at a time, as
// the board runs them), plus one per upstream notification being written
// to the board (at most voice.mcp_queue). Relay.Close closes every open
// conversation and waits for them.
//
// # Locks
//
// Relay.mu guards the set of conversations and the failure memory; a
// Conversation's mu guards its close reason. Neither is held while the
// other is taken, nor during I/O.
package voice
