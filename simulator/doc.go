// Package simulator imitates xiaozhi-esp32 boards (firmware v2.4.x) closely
// enough that a server cannot tell them from real hardware at the protocol
// level. Tests start boards in-process; cmd/simulator runs fleets of them.
//
// Where a real board is odd, the simulator is odd in the same way: it sends
// MCP errors without a code and without escaping, drops malformed MCP
// messages without a word, pages tools/list by an inclusive tool name,
// crashes on a server hello without a transport, never answers
// self.reboot, and parses JSON with cJSON's rules (keys match regardless of
// case, the first of duplicate keys wins, bytes after the value are
// ignored).
//
// # Layout
//
//	Board ── identity, tool state, session id (kept across connections)
//	  │
//	  └─ link (one per connection; wsLink or the MQTT link)
//	       reader goroutine ── parse JSON, check type, validate MCP ──┐
//	       main task ◄── tool calls, reboots, every reply, in order ◄─┘
//	       writer goroutine ── the only code writing data frames
//
// The core (board.go, mcp.go, tools.go, cjson.go) does not know which
// transport it runs on. A transport implements the small link interface:
// send a text message, close the channel, and look at hello/goodbye before
// the core does. An MQTT transport fits beside ws.go.
//
// # Ordering
//
// As on the firmware, requests are validated on the receive path and
// everything else runs on a single main task: tool callbacks and every
// send. A tool's reply is queued when the tool finishes, behind anything
// queued while it ran. So while a slow tool runs, nothing is answered, and
// once it finishes, answers to requests that arrived meanwhile (validation
// errors, tools/list pages) go out before the slow tool's own reply.
//
// # Lifecycle
//
//	b, _ := simulator.NewBoard(simulator.Config{Profile: p, Token: "t"})
//	if err := b.ConnectWebSocket(ctx, "ws://127.0.0.1:8000/xiaozhi/v1/"); err != nil { ... }
//	err := b.Serve(ctx) // until the server closes, the board reboots, or ctx ends
//	b.Close()           // idempotent; waits for the connection's goroutines
//
// The board closes connections the firmware way: TCP close, no close frame.
// It answers pings and never sends them. Fleet and RunFleet keep many
// boards connected, with deterministic MACs and optional reconnect backoff.
//
// # Conversations
//
// Board.Converse holds a voice conversation on the live connection, as
// the firmware does (listen detect, listen start, 60 ms Opus packets,
// listen stop in manual mode, then the server's stt, llm, tts and audio
// until tts stop), and returns a Conversation: what the board heard and
// the downlink payloads it played, with arrival times.
//
//	c, err := b.Converse(ctx, simulator.ConverseOptions{Frames: 50, Pace: 60 * time.Millisecond})
//
// Uplink payloads are given (DefaultPayload, or ConverseOptions.Payload),
// not encoded: the board has no microphone. On WebSocket they go framed in
// the connection's binary protocol version; over MQTT the audio channel is
// opened first if needed, and the packets go as AES-128-CTR datagrams.
// Whatever the connection, downlink audio plays only while the board is
// speaking (between tts start and tts stop), through a model of the
// firmware's 40-packet decode queue, and UDP datagrams must pass the
// firmware's checks (type 0x01, exact length, rising sequence, from the
// hello's server:port); the rest is counted as dropped. FleetConfig.Converse
// makes every board of a fleet talk after each connect.
//
// # Lock order
//
// Board.connectMu is held for a whole connection attempt (closing the
// previous link and waiting for its goroutines); Board.linkMu and Board.mu
// are taken under it. Board.linkMu, Board.mu, the main task's mu, a
// session's timersMu and audio.mu, and MQTTConn.chMu are leaves, and a
// link's goroutines never take connectMu.
//
// # Profiles
//
// A Profile (YAML, see LoadProfile and the files in configs/profiles)
// declares the board's identity, display, initial state and tools. State is
// a nested mapping flattened to dotted keys (audio_speaker.volume). Tool
// properties are boolean, integer (with optional default and a min/max
// range that needs both ends) or string. Each tool names a behavior:
//
//	device_status     the firmware's status JSON built from state
//	set_volume        store argument volume in audio_speaker.volume; true
//	set_brightness    store brightness in screen.brightness; true
//	set_theme         store theme in screen.theme if listed in themes; true, else false
//	lamp_state        {"power": true|false} from lamp.power
//	lamp_on/lamp_off  set lamp.power; true
//	battery_level     {"level":N,"charging":B} from battery.*
//	system_info       the system information JSON (OTA body)
//	screen_info       {"width":W,"height":H,"monochrome":B}
//	reboot            queue a reboot; the reply never leaves the board
//	upgrade_firmware  close the channel first, as the firmware does; no reply on WebSocket
//	set               store every bound argument at <key>.<name> (key defaults
//	                  to the tool name without "self."); true
//	get               the state value at key, as text
//	const             the fixed text
//	fail              an error reply carrying text
//	sleep             answer after the argument seconds (at most MaxSleep, 300 s)
//	                  with text (default "done after N s"); the wait is off the
//	                  main task, as on a board whose tool runs in a task of its
//	                  own, so the board answers other calls meanwhile
//	format            text with each {name} replaced by that argument
//	echo              the arguments received, as a JSON object in one text
//	content           the tool's result, given whole (see below)
//
// Beyond the stock firmware, which only ever answers one text item and
// knows three property types, a tool may give what other boards (custom
// firmware, py-xiaozhi) can: input_schema, a whole inputSchema written as
// YAML and listed as JSON in the order written (numbers, enums, arrays,
// $defs; the board then checks only its required arguments, and goes
// with const, fail, echo and content), and result, the whole tools/call
// result of a content tool in MCP's shape (content items of type text,
// image, audio, resource_link and resource, structuredContent, isError,
// _meta; binary data as standard base64), checked at load and at most
// MaxResultBytes. configs/profiles/conformance.yaml uses both.
package simulator
