package flow

import (
	"container/heap"
	"context"
	"sync"
)

// sweepBatch bounds how many expired entries one call cleans up.
const sweepBatch = 32

// store is where interactions live between calls. The Engine is the state
// machine (answer, next, present, execute) over a private copy of an
// interaction's record; a store hands that copy out and takes the outcome
// back. There are two:
//
//   - memStore (memstore.go): records in memory, by random id, with
//     per-owner limits and expiry; one bridge only;
//   - tokenStore (tokenstore.go): the record travels, signed, in the
//     sessionId (token.go); a SpentStore makes each token usable once,
//     across every replica sharing it.
//
// Both keep a table of entries (below); its lock is the only lock in the
// engine, and no store method calls out (tools, lookups, the SpentStore)
// while holding it.
type store interface {
	// open registers a new interaction rec for owner at now (Unix ms). need
	// is how many prompts it will show (0: it runs at once); cancel stops
	// the call that starts it. The entry is nil when the store keeps none.
	open(owner string, rec *record, need int, now int64, cancel context.CancelFunc) (*entry, error)
	// acquire finds interaction id for an answer, checks that it waits for
	// one and marks it processing; it returns a private copy to work on.
	acquire(owner, id string, cancel context.CancelFunc) (*entry, *record, error)
	// claim makes an acquired answer final, once the engine can handle it
	// (the tool was found): a token's step is spent here.
	claim(ctx context.Context, id string, ent *entry, work *record) error
	// release puts an acquired interaction back, waiting for the same
	// answer, after a failure that consumed nothing.
	release(ent *entry)
	// commit stores work, the outcome of Start or Respond, unless the
	// interaction was cancelled meanwhile (then the step says so). It
	// returns the sessionId to hand out and the record whose deadline the
	// step reports; an empty id means the engine closed meanwhile.
	commit(ctx context.Context, owner string, ent *entry, work *record, step *Step, err error) (string, *record, *Step, error)
	// get is owner's snapshot of interaction id.
	get(ctx context.Context, owner, id string) (*Snapshot, error)
	// cancel ends interaction id for owner.
	cancel(ctx context.Context, owner, id, reason string) error
	// counts is what the store holds now, by state, for metrics.
	counts(now int64) map[State]int
	// close cancels what runs and forgets everything; later calls fail
	// with errClosed.
	close()
}

// entry is an interaction (memStore), or a token store's marker of an
// answer being processed or an interaction that ended here.
type entry struct {
	key      string
	owner    string
	rec      *record // nil once expired (kept a while to answer CodeSessionExpired)
	expired  string  // why it expired (memStore)
	limit    string  // the limit that expired it, for messages (memStore)
	deadline int64   // Unix ms
	index    int     // in byTime
	open     bool    // counted in memStore.owners
	cancel   context.CancelFunc
}

// An entry's place in table.byTime: by deadline.
func (ent *entry) before(o *entry) bool { return ent.deadline < o.deadline }
func (ent *entry) setIndex(i int)       { ent.index = i }

// table is the entries a store holds, with a deadline heap so that
// expired ones are found without a scan. Expiry is lazy (no goroutine): a
// bounded sweep on each Start, and checks on touch.
type table struct {
	mu      sync.Mutex
	closed  bool
	entries map[string]*entry
	byTime  timeHeap[*entry]
}

func newTable() table { return table{entries: map[string]*entry{}} }

// add puts ent in the table (mu held).
func (t *table) add(ent *entry) {
	t.entries[ent.key] = ent
	heap.Push(&t.byTime, ent)
}

// moved re-sorts ent after its deadline changed (mu held).
func (t *table) moved(ent *entry) { heap.Fix(&t.byTime, ent.index) }

// drop removes ent (mu held).
func (t *table) drop(ent *entry) {
	if ent.index >= 0 && ent.index < len(t.byTime) && t.byTime[ent.index] == ent {
		heap.Remove(&t.byTime, ent.index)
	}
	delete(t.entries, ent.key)
}

// sweep handles up to sweepBatch entries whose deadline passed (mu held).
// What is running never expires: it is looked at again recheck ms later.
// A live record goes to expire when the store turns it into a tombstone
// (nil: it is dropped); tombstones and markers are dropped.
func (t *table) sweep(now, recheck int64, expire func(ent *entry, now int64)) {
	for i := 0; i < sweepBatch && len(t.byTime) > 0; i++ {
		ent := t.byTime[0]
		if ent.deadline >= now {
			return
		}
		switch {
		case ent.rec != nil && ent.rec.State.busy():
			ent.deadline = now + recheck
			heap.Fix(&t.byTime, 0)
		case ent.rec != nil && expire != nil:
			expire(ent, now)
		default:
			heap.Pop(&t.byTime)
			delete(t.entries, ent.key)
		}
	}
}

// counts is every entry with a record, by state, leaving out the expired
// ones not yet swept.
func (t *table) counts(now int64) map[State]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[State]int{}
	for _, ent := range t.entries {
		if ent.rec == nil {
			continue
		}
		if !ent.rec.State.busy() && ent.deadline < now {
			continue
		}
		out[ent.rec.State]++
	}
	return out
}

// shut marks the table closed, cancels what runs and forgets every entry
// (mu held).
func (t *table) shut() {
	t.closed = true
	for _, ent := range t.entries {
		if ent.cancel != nil {
			ent.cancel()
		}
	}
	t.entries = map[string]*entry{}
	t.byTime = nil
}

// cancelledMeanwhile is the step of an answer whose interaction was
// cancelled while it was processed.
func cancelledMeanwhile(reason string) *Step {
	return &Step{State: StateCancelled,
		Summary: "Cancelled while the answer was being processed (" + reason + "); the outcome was discarded."}
}
