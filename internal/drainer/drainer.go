// Package drainer runs a queue's consumer in a goroutine that exists only
// while the queue has work, so an idle owner (a board's connection, of
// which the bridge holds thousands) costs no goroutine.
//
// The owner keeps the queue (a buffered channel, say) and whatever lock
// its consumer needs; after adding work it calls Kick. At most one worker
// runs at a time. A worker that finds the queue empty clears its flag and
// then looks again: work added between its last look and the clear saw a
// worker running and started none, so the worker that is ending takes it.
//
// Who waits: the owner. Close, called where the owner shuts down, refuses
// further Kicks and waits for the worker that runs, if any.
package drainer

import (
	"sync"
	"sync/atomic"
)

// Drainer starts and tracks the worker of one queue.
type Drainer struct {
	drain   func() bool
	pending func() bool

	// running is set while a worker runs; Kick starts one only by setting
	// it, so there is never more than one.
	running atomic.Bool

	mu     sync.Mutex // orders wg.Add with Close's Wait; a leaf
	closed bool
	wg     sync.WaitGroup
}

// New returns a Drainer whose worker calls drain, which consumes the queue
// until it finds it empty and returns true, or returns false to end the
// worker without looking again (the owner is closing, or its output
// failed). pending reports whether the queue holds work; it must not
// block.
func New(drain func() bool, pending func() bool) *Drainer {
	return &Drainer{drain: drain, pending: pending}
}

// Kick notes that work was queued: it starts a worker unless one runs or
// the Drainer is closed. It never blocks on the worker.
func (d *Drainer) Kick() {
	if !d.running.CompareAndSwap(false, true) {
		return
	}
	d.mu.Lock()
	if d.closed {
		// running stays set, so later Kicks stop at the swap above.
		d.mu.Unlock()
		return
	}
	d.wg.Add(1)
	d.mu.Unlock()
	go d.work()
}

// Close refuses further Kicks and waits for the running worker to end.
// drain must end promptly once the owner is closing. Close is idempotent
// and must not be called from drain.
func (d *Drainer) Close() {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	d.wg.Wait()
}

func (d *Drainer) work() {
	defer d.wg.Done()
	for {
		if !d.drain() {
			d.running.Store(false)
			return
		}
		d.running.Store(false)
		// A Kick between drain's last look and the Store above found a
		// worker running and started none: take its work.
		if !d.pending() || !d.running.CompareAndSwap(false, true) {
			return
		}
	}
}
