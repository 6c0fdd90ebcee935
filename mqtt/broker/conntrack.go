package broker

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// connListener wraps the board listener for three jobs mochi leaves open.
//
// mochi reads a client's CONNECT with no deadline, and Server.Close waits
// for every accepted connection to end. So a socket that never sends
// CONNECT would hold a slot forever and block the bridge's shutdown. Each
// accepted connection therefore gets a deadline for its CONNECT (mochi
// replaces it with its keepalive deadline once CONNECT is read), and
// closing the listener closes every connection still open, so Close never
// waits on a silent socket.
//
// mochi also accepts any number of sockets. The listener bounds them:
// maxConns open sockets in all, and maxPending sockets not yet admitted
// (CONNECT accepted), so silent or slow sockets cannot take every place
// from boards. A socket past either bound is closed at once.
type connListener struct {
	net.Listener
	connectTimeout       time.Duration
	maxConns, maxPending int
	refused              func(limit string) // called, outside mu, for every socket turned away

	mu      sync.Mutex
	conns   map[*trackedConn]struct{}
	pending int // sockets in conns not yet admitted
	closed  bool
}

func newConnListener(ln net.Listener, connectTimeout time.Duration, maxConns, maxPending int, refused func(string)) *connListener {
	return &connListener{Listener: ln, connectTimeout: connectTimeout, maxConns: maxConns, maxPending: maxPending,
		refused: refused, conns: map[*trackedConn]struct{}{}}
}

// Accept returns the next socket within the bounds. Sockets past them are
// closed here and never reach mochi, whose serve loop ends on any error.
func (l *connListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		tc := &trackedConn{Conn: c, l: l, pending: true}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			_ = c.Close()
			return nil, net.ErrClosed
		}
		var limit string
		switch {
		case len(l.conns) >= l.maxConns:
			limit = "mqtt.max_connections"
		case l.pending >= l.maxPending:
			limit = "mqtt.max_pending_connects"
		default:
			l.conns[tc] = struct{}{}
			l.pending++
		}
		l.mu.Unlock()
		if limit != "" {
			// Counted before the close, so that a client seeing its socket
			// closed finds the refusal counted.
			l.refused(limit)
			_ = c.Close()
			continue
		}
		_ = c.SetDeadline(time.Now().Add(l.connectTimeout))
		return tc, nil
	}
}

// Close stops accepting and closes every connection still open.
func (l *connListener) Close() error {
	err := l.Listener.Close()
	l.mu.Lock()
	l.closed = true
	conns := l.conns
	l.conns = map[*trackedConn]struct{}{}
	l.mu.Unlock()
	for c := range conns {
		_ = c.Conn.Close()
	}
	return err
}

// stopAccepting closes the listening socket only: connections already
// accepted stay open, for the broker to disconnect.
func (l *connListener) stopAccepting() { _ = l.Listener.Close() }

// allRead reports whether mochi has started reading every accepted
// connection still open, so has counted each in the wait group its Close
// waits on.
func (l *connListener) allRead() bool {
	open, reading := l.open()
	return open == reading
}

// open reports how many accepted connections are still open, and how many
// of them mochi has started reading (so it has counted them in the wait
// group its Close waits on).
func (l *connListener) open() (open, reading int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.conns {
		if c.read.Load() {
			reading++
		}
	}
	return len(l.conns), reading
}

type trackedConn struct {
	net.Conn
	l       *connListener
	once    sync.Once
	read    atomic.Bool
	pending bool // not yet admitted (under l.mu)
}

// admitted takes a socket out of the pending count once its CONNECT was
// accepted.
func (c *trackedConn) admitted() {
	c.l.mu.Lock()
	if c.pending {
		c.pending = false
		c.l.pending--
	}
	c.l.mu.Unlock()
}

func (c *trackedConn) Read(p []byte) (int, error) {
	c.read.Store(true)
	return c.Conn.Read(p)
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		if _, ok := c.l.conns[c]; ok {
			delete(c.l.conns, c)
			if c.pending {
				c.pending = false
				c.l.pending--
			}
		}
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}
