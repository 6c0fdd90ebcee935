// Package taskstore keeps the tasks of /mcp: board tool calls that run on
// after the request that started them, whose caller polls for the outcome
// (MCP tasks, in both protocol eras). It knows nothing of MCP or of
// boards: a task is an owner, a status, its input requests and its
// outcome as JSON, and the goroutine doing its work.
//
// It owns the bounds a caller can reach: tasks at once in all and per
// owner (refused past them with a LimitError), and each task's life, from
// its creation to its TTL: a task still running then is cancelled, and its
// record, finished or not, is gone (ErrNotFound). Records are dropped
// lazily, when a lookup finds them expired or a new task needs room.
//
// Every task belongs to the owner that started it; a lookup by anyone else
// finds nothing (ErrNotFound, exactly as for an unknown id), so ids of
// other callers' tasks cannot even be confirmed.
//
// Lock order: Store.mu is a leaf. No callback runs under it.
//
// Goroutines: one per task, running its work, counted in Store.wg; Close
// cancels every task and waits for them.
package taskstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sort"
	"sync"
	"time"

	"github.com/devicebridge/devicebridge/internal/randid"
)

// Status is where a task is in its life.
type Status string

// The statuses of MCP tasks (both eras use the same five).
const (
	Working       Status = "working"
	InputRequired Status = "input_required"
	Completed     Status = "completed"
	Failed        Status = "failed"
	Cancelled     Status = "cancelled"
)

// Terminal reports whether a task in this status has ended.
func (s Status) Terminal() bool { return s == Completed || s == Failed || s == Cancelled }

// Error is the JSON-RPC error of a failed task.
type Error struct {
	Code    int64           `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// Snapshot is a task as it is at one moment. Its maps and slices are the
// caller's own copy.
type Snapshot struct {
	ID      string
	Owner   string
	Status  Status
	Message string // statusMessage
	Created time.Time
	Updated time.Time
	// TTL is the task's whole life, from Created: the store forgets it
	// then (and cancels it, if it still runs).
	TTL time.Duration
	// Result is the outcome of a completed task.
	Result json.RawMessage
	// Error is the outcome of a failed one.
	Error *Error
	// Input holds the outstanding input requests of an input_required
	// task, by key.
	Input map[string]json.RawMessage
}

// Expires is when the store forgets the task.
func (s Snapshot) Expires() time.Time { return s.Created.Add(s.TTL) }

// Errors of the store's lookups.
var (
	// ErrNotFound: no task of that id belongs to the owner (unknown,
	// expired, or someone else's).
	ErrNotFound = errors.New("no such task")
	// ErrTerminal: the task has already ended (Cancel).
	ErrTerminal = errors.New("the task has already ended")
	// ErrClosed: the store is closed (the server is shutting down).
	ErrClosed = errors.New("the server is shutting down")
)

// LimitError refuses a task past one of the store's bounds.
type LimitError struct {
	// PerOwner is true for the bound on one owner's tasks, false for the
	// bound on all.
	PerOwner bool
	Limit    int
}

func (e *LimitError) Error() string {
	if e.PerOwner {
		return fmt.Sprintf("this caller already has %d tasks, the most it may have at once", e.Limit)
	}
	return fmt.Sprintf("the bridge already holds %d tasks, the most it keeps at once", e.Limit)
}

// MinTTL is the shortest life a task is given, whatever was asked.
const MinTTL = time.Second

// Options bound a Store. Zero values are not defaults: the caller fills
// them in.
type Options struct {
	// MaxTasks bounds the tasks kept at once, finished ones included until
	// they expire; MaxPerOwner bounds those of one owner.
	MaxTasks, MaxPerOwner int
	// Prefix, when set, is called for each new task and its result (when
	// not empty) starts the task's id, followed by a dot: a fleet puts
	// the node's id there, so that any node can tell which holds a task.
	Prefix func() string
}

// Store holds tasks. The zero value is not usable; call New.
type Store struct {
	opts Options
	ctx  context.Context // ends with Close; every task's context derives from it
	stop context.CancelFunc
	wg   sync.WaitGroup // the tasks' goroutines

	mu     sync.Mutex
	closed bool
	tasks  map[string]*record
	owners map[string]int // tasks kept per owner
}

// record is a task inside the store, guarded by Store.mu.
type record struct {
	snap    Snapshot
	cancel  context.CancelCauseFunc
	done    chan struct{} // closed when the task ends
	answers map[string]json.RawMessage
	// resume is the status message the task goes back to when its input
	// requests are answered.
	resume string
	// answered is signalled (buffer 1) when the last outstanding input
	// request got its answer.
	answered chan struct{}
}

// New returns an empty store.
func New(opts Options) *Store {
	s := &Store{opts: opts, tasks: map[string]*record{}, owners: map[string]int{}}
	s.ctx, s.stop = context.WithCancel(context.Background())
	return s
}

// errCancelled and errExpired end a task's context.
var (
	errCancelled = errors.New("the task was cancelled")
	errExpired   = errors.New("the task's time to live ran out")
)

// Start creates a task of owner that lives ttl (at least MinTTL), working
// with message as its status message, and runs work on a goroutine of its
// own. The task is in the store, working, when
// Start returns: a lookup right after finds it. work must end its task
// (Run.Complete or Run.Fail) unless the task is cancelled first; a work
// that returns without doing so (or panics) leaves it failed.
func (s *Store) Start(owner string, ttl time.Duration, message string, work func(*Run)) (Snapshot, error) {
	ttl = max(ttl, MinTTL)
	id := randid.Hex16()
	if s.opts.Prefix != nil {
		if p := s.opts.Prefix(); p != "" {
			id = p + "." + id
		}
	}
	now := time.Now()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return Snapshot{}, ErrClosed
	}
	s.sweepLocked(now)
	if len(s.tasks) >= s.opts.MaxTasks {
		s.mu.Unlock()
		return Snapshot{}, &LimitError{Limit: s.opts.MaxTasks}
	}
	if s.owners[owner] >= s.opts.MaxPerOwner {
		s.mu.Unlock()
		return Snapshot{}, &LimitError{PerOwner: true, Limit: s.opts.MaxPerOwner}
	}
	ctx, cancel := context.WithCancelCause(s.ctx)
	ctx, stopExpiry := context.WithDeadlineCause(ctx, now.Add(ttl), errExpired)
	r := &record{
		snap:     Snapshot{ID: id, Owner: owner, Status: Working, Message: message, Created: now, Updated: now, TTL: ttl},
		cancel:   cancel,
		done:     make(chan struct{}),
		answered: make(chan struct{}, 1),
	}
	s.tasks[id] = r
	s.owners[owner]++
	snap := r.copy()
	// Counted while mu is held, so that a Close that takes mu after this
	// waits for the goroutine.
	s.wg.Add(1)
	s.mu.Unlock()

	run := &Run{s: s, id: id, ctx: ctx}
	go func() {
		defer s.wg.Done()
		defer stopExpiry()
		defer cancel(nil)
		defer func() {
			if p := recover(); p != nil {
				run.Fail(&Error{Code: -32603, Message: fmt.Sprintf("internal error: %v", p)}, "The task failed inside the bridge.")
			}
			// Whatever work left undone: it cannot be finished any more.
			run.Fail(&Error{Code: -32603, Message: "the task ended without a result"}, "The task ended without a result.")
		}()
		work(run)
	}()
	return snap, nil
}

// copy is the record's snapshot with maps of its own. Called with mu held.
func (r *record) copy() Snapshot {
	out := r.snap
	if r.snap.Input != nil {
		out.Input = maps.Clone(r.snap.Input)
	}
	return out
}

// sweepLocked drops the expired records. Called with mu held.
func (s *Store) sweepLocked(now time.Time) {
	for id, r := range s.tasks {
		if now.After(r.snap.Expires()) {
			s.dropLocked(id, r)
		}
	}
}

// dropLocked forgets a record, cancelling its task if it still runs.
func (s *Store) dropLocked(id string, r *record) {
	delete(s.tasks, id)
	if s.owners[r.snap.Owner]--; s.owners[r.snap.Owner] <= 0 {
		delete(s.owners, r.snap.Owner)
	}
	r.cancel(errExpired)
	if !r.snap.Status.Terminal() {
		close(r.done) // nobody can see it end any more: release the waiters
	}
}

// lookupLocked finds owner's task id, dropping it if it has expired.
func (s *Store) lookupLocked(owner, id string, now time.Time) (*record, error) {
	r, ok := s.tasks[id]
	if !ok || r.snap.Owner != owner {
		return nil, ErrNotFound
	}
	if now.After(r.snap.Expires()) {
		s.dropLocked(id, r)
		return nil, ErrNotFound
	}
	return r, nil
}

// Get returns owner's task id.
func (s *Store) Get(owner, id string) (Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.lookupLocked(owner, id, time.Now())
	if err != nil {
		return Snapshot{}, err
	}
	return r.copy(), nil
}

// Wait blocks until owner's task id has ended (or expired, ErrNotFound),
// or ctx ends, and returns it as it ended.
func (s *Store) Wait(ctx context.Context, owner, id string) (Snapshot, error) {
	s.mu.Lock()
	r, err := s.lookupLocked(owner, id, time.Now())
	s.mu.Unlock()
	if err != nil {
		return Snapshot{}, err
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		return Snapshot{}, context.Cause(ctx)
	}
	return s.Get(owner, id)
}

// Cancel cancels owner's task id: a task still running (or waiting for
// input) ends cancelled, with message as its status message, and its work
// is told to stop. A task that has already ended is left as it is, and
// Cancel returns it with ErrTerminal.
func (s *Store) Cancel(owner, id, message string) (Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.lookupLocked(owner, id, time.Now())
	if err != nil {
		return Snapshot{}, err
	}
	if r.snap.Status.Terminal() {
		return r.copy(), ErrTerminal
	}
	s.endLocked(r, Cancelled, message, nil, nil)
	r.cancel(errCancelled)
	return r.copy(), nil
}

// Update delivers answers to owner's task id: each one whose key is an
// outstanding input request is taken (and the request withdrawn), any
// other is ignored. When the last outstanding request has its answer, the
// task is working again and its work gets the answers. Answers to a task
// that has ended are ignored.
func (s *Store) Update(owner, id string, answers map[string]json.RawMessage) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.lookupLocked(owner, id, time.Now())
	if err != nil {
		return err
	}
	if r.snap.Status != InputRequired {
		return nil
	}
	took := false
	for k, v := range answers {
		if _, open := r.snap.Input[k]; !open {
			continue
		}
		delete(r.snap.Input, k)
		r.answers[k] = v
		took = true
	}
	if !took {
		return nil
	}
	r.snap.Updated = time.Now()
	if len(r.snap.Input) == 0 {
		r.snap.Status, r.snap.Input, r.snap.Message = Working, nil, r.resume
		select {
		case r.answered <- struct{}{}:
		default:
		}
	}
	return nil
}

// List returns owner's tasks, oldest first, at most limit of them, after
// the task named by cursor (from the start when ""). next is the cursor of
// the following page, "" after the last.
func (s *Store) List(owner, cursor string, limit int) (page []Snapshot, next string) {
	now := time.Now()
	s.mu.Lock()
	s.sweepLocked(now)
	var mine []Snapshot
	for _, r := range s.tasks {
		if r.snap.Owner == owner {
			mine = append(mine, r.copy())
		}
	}
	s.mu.Unlock()
	sort.Slice(mine, func(i, j int) bool {
		if !mine[i].Created.Equal(mine[j].Created) {
			return mine[i].Created.Before(mine[j].Created)
		}
		return mine[i].ID < mine[j].ID
	})
	start := 0
	if cursor != "" {
		start = len(mine) // an unknown or expired cursor: nothing after it
		for i, t := range mine {
			if t.ID == cursor {
				start = i + 1
				break
			}
		}
	}
	end := min(start+max(limit, 1), len(mine))
	if end < len(mine) {
		next = mine[end-1].ID
	}
	return mine[start:end], next
}

// Len reports the tasks held now, expired ones not yet dropped included.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.tasks)
}

// Close cancels every task and waits for their goroutines. Later Starts
// fail with ErrClosed. It is idempotent.
func (s *Store) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.stop()
	s.wg.Wait()
}

// endLocked moves a task to a terminal status. Called with mu held, on a
// task that has not ended.
func (s *Store) endLocked(r *record, st Status, message string, result json.RawMessage, e *Error) {
	r.snap.Status, r.snap.Message, r.snap.Result, r.snap.Error = st, message, result, e
	r.snap.Input, r.answers = nil, nil
	r.snap.Updated = time.Now()
	close(r.done)
}

// Run is a task as its work sees it.
type Run struct {
	s   *Store
	id  string
	ctx context.Context
}

// ID is the task's id.
func (r *Run) ID() string { return r.id }

// Context ends when the task is cancelled, expires or the store closes:
// the work should then stop.
func (r *Run) Context() context.Context { return r.ctx }

// Cancelled reports whether the task ended by Cancel (rather than expiry
// or the store closing).
func (r *Run) Cancelled() bool { return errors.Is(context.Cause(r.ctx), errCancelled) }

// finish ends the task unless it has ended already or is gone.
func (r *Run) finish(st Status, message string, result json.RawMessage, e *Error) {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	rec, ok := r.s.tasks[r.id]
	if !ok || rec.snap.Status.Terminal() {
		return
	}
	r.s.endLocked(rec, st, message, result, e)
}

// Complete ends the task with its result.
func (r *Run) Complete(result json.RawMessage, message string) {
	r.finish(Completed, message, result, nil)
}

// Fail ends the task with a JSON-RPC error.
func (r *Run) Fail(e *Error, message string) { r.finish(Failed, message, nil, e) }

// Ask puts the task in input_required with these requests (by key; keys
// must be new to the task) and message, and waits until every one has its
// answer (Update), or the task's context ends (its cause is returned).
func (r *Run) Ask(requests map[string]json.RawMessage, message string) (map[string]json.RawMessage, error) {
	s := r.s
	s.mu.Lock()
	rec, ok := s.tasks[r.id]
	if !ok || rec.snap.Status.Terminal() {
		s.mu.Unlock()
		if err := context.Cause(r.ctx); err != nil {
			return nil, err
		}
		return nil, ErrTerminal
	}
	rec.resume = rec.snap.Message
	rec.snap.Status, rec.snap.Message, rec.snap.Input = InputRequired, message, maps.Clone(requests)
	rec.snap.Updated = time.Now()
	rec.answers = map[string]json.RawMessage{}
	select { // a stale signal from an earlier round
	case <-rec.answered:
	default:
	}
	s.mu.Unlock()

	select {
	case <-rec.answered:
	case <-r.ctx.Done():
		return nil, context.Cause(r.ctx)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if rec.snap.Status.Terminal() { // cancelled as the answers came
		return nil, ErrTerminal
	}
	out := rec.answers
	rec.answers = nil
	return out, nil
}
