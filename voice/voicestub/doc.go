// Package voicestub is a stand-in voice server: it behaves like
// xiaozhi-esp32-server as far as a board (or a relay speaking for one)
// can see, deterministically, so tests can check bytes. It owns the
// WebSocket endpoint (/xiaozhi/v1/), the OTA endpoint (/xiaozhi/ota/ and
// /xiaozhi/ota/activate), a device-MCP client with the real server's fixed
// ids, a canned conversation, and a record of everything it saw.
//
// # What a board sees
//
//   - Upgrade: refused with 401 unless Authorization carries a static token
//     or a valid HMAC gateway token (Token), when either is configured; 400
//     for a Protocol-Version other than 1, 2 or 3; 503 past MaxConns or
//     with Faults.RefuseUpgrade.
//   - Hello: after the board's hello, the server hello
//     {"type":"hello","transport":"websocket","session_id":S,"audio_params":{"format":"opus","sample_rate":24000,"channels":1,"frame_duration":60}}.
//   - MCP, if the hello said features.mcp: initialize (id 1,
//     InitializePayload), once answered notifications/initialized, then
//     tools/list (id 2 on every page; ToolsListPayload). CallTool sends
//     tools/call with ids from 3 up.
//   - Conversation: listen start opens a turn; binary frames are de-framed
//     per the connection's Protocol-Version; the turn ends on listen stop,
//     or after AutoFrames frames in auto and realtime modes. The answer is
//     stt {"text":"heard N frames"}, llm {"text":"😀","emotion":"happy"},
//     tts start, tts sentence_start {"text":"You said N frames."},
//     TTSFrames binary frames (ExpectedFrame: payload k is "tts-k-" and
//     the turn's first heard payload; with Stamp, the time of the write
//     in 8 bytes before it, StampedReply), paced Pace apart when set,
//     tts stop. An abort cuts the answer at the next frame and is
//     answered with one tts stop. Every downlink text message carries
//     session_id.
//   - OTA: server_time, the board's own version echoed as firmware, the
//     WebSocket URL and token, and an activation block until the device
//     has called /activate twice (202, then 200).
//
// # Inspection
//
// Connections, Device and OTARequests return snapshots; Wait and the
// WaitX helpers block on change notifications (no polling). Faults make
// connections fail on purpose.
//
// # Goroutines and locks
//
// Per connection: the HTTP handler's goroutine reads; a writer alone
// writes the socket (with a deadline); a session goroutine sends the
// hello and lists tools; a speaker answers turns and aborts in order. The
// handler waits for the other three, and Close waits for every handler
// and the serve goroutine. The reader never waits on the writer: answers
// and aborts go through a short queue that drops (and records) overflow.
//
// Server.mu guards the Server's state and every record; a connection's
// mcpMu guards its pending MCP requests. Both are leaves: neither is held
// while taking the other.
package voicestub
