package flow

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/internal/argcheck"
	"github.com/devicebridge/devicebridge/internal/randid"
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
// The Engine is the state machine (answer, next, present, execute) and
// nothing else: where interactions live between calls is its store, in
// memory by random id (memStore), or signed into the sessionId with
// Options.Secret (tokenStore, whose SpentStore makes every token usable
// once). See store.go.
type Engine struct {
	lookup      Lookup
	timeout     time.Duration
	maxPrompts  int
	maxDuration time.Duration
	now         func() time.Time
	log         *zap.Logger
	store       store
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
	e := &Engine{lookup: o.Lookup, timeout: o.Timeout, maxPrompts: o.MaxPrompts,
		maxDuration: o.MaxDuration, now: o.Now, log: o.Logger}
	if o.Secret != nil {
		spent := o.Spent
		if spent == nil {
			spent = NewMemorySpent(0, o.Now)
		}
		e.store = newTokenStore(o.Secret, spent, e.timeout, e.now, e.log)
	} else {
		e.store = newMemStore(e.timeout, o.MaxPerOwner, e.maxDuration, e.now, e.log)
	}
	return e, nil
}

// Stateless reports whether interactions travel as signed tokens.
func (e *Engine) Stateless() bool {
	_, ok := e.store.(*tokenStore)
	return ok
}

// Close cancels running executions and forgets every interaction; later
// calls fail with CodeNotInteractive. The engine starts no goroutine, so
// there is nothing else to stop.
func (e *Engine) Close() { e.store.close() }

func nowMS(t time.Time) int64 { return t.UnixMilli() }

func fmtDur(ms int64) string { return (time.Duration(ms) * time.Millisecond).String() }

func newID() string { return randid.Hex16() }

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
	// max(x, 0): a negative per-call timeout means the engine's, as zero does.
	timeout := cmp.Or(max(opts.Timeout, 0), e.timeout)
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

	work := rec.clone()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ent, err := e.store.open(owner, rec, need, nowMS(now), cancel)
	if err != nil {
		return nil, err
	}

	step, err := e.next(ctx, tool, work, nil)
	if step != nil && len(problems) > 0 {
		step.Validation = &Validation{Valid: false, Error: joinErrors(problems), Suggestion: problems[0].Suggestion}
	}
	if step != nil {
		step.InitialPrompt, step.NextPrompt = step.NextPrompt, nil
	}
	e.log.Debug("flow: interaction started", zap.String("tool", toolName), zap.String("state", string(work.State)),
		zap.Int("prompts", len(work.Pending)))
	return e.finish(e.store.commit(ctx, owner, ent, work, step, err))
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
	ent, work, err := e.store.acquire(owner, id, cancel)
	if err != nil {
		return nil, err
	}
	tool, err := e.lookup(ctx, work.Tool)
	if err == nil && tool == nil {
		err = errors.New("lookup returned no tool")
	}
	if err != nil {
		e.store.release(ent)
		return nil, fmt.Errorf("flow: looking up tool %q: %w", work.Tool, err)
	}
	if err := e.store.claim(ctx, id, ent, work); err != nil {
		e.store.release(ent)
		return nil, err
	}
	step, err := e.answer(ctx, tool, work, value)
	return e.finish(e.store.commit(ctx, owner, ent, work, step, err))
}

// finish hands out what a store committed: the Step gets the sessionId
// and expiry, and an *Error the sessionId.
func (e *Engine) finish(id string, rec *record, step *Step, err error) (*Step, error) {
	if step != nil {
		step.SessionID = id
		step.ExpiresAt, _ = rec.deadline()
	}
	if err != nil {
		var fe *Error
		if id != "" && errors.As(err, &fe) {
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
	return e.store.get(ctx, owner, id)
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
	if reason == "" {
		reason = "cancelled by the caller"
	}
	return e.store.cancel(ctx, owner, id, reason)
}

// Counts reports the interactions this engine knows now, by state, for
// metrics. In stateful mode that is every interaction not yet expired
// (open ones, and finished ones still readable with GetState); in
// stateless mode the state travels with the caller, so only what this
// replica holds is counted: answers being processed and interactions
// finished here. Expired entries not yet swept are left out.
func (e *Engine) Counts() map[State]int { return e.store.counts(nowMS(e.now())) }
