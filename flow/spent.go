package flow

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"sync"
	"time"
)

// SpentStore is replay protection for state that travels with the caller:
// stateless interaction tokens (Options.Secret) and, in mcpserver/, MRTR
// requestStates. Each such token may be consumed once; the store remembers
// which were, for as long as the token could still be presented.
//
// Engines that share a secret must share a store, or a token consumed on
// one of them can be replayed on another: one bridge uses a MemorySpent,
// a fleet of bridges a store all its nodes see (cluster/ implements one on
// a JetStream key-value bucket).
//
// An error means the store could not tell: the caller must act as if the
// token were spent (fail closed) and tell its caller to retry.
type SpentStore interface {
	// Spend marks key as used for use (a short word such as "answered")
	// until the time given. Exactly one Spend per key, among every engine
	// sharing the store, gets first true until the entry expires; the others
	// get first false and the use the first one recorded.
	Spend(ctx context.Context, key, use string, until time.Time) (first bool, prior string, err error)
	// Spent returns the use recorded for key, or "" if it was not spent
	// (or its entry expired).
	Spent(ctx context.Context, key string) (string, error)
}

// What the engine records in a SpentStore: a token's step is "answered" or
// "cancelled"; an interaction's end is its final State.
const (
	UseAnswered  = "answered"
	UseCancelled = "cancelled"
)

// DefaultSpentCapacity bounds a MemorySpent made with capacity 0.
const DefaultSpentCapacity = 1 << 18

// ErrSpentFull is MemorySpent's error when it holds its capacity of live
// entries: it refuses rather than forget one (a forgotten entry is a token
// that could be replayed).
var ErrSpentFull = errors.New("flow: the replay store is full (too many tokens in use at once); retry shortly")

// MemorySpent is the SpentStore of one bridge: a map with an expiry heap,
// bounded, cleaned up lazily on each call (no goroutine).
type MemorySpent struct {
	capacity int
	now      func() time.Time

	mu     sync.Mutex
	byKey  map[string]*spentEntry
	expiry timeHeap[*spentEntry]
}

type spentEntry struct {
	key   string
	use   string
	until time.Time
	index int
}

// NewMemorySpent returns an in-memory store holding at most capacity live
// entries (0: DefaultSpentCapacity); now is the clock (nil: time.Now).
func NewMemorySpent(capacity int, now func() time.Time) *MemorySpent {
	capacity = cmp.Or(max(capacity, 0), DefaultSpentCapacity)
	if now == nil {
		now = time.Now
	}
	return &MemorySpent{capacity: capacity, now: now, byKey: map[string]*spentEntry{}}
}

// Spend implements SpentStore. An entry is live until (and including) its
// until time.
func (m *MemorySpent) Spend(_ context.Context, key, use string, until time.Time) (bool, string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.purge()
	if e := m.byKey[key]; e != nil {
		return false, e.use, nil
	}
	if len(m.byKey) >= m.capacity {
		return false, "", ErrSpentFull
	}
	e := &spentEntry{key: key, use: use, until: until}
	m.byKey[key] = e
	heap.Push(&m.expiry, e)
	return true, "", nil
}

// Spent implements SpentStore.
func (m *MemorySpent) Spent(_ context.Context, key string) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.purge()
	if e := m.byKey[key]; e != nil {
		return e.use, nil
	}
	return "", nil
}

// Len reports the live entries.
func (m *MemorySpent) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.purge()
	return len(m.byKey)
}

// purge drops the expired entries (m.mu held). Each entry is pushed and
// popped once, so the cost is amortized over the Spends.
func (m *MemorySpent) purge() {
	now := m.now()
	for len(m.expiry) > 0 && m.expiry[0].until.Before(now) {
		e := heap.Pop(&m.expiry).(*spentEntry)
		delete(m.byKey, e.key)
	}
}

// A spentEntry's place in MemorySpent.expiry: by until.
func (e *spentEntry) before(o *spentEntry) bool { return e.until.Before(o.until) }
func (e *spentEntry) setIndex(i int)            { e.index = i }

// ErrReplayCheck wraps a SpentStore failure: the engine could not check
// that a token was not used before, so it did nothing with it.
var ErrReplayCheck = errors.New("the bridge could not check that this step was not already used (its replay store is unreachable), so it ran nothing; retry the same call in a few seconds")
