package broker

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// connListener wraps the board listener for two jobs mochi leaves open.
//
// mochi reads a client's CONNECT with no deadline, and Server.Close waits
// for every accepted connection to end. So a socket that never sends
// CONNECT would hold a slot forever and block the bridge's shutdown. Each
// accepted connection therefore gets a deadline for its CONNECT (mochi
// replaces it with its keepalive deadline once CONNECT is read), and
// closing the listener closes every connection still open, so Close never
// waits on a silent socket.
type connListener struct {
	net.Listener
	connectTimeout time.Duration

	mu     sync.Mutex
	conns  map[*trackedConn]struct{}
	closed bool
}

func newConnListener(ln net.Listener, connectTimeout time.Duration) *connListener {
	return &connListener{Listener: ln, connectTimeout: connectTimeout, conns: map[*trackedConn]struct{}{}}
}

func (l *connListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(l.connectTimeout))
	tc := &trackedConn{Conn: c, l: l}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		_ = c.Close()
		return nil, net.ErrClosed
	}
	l.conns[tc] = struct{}{}
	l.mu.Unlock()
	return tc, nil
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
	l    *connListener
	once sync.Once
	read atomic.Bool
}

func (c *trackedConn) Read(p []byte) (int, error) {
	c.read.Store(true)
	return c.Conn.Read(p)
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}
