package device

import (
	"context"
	"errors"
)

// Link is one board connection as a transport presents it: one JSON text
// message out, the next one in, closed with a reason. Implementations must
// let Send, Receive and Close be called from different goroutines, bound
// their outbound queue (Send fails or waits for ctx rather than buffering
// without limit), and make Close unblock Receive.
type Link interface {
	// Send queues one text message for the board.
	Send(ctx context.Context, msg []byte) error
	// Receive returns the next text message from the board (after the hello
	// handshake, which the transport handles itself).
	Receive(ctx context.Context) ([]byte, error)
	// SessionID is the id the bridge gave the board in its server hello;
	// every outgoing message is stamped with it.
	SessionID() string
	// Close ends the connection; reason is recorded and reported by Err.
	// It is idempotent: the first reason wins.
	Close(reason error)
	// Done is closed once the link has closed, for whatever reason.
	Done() <-chan struct{}
	// Err is the close reason once Done is closed.
	Err() error
	// AfterClose runs f in its own goroutine once the link has closed (at
	// once if it already has). The Hub ends a session this way, so an idle
	// board costs no goroutine parked on Done. LinkBase provides it.
	AfterClose(f func())
}

// Close reasons the device layer itself uses. Transports add their own.
var (
	// ErrReplaced: the same board connected again; the older session ends.
	ErrReplaced = errors.New("replaced by a newer connection from the same device")
	// ErrShutdown: the bridge is shutting down.
	ErrShutdown = errors.New("bridge shutting down")
	// ErrLinkClosed is what links return from Send/Receive once closed.
	ErrLinkClosed = errors.New("device link closed")
	// ErrFlapping: two live connections keep replacing each other under
	// one device id; the newcomer is turned away for a while.
	ErrFlapping = errors.New("device id flapping between live connections")
	// ErrUnresponsive: the board stopped answering keepalive probes.
	ErrUnresponsive = errors.New("board stopped answering liveness probes")
	// errInitFailed wraps an initialization failure as a close reason.
	errInitFailed = errors.New("initialization failed")
)

// Identity is what a transport learned about a board during its handshake.
type Identity struct {
	// DeviceID is the board's MAC as it sends it (Device-Id), e.g.
	// "aa:bb:cc:dd:ee:ff". It is the key of the Hub.
	DeviceID string `json:"device_id"`
	// ClientID is the board's persistent UUID (Client-Id).
	ClientID string `json:"client_id,omitempty"`
	// Transport is "websocket" or "mqtt".
	Transport string `json:"transport"`
	// RemoteAddr is the peer address as the transport sees it.
	RemoteAddr string `json:"remote_addr,omitempty"`
	// ProtocolVersion is the board's binary audio protocol version.
	ProtocolVersion int `json:"protocol_version,omitempty"`
	// HasMCP is false when the hello did not announce features.mcp; such a
	// board stays connected but has no tools.
	HasMCP bool `json:"has_mcp"`
}
