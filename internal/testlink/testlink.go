// Package testlink provides an in-memory device.Link pair for unit tests of
// the layers above the transports. Integration tests use real sockets.
//
// Lock order: none to keep; each type's mutex is a leaf.
package testlink

import (
	"context"
	"fmt"
	"sync"
)

// Link is one end of an in-memory connection. Closing either end closes
// both, as a dropped socket would.
type Link struct {
	in, out chan []byte
	shared  *shared
	Session string
}

type shared struct {
	once   sync.Once
	done   chan struct{}
	mu     sync.Mutex
	reason error
	closed bool
	after  []func() // AfterClose callbacks not yet run
}

// ErrClosed is returned by Send and Receive after Close.
var ErrClosed = fmt.Errorf("testlink: closed")

// Pair returns two connected ends with queues of size buf.
func Pair(buf int) (*Link, *Link) {
	a2b, b2a := make(chan []byte, buf), make(chan []byte, buf)
	sh := &shared{done: make(chan struct{})}
	return &Link{in: b2a, out: a2b, shared: sh, Session: "test-session"},
		&Link{in: a2b, out: b2a, shared: sh, Session: "test-session"}
}

func (l *Link) Send(ctx context.Context, msg []byte) error {
	select {
	case <-l.shared.done:
		return ErrClosed
	default:
	}
	select {
	case l.out <- append([]byte(nil), msg...):
		return nil
	case <-l.shared.done:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l *Link) Receive(ctx context.Context) ([]byte, error) {
	select {
	case m := <-l.in:
		return m, nil
	case <-l.shared.done:
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *Link) SessionID() string { return l.Session }

func (l *Link) Close(reason error) {
	l.shared.once.Do(func() {
		l.shared.mu.Lock()
		l.shared.reason, l.shared.closed = reason, true
		after := l.shared.after
		l.shared.after = nil
		l.shared.mu.Unlock()
		close(l.shared.done)
		for _, f := range after {
			go f()
		}
	})
}

// AfterClose runs f in its own goroutine once the pair has closed (at once
// if it has), as device.LinkBase does for the real transports.
func (l *Link) AfterClose(f func()) {
	l.shared.mu.Lock()
	if !l.shared.closed {
		l.shared.after = append(l.shared.after, f)
		l.shared.mu.Unlock()
		return
	}
	l.shared.mu.Unlock()
	go f()
}

func (l *Link) Done() <-chan struct{} { return l.shared.done }

func (l *Link) Err() error {
	l.shared.mu.Lock()
	defer l.shared.mu.Unlock()
	return l.shared.reason
}
