package device

import (
	"context"
	"fmt"
	"sync"
)

// LinkBase is the part of a Link every transport shares: an inbound queue
// that Receive drains, and a close that happens once and keeps its reason.
// A transport embeds a *LinkBase, feeds it with Deliver or TryDeliver from
// its reader, and adds Send and SessionID.
type LinkBase struct {
	inbound chan []byte
	done    chan struct{}
	once    sync.Once
	mu      sync.Mutex
	reason  error
	// afterClose run once the link has closed (AfterClose).
	afterClose []func()
}

// NewLinkBase returns a LinkBase whose inbound queue holds queue messages.
func NewLinkBase(queue int) *LinkBase {
	return &LinkBase{inbound: make(chan []byte, max(queue, 1)), done: make(chan struct{})}
}

// Receive returns the next inbound message.
func (b *LinkBase) Receive(ctx context.Context) ([]byte, error) {
	select {
	case m := <-b.inbound:
		return m, nil
	case <-b.done:
		return nil, b.ClosedErr()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Deliver queues an inbound message, waiting while the queue is full. It
// reports false once the link has closed.
func (b *LinkBase) Deliver(msg []byte) bool {
	select {
	case b.inbound <- msg:
		return true
	case <-b.done:
		return false
	}
}

// TryDeliver queues an inbound message without waiting; false means the
// queue was full or the link closed, and the message was dropped.
func (b *LinkBase) TryDeliver(msg []byte) bool {
	select {
	case <-b.done:
		return false
	default:
	}
	select {
	case b.inbound <- msg:
		return true
	default:
		return false
	}
}

// Close ends the link. The first reason wins; nil means ErrLinkClosed.
func (b *LinkBase) Close(reason error) {
	b.once.Do(func() {
		if reason == nil {
			reason = ErrLinkClosed
		}
		b.mu.Lock()
		b.reason = reason
		after := b.afterClose
		b.afterClose = nil
		b.mu.Unlock()
		close(b.done)
		for _, f := range after {
			go f()
		}
	})
}

// AfterClose arranges for f to run in its own goroutine once the link has
// closed (at once if it has). It lets the owner of a link wait for the
// close without a goroutine parked on Done for the life of the link.
func (b *LinkBase) AfterClose(f func()) {
	b.mu.Lock()
	if b.reason == nil {
		b.afterClose = append(b.afterClose, f)
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	go f()
}

// Done is closed once the link has closed.
func (b *LinkBase) Done() <-chan struct{} { return b.done }

// Closed reports whether the link has closed.
func (b *LinkBase) Closed() bool {
	select {
	case <-b.done:
		return true
	default:
		return false
	}
}

// Err is the close reason, nil while open.
func (b *LinkBase) Err() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.reason
}

// ClosedErr is what Send and Receive return once the link has closed.
func (b *LinkBase) ClosedErr() error {
	return fmt.Errorf("%w: %v", ErrLinkClosed, b.Err())
}
