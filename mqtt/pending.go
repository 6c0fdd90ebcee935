package mqtt

import "sync"

// Bounds of the messages that wait for the supervisor to discover their
// board. A burst of boards all saying hello at once (a broker restart, a
// fleet powering up) must wait, not be dropped: behind an external broker
// a board's hello is often the only message it sends until it is spoken
// to, so a dropped one is a board the bridge never finds. A flood of
// unknown ids costs at most these bounds.
const (
	// DefaultDiscoveryBoards bounds the boards waiting at once.
	DefaultDiscoveryBoards = 65536
	// DefaultDiscoveryBytes bounds the payload bytes waiting at once.
	DefaultDiscoveryBytes = 32 << 20
	// discoveryPerBoard bounds the messages kept for one waiting board:
	// before the bridge speaks, a board sends a hello and little else.
	discoveryPerBoard = 8
	// discoveryBatch is how many boards the supervisor discovers before
	// it looks at its other work again.
	discoveryBatch = 256
)

// pending holds first messages of boards the gateway has no link for yet,
// grouped by board in arrival order, until the supervisor takes them. Its
// mutex is a leaf.
type pending struct {
	maxBoards, maxBytes int

	mu     sync.Mutex
	boards map[string][]discovery
	order  []string // the waiting boards, first heard first
	bytes  int

	ready chan struct{} // one slot: something waits
}

func newPending(maxBoards, maxBytes int) *pending {
	return &pending{maxBoards: maxBoards, maxBytes: maxBytes, boards: map[string][]discovery{}, ready: make(chan struct{}, 1)}
}

// add queues d; false when a bound is reached, and d is dropped.
func (p *pending) add(d discovery) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bytes+len(d.payload) > p.maxBytes {
		return false
	}
	waiting, known := p.boards[d.deviceID]
	switch {
	case known && len(waiting) >= discoveryPerBoard:
		return false
	case !known && len(p.order) >= p.maxBoards:
		return false
	case !known:
		p.order = append(p.order, d.deviceID)
	}
	p.boards[d.deviceID] = append(waiting, d)
	p.bytes += len(d.payload)
	select {
	case p.ready <- struct{}{}:
	default:
	}
	return true
}

// take returns the messages of up to n waiting boards, board by board in
// arrival order, and signals ready again if more wait: the supervisor
// takes a batch at a time, so other work is not held up behind a burst.
func (p *pending) take(n int) []discovery {
	p.mu.Lock()
	defer p.mu.Unlock()
	n = min(n, len(p.order))
	var out []discovery
	for _, id := range p.order[:n] {
		for _, d := range p.boards[id] {
			p.bytes -= len(d.payload)
			out = append(out, d)
		}
		delete(p.boards, id)
	}
	p.order = append(p.order[:0], p.order[n:]...)
	if len(p.order) > 0 {
		select {
		case p.ready <- struct{}{}:
		default:
		}
	}
	return out
}
