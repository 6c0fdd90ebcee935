// Package ota is where real boards find the bridge: the OTA endpoint every
// xiaozhi-esp32 board calls on boot, the answer that tells it which
// transport to use and with which credentials, and admission (an allowlist
// and an approval mode with activation codes).
//
//	board ── POST /xiaozhi/ota/ (headers + system info) ──► ParseRequest
//	                                                          │
//	          admission: allowlist? approved? ◄───────────────┤ Store (data_dir)
//	                                                          ▼
//	board ◄── 200 {server_time, firmware, websocket | mqtt} ── Build + CheckAnswer
//	board ── POST /xiaozhi/ota/activate ──► 202 until approved, then 200
//
// The answer is checked against the firmware's crash rules before it is
// sent (CheckAnswer): a key longer than 15 characters inside mqtt or
// websocket, a string value near the NVS limit, a non-numeric version
// part, a non-numeric MQTT port or a firmware.version newer than the
// board's make real boards abort or flash themselves, and because the OTA
// check runs at every boot, a bad answer is a boot loop.
//
// Credentials are derived from one server secret with HMAC-SHA256 over the
// device identity (Credentials), so nothing per board has to be stored to
// verify them: the WebSocket listener and the embedded broker ask the
// Server (through small interfaces of their own) whether what a board
// presents is what it was issued. A WebSocket token names its board in the
// clear ("dbw1.<mac>.<hmac>"), as the MQTT username does, so that a board
// presenting another board's credentials is refused even where credentials
// are optional.
//
// Before admission a board is anyone who can reach the device listener and
// claims a MAC, so everything it can make the bridge hold is bounded:
// requests per source address (internal/keyrate), boards waiting for
// approval (a cap, and an expiry for boards that stopped asking), boards
// recorded, and wrong activation codes on the approve route. The bounds
// apply to the stored state when it is loaded too.
//
// With a voice upstream (Config.Upstream, upstream.go), the boot calls and
// activation polls of admitted boards are passed on to the user's own
// voice server's OTA endpoint: its activation, firmware and server_time
// are merged into the bridge's answer, each checked against the same
// crash rules, while the transport and credentials stay the bridge's. An
// upstream that fails leaves the board the bridge's own answer.
//
// The protocol gives a board no secret before its first OTA call. Where
// credentials are required, the OTA call binds them to the Client-Id (the
// UUID in the board's NVS) the board first registers with: trust on first
// use. Another Client-Id for the same MAC gets no credentials, and the
// transports refuse the credentials with it, until an operator resets the
// binding (a board whose flash was erased has a new UUID).
package ota
