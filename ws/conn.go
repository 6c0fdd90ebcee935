package ws

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device"
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
	outbound chan []byte
	done     <-chan struct{}

	textIn, binaryIn, textOut atomic.Int64
}

var _ device.Link = (*conn)(nil)

func newConn(ws *websocket.Conn, cfg Config, log *zap.Logger) *conn {
	base := device.NewLinkBase(inboundQueue)
	return &conn{
		ws:       ws,
		cfg:      cfg,
		log:      log,
		LinkBase: base,
		outbound: make(chan []byte, cfg.SendQueue),
		done:     base.Done(),
	}
}

func (c *conn) SessionID() string { return c.sessionID }

func (c *conn) Send(ctx context.Context, msg []byte) error {
	select {
	case <-c.done:
		return c.ClosedErr()
	default:
	}
	select {
	case c.outbound <- msg:
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
			c.binaryIn.Add(1) // audio: counted, not played (yet)
			continue
		}
		c.textIn.Add(1)
		if !c.Deliver(data) {
			return
		}
	}
}

// writeLoop is the connection's only writer; it also sends pings and, on
// close, a close frame carrying the reason before dropping the socket.
func (c *conn) writeLoop() {
	ping := time.NewTicker(c.cfg.PingInterval)
	defer ping.Stop()
	defer c.ws.Close()
	for {
		select {
		case msg := <-c.outbound:
			_ = c.ws.SetWriteDeadline(time.Now().Add(c.cfg.WriteTimeout))
			if err := c.ws.WriteMessage(websocket.TextMessage, msg); err != nil {
				c.Close(device.Closing(device.CauseDisconnected, fmt.Errorf("write failed: %w", err)))
				return
			}
			c.textOut.Add(1)
		case <-ping.C:
			if err := c.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(c.cfg.WriteTimeout)); err != nil {
				c.Close(device.Closing(device.CauseDisconnected, fmt.Errorf("ping failed: %w", err)))
				return
			}
		case <-c.done:
			frame := websocket.FormatCloseMessage(closeCode(c.Err()), closeText(c.Err()))
			_ = c.ws.WriteControl(websocket.CloseMessage, frame, time.Now().Add(time.Second))
			return
		}
	}
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
