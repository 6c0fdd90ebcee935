// Package ws is the device-facing WebSocket transport: the /xiaozhi/v1/
// endpoint real boards connect to. It checks the handshake headers (token,
// Device-Id) before upgrading, waits for the board's hello and answers with
// a server hello boards accept, then hands the connection to the device Hub
// as a device.Link.
//
// Each connection has one reader goroutine, and one writer goroutine while
// messages wait to be sent (internal/drainer); the Server waits for both on
// Close. Reads are size-limited, writes have deadlines, and pings detect
// dead peers (boards answer pings, never send them). Binary audio frames
// and message types the bridge does not use are counted, never fatal.
//
// Lock order: Server.mu (connections and admission counts) and a conn's wmu
// (taking a message off its queue and writing it; the close path's flush
// and close frame) are never held together.
package ws
