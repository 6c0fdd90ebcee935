package ws

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/drainer"
)

// inboundQueue bounds text messages read but not yet consumed. When it is
// full the reader stops reading, and TCP flow control pushes back on the
// board instead of the bridge buffering without limit.
const inboundQueue = 16

// conn is one board's WebSocket; it implements device.Link.
type conn struct {
	ws        *websocket.Conn
	cfg       Config
	log       *zap.Logger
	sessionID string

	// LinkBase gives Receive, Close, Done and Err; the reader feeds it.
	*device.LinkBase
	// outbound holds text messages and, while a conversation is relayed,
	// audio frames, in the order they are to be written.
	outbound chan outMsg
	done     <-chan struct{}

	// writer runs a goroutine (write) only while outbound holds messages:
	// an idle board costs no goroutine for writing. The close path waits
	// for it.
	writer *drainer.Drainer
	// wmu is held while a data message is taken from outbound and written.
	wmu sync.Mutex
	// pinger sends the next ping.
	pinger *time.Timer
	// sockClosed is closed once the close frame is out and the socket
	// closed (shutdown).
	sockClosed chan struct{}

	textIn, binaryIn, textOut, binaryOut, audioDropped atomic.Int64

	// voice relays the board's conversation when the bridge has a voice
	// upstream for it (nil otherwise).
	voice *voiceLink

	// helloPending is set while the conn holds one of the server's
	// pending-hello slots; guarded by Server.mu.
	helloPending bool
}

var _ device.Link = (*conn)(nil)

func newConn(ws *websocket.Conn, cfg Config, log *zap.Logger) *conn {
	base := device.NewLinkBase(inboundQueue)
	c := &conn{
		ws:         ws,
		cfg:        cfg,
		log:        log,
		LinkBase:   base,
		outbound:   make(chan outMsg, cfg.SendQueue),
		done:       base.Done(),
		sockClosed: make(chan struct{}),
	}
	c.writer = drainer.New(c.write, func() bool { return len(c.outbound) > 0 })
	return c
}

// outMsg is one message for the board: text, or a binary audio frame.
type outMsg struct {
	binary bool
	data   []byte
}

func (m outMsg) kind() int {
	if m.binary {
		return websocket.BinaryMessage
	}
	return websocket.TextMessage
}

func (c *conn) SessionID() string {
	if v := c.voice; v != nil {
		if id := v.sessionID(); id != "" {
			return id
		}
	}
	return c.sessionID
}

// sendAudio queues one audio frame without waiting: a board drops audio it
// cannot play in time, and so does a full queue.
func (c *conn) sendAudio(frame []byte) bool {
	select {
	case <-c.done:
		return false
	case c.outbound <- outMsg{binary: true, data: frame}:
		c.writer.Kick()
		return true
	default:
		c.audioDropped.Add(1)
		return false
	}
}

func (c *conn) Send(ctx context.Context, msg []byte) error {
	select {
	case <-c.done:
		return c.ClosedErr()
	default:
	}
	select {
	case c.outbound <- outMsg{data: msg}:
		c.writer.Kick()
		return nil
	case <-c.done:
		return c.ClosedErr()
	case <-ctx.Done():
		return fmt.Errorf("websocket send queue full: %w", ctx.Err())
	}
}

// readLoop is the connection's only reader.
func (c *conn) readLoop() {
	c.ws.SetReadLimit(c.cfg.ReadLimit)
	wait := c.cfg.PingInterval + c.cfg.PongWait
	_ = c.ws.SetReadDeadline(time.Now().Add(wait))
	c.ws.SetPongHandler(func(string) error {
		return c.ws.SetReadDeadline(time.Now().Add(wait))
	})
	for {
		kind, data, err := c.ws.ReadMessage()
		if err != nil {
			c.Close(readError(err))
			return
		}
		// Any frame proves the board alive, not only pongs.
		_ = c.ws.SetReadDeadline(time.Now().Add(wait))
		if kind == websocket.BinaryMessage {
			c.binaryIn.Add(1)
			if c.voice != nil {
				c.voice.audio(data)
			}
			continue
		}
		c.textIn.Add(1)
		if c.voice != nil && c.voice.text(data) {
			continue // a conversation message, relayed
		}
		if !c.Deliver(data) {
			return
		}
	}
}

// write is the connection's only writer of data messages while it runs
// (c.writer's worker): it writes what Send queued until the queue is empty,
// or stops on a failed write. wmu is held from taking a message to having
// written it, so the close path (which flushes what is left under wmu)
// never reorders messages.
func (c *conn) write() bool {
	for {
		c.wmu.Lock()
		select {
		case msg := <-c.outbound:
			_ = c.ws.SetWriteDeadline(time.Now().Add(c.cfg.WriteTimeout))
			err := c.ws.WriteMessage(msg.kind(), msg.data)
			c.wmu.Unlock()
			if err != nil {
				c.Close(device.Closing(device.CauseDisconnected, fmt.Errorf("write failed: %w", err)))
				return false
			}
			c.countOut(msg)
		default:
			c.wmu.Unlock()
			return true
		}
	}
}

func (c *conn) countOut(m outMsg) {
	if m.binary {
		c.binaryOut.Add(1)
	} else {
		c.textOut.Add(1)
	}
}

// flush writes what is still queued, within deadline; wmu is held.
func (c *conn) flush(deadline time.Time) {
	_ = c.ws.SetWriteDeadline(deadline)
	for {
		select {
		case msg := <-c.outbound:
			if c.ws.WriteMessage(msg.kind(), msg.data) != nil {
				return
			}
			c.countOut(msg)
		default:
			return
		}
	}
}

// startPings sends a ping every PingInterval from a timer (gorilla's
// WriteControl may run alongside a data write), and on close sends a close
// frame carrying the reason before dropping the socket. done runs after
// the socket is closed and the writer goroutine, if any, has ended.
func (c *conn) startPings(done func()) {
	c.pinger = time.AfterFunc(c.cfg.PingInterval, c.ping)
	c.AfterClose(func() {
		c.pinger.Stop()
		// Messages Send accepted before the close (a server hello, say)
		// go out before the close frame.
		deadline := time.Now().Add(time.Second)
		if !c.wmu.TryLock() {
			// A write in progress to a board that stopped reading ends
			// within the same second (net.Conn deadlines may be set
			// alongside a write).
			_ = c.ws.NetConn().SetWriteDeadline(deadline)
			c.wmu.Lock()
		}
		c.flush(deadline)
		frame := websocket.FormatCloseMessage(closeCode(c.Err()), closeText(c.Err()))
		_ = c.ws.WriteControl(websocket.CloseMessage, frame, deadline)
		_ = c.ws.Close() // ends readLoop
		c.wmu.Unlock()
		// A writer still running finds the queue flushed or the socket
		// closed, and ends.
		c.writer.Close()
		close(c.sockClosed)
		done()
	})
}

func (c *conn) ping() {
	if c.Closed() {
		return
	}
	if err := c.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(c.cfg.WriteTimeout)); err != nil {
		c.Close(device.Closing(device.CauseDisconnected, fmt.Errorf("ping failed: %w", err)))
		return
	}
	c.pinger.Reset(c.cfg.PingInterval)
}

func closeCode(reason error) int {
	switch device.CauseOf(reason) {
	case device.CauseShutdown:
		return websocket.CloseGoingAway
	case device.CauseProtocol:
		return websocket.ClosePolicyViolation
	case device.CauseRefused:
		return websocket.CloseTryAgainLater
	default:
		return websocket.CloseNormalClosure
	}
}

// closeText fits the reason into a close frame (at most 123 bytes of UTF-8).
func closeText(reason error) string {
	if reason == nil {
		return ""
	}
	s := reason.Error()
	for len(s) > 123 {
		_, size := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-size]
	}
	return s
}

// readError turns a read failure into a close reason a person can act on.
func readError(err error) error {
	var ce *websocket.CloseError
	switch {
	case websocket.IsCloseError(err, websocket.CloseNormalClosure, websocket.CloseGoingAway):
		return device.Closing(device.CauseDisconnected, fmt.Errorf("device closed the connection: %w", err))
	case errors.As(err, &ce) && ce.Code == websocket.CloseMessageTooBig,
		errors.Is(err, websocket.ErrReadLimit):
		return device.Closing(device.CauseProtocol, fmt.Errorf("device sent a message over the size limit: %w", err))
	}
	if ne, ok := err.(interface{ Timeout() bool }); ok && ne.Timeout() {
		return device.Closing(device.CauseUnresponsive, fmt.Errorf("device stopped answering pings: %w", err))
	}
	return device.Closing(device.CauseDisconnected, fmt.Errorf("connection lost: %w", err))
}
