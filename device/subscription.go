package device

import "sync"

// SubscribeOptions choose what a subscription receives beyond the board
// events (online, tools changed, offline, resync).
type SubscribeOptions struct {
	// Calls adds an EventCall for every tool call that ends, and an
	// EventVoice for every relayed conversation that opens, closes or
	// fails: activity, not board state. They share the subscription's
	// bounded backlog, so a subscriber that falls behind gets EventResync
	// and loses the activity it missed.
	Calls bool
}

// DefaultSubscriptionBuffer is how many events a subscriber may fall behind
// before its backlog is collapsed into one EventResync.
const DefaultSubscriptionBuffer = 1024

// Subscription receives the Hub's events in order. It never blocks the Hub:
// when the backlog exceeds its bound, the backlog is replaced by a single
// EventResync, after which the subscriber re-reads Hub.Devices(). So a slow
// subscriber loses detail, never the final state.
type Subscription struct {
	hub    *Hub
	calls  bool // receives EventCall too
	mu     sync.Mutex
	queue  []Event
	max    int
	signal chan struct{}
	closed bool
}

// C is signalled whenever events are waiting; call Next to take them.
func (s *Subscription) C() <-chan struct{} { return s.signal }

// Next takes all waiting events, oldest first.
func (s *Subscription) Next() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queue
	s.queue = nil
	return q
}

// Close stops delivery. It is idempotent.
func (s *Subscription) Close() {
	s.hub.unsubscribe(s)
	s.mu.Lock()
	s.closed = true
	s.queue = nil
	s.mu.Unlock()
}

func (s *Subscription) push(ev Event) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	if len(s.queue) >= s.max {
		s.queue = append(s.queue[:0], Event{Type: EventResync, Seq: ev.Seq})
	} else {
		s.queue = append(s.queue, ev)
	}
	s.mu.Unlock()
	select {
	case s.signal <- struct{}{}:
	default: // already signalled; the reader will take everything at once
	}
}
