// Package connlimit caps the connections a listener holds open at once.
// Past the cap a new connection is refused as soon as it is accepted: an
// optional canned answer is written under a short deadline, the socket is
// closed, the refusal is counted and logged (throttled, since a client can
// repeat it at will). The cap counts every accepted connection until it is
// closed, whatever it carries: idle keep-alive, a slow request, a stream or
// a hijacked WebSocket.
package connlimit

import (
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/internal/logthrottle"
)

// refusalWriteTimeout bounds the write of the canned answer to a refused
// connection, so a client that does not read cannot hold the accept loop.
const refusalWriteTimeout = 100 * time.Millisecond

// HTTPRefusal is a canned HTTP answer for a plain-text HTTP listener at its
// cap. It is written before the request is read; a client may see the
// connection reset instead, which says the same.
func HTTPRefusal(setting string) []byte {
	body := "Service Unavailable: too many connections (" + setting + "); retry later\n"
	return []byte("HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\n" +
		"Content-Type: text/plain; charset=utf-8\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}

// Options configure a Listener.
type Options struct {
	// Max is the most connections open at once; it must be positive.
	Max int
	// Name identifies the listener in logs ("device", "control").
	Name string
	// Setting names the configuration key of Max, for the log line.
	Setting string
	// Refusal, when set, is written to a refused connection before it is
	// closed. Leave it nil on a TLS listener: the bytes would not be TLS.
	Refusal []byte
	// Logger receives the refusal line. Nil discards.
	Logger *zap.Logger
}

// Listener wraps a net.Listener with the cap. Wrap the raw TCP listener,
// beneath any TLS, so that a handshake in progress counts too.
type Listener struct {
	net.Listener
	opts     Options
	throttle logthrottle.Throttle

	active, refused atomic.Int64
}

// New caps ln at opts.Max connections.
func New(ln net.Listener, opts Options) *Listener {
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	return &Listener{Listener: ln, opts: opts}
}

// Accept returns the next connection under the cap, refusing those past it
// on the way.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.active.Add(1) <= int64(l.opts.Max) {
			return &conn{Conn: c, l: l}, nil
		}
		l.active.Add(-1)
		l.refuse(c)
	}
}

func (l *Listener) refuse(c net.Conn) {
	n := l.refused.Add(1)
	l.throttle.Warn(l.opts.Logger, "connection refused: listener at its connection limit",
		zap.String("listener", l.opts.Name), zap.Int("max", l.opts.Max), zap.String("setting", l.opts.Setting),
		zap.String("remote", c.RemoteAddr().String()), zap.Int64("refused_total", n))
	if l.opts.Refusal != nil {
		_ = c.SetWriteDeadline(time.Now().Add(refusalWriteTimeout))
		_, _ = c.Write(l.opts.Refusal)
	}
	_ = c.Close()
}

// Stats is a snapshot of a Listener's counters.
type Stats struct {
	Name string
	Max  int
	// Active is the connections open now; Refused those refused so far.
	Active, Refused int64
}

// Stats reads the counters.
func (l *Listener) Stats() Stats {
	return Stats{Name: l.opts.Name, Max: l.opts.Max, Active: l.active.Load(), Refused: l.refused.Load()}
}

// conn gives its slot back once, on the first Close.
type conn struct {
	net.Conn
	l    *Listener
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.active.Add(-1) })
	return err
}

// CloseWrite half-closes a TCP connection: net/http uses it to let the
// client read an error answer before the socket closes.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
