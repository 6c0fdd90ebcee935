package device

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device/internal/mcpclient"
	"github.com/devicebridge/devicebridge/internal/clip"
)

// A peer is a second MCP client of a board: the user's own voice server,
// to which the voice relay hands the board's conversation, also lists and
// calls the board's tools. It numbers its requests 1, 2, ... as the
// bridge does, so its messages cannot go to the board as they are: the
// ids would collide, and the board runs one request at a time anyway.
// ServePeer sends each of its requests through the bridge's own client of
// the board instead, under an id the client picks, and answers the peer
// under the peer's id.
//
// Fairness. The client's queue is first come, first served, and a peer
// holds at most HubConfig.PeerMaxPending of its places (at most half), so
// the bridge's own calls always find room, and wait behind at most that
// many peer requests, each bounded by its own deadline.

// JSON-RPC error codes of the replies ServePeer makes itself. A board's
// own error is passed on with the board's code (none, from mainline
// firmware).
const (
	// PeerCodeInvalidRequest: the message is not a request the bridge can
	// forward (a bad id, method or params, too large, a batch).
	PeerCodeInvalidRequest = -32600
	// PeerCodeUnavailable: the board cannot take requests: it went
	// offline, did not become ready in time, has no MCP, or the bridge is
	// shutting down.
	PeerCodeUnavailable = -32000
	// PeerCodeBusy: too many requests pending, the peer's
	// (HubConfig.PeerMaxPending) or the board's queue.
	PeerCodeBusy = -32001
	// PeerCodeTimeout: no reply in time. The message says whether the
	// request was sent (outcome unknown) or not (nothing happened).
	PeerCodeTimeout = -32002
	// PeerCodeFailed: anything else (cancelled, a reply the bridge could
	// not read).
	PeerCodeFailed = -32003
)

// Bounds on what ServePeer forwards. Both are far past what an MCP client
// of a board sends (its requests are a few hundred bytes) and keep a board
// from being handed what its firmware cannot hold.
const (
	// maxPeerMessage bounds one peer message, as the bridge bounds one
	// message from a board (envelope.DefaultMaxMessageSize).
	maxPeerMessage = 64 << 10
	// maxPeerMethod bounds a method name.
	maxPeerMethod = 128
)

// errPeerCancelled is the cause of a peer request the peer cancelled.
var errPeerCancelled = errors.New("cancelled by the peer (notifications/cancelled)")

// PeerStats counts what a session's peer sent and got.
type PeerStats struct {
	// Requests counts the peer's requests (messages with a method and an
	// id), each answered; Errors those answered with an error, the board's
	// or the bridge's.
	Requests, Errors int64
	// Notifications counts the peer's notifications forwarded to the
	// board (or, for notifications/cancelled, acted on by the bridge).
	Notifications int64
	// Dropped counts peer messages dropped without a reply: responses,
	// input that is not a JSON-RPC message, notifications that could not
	// be forwarded.
	Dropped int64
	// FromBoard counts the board's notifications handed to the peer.
	FromBoard int64
}

// peerState is a session's peer counters and hook.
type peerState struct {
	pending                                             atomic.Int32
	requests, errors, notifications, dropped, fromBoard atomic.Int64
	notify                                              atomic.Pointer[func(json.RawMessage)]
}

// peerCall is one peer request in progress.
type peerCall struct {
	id     string // the peer's id, raw
	cancel context.CancelCauseFunc
}

// PeerStats returns the session's peer counters.
func (s *Session) PeerStats() PeerStats {
	p := &s.peer
	return PeerStats{Requests: p.requests.Load(), Errors: p.errors.Load(), Notifications: p.notifications.Load(),
		Dropped: p.dropped.Load(), FromBoard: p.fromBoard.Load()}
}

// SetPeerNotify hands the board's notifications (JSON-RPC messages without
// an id) to f, from now on; nil stops it. f is called on the goroutine that
// reads the board's replies: it must not block (give it a bounded queue
// that drops when full). Requests from the board are never handed on.
// Mainline firmware sends no notifications.
func (s *Session) SetPeerNotify(f func(msg json.RawMessage)) {
	if f == nil {
		s.peer.notify.Store(nil)
		return
	}
	s.peer.notify.Store(&f)
}

// fromBoard is the client's OnNotification.
func (s *Session) fromBoard(msg json.RawMessage) {
	if f := s.peer.notify.Load(); f != nil {
		(*f)(msg)
		s.peer.fromBoard.Add(1)
	}
}

// peerMessage is what ServePeer reads of a peer's message.
type peerMessage struct {
	ID     json.RawMessage `json:"id"`
	Method json.RawMessage `json:"method"`
	Params json.RawMessage `json:"params"`
}

// nullID is the id of a reply to a request whose id could not be read.
var nullID = json.RawMessage("null")

// ServePeer handles one JSON-RPC message from the session's peer (the
// payload of an "mcp" envelope from the user's voice server; any bytes)
// and returns the reply to send back, or nil when there is none.
//
// A request (a method and an id, number or string) waits for the session
// to be ready (within ctx and HubConfig.ReadyWait), then goes to the board
// through the queue the bridge's own requests take, with an id the bridge
// picks and the params unchanged. Its deadline is the one the bridge's own
// request gets: the tool's timeout for tools/call, the request timeout for
// anything else, time in the queue included. The reply carries the peer's
// id as the peer wrote it, and the board's result byte for byte, or the
// board's error (message, and code and data when the board gave them).
// When the bridge cannot deliver the request, the reply is an error with
// one of the PeerCode codes: a request is never left unanswered.
//
// A notification is forwarded to the board, except notifications/cancelled,
// whose requestId means nothing to the board (it saw the bridge's id): it
// cancels the peer's request of that id here instead. Anything else
// (responses, input that is not JSON-RPC) is dropped and counted.
//
// The peer's requests leave the bridge's view of the board alone: a
// tools/list the peer sends changes no catalogue.
func (s *Session) ServePeer(ctx context.Context, msg json.RawMessage) (reply json.RawMessage) {
	if t := bytes.TrimLeft(msg, " \t\r\n"); len(t) > 0 && t[0] == '[' && json.Valid(t) {
		s.peer.requests.Add(1)
		return s.peerRefuse(nullID, PeerCodeInvalidRequest, "invalid request: batches are not supported; send one message at a time")
	}
	var m peerMessage
	if json.Unmarshal(msg, &m) != nil || len(m.Method) == 0 || string(m.Method) == "null" {
		s.peer.dropped.Add(1) // a response, or not a JSON-RPC message at all
		return nil
	}
	var method string
	methodOK := json.Unmarshal(m.Method, &method) == nil && method != ""
	if m.ID == nil {
		if !methodOK {
			s.peer.dropped.Add(1)
			return nil
		}
		s.peerNotification(ctx, method, m.Params)
		return nil
	}
	s.peer.requests.Add(1)
	if !validID(m.ID) {
		return s.peerRefuse(nullID, PeerCodeInvalidRequest, "invalid request: id must be a number or a string")
	}
	switch {
	case !methodOK:
		return s.peerRefuse(m.ID, PeerCodeInvalidRequest, "invalid request: method must be a non-empty string")
	case strings.HasPrefix(method, "notifications"):
		// The board drops it without a reply, as it drops every
		// notification, and its params may name the peer's ids.
		return s.peerRefuse(m.ID, PeerCodeInvalidRequest, "invalid request: a notification has no id")
	case len(method) > maxPeerMethod:
		return s.peerRefuse(m.ID, PeerCodeInvalidRequest, fmt.Sprintf("invalid request: method longer than %d bytes", maxPeerMethod))
	case len(msg) > maxPeerMessage:
		return s.peerRefuse(m.ID, PeerCodeInvalidRequest, fmt.Sprintf("invalid request: larger than %d bytes", maxPeerMessage))
	}
	params := m.Params
	if string(params) == "null" {
		params = nil
	}
	if len(params) > 0 && params[0] != '{' {
		// The board drops such a request without a reply.
		return s.peerRefuse(m.ID, PeerCodeInvalidRequest, "invalid request: params must be an object")
	}
	limit := int32(s.hub.cfg.PeerMaxPending)
	if s.peer.pending.Add(1) > limit {
		s.peer.pending.Add(-1)
		return s.peerRefuse(m.ID, PeerCodeBusy, fmt.Sprintf("too many requests pending on this board: at most %d at once "+
			"from a peer (devices.peer_max_pending); nothing was sent", limit))
	}
	defer s.peer.pending.Add(-1)

	res, err := s.forward(ctx, m.ID, method, params)
	if err != nil {
		var de *DeviceError
		if errors.As(err, &de) {
			s.peer.errors.Add(1)
			return peerError(m.ID, de.Code, de.Message, de.Data)
		}
		if ce := s.log.Check(zap.DebugLevel, "peer request failed"); ce != nil {
			ce.Write(clip.Field("method", method), zap.Error(err))
		}
		return s.peerRefuse(m.ID, peerCode(err), err.Error())
	}
	reply = make([]byte, 0, len(m.ID)+len(res)+32)
	reply = append(reply, `{"jsonrpc":"2.0","id":`...)
	reply = append(reply, m.ID...)
	reply = append(reply, `,"result":`...)
	reply = append(reply, res...)
	return append(reply, '}')
}

// forward sends one peer request to the board and waits for its result.
func (s *Session) forward(ctx context.Context, id json.RawMessage, method string, params json.RawMessage) (json.RawMessage, error) {
	h := s.hub
	if h.draining.Err() != nil {
		return nil, fmt.Errorf("%w: %s was not sent", ErrShutdown, method)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(h.draining, func() { cancel(ErrShutdown) })
	defer stop()
	call := &peerCall{id: string(id), cancel: cancel}
	s.mu.Lock()
	s.peerCalls = append(s.peerCalls, call)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.peerCalls = slices.DeleteFunc(s.peerCalls, func(c *peerCall) bool { return c == call })
		s.mu.Unlock()
	}()

	res, err := s.forwardReady(ctx, method, params)
	if err == nil {
		return res, nil
	}
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errPeerCancelled):
		return nil, fmt.Errorf("%s %w: %w", method, errPeerCancelled, err)
	case errors.Is(cause, ErrShutdown) && !errors.Is(err, ErrShutdown):
		return nil, cutOff(method, err)
	}
	return nil, err
}

// forwardReady waits for the session to be ready, then forwards.
func (s *Session) forwardReady(ctx context.Context, method string, params json.RawMessage) (json.RawMessage, error) {
	wait := s.hub.cfg.ReadyWait
	waitCtx, cancel := context.WithTimeout(ctx, wait)
	err := s.WaitReady(waitCtx)
	cancel()
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case errors.Is(err, context.DeadlineExceeded):
		return nil, fmt.Errorf("%w: still %s after %v", ErrNotReady, s.Info().State, wait)
	default:
		return nil, err
	}
	c, err := s.readyClient()
	if err != nil {
		return nil, err
	}
	res, err := c.Forward(ctx, method, params)
	if errors.Is(err, mcpclient.ErrDisconnected) {
		return nil, s.disconnected(method, err)
	}
	return res, err
}

// peerNotification forwards a notification from the peer to the board.
// It takes one of the peer's places while it is written, so that a peer
// cannot park writers without bound behind a board that does not read.
func (s *Session) peerNotification(ctx context.Context, method string, params json.RawMessage) {
	if method == "notifications/cancelled" {
		s.peer.notifications.Add(1)
		s.cancelPeer(params)
		return
	}
	c, err := s.readyClient()
	if err != nil || s.peer.pending.Add(1) > int32(s.hub.cfg.PeerMaxPending) {
		if err == nil {
			s.peer.pending.Add(-1)
		}
		s.peer.dropped.Add(1)
		return
	}
	defer s.peer.pending.Add(-1)
	if string(params) == "null" {
		params = nil
	}
	if err := c.Notify(ctx, method, params); err != nil {
		s.peer.dropped.Add(1)
		return
	}
	s.peer.notifications.Add(1)
}

// cancelPeer cancels the peer's request named by a notifications/cancelled
// (the oldest of that id, should the peer reuse one). A request not yet
// sent never is; one sent stops being waited for (the board may still run
// it; the client goes on to the next request, as after a timeout).
func (s *Session) cancelPeer(params json.RawMessage) {
	var p struct {
		RequestID json.RawMessage `json:"requestId"`
	}
	if json.Unmarshal(params, &p) != nil || len(p.RequestID) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.peerCalls {
		if c.id == string(p.RequestID) {
			c.cancel(errPeerCancelled)
			return
		}
	}
}

// validID: a JSON-RPC id, as the decoder left it (a valid JSON value with
// no space around it), is a number or a string.
func validID(id json.RawMessage) bool {
	return len(id) > 0 && (id[0] == '"' || id[0] == '-' || (id[0] >= '0' && id[0] <= '9'))
}

// peerCode is the JSON-RPC code of a request the bridge could not deliver.
func peerCode(err error) int64 {
	switch CodeOf(err) {
	case CodeBusy:
		return PeerCodeBusy
	case CodeTimeout, CodeQueueTimeout:
		return PeerCodeTimeout
	case CodeOffline, CodeNotReady, CodeNoMCP, CodeShuttingDown, CodeUnknownDevice:
		return PeerCodeUnavailable
	}
	return PeerCodeFailed
}

// peerRefuse counts and builds an error reply of the bridge's own.
func (s *Session) peerRefuse(id json.RawMessage, code int64, msg string) json.RawMessage {
	s.peer.errors.Add(1)
	return peerError(id, code, msg, nil)
}

// peerError is a JSON-RPC error reply. id and data are raw JSON from the
// decoder and go out as they came; code is left out when 0, as the board
// sends none.
func peerError(id json.RawMessage, code int64, msg string, data json.RawMessage) json.RawMessage {
	var buf bytes.Buffer
	buf.WriteString(`{"jsonrpc":"2.0","id":`)
	buf.Write(id)
	buf.WriteString(`,"error":{`)
	if code != 0 {
		buf.WriteString(`"code":` + strconv.FormatInt(code, 10) + `,`)
	}
	buf.WriteString(`"message":`)
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(msg)         // a string always encodes
	buf.Truncate(buf.Len() - 1) // Encode's newline
	if len(data) > 0 {
		buf.WriteString(`,"data":`)
		buf.Write(data)
	}
	buf.WriteString(`}}`)
	return buf.Bytes()
}
