package envelope

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sourcegraph/jsonrpc2"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/internal/logthrottle"
)

// Link is the part of a device connection a Stream needs: one text message
// out, the next text message in, and the session id to stamp on outgoing
// messages. Transports implement it (device.Link is a superset).
type Link interface {
	Send(ctx context.Context, msg []byte) error
	Receive(ctx context.Context) ([]byte, error)
	SessionID() string
}

// DefaultWriteTimeout bounds how long WriteObject waits for the link to
// accept a message (its outbound queue is bounded).
const DefaultWriteTimeout = 10 * time.Second

// StreamOptions configure a Stream. The zero value is usable.
type StreamOptions struct {
	MaxMessageSize int
	WriteTimeout   time.Duration
	Logger         *zap.Logger
}

// StreamStats counts what a Stream saw. Dropped messages are never fatal.
type StreamStats struct {
	MCPIn, MCPOut int64
	// Other counts valid envelopes of other types (listen, abort, ...).
	Other int64
	// Dropped counts messages that could not be used: malformed JSON,
	// oversized, no type, non-object payloads, payloads that are not
	// JSON-RPC.
	Dropped int64
	// Repaired counts error replies with unescaped messages that were fixed.
	Repaired int64
}

// Stream adapts a Link to jsonrpc2.ObjectStream: each JSON-RPC object becomes
// the payload of an "mcp" envelope. Reading skips everything that is not a
// usable MCP message, so one bad message from a board never tears down the
// JSON-RPC connection (sourcegraph/jsonrpc2 closes on any read error).
type Stream struct {
	link   Link
	opts   StreamOptions
	log    *zap.Logger
	ctx    context.Context
	cancel context.CancelFunc

	mcpIn, mcpOut, other, dropped, repaired atomic.Int64
	closeOnce                               sync.Once
	// dropLog throttles the warning about dropped messages: a board can
	// send garbage as fast as its link carries it.
	dropLog logthrottle.Throttle
}

var _ jsonrpc2.ObjectStream = (*Stream)(nil)

// ErrStreamClosed is returned by ReadObject and WriteObject after Close.
var ErrStreamClosed = errors.New("envelope: stream closed")

// NewStream wraps link. Closing the Stream does not close the link: the
// device session owns the link and closes it with a reason.
func NewStream(link Link, opts StreamOptions) *Stream {
	opts.WriteTimeout = cmp.Or(max(opts.WriteTimeout, 0), DefaultWriteTimeout)
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Stream{link: link, opts: opts, log: log, ctx: ctx, cancel: cancel}
}

// WriteObject sends obj (a JSON-RPC message) as an "mcp" envelope.
func (s *Stream) WriteObject(obj any) error {
	if s.ctx.Err() != nil {
		return ErrStreamClosed
	}
	payload, err := json.Marshal(obj)
	if err != nil {
		return fmt.Errorf("envelope: encode payload: %w", err)
	}
	msg, err := Encode(s.link.SessionID(), TypeMCP, payload)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.opts.WriteTimeout)
	defer cancel()
	if err := s.link.Send(ctx, msg); err != nil {
		return err
	}
	s.mcpOut.Add(1)
	return nil
}

// ReadObject blocks until the next usable MCP payload arrives and decodes it
// into v. It returns an error only when the link or the stream is closed.
func (s *Stream) ReadObject(v any) error {
	for {
		msg, err := s.link.Receive(s.ctx)
		if err != nil {
			if s.ctx.Err() != nil {
				return ErrStreamClosed
			}
			return err
		}
		env, err := Decode(msg, s.opts.MaxMessageSize)
		if err != nil {
			s.drop("undecodable message", err, len(msg))
			continue
		}
		if env.Repaired {
			s.repaired.Add(1)
		}
		if env.Type != TypeMCP {
			s.other.Add(1)
			continue
		}
		if env.Payload == nil {
			s.drop("mcp message without payload", nil, len(msg))
			continue
		}
		if err := decodeInto(env.Payload, v); err != nil {
			s.drop("payload is not JSON-RPC", err, len(msg))
			continue
		}
		s.mcpIn.Add(1)
		return nil
	}
}

// decodeInto decodes into a fresh value first, so a failed decode cannot
// leave v half-filled for the next message.
func decodeInto(payload json.RawMessage, v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("envelope: ReadObject needs a non-nil pointer, got %T", v)
	}
	fresh := reflect.New(rv.Elem().Type())
	if err := json.Unmarshal(payload, fresh.Interface()); err != nil {
		return err
	}
	rv.Elem().Set(fresh.Elem())
	return nil
}

func (s *Stream) drop(why string, err error, size int) {
	s.dropped.Add(1)
	// The decoder's error may quote the board's bytes.
	s.dropLog.Warn(s.log, "dropped device message", zap.String("reason", why), clip.Error(err), zap.Int("bytes", size))
}

// Close unblocks ReadObject and makes later writes fail. It is idempotent.
func (s *Stream) Close() error {
	s.closeOnce.Do(s.cancel)
	return nil
}

// Stats returns a snapshot of the counters.
func (s *Stream) Stats() StreamStats {
	return StreamStats{
		MCPIn: s.mcpIn.Load(), MCPOut: s.mcpOut.Load(), Other: s.other.Load(),
		Dropped: s.dropped.Load(), Repaired: s.repaired.Load(),
	}
}
