package flow

import (
	"bytes"
	"cmp"
	"container/heap"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/internal/argcheck"
)

// Lookup resolves a tool by name. The engine calls it at Start and again
// before handling each answer, so that an interaction always runs against
// the tool as it is now (and a stateless token can be resumed on another
// replica). Its errors are returned to the caller unchanged (wrapped with
// %w), and an answer that could not be handled because of one is not
// consumed: the same prompt stays open.
type Lookup func(ctx context.Context, toolName string) (*Tool, error)

// Defaults for Options.
const (
	DefaultTimeout     = 5 * time.Minute
	DefaultMaxPerOwner = 16
	DefaultMaxPrompts  = 20
	DefaultMaxDuration = 30 * time.Minute
)

// sweepBatch bounds how many expired entries one call cleans up.
const sweepBatch = 32

// Options configure an Engine. Zero values take the defaults.
type Options struct {
	Lookup Lookup
	// Timeout is the inactivity timeout of an interaction (default 5m).
	// Finished interactions stay readable with GetState for as long.
	Timeout time.Duration
	// MaxPerOwner bounds the open (not finished) interactions of one owner
	// (default 16; negative: no limit). A Start that needs no prompt runs
	// at once and is not refused. Stateful mode only: stateless
	// interactions are not counted.
	MaxPerOwner int
	// MaxPrompts bounds the prompts one interaction shows, refused answers
	// included (default 20; negative: no limit).
	MaxPrompts int
	// MaxDuration bounds an interaction's total life (default 30m;
	// negative: no limit).
	MaxDuration time.Duration
	// Now is the clock (tests pass a fake one); time.Now by default.
	Now func() time.Time
	// Secret enables stateless mode: the interaction's whole state travels
	// in the sessionId as a token signed with HMAC-SHA256 under this key
	// (at least 32 bytes), bound to the owner. Engines sharing the secret
	// continue each other's interactions.
	Secret []byte
	// Spent is the replay protection of stateless tokens (see SpentStore):
	// every engine sharing the secret must share it. Nil: a MemorySpent
	// of DefaultSpentCapacity entries, enough for one bridge.
	Spent  SpentStore
	Logger *zap.Logger
}

// withDefaults returns o with unset fields set to their defaults. Spent is
// left alone: only stateless mode has one.
func (o Options) withDefaults() Options {
	// Only zero: a negative limit is kept as given (no limit).
	o.MaxPerOwner = cmp.Or(o.MaxPerOwner, DefaultMaxPerOwner)
	o.MaxPrompts = cmp.Or(o.MaxPrompts, DefaultMaxPrompts)
	o.MaxDuration = cmp.Or(o.MaxDuration, DefaultMaxDuration)
	// max(x, 0): a negative timeout has always meant the default too.
	o.Timeout = cmp.Or(max(o.Timeout, 0), DefaultTimeout)
	o.Logger = cmp.Or(o.Logger, zap.NewNop())
	if o.Now == nil { // a func: cmp.Or cannot compare it
		o.Now = time.Now
	}
	return o
}

// StartOptions tune one interaction.
type StartOptions struct {
	// Timeout overrides the inactivity timeout (it cannot exceed
	// MaxDuration).
	Timeout time.Duration
	// Guided also asks the optional properties when the tool has no
	// required ones (a caller who asked to be walked through it).
	Guided bool
}

// Engine runs interactions. It is safe for concurrent use; the answers to
// one interaction are handled one at a time (a second answer while one is
// processed gets CodeInvalidStateTransition).
//
// Memory: in stateful mode, interactions live in a map with a deadline
// heap; expired ones are removed lazily when touched and by a bounded
// sweep on each Start (no goroutine). In stateless mode the engine keeps
// short-lived markers of the answers it is processing and of the
// interactions that finished here (for Counts, and as a shortcut); what
// was consumed lives in
// the SpentStore (Options.Spent): each token's step ("<id>.<turn>": answered
// or cancelled, once) and each interaction's end ("<id>.end": its final
// state), so that a token cannot run its step twice, on this replica or on
// any other sharing the store, and a second cancel gets
// CodeAlreadyCancelled.
type Engine struct {
	lookup      Lookup
	timeout     time.Duration
	maxPerOwner int
	maxPrompts  int
	maxDuration time.Duration
	now         func() time.Time
	secret      []byte
	spent       SpentStore
	log         *zap.Logger

	mu      sync.Mutex
	closed  bool
	entries map[string]*entry // by sessionId (stateful) or record ID (stateless markers)
	byTime  timeHeap[*entry]
	owners  map[string]int // open interactions per owner (stateful)
}

// entry is an interaction (stateful), or a marker (stateless).
type entry struct {
	key      string
	owner    string
	rec      *record // nil once expired (kept a while to answer CodeSessionExpired)
	expired  string  // why it expired
	limit    string  // the limit that expired it, for messages
	deadline int64   // Unix ms
	index    int     // in byTime
	open     bool    // counted in owners
	cancel   context.CancelFunc
}

// NewEngine returns an engine. It fails when Lookup is missing or Secret
// is too short.
func NewEngine(o Options) (*Engine, error) {
	if o.Lookup == nil {
		return nil, errors.New("flow: Options.Lookup is required")
	}
	if o.Secret != nil && len(o.Secret) < 32 {
		return nil, errors.New("flow: Options.Secret must be at least 32 bytes (or nil for stateful mode)")
	}
	o = o.withDefaults()
	e := &Engine{lookup: o.Lookup, timeout: o.Timeout, maxPerOwner: o.MaxPerOwner, maxPrompts: o.MaxPrompts,
		maxDuration: o.MaxDuration, now: o.Now, log: o.Logger,
		entries: map[string]*entry{}, owners: map[string]int{}}
	if o.Secret != nil {
		e.secret = append([]byte(nil), o.Secret...)
		e.spent = o.Spent
		if e.spent == nil {
			e.spent = NewMemorySpent(0, o.Now)
		}
	}
	return e, nil
}

// Stateless reports whether interactions travel as signed tokens.
func (e *Engine) Stateless() bool { return e.secret != nil }

// Close cancels running executions and forgets every interaction; later
// calls fail with CodeNotInteractive. The engine starts no goroutine, so
// there is nothing else to stop.
func (e *Engine) Close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	for _, ent := range e.entries {
		if ent.cancel != nil {
			ent.cancel()
		}
	}
	e.entries = map[string]*entry{}
	e.byTime = nil
	e.owners = map[string]int{}
}

func errClosed() *Error {
	return newError(CodeNotInteractive, nil,
		"The interaction engine is shutting down. Retry against a running bridge; interactions from this one are gone, so start a new one.")
}

func nowMS(t time.Time) int64 { return t.UnixMilli() }

func fmtDur(ms int64) string { return (time.Duration(ms) * time.Millisecond).String() }

func newID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("flow: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}

// Start begins an interaction with a tool for owner (an opaque caller
// identity: only the same owner can see or continue it). initial holds the
// arguments already known (a JSON object; empty or null for none).
//
// When nothing needs asking (all arguments valid, no confirmation), the
// tool runs at once and the returned Step is final. Otherwise the Step
// carries the InitialPrompt; if some initial values were invalid,
// Validation says which and the prompts for them carry the reason.
//
// Errors: Lookup's errors unchanged (wrapped); *Error with
// CodeNotInteractive (unusable schema, no Execute, engine closed),
// CodeValidationFailed (arguments prompting cannot fix),
// CodeTimeout (MaxPerOwner reached), CodeInvalidStateTransition (more
// prompts needed than MaxPrompts).
func (e *Engine) Start(ctx context.Context, owner, toolName string, initial json.RawMessage, opts StartOptions) (*Step, error) {
	tool, err := e.lookup(ctx, toolName)
	if err != nil {
		return nil, fmt.Errorf("flow: looking up tool %q: %w", toolName, err)
	}
	if tool == nil {
		return nil, fmt.Errorf("flow: looking up tool %q: lookup returned no tool", toolName)
	}
	if tool.Execute == nil {
		return nil, newError(CodeNotInteractive, map[string]any{"tool": tool.Name},
			"%s cannot be run: it has no executor. Call it with tools/call instead.", toolName)
	}
	plan, err := tool.Plan(initial, opts.Guided)
	if err != nil {
		return nil, err
	}
	now := e.now()
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = e.timeout
	}
	if e.maxDuration > 0 && timeout > e.maxDuration {
		timeout = e.maxDuration
	}
	rec := &record{ID: newID(), Tool: toolName, State: StateIdle, Created: nowMS(now), Last: nowMS(now),
		Timeout: timeout.Milliseconds()}
	if e.maxDuration > 0 {
		rec.Hard = rec.Created + e.maxDuration.Milliseconds()
	}
	var problems []Problem
	if err := json.Unmarshal(plan.Args, &rec.Args); err != nil {
		return nil, err // cannot happen: Plan renders an object
	}
	for _, p := range plan.Prompts {
		rec.Pending = append(rec.Pending, p.Property)
		if p.Error != "" {
			if rec.Issues == nil {
				rec.Issues = map[string]Problem{}
			}
			pr := Problem{Property: p.Property, Error: p.Error, Suggestion: p.Suggestion}
			rec.Issues[p.Property] = pr
			problems = append(problems, pr)
		}
	}
	rec.State = StateActive
	need := len(plan.Prompts)
	if plan.Confirm != nil {
		need++
	}
	if e.maxPrompts > 0 && need > e.maxPrompts {
		return nil, newError(CodeInvalidStateTransition, map[string]any{"tool": toolName, "limit": "maxPrompts", "needed": need},
			"%s would need %d prompts, more than the %d one interaction may show. Pass more of its arguments in initialParams (it takes %s), or call it directly with tools/call.",
			toolName, need, e.maxPrompts, loadSchema(tool.InputSchema).ArgList())
	}

	var ent *entry
	work := rec.clone()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, errClosed()
	}
	e.sweep(nowMS(now))
	if !e.Stateless() {
		if e.maxPerOwner > 0 && need > 0 && e.owners[owner] >= e.maxPerOwner {
			n := e.owners[owner]
			e.mu.Unlock()
			return nil, newError(CodeTimeout, map[string]any{"limit": "maxPerOwner", "open": n},
				"You already have %d open interactions, the most allowed at once. Finish or cancel one (interaction.cancel {\"sessionId\": ...}) or wait for one to expire (after %s without activity), then start again.",
				n, e.timeout)
		}
		ent = &entry{key: "flw_" + rec.ID, owner: owner, rec: rec, open: true, cancel: cancel}
		ent.deadline, _ = rec.deadline()
		e.entries[ent.key] = ent
		heap.Push(&e.byTime, ent)
		e.owners[owner]++
	}
	e.mu.Unlock()

	step, err := e.next(ctx, tool, work, nil)
	if step != nil && len(problems) > 0 {
		step.Validation = &Validation{Valid: false, Error: joinErrors(problems), Suggestion: problems[0].Suggestion}
	}
	if step != nil {
		step.InitialPrompt, step.NextPrompt = step.NextPrompt, nil
	}
	e.log.Debug("flow: interaction started", zap.String("tool", toolName), zap.String("state", string(work.State)),
		zap.Int("prompts", len(work.Pending)))
	return e.commit(owner, ent, work, step, err)
}

func joinErrors(ps []Problem) string {
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = p.Error
	}
	return strings.Join(parts, "; ")
}

// Respond answers the open prompt of interaction id with value (any JSON
// value; null takes the prompt's default, or skips an optional property).
//
// A refused answer is not an error: the Step has Accepted false, the
// Validation says why, and the same prompt is offered again (counting
// towards MaxPrompts). An accepted answer leads to the next prompt, or to
// the end: the tool runs (completed, or error when Execute failed), or a
// declined confirmation cancels the interaction with nothing run.
//
// Errors (*Error): CodeSessionNotFound, CodeSessionExpired,
// CodeInvalidStateTransition (no prompt open: finished, or an answer is
// being processed; or MaxPrompts reached, which ends the interaction),
// CodeNotInteractive; Lookup's errors unchanged (the answer is not
// consumed).
func (e *Engine) Respond(ctx context.Context, owner, id string, value json.RawMessage) (*Step, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ent, work, err := e.acquire(owner, id, cancel)
	if err != nil {
		return nil, err
	}
	tool, err := e.lookup(ctx, work.Tool)
	if err == nil && tool == nil {
		err = errors.New("lookup returned no tool")
	}
	if err != nil {
		e.releaseUnchanged(ent, work)
		return nil, fmt.Errorf("flow: looking up tool %q: %w", work.Tool, err)
	}
	if e.Stateless() {
		if err := e.spendStep(ctx, id, work); err != nil {
			e.releaseUnchanged(ent, work)
			return nil, err
		}
	}
	step, err := e.answer(ctx, tool, work, value)
	if e.Stateless() && work.State.Final() {
		step, err = e.recordEnd(ctx, work, step, err)
	}
	return e.commit(owner, ent, work, step, err)
}

// stepKey names a stateless token's step in the SpentStore: every token
// that waits for an answer has its own prompt count (Turns), so the
// interaction id and that count identify it.
func stepKey(rec *record) string { return "flt." + rec.ID + "." + strconv.Itoa(rec.Turns) }

// endKey names a stateless interaction's end in the SpentStore.
func endKey(id string) string { return "flt." + id + ".end" }

// endUntil is how long the end of rec's interaction must be remembered:
// as long as any of its tokens can be presented (none was issued after
// now, and none outlives its timeout or the interaction's hard expiry).
func (e *Engine) endUntil(rec *record) time.Time {
	d := nowMS(e.now()) + rec.Timeout
	if rec.Hard > 0 && rec.Hard < d {
		d = rec.Hard
	}
	return time.UnixMilli(d)
}

// spendStep consumes a stateless token for an answer, fleet-wide: it
// fails if the interaction has ended, or if the token was already
// answered or cancelled (here or on another replica sharing the store).
func (e *Engine) spendStep(ctx context.Context, id string, rec *record) error {
	end, err := e.spent.Spent(ctx, endKey(rec.ID))
	if err != nil {
		return e.replayErr(err)
	}
	if end != "" {
		return errNotWaiting(id, State(end))
	}
	d, _ := rec.deadline()
	first, prior, err := e.spent.Spend(ctx, stepKey(rec), UseAnswered, time.UnixMilli(d))
	if err != nil {
		return e.replayErr(err)
	}
	if !first {
		if prior == UseCancelled {
			return errNotWaiting(id, StateCancelled)
		}
		return errStepUsed(id)
	}
	return nil
}

// recordEnd records the final state of a stateless interaction. If it was
// cancelled meanwhile on another replica (which could not stop this one's
// call), the outcome is discarded as for a local cancel.
func (e *Engine) recordEnd(ctx context.Context, work *record, step *Step, err error) (*Step, error) {
	first, prior, serr := e.spent.Spend(context.WithoutCancel(ctx), endKey(work.ID), string(work.State), e.endUntil(work))
	switch {
	case serr != nil:
		// Its tokens are all spent already; only a later cancel with an
		// older token could be told "cancelled" instead of "completed".
		e.log.Warn("flow: could not record the end of an interaction", zap.String("tool", work.Tool), zap.Error(serr))
	case !first && State(prior) == StateCancelled && work.State != StateCancelled:
		work.State, work.Reason, work.Current = StateCancelled, "cancelled on another replica", nil
		return &Step{State: StateCancelled,
			Summary: "Cancelled (on another bridge) while the answer was being processed; the outcome was discarded, but what the tool already did stays done."}, nil
	}
	return step, err
}

func (e *Engine) replayErr(err error) error {
	e.log.Warn("flow: replay store unavailable; refusing the step", zap.Error(err))
	return fmt.Errorf("flow: %w (%v)", ErrReplayCheck, err)
}

func errStepUsed(id string) *Error {
	return newError(CodeInvalidStateTransition, map[string]any{"sessionId": id, "reason": "token already used"},
		"This sessionId of interaction %s was already answered (on this bridge or another one sharing its flow secret), so this answer was not used and nothing ran again. "+
			"The sessionId changes with every step: answer with the latest one, which the previous interaction.respond returned. Use interaction.getState to see where it stands.", short(id))
}

// acquire finds the interaction for an answer, checks it waits for one,
// and marks it processing. It returns the entry (stateful) and a private
// copy of the record to work on.
func (e *Engine) acquire(owner, id string, cancel context.CancelFunc) (*entry, *record, error) {
	now := nowMS(e.now())
	if e.Stateless() {
		rec, err := e.decode(owner, id, now)
		if err != nil {
			return nil, nil, err
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.closed {
			return nil, nil, errClosed()
		}
		if m := e.entries[rec.ID]; m != nil && m.owner == owner && m.rec != nil {
			return nil, nil, errNotWaiting(id, m.rec.State)
		}
		if rec.State != StateWaitingUser {
			return nil, nil, errNotWaiting(id, rec.State)
		}
		m := &entry{key: rec.ID, owner: owner, rec: &record{State: StateProcessing}, cancel: cancel}
		m.deadline, _ = rec.deadline()
		e.entries[m.key] = m
		heap.Push(&e.byTime, m)
		work := rec.clone()
		work.State = StateProcessing
		return m, work, nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, nil, errClosed()
	}
	ent, err := e.find(owner, id, now)
	if err != nil {
		return nil, nil, err
	}
	if ent.rec.State != StateWaitingUser {
		return nil, nil, errNotWaiting(id, ent.rec.State)
	}
	work := ent.rec.clone()
	ent.rec.State = StateProcessing
	ent.cancel = cancel
	work.State = StateProcessing
	return ent, work, nil
}

// find returns owner's live interaction id (stateful; e.mu held),
// expiring it when its time is up.
func (e *Engine) find(owner, id string, now int64) (*entry, error) {
	ent := e.entries[id]
	if ent == nil || ent.owner != owner {
		return nil, errNotFound(id)
	}
	if ent.rec == nil {
		return nil, errExpired(id, ent.expired, ent.limit)
	}
	if !ent.rec.State.busy() {
		if d, why := ent.rec.deadline(); now > d {
			e.expire(ent, why, now)
			return nil, errExpired(id, ent.expired, ent.limit)
		}
	}
	return ent, nil
}

// expire turns a live entry into a tombstone that answers
// CodeSessionExpired until it is swept (e.mu held).
func (e *Engine) expire(ent *entry, why string, now int64) {
	ent.limit = fmtDur(ent.rec.Timeout)
	if why == reasonMaxDuration {
		ent.limit = e.maxDuration.String()
	}
	ent.expired = why
	if ent.open {
		e.close(ent)
	}
	e.log.Debug("flow: interaction expired", zap.String("tool", ent.rec.Tool), zap.String("reason", why))
	ent.rec = nil
	ent.deadline = now + e.timeout.Milliseconds()
	heap.Fix(&e.byTime, ent.index)
}

// close stops counting an entry as open for its owner (e.mu held).
func (e *Engine) close(ent *entry) {
	ent.open = false
	if e.owners[ent.owner]--; e.owners[ent.owner] <= 0 {
		delete(e.owners, ent.owner)
	}
}

// sweep removes up to sweepBatch entries whose deadline passed (e.mu
// held): live interactions become tombstones, tombstones and stateless
// markers go.
func (e *Engine) sweep(now int64) {
	for i := 0; i < sweepBatch && len(e.byTime) > 0; i++ {
		ent := e.byTime[0]
		if ent.deadline >= now {
			return
		}
		switch {
		case ent.rec != nil && ent.rec.State.busy():
			// Never expire what is running; look again later.
			ent.deadline = now + e.timeout.Milliseconds()
			heap.Fix(&e.byTime, 0)
		case ent.rec != nil && !e.Stateless():
			_, why := ent.rec.deadline()
			e.expire(ent, why, now)
		default:
			heap.Pop(&e.byTime)
			delete(e.entries, ent.key)
		}
	}
}

func errNotWaiting(id string, s State) *Error {
	var why string
	switch s {
	case StateProcessing, StateActive, StateIdle:
		why = "an earlier answer (or the tool) is still being processed. Wait for that call to return, then answer the prompt it gives you"
	case StateCompleted:
		why = "it has completed. Start a new interaction to run the tool again"
	case StateCancelled:
		why = "it was cancelled. Start a new interaction if you still want to run the tool"
	case StateError:
		why = "it ended with an error. Start a new interaction to try again"
	default:
		why = "no prompt is open"
	}
	return newError(CodeInvalidStateTransition, map[string]any{"sessionId": id, "state": s},
		"Interaction %s is %s and is not waiting for an answer: %s. Use interaction.getState to see where it stands.", short(id), s, why)
}

// releaseUnchanged puts an interaction back to waiting for the same
// answer, after a failure that consumed nothing.
func (e *Engine) releaseUnchanged(ent *entry, work *record) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ent.cancel = nil
	if e.Stateless() {
		if e.entries[ent.key] == ent && ent.rec.State == StateProcessing {
			e.drop(ent)
		}
		return
	}
	if ent.rec != nil && ent.rec.State == StateProcessing {
		ent.rec.State = StateWaitingUser
	}
}

// drop removes an entry (e.mu held).
func (e *Engine) drop(ent *entry) {
	if ent.index >= 0 && ent.index < len(e.byTime) && e.byTime[ent.index] == ent {
		heap.Remove(&e.byTime, ent.index)
	}
	delete(e.entries, ent.key)
}

// commit stores the outcome of processing (work) unless the interaction
// was cancelled meanwhile, and finishes the Step.
func (e *Engine) commit(owner string, ent *entry, work *record, step *Step, err error) (*Step, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	id := ""
	if ent != nil {
		ent.cancel = nil
		if e.closed || e.entries[ent.key] != ent {
			if err == nil {
				err = errClosed()
			}
			return nil, err
		}
		if ent.rec != nil && ent.rec.State == StateCancelled {
			// Cancelled while processing: the outcome is discarded.
			work.State, work.Reason, work.Current = StateCancelled, ent.rec.Reason, nil
			step, err = &Step{State: StateCancelled,
				Summary: "Cancelled while the answer was being processed (" + ent.rec.Reason + "); the outcome was discarded."}, nil
			if !e.Stateless() {
				work = ent.rec
			}
		}
	}
	if e.Stateless() {
		// What was consumed is in the SpentStore. A finished interaction
		// keeps its marker until its tokens expire, for Counts and as a
		// local shortcut.
		id = e.encode(owner, work)
		if ent != nil {
			if work.State.Final() {
				ent.rec = &record{State: work.State}
				ent.deadline, _ = work.deadline()
				heap.Fix(&e.byTime, ent.index)
			} else {
				e.drop(ent)
			}
		}
	} else {
		id = ent.key
		if ent.rec != work {
			ent.rec = work
			ent.deadline, _ = work.deadline()
			heap.Fix(&e.byTime, ent.index)
		}
		if work.State.Final() && ent.open {
			e.close(ent)
		}
	}
	if step != nil {
		step.SessionID = id
		step.ExpiresAt, _ = work.deadline()
	}
	if err != nil {
		var fe *Error
		if errors.As(err, &fe) {
			if m, ok := fe.Data.(map[string]any); ok {
				m["sessionId"] = id
			}
		}
		return nil, err
	}
	return step, nil
}

// answer handles an answer to work's open prompt (work is private).
func (e *Engine) answer(ctx context.Context, tool *Tool, work *record, value json.RawMessage) (*Step, error) {
	si := loadSchema(tool.InputSchema)
	if si.Err() != nil {
		work.State = StateError
		return nil, errBadSchema(tool.Name, si.Err())
	}
	now := nowMS(e.now())
	work.Last = now
	value = bytes.TrimSpace(value)
	if len(value) == 0 {
		value = json.RawMessage("null")
	}
	if len(value) > maxValueBytes {
		value = json.RawMessage(fmt.Sprintf("%q", fmt.Sprintf("(%d bytes, cut)", len(value))))
	}
	cur := work.Current
	turn := Turn{TurnID: len(work.History), Prompt: cur, Response: Response{Value: argcheck.Compact(value)}, Timestamp: now}
	if cur == nil {
		work.State = StateError
		return nil, newError(CodeInvalidStateTransition, map[string]any{}, "The interaction has no open prompt. Start a new one.")
	}
	refuse := func(pr Problem) (*Step, error) {
		turn.Response.Error = pr.Error
		work.History = append(work.History, turn)
		again := *cur
		again.Error, again.Suggestion = pr.Error, pr.Suggestion
		if p := si.Prop(cur.Property); p != nil && cur.Property != "" {
			again = prompt(p)
			again.Error, again.Suggestion = pr.Error, pr.Suggestion
		}
		step, err := e.present(tool, work, again)
		if step != nil {
			f := false
			step.Accepted = &f
			step.Validation = &Validation{Valid: false, Error: pr.Error, Suggestion: pr.Suggestion}
		}
		return step, err
	}
	accept := func() {
		turn.Response.Accepted = true
		work.History = append(work.History, turn)
		work.Done++
	}

	if cur.Property == "" { // the confirmation
		yes, ok := parseConfirm(value)
		if !ok {
			return refuse(Problem{Error: "the confirmation must be true or false, but got " + argcheck.DescribeValue(value),
				Suggestion: "Answer true to run " + tool.Name + ", or false to cancel without running anything."})
		}
		accept()
		if !yes {
			work.State = StateCancelled
			work.Reason = "confirmation declined"
			work.Current = nil
			t := true
			return &Step{State: StateCancelled, Accepted: &t, Validation: &Validation{Valid: true},
				Summary: "Declined: " + tool.Name + " was not run. Start a new interaction if you change your mind."}, nil
		}
		work.Confirmed = true
		return e.next(ctx, tool, work, &Validation{Valid: true})
	}

	name := cur.Property
	undo := work.clone()
	if p := si.Prop(name); p != nil {
		v, set, pr := answer(p, value)
		if pr != nil {
			return refuse(issue(pr))
		}
		if set {
			work.Args[name] = v
		} else {
			delete(work.Args, name)
		}
	}
	// (An answer for a property the tool no longer declares is dropped.)
	work.Pending = slices.DeleteFunc(work.Pending, func(s string) bool { return s == name })
	delete(work.Issues, name)
	e.replan(si, work)
	if len(work.Pending) == 0 {
		if err := objectCheck(tool.Name, si, work.Args); err != nil {
			var fe *Error
			msg := err.Error()
			if errors.As(err, &fe) {
				msg = fe.Message
			}
			*work = *undo
			work.Last = now
			return refuse(Problem{Property: name, Error: msg, Suggestion: "Give a value for " + name + " that fits together with the other arguments."})
		}
	}
	accept()
	return e.next(ctx, tool, work, &Validation{Valid: true})
}

// replan re-checks the accumulated arguments against the tool's current
// schema: values that became invalid are asked again, required properties
// that appeared are added, and properties that disappeared are dropped.
func (e *Engine) replan(si *argcheck.Schema, work *record) {
	var keep []string
	for _, name := range work.Pending {
		if si.Prop(name) != nil {
			keep = append(keep, name)
		}
	}
	work.Pending = keep
	for _, p := range si.Props() {
		if slices.Contains(work.Pending, p.Name) {
			continue
		}
		raw, ok := work.Args[p.Name]
		switch {
		case ok:
			if pr := check(p, raw); pr != nil {
				delete(work.Args, p.Name)
				work.Pending = append(work.Pending, p.Name)
				if work.Issues == nil {
					work.Issues = map[string]Problem{}
				}
				work.Issues[p.Name] = issue(pr)
			}
		case p.Required:
			work.Pending = append(work.Pending, p.Name)
		}
	}
}

// next presents the next prompt, or runs the tool when nothing is left to
// ask. v is the verdict on the answer that led here (nil at Start).
func (e *Engine) next(ctx context.Context, tool *Tool, work *record, v *Validation) (*Step, error) {
	si := loadSchema(tool.InputSchema)
	var step *Step
	var err error
	switch {
	case len(work.Pending) > 0:
		name := work.Pending[0]
		var pr Prompt
		if p := si.Prop(name); p != nil {
			pr = prompt(p)
		} else {
			pr = Prompt{Type: PromptCustom, Property: name, Message: name + ": give a JSON value."}
		}
		if is, ok := work.Issues[name]; ok {
			pr.Error, pr.Suggestion = is.Error, is.Suggestion
		}
		step, err = e.present(tool, work, pr)
	case tool.Confirm && !work.Confirmed:
		step, err = e.present(tool, work, confirmPrompt(tool, encodeArgs(work.Args)))
	default:
		step = e.execute(ctx, tool, work)
	}
	if step != nil && v != nil {
		t := true
		step.Accepted, step.Validation = &t, v
	}
	return step, err
}

// present opens a prompt, unless MaxPrompts is reached, which ends the
// interaction in state error.
func (e *Engine) present(tool *Tool, work *record, pr Prompt) (*Step, error) {
	if e.maxPrompts > 0 && work.Turns >= e.maxPrompts {
		work.State = StateError
		work.Current = nil
		work.Reason = "prompt limit reached"
		si := loadSchema(tool.InputSchema)
		return nil, newError(CodeInvalidStateTransition, map[string]any{"state": StateError, "limit": "maxPrompts"},
			"This interaction has shown %d prompts, the most allowed, and has ended without running %s. "+
				"Start a new one and pass the values you know in initialParams, for example %s.",
			work.Turns, tool.Name, si.Example(work.Args))
	}
	work.Turns++
	work.State = StateWaitingUser
	work.Current = &pr
	total := work.Done + len(work.Pending)
	if tool.Confirm && !work.Confirmed {
		total++
	}
	cur := work.Done + 1
	total = max(total, cur)
	msg := fmt.Sprintf("Step %d of %d", cur, total)
	if pr.Property == "" {
		msg += ": confirmation"
	} else {
		msg += ": " + pr.Property
	}
	p := pr
	return &Step{State: StateWaitingUser, NextPrompt: &p, Progress: &Progress{Current: cur, Total: total, Message: msg}}, nil
}

// execute runs the tool with the accumulated arguments.
func (e *Engine) execute(ctx context.Context, tool *Tool, work *record) *Step {
	work.State = StateProcessing
	work.Current = nil
	args := encodeArgs(work.Args)
	res, err := safeExecute(ctx, tool, args)
	work.Last = nowMS(e.now())
	if err != nil {
		work.State = StateError
		work.Reason = "execution failed"
		e.log.Debug("flow: tool failed", zap.String("tool", tool.Name), zap.Error(err))
		return &Step{State: StateError, Result: &Outcome{Success: false, Text: err.Error(), IsError: true},
			Summary: fmt.Sprintf("%s failed: %v. Nothing more will run in this interaction; start a new one to try again.", tool.Name, err)}
	}
	work.State = StateCompleted
	out := &Outcome{Success: !res.IsError, Text: res.Text, Data: res.Data, IsError: res.IsError}
	summary := fmt.Sprintf("%s ran with %s.", tool.Name, args)
	if res.IsError {
		summary = fmt.Sprintf("%s ran with %s and reported an error: %s", tool.Name, args, res.Text)
	}
	return &Step{State: StateCompleted, Result: out, Summary: summary}
}

func safeExecute(ctx context.Context, tool *Tool, args json.RawMessage) (res Result, err error) {
	defer func() {
		if x := recover(); x != nil {
			err = fmt.Errorf("the tool panicked: %v", x)
		}
	}()
	return tool.Execute(ctx, args)
}

// GetState returns owner's view of interaction id. In stateless mode the
// state is the token's, or the interaction's end when the SpentStore
// knows it (ctx bounds that lookup; its failure is ErrReplayCheck).
//
// Errors (*Error): CodeSessionNotFound, CodeSessionExpired,
// CodeNotInteractive (engine closed).
func (e *Engine) GetState(ctx context.Context, owner, id string) (*Snapshot, error) {
	now := nowMS(e.now())
	if e.Stateless() {
		rec, err := e.decode(owner, id, now)
		if err != nil {
			return nil, err
		}
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			return nil, errClosed()
		}
		m := e.entries[rec.ID]
		local := m != nil && m.owner == owner && m.rec != nil
		if local {
			rec.State = m.rec.State
		}
		e.mu.Unlock()
		if !local {
			end, err := e.spent.Spent(ctx, endKey(rec.ID))
			if err != nil {
				return nil, e.replayErr(err)
			}
			if end != "" {
				rec.State, rec.Current = State(end), nil
			}
		}
		return rec.snapshot(id), nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, errClosed()
	}
	ent, err := e.find(owner, id, now)
	if err != nil {
		return nil, err
	}
	return ent.rec.snapshot(id), nil
}

// Cancel cancels interaction id. A running Execute has its context
// cancelled and its outcome discarded (what it already did stays done).
//
// In stateless mode, cancelling with any token of the interaction cancels
// it, on every replica sharing the SpentStore; a board call already running
// on another replica is not stopped there, but its outcome is discarded.
//
// Errors (*Error): CodeSessionNotFound, CodeSessionExpired,
// CodeAlreadyCancelled (cancelled before), CodeInvalidStateTransition
// (completed or ended in error), CodeNotInteractive (engine closed);
// ErrReplayCheck (wrapped) when the SpentStore fails.
func (e *Engine) Cancel(ctx context.Context, owner, id, reason string) error {
	now := nowMS(e.now())
	if reason == "" {
		reason = "cancelled by the caller"
	}
	if e.Stateless() {
		return e.cancelToken(ctx, owner, id, reason, now)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errClosed()
	}
	ent, err := e.find(owner, id, now)
	if err != nil {
		return err
	}
	if err := errCannotCancel(id, ent.rec.State); err != nil {
		return err
	}
	if ent.cancel != nil {
		ent.cancel()
	}
	// Replace the record rather than change it: a Respond in flight works
	// on its own copy and will see the cancellation at commit.
	c := ent.rec.clone()
	c.State, c.Reason, c.Current, c.Last = StateCancelled, reason, nil, now
	ent.rec = c
	ent.deadline, _ = c.deadline()
	heap.Fix(&e.byTime, ent.index)
	if ent.open {
		e.close(ent)
	}
	e.log.Debug("flow: interaction cancelled", zap.String("tool", c.Tool))
	return nil
}

// cancelToken is Cancel in stateless mode.
func (e *Engine) cancelToken(ctx context.Context, owner, id, reason string, now int64) error {
	rec, err := e.decode(owner, id, now)
	if err != nil {
		return err
	}
	if err := errCannotCancel(id, rec.State); err != nil {
		return err
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return errClosed()
	}
	if m := e.entries[rec.ID]; m != nil && m.owner == owner && m.rec != nil && m.rec.State.Final() {
		e.mu.Unlock()
		return errCannotCancel(id, m.rec.State)
	}
	e.mu.Unlock()
	// The token's step first: a cancel and an answer with the same token
	// race on it, and exactly one wins.
	d, _ := rec.deadline()
	first, prior, err := e.spent.Spend(ctx, stepKey(rec), UseCancelled, time.UnixMilli(d))
	if err != nil {
		return e.replayErr(err)
	}
	if !first && prior == UseCancelled {
		return errCannotCancel(id, StateCancelled)
	}
	// The token was current (first), or was answered: either way the
	// interaction as a whole ends here, unless it already ended.
	first, prior, err = e.spent.Spend(ctx, endKey(rec.ID), string(StateCancelled), e.endUntil(rec))
	if err != nil {
		return e.replayErr(err)
	}
	if !first {
		return errCannotCancel(id, State(prior))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	if m := e.entries[rec.ID]; m != nil && m.owner == owner && m.rec != nil {
		// Being processed here: stop it; commit discards the outcome.
		m.rec.State, m.rec.Reason = StateCancelled, reason
		if m.cancel != nil {
			m.cancel()
		}
	} else {
		m = &entry{key: rec.ID, owner: owner, rec: &record{State: StateCancelled, Reason: reason}}
		m.deadline = e.endUntil(rec).UnixMilli()
		e.entries[m.key] = m
		heap.Push(&e.byTime, m)
	}
	e.log.Debug("flow: interaction cancelled", zap.String("tool", rec.Tool))
	return nil
}

func errCannotCancel(id string, s State) error {
	switch s {
	case StateCancelled:
		return newError(CodeAlreadyCancelled, map[string]any{"sessionId": id, "state": s},
			"Interaction %s was already cancelled; nothing more to do. Start a new interaction to run the tool.", short(id))
	case StateCompleted, StateError:
		return newError(CodeInvalidStateTransition, map[string]any{"sessionId": id, "state": s},
			"Interaction %s has already ended (%s) and cannot be cancelled; what ran stays done. Use interaction.getState to see its outcome.", short(id), s)
	}
	return nil
}

// An entry's place in Engine.byTime: by deadline.
func (ent *entry) before(o *entry) bool { return ent.deadline < o.deadline }
func (ent *entry) setIndex(i int)       { ent.index = i }

// Counts reports the interactions this engine knows now, by state, for
// metrics. In stateful mode that is every interaction not yet expired
// (open ones, and finished ones still readable with GetState); in
// stateless mode the state travels with the caller, so only what this
// replica holds is counted: answers being processed and interactions
// finished here. Expired entries not yet swept are left out.
func (e *Engine) Counts() map[State]int {
	now := nowMS(e.now())
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[State]int{}
	for _, ent := range e.entries {
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
