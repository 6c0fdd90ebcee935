// Package mqtt is the bridge's MQTT transport: a gateway that speaks to a
// broker with paho and presents every board behind it as a device.Link, so
// MQTT boards join the same device.Hub (and show up in the same APIs) as
// WebSocket ones.
//
// # How boards behave, and what follows
//
// Current xiaozhi firmware connects to the broker at boot and stays
// connected, publishes everything (QoS 0) to one publish_topic, never
// subscribes, and handles whatever the broker writes to its connection. It
// sends a hello only when a conversation starts, but answers MCP at any
// time. Hence:
//
//   - The bridge initializes a board (initialize + tools/list) as soon as
//     it knows the board is there: when the broker reports the connection
//     (the embedded broker, through [Presence]) or when the board is first
//     heard from (external brokers). It does not wait for a hello.
//   - Downlink goes to the per-board topic (default devices/p2p/{mac}); the
//     broker must deliver it to a board that never subscribed. The embedded
//     broker (package mqtt/broker) does; an external broker needs an
//     auto-subscribe rule (EMQX) or an old, subscribing firmware.
//   - A plain MQTT 3.1.1 PUBLISH does not name its sender, so the gateway
//     reads the board from the uplink topic (default devices/up/{mac}). The
//     embedded broker moves publishes on the shared topic (device-server)
//     there, attributing them by connection.
//
// # Several bridges on one broker
//
// Every bridge subscribed to the uplink wildcard hears every board. With
// an [Owner] set (Gateway.SetOwner; cluster.Claims in a fleet) a gateway
// serves only the boards the Owner says it holds: it claims a board before
// attaching it, drops the messages of boards another bridge holds (counted
// in Stats.NotOwned), and takes on boards handed to it (Gateway.Adopt) by
// initializing them without waiting for them to speak.
//
// # Per board
//
// A hello (version 3, transport udp) is answered with a server hello
// carrying a fresh session id and UDP parameters (16-byte key and nonce,
// the nonce laid out as 01 00 0000 <ssrc> 0..0); a later hello replaces
// the audio session. Goodbyes work both ways and only for the current
// session id. Audio datagrams are accepted and counted, never played.
//
// # Floods
//
// A board may publish at most mqtt.board_limits (rate and burst); the
// excess is dropped, and a board over its rate for the flood grace is cut
// off for as long. Behind the embedded broker this happens in the broker,
// before a message is routed (package mqtt/broker); behind an external
// broker the gateway drops, closes the board's session and ignores it
// (flood.go). Warnings a board or the broker can repeat at will are
// throttled (warnings.go): one line per interval, with a count.
//
// # Failure handling
//
// paho's callbacks only record and hand off; every board has a bounded
// inbox, drained by a goroutine of its own while messages wait. When the
// broker connection drops, every board's link closes at once (pending
// calls fail instead of hanging); after the reconnect the gateway
// re-subscribes and re-initializes the boards it lost. Without a presence
// source, links opt in to the device Session's keepalive
// (device.KeepaliveLink): idle boards are probed with a request they
// answer with an error, and marked offline after several unanswered
// probes.
//
// # Lock order
//
// There is none to keep: every mutex here is a leaf, never held while
// another is taken or while publishing. They are Gateway.mu (links, closed,
// the Owner's work), a link's audioMu (its audio session), udpServer.mu
// (audio sessions by ssrc), the mute list's, the publish guards' and the
// log throttles'. A link's messages are handled one at a time by its
// reader goroutine (internal/drainer) rather than under a lock, and the
// link's close path waits for that reader before it ends the audio
// session, so no hello can open a new one behind the goodbye. With a voice
// upstream (voice.go), a hello opens its conversation in a goroutine of the
// link's, which the close path cancels and waits for too.
package mqtt
