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
// presents is what it was issued.
package ota
