package flow

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/stretchr/testify/assert"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// clock is a fake clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2025, 1, 31, 12, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// calls records Execute calls.
type calls struct {
	mu   sync.Mutex
	args []string
}

func (c *calls) add(a json.RawMessage) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.args = append(c.args, string(a))
}

func (c *calls) list() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.args...)
}

// registry is a Lookup over a fixed set of tools.
type registry struct {
	mu    sync.Mutex
	tools map[string]*Tool
}

func (r *registry) lookup(_ context.Context, name string) (*Tool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.tools[name]
	if !ok {
		return nil, errUnknownTool
	}
	return t, nil
}

func (r *registry) set(t *Tool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tools[t.Name] = t
}

type unknownToolError struct{}

func (unknownToolError) Error() string { return "unknown tool" }

var errUnknownTool error = unknownToolError{}

// recordingTool returns a tool whose Execute records its arguments.
func recordingTool(name, schema string, c *calls) *Tool {
	return &Tool{Name: name, InputSchema: json.RawMessage(schema),
		Execute: func(_ context.Context, args json.RawMessage) (Result, error) {
			c.add(args)
			return Result{Text: "true"}, nil
		}}
}

type fixture struct {
	clock *clock
	reg   *registry
	calls *calls
	eng   *Engine
}

func newFixture(t *testing.T, o Options) *fixture {
	t.Helper()
	f := &fixture{clock: newClock(), reg: &registry{tools: map[string]*Tool{}}, calls: &calls{}}
	for name, s := range map[string]string{
		"self.audio_speaker.set_volume": volumeSchema,
		"self.screen.set_theme":         themeSchema,
		"self.camera.take_photo":        photoSchema,
		"self.get_device_status":        emptySchema,
		"self.lamp.set":                 enableSchema,
	} {
		f.reg.set(recordingTool(name, s, f.calls))
	}
	o.Lookup = f.reg.lookup
	o.Now = f.clock.Now
	eng, err := NewEngine(o)
	require.NoError(t, err)
	t.Cleanup(eng.Close)
	f.eng = eng
	return f
}

func start(t *testing.T, f *fixture, owner, tool, args string) *Step {
	t.Helper()
	st, err := f.eng.Start(context.Background(), owner, tool, raw(args), StartOptions{})
	require.NoError(t, err)
	return st
}

func TestSetVolumeRetryAfterFailedAnswer(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	st := start(t, f, "alice", "self.audio_speaker.set_volume", `{}`)
	require.Equal(t, StateWaitingUser, st.State)
	require.NotNil(t, st.InitialPrompt)
	assert.Nil(t, st.NextPrompt)
	assert.Equal(t, PromptNumber, st.InitialPrompt.Type)
	assert.Equal(t, &Progress{Current: 1, Total: 1, Message: "Step 1 of 1: volume"}, st.Progress)
	assert.Nil(t, st.Accepted)
	id := st.SessionID
	assert.Regexp(t, `^flw_[0-9a-f]{32}$`, id)

	st, err := f.eng.Respond(ctx, "alice", id, raw(`150`))
	require.NoError(t, err)
	assert.Equal(t, StateWaitingUser, st.State)
	require.NotNil(t, st.Accepted)
	assert.False(t, *st.Accepted)
	require.NotNil(t, st.Validation)
	assert.False(t, st.Validation.Valid)
	assert.Contains(t, st.Validation.Error, "above the maximum of 100")
	assert.Contains(t, st.Validation.Suggestion, "from 0 to 100")
	require.NotNil(t, st.NextPrompt)
	assert.Equal(t, "volume", st.NextPrompt.Property, "the same prompt again")
	assert.Equal(t, st.Validation.Error, st.NextPrompt.Error)
	assert.Empty(t, f.calls.list())

	st, err = f.eng.Respond(ctx, "alice", id, raw(`40`))
	require.NoError(t, err)
	assert.Equal(t, StateCompleted, st.State)
	assert.True(t, *st.Accepted)
	assert.True(t, st.Validation.Valid)
	assert.Nil(t, st.Prompt())
	require.NotNil(t, st.Result)
	assert.True(t, st.Result.Success)
	assert.Equal(t, "true", st.Result.Text)
	assert.Contains(t, st.Summary, `{"volume":40}`)
	calls := f.calls.list()
	require.Len(t, calls, 1)
	assert.JSONEq(t, `{"volume":40}`, calls[0])

	snap, err := f.eng.GetState(t.Context(), "alice", id)
	require.NoError(t, err)
	assert.Equal(t, StateCompleted, snap.State)
	require.Len(t, snap.History, 2)
	assert.False(t, snap.History[0].Response.Accepted)
	assert.JSONEq(t, `150`, string(snap.History[0].Response.Value))
	assert.True(t, snap.History[1].Response.Accepted)
	assert.Equal(t, 1, snap.History[1].TurnID)
	assert.JSONEq(t, `40`, string(snap.AccumulatedData["volume"]))
	assert.Equal(t, "self.audio_speaker.set_volume", snap.Metadata.ToolName)
	assert.Equal(t, 2, snap.Metadata.Prompts)
}

func TestStartWithValidArgsRunsAtOnce(t *testing.T) {
	f := newFixture(t, Options{})
	st := start(t, f, "alice", "self.camera.take_photo", `{"url":"http://v/x"}`)
	assert.Equal(t, StateCompleted, st.State)
	assert.Nil(t, st.Prompt())
	assert.Equal(t, []string{`{"url":"http://v/x"}`}, f.calls.list())

	st = start(t, f, "alice", "self.get_device_status", ``)
	assert.Equal(t, StateCompleted, st.State)
	assert.Len(t, f.calls.list(), 2)
}

func TestInvalidInitialValueIsReported(t *testing.T) {
	f := newFixture(t, Options{})
	st := start(t, f, "alice", "self.camera.take_photo", `{"url":"http://v/x","quality":"high"}`)
	require.Equal(t, StateWaitingUser, st.State)
	require.NotNil(t, st.Validation)
	assert.False(t, st.Validation.Valid)
	assert.Contains(t, st.Validation.Error, "default 80")
	assert.Equal(t, "quality", st.InitialPrompt.Property)
	assert.Contains(t, st.InitialPrompt.Error, "default 80")

	// null takes the default.
	st, err := f.eng.Respond(context.Background(), "alice", st.SessionID, raw(`null`))
	require.NoError(t, err)
	assert.Equal(t, StateCompleted, st.State)
	assert.JSONEq(t, `{"url":"http://v/x","quality":80}`, f.calls.list()[0])
}

func TestMultiTurnProgress(t *testing.T) {
	f := newFixture(t, Options{})
	f.reg.set(recordingTool("wizard", `{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0},"ok":{"type":"boolean"}},"required":["name","age","ok"]}`, f.calls))
	ctx := context.Background()
	st := start(t, f, "alice", "wizard", `{"age":30}`)
	assert.Equal(t, "name", st.InitialPrompt.Property)
	assert.Equal(t, 1, st.Progress.Current)
	assert.Equal(t, 2, st.Progress.Total)
	st, err := f.eng.Respond(ctx, "alice", st.SessionID, raw(`"John"`))
	require.NoError(t, err)
	assert.Equal(t, "ok", st.NextPrompt.Property)
	assert.Equal(t, PromptConfirm, st.NextPrompt.Type)
	assert.Equal(t, 2, st.Progress.Current)
	// false is a value for a boolean property, not a refusal.
	st, err = f.eng.Respond(ctx, "alice", st.SessionID, raw(`false`))
	require.NoError(t, err)
	assert.Equal(t, StateCompleted, st.State)
	assert.JSONEq(t, `{"name":"John","age":30,"ok":false}`, f.calls.list()[0])
}

func TestGuidedAsksOptional(t *testing.T) {
	f := newFixture(t, Options{})
	f.reg.set(recordingTool("opt", `{"type":"object","properties":{"brightness":{"type":"integer","minimum":0,"maximum":100,"default":50},"label":{"type":"string"}}}`, f.calls))
	ctx := context.Background()
	st, err := f.eng.Start(ctx, "alice", "opt", nil, StartOptions{Guided: true})
	require.NoError(t, err)
	assert.Equal(t, "brightness", st.InitialPrompt.Property)
	assert.Equal(t, 2, st.Progress.Total)
	st, err = f.eng.Respond(ctx, "alice", st.SessionID, raw(`70`))
	require.NoError(t, err)
	assert.Equal(t, "label", st.NextPrompt.Property)
	// null skips an optional property without a default.
	st, err = f.eng.Respond(ctx, "alice", st.SessionID, raw(`null`))
	require.NoError(t, err)
	assert.Equal(t, StateCompleted, st.State)
	assert.JSONEq(t, `{"brightness":70}`, f.calls.list()[0])

	// Not guided: runs at once.
	st, err = f.eng.Start(ctx, "alice", "opt", nil, StartOptions{})
	require.NoError(t, err)
	assert.Equal(t, StateCompleted, st.State)
}

// TestProseDefaultIsNotPrefilled: the firmware's self.upgrade_firmware
// declares its url's default as a sentence about the url. A guided call
// neither offers it nor sends it when the answer is left empty.
func TestProseDefaultIsNotPrefilled(t *testing.T) {
	f := newFixture(t, Options{})
	f.reg.set(recordingTool("upgrade", `{"type":"object","properties":{"url":{"type":"string","default":"The URL of the firmware binary file to download and install"}}}`, f.calls))
	ctx := context.Background()
	st, err := f.eng.Start(ctx, "alice", "upgrade", nil, StartOptions{Guided: true})
	require.NoError(t, err)
	pr := st.InitialPrompt
	require.NotNil(t, pr)
	assert.Equal(t, "url", pr.Property)
	assert.Empty(t, pr.DefaultValue, "no prefill")
	assert.NotContains(t, pr.Message, "firmware binary file")
	assert.Equal(t, "url: a URL (optional; answer null to skip).", pr.Message)
	assert.Equal(t, "http://example.com/file", pr.Placeholder)
	st, err = f.eng.Respond(ctx, "alice", st.SessionID, raw(`null`))
	require.NoError(t, err)
	assert.Equal(t, StateCompleted, st.State)
	assert.Equal(t, []string{`{}`}, f.calls.list(), "nothing sent for the url")
}

func confirmTool(f *fixture) {
	t := recordingTool("self.reboot", volumeSchema, f.calls)
	t.Confirm = true
	t.ConfirmMessage = "Reboot with this volume?"
	f.reg.set(t)
}

func TestConfirmAndDecline(t *testing.T) {
	f := newFixture(t, Options{})
	confirmTool(f)
	ctx := context.Background()

	// Decline: cancelled, nothing executed.
	st := start(t, f, "alice", "self.reboot", `{"volume":10}`)
	require.Equal(t, StateWaitingUser, st.State)
	require.NotNil(t, st.InitialPrompt)
	assert.Equal(t, PromptConfirm, st.InitialPrompt.Type)
	assert.Empty(t, st.InitialPrompt.Property)
	assert.Contains(t, st.InitialPrompt.Message, "Reboot with this volume?")
	assert.Equal(t, "Step 1 of 1: confirmation", st.Progress.Message)
	id := st.SessionID
	st, err := f.eng.Respond(ctx, "alice", id, raw(`"maybe"`))
	require.NoError(t, err)
	assert.False(t, *st.Accepted)
	assert.Contains(t, st.Validation.Suggestion, "true to run")
	st, err = f.eng.Respond(ctx, "alice", id, raw(`false`))
	require.NoError(t, err)
	assert.Equal(t, StateCancelled, st.State)
	assert.True(t, *st.Accepted)
	assert.Contains(t, st.Summary, "not run")
	assert.Empty(t, f.calls.list())
	snap, err := f.eng.GetState(t.Context(), "alice", id)
	require.NoError(t, err)
	assert.Equal(t, StateCancelled, snap.State)
	assert.Equal(t, "confirmation declined", snap.Metadata.Reason)

	// Confirm after asking the property.
	st = start(t, f, "alice", "self.reboot", `{}`)
	assert.Equal(t, 2, st.Progress.Total)
	st, err = f.eng.Respond(ctx, "alice", st.SessionID, raw(`20`))
	require.NoError(t, err)
	require.NotNil(t, st.NextPrompt)
	assert.Equal(t, PromptConfirm, st.NextPrompt.Type)
	assert.Equal(t, &Progress{Current: 2, Total: 2, Message: "Step 2 of 2: confirmation"}, st.Progress)
	st, err = f.eng.Respond(ctx, "alice", st.SessionID, raw(`true`))
	require.NoError(t, err)
	assert.Equal(t, StateCompleted, st.State)
	assert.Equal(t, []string{`{"volume":20}`}, f.calls.list())
}

func TestExecuteOutcomes(t *testing.T) {
	f := newFixture(t, Options{})
	f.reg.set(&Tool{Name: "fails", InputSchema: raw(emptySchema), Execute: func(context.Context, json.RawMessage) (Result, error) {
		return Result{}, errors.New("Failed to capture photo")
	}})
	f.reg.set(&Tool{Name: "iserror", InputSchema: raw(emptySchema), Execute: func(context.Context, json.RawMessage) (Result, error) {
		return Result{Text: "lamp is off", IsError: true}, nil
	}})
	f.reg.set(&Tool{Name: "panics", InputSchema: raw(emptySchema), Execute: func(context.Context, json.RawMessage) (Result, error) {
		panic("boom")
	}})
	st := start(t, f, "alice", "fails", `{}`)
	assert.Equal(t, StateError, st.State)
	assert.False(t, st.Result.Success)
	assert.Equal(t, "Failed to capture photo", st.Result.Text)
	assert.Contains(t, st.Summary, "start a new one")

	st = start(t, f, "alice", "iserror", `{}`)
	assert.Equal(t, StateCompleted, st.State)
	assert.False(t, st.Result.Success)
	assert.True(t, st.Result.IsError)
	assert.Contains(t, st.Summary, "reported an error: lamp is off")

	st = start(t, f, "alice", "panics", `{}`)
	assert.Equal(t, StateError, st.State)
	assert.Contains(t, st.Result.Text, "boom")

	_, err := f.eng.Start(context.Background(), "alice", "nope", nil, StartOptions{})
	require.ErrorIs(t, err, errUnknownTool)
	f.reg.set(&Tool{Name: "noexec", InputSchema: raw(emptySchema)})
	_, err = f.eng.Start(context.Background(), "alice", "noexec", nil, StartOptions{})
	requireCode(t, err, CodeNotInteractive)
}

func TestStateMachine(t *testing.T) {
	for from, tos := range transitions {
		for _, to := range tos {
			assert.True(t, CanMove(from, to), "%s → %s", from, to)
		}
	}
	for _, s := range []State{StateCompleted, StateCancelled, StateError} {
		assert.True(t, s.Final())
		for _, to := range []State{StateIdle, StateActive, StateWaitingUser, StateProcessing, StateCompleted, StateCancelled, StateError} {
			assert.False(t, CanMove(s, to), "%s is final", s)
		}
	}
	assert.False(t, CanMove(StateIdle, StateWaitingUser))
	assert.False(t, CanMove(StateWaitingUser, StateCompleted), "an answer is processed first")
	assert.False(t, CanMove(StateWaitingUser, StateWaitingUser))
}

func TestInvalidTransitions(t *testing.T) {
	f := newFixture(t, Options{})
	f.reg.set(&Tool{Name: "fails", InputSchema: raw(volumeSchema), Execute: func(context.Context, json.RawMessage) (Result, error) {
		return Result{}, errors.New("nope")
	}})
	ctx := context.Background()

	// completed: no answer, no cancel
	done := start(t, f, "alice", "self.get_device_status", `{}`)
	_, err := f.eng.Respond(ctx, "alice", done.SessionID, raw(`1`))
	fe := requireCode(t, err, CodeInvalidStateTransition)
	assert.Contains(t, fe.Message, "completed")
	assert.Contains(t, fe.Message, "Start a new interaction")
	err = f.eng.Cancel(t.Context(), "alice", done.SessionID, "")
	requireCode(t, err, CodeInvalidStateTransition)

	// error: the same
	st := start(t, f, "alice", "fails", `{}`)
	st, err = f.eng.Respond(ctx, "alice", st.SessionID, raw(`5`))
	require.NoError(t, err)
	require.Equal(t, StateError, st.State)
	_, err = f.eng.Respond(ctx, "alice", st.SessionID, raw(`5`))
	requireCode(t, err, CodeInvalidStateTransition)
	requireCode(t, f.eng.Cancel(t.Context(), "alice", st.SessionID, ""), CodeInvalidStateTransition)

	// cancelled: answer refused, cancel twice refused with its own code
	st = start(t, f, "alice", "self.audio_speaker.set_volume", `{}`)
	require.NoError(t, f.eng.Cancel(t.Context(), "alice", st.SessionID, "user changed mind"))
	_, err = f.eng.Respond(ctx, "alice", st.SessionID, raw(`5`))
	requireCode(t, err, CodeInvalidStateTransition)
	err = f.eng.Cancel(t.Context(), "alice", st.SessionID, "again")
	fe = requireCode(t, err, CodeAlreadyCancelled)
	assert.Equal(t, "ALREADY_CANCELLED", CodeName(fe.Code))
	snap, err := f.eng.GetState(t.Context(), "alice", st.SessionID)
	require.NoError(t, err)
	assert.Equal(t, StateCancelled, snap.State)
	assert.Equal(t, "user changed mind", snap.Metadata.Reason)
	assert.Nil(t, snap.CurrentPrompt)
	assert.Equal(t, []string{`{}`}, f.calls.list(), "only the status tool ran")

	// unknown ids
	_, err = f.eng.Respond(ctx, "alice", "flw_0000", raw(`5`))
	requireCode(t, err, CodeSessionNotFound)
	_, err = f.eng.GetState(t.Context(), "alice", "")
	requireCode(t, err, CodeSessionNotFound)
}

// blockingTool's Execute waits until released or cancelled.
type blockingTool struct {
	started chan struct{}
	release chan struct{}
	ctxErr  chan error
}

func newBlockingTool(f *fixture, name, schema string) *blockingTool {
	b := &blockingTool{started: make(chan struct{}, 1), release: make(chan struct{}), ctxErr: make(chan error, 1)}
	f.reg.set(&Tool{Name: name, InputSchema: raw(schema), Execute: func(ctx context.Context, args json.RawMessage) (Result, error) {
		f.calls.add(args)
		b.started <- struct{}{}
		select {
		case <-b.release:
			b.ctxErr <- nil
			return Result{Text: "done"}, nil
		case <-ctx.Done():
			b.ctxErr <- ctx.Err()
			return Result{}, ctx.Err()
		}
	}})
	return b
}

func TestConcurrentRespond(t *testing.T) {
	f := newFixture(t, Options{})
	b := newBlockingTool(f, "slow", volumeSchema)
	ctx := context.Background()
	st := start(t, f, "alice", "slow", `{}`)
	id := st.SessionID

	type res struct {
		st  *Step
		err error
	}
	first := make(chan res, 1)
	go func() {
		st, err := f.eng.Respond(ctx, "alice", id, raw(`40`))
		first <- res{st, err}
	}()
	<-b.started
	// While the first answer is processed, a second one is refused.
	_, err := f.eng.Respond(ctx, "alice", id, raw(`41`))
	fe := requireCode(t, err, CodeInvalidStateTransition)
	assert.Contains(t, fe.Message, "still being processed")
	snap, err := f.eng.GetState(t.Context(), "alice", id)
	require.NoError(t, err)
	assert.Equal(t, StateProcessing, snap.State)
	close(b.release)
	r := <-first
	require.NoError(t, r.err)
	assert.Equal(t, StateCompleted, r.st.State)
	assert.Equal(t, []string{`{"volume":40}`}, f.calls.list())
	require.NoError(t, <-b.ctxErr)
}

func TestManyConcurrentRespondsOneWins(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	st := start(t, f, "alice", "self.audio_speaker.set_volume", `{}`)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ok, refused int
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := f.eng.Respond(ctx, "alice", st.SessionID, raw(`40`))
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				ok++
				return
			}
			var fe *Error
			if errors.As(err, &fe) && fe.Code == CodeInvalidStateTransition {
				refused++
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, 1, ok)
	assert.Equal(t, 7, refused)
	assert.Len(t, f.calls.list(), 1)
}

func TestCancelWhileProcessing(t *testing.T) {
	f := newFixture(t, Options{})
	b := newBlockingTool(f, "slow", volumeSchema)
	ctx := context.Background()
	st := start(t, f, "alice", "slow", `{}`)
	done := make(chan *Step, 1)
	go func() {
		st, err := f.eng.Respond(ctx, "alice", st.SessionID, raw(`40`))
		assert.NoError(t, err)
		done <- st
	}()
	<-b.started
	require.NoError(t, f.eng.Cancel(t.Context(), "alice", st.SessionID, "stop"))
	require.ErrorIs(t, <-b.ctxErr, context.Canceled, "Execute's context is cancelled")
	got := <-done
	assert.Equal(t, StateCancelled, got.State)
	assert.Nil(t, got.Result, "the outcome is discarded")
	snap, err := f.eng.GetState(t.Context(), "alice", st.SessionID)
	require.NoError(t, err)
	assert.Equal(t, StateCancelled, snap.State)
	requireCode(t, f.eng.Cancel(t.Context(), "alice", st.SessionID, ""), CodeAlreadyCancelled)
}

func TestOwnerIsolation(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	st := start(t, f, "alice", "self.audio_speaker.set_volume", `{}`)
	_, errUnknown := f.eng.GetState(t.Context(), "bob", "flw_00000000000000000000000000000000")
	fe := requireCode(t, errUnknown, CodeSessionNotFound)

	_, err := f.eng.Respond(ctx, "bob", st.SessionID, raw(`40`))
	fe2 := requireCode(t, err, CodeSessionNotFound)
	_, err = f.eng.GetState(t.Context(), "bob", st.SessionID)
	requireCode(t, err, CodeSessionNotFound)
	requireCode(t, f.eng.Cancel(t.Context(), "bob", st.SessionID, ""), CodeSessionNotFound)
	// Same wording as an unknown id, apart from the id itself.
	assert.Equal(t, strings.ReplaceAll(fe.Message, "flw_00000000000000000000000000000000", "ID"),
		strings.ReplaceAll(fe2.Message, st.SessionID, "ID"))

	// Alice's interaction is untouched.
	st, err = f.eng.Respond(ctx, "alice", st.SessionID, raw(`40`))
	require.NoError(t, err)
	assert.Equal(t, StateCompleted, st.State)
}

func TestIDsAreRandom(t *testing.T) {
	f := newFixture(t, Options{MaxPerOwner: -1})
	seen := map[string]bool{}
	for i := 0; i < 200; i++ {
		st := start(t, f, "alice", "self.audio_speaker.set_volume", `{}`)
		require.False(t, seen[st.SessionID])
		seen[st.SessionID] = true
	}
}

func TestExpiry(t *testing.T) {
	f := newFixture(t, Options{Timeout: time.Minute, MaxDuration: 10 * time.Minute})
	ctx := context.Background()
	st := start(t, f, "alice", "self.audio_speaker.set_volume", `{}`)
	assert.Equal(t, f.clock.Now().Add(time.Minute).UnixMilli(), st.ExpiresAt)

	// Activity keeps it alive.
	f.clock.Advance(59 * time.Second)
	st, err := f.eng.Respond(ctx, "alice", st.SessionID, raw(`500`))
	require.NoError(t, err)
	f.clock.Advance(59 * time.Second)
	_, err = f.eng.GetState(t.Context(), "alice", st.SessionID)
	require.NoError(t, err)

	// Inactivity expires it; it stays expired, and nothing runs.
	f.clock.Advance(2 * time.Second)
	_, err = f.eng.Respond(ctx, "alice", st.SessionID, raw(`40`))
	fe := requireCode(t, err, CodeSessionExpired)
	assert.Contains(t, fe.Message, "no activity for 1m0s")
	assert.Contains(t, fe.Message, "initialParams")
	_, err = f.eng.GetState(t.Context(), "alice", st.SessionID)
	requireCode(t, err, CodeSessionExpired)
	requireCode(t, f.eng.Cancel(t.Context(), "alice", st.SessionID, ""), CodeSessionExpired)
	// Another owner still learns nothing.
	_, err = f.eng.GetState(t.Context(), "bob", st.SessionID)
	requireCode(t, err, CodeSessionNotFound)
	assert.Empty(t, f.calls.list())

	// The tombstone is swept later; then the id is simply unknown.
	f.clock.Advance(2 * time.Minute)
	start(t, f, "alice", "self.get_device_status", `{}`)
	_, err = f.eng.GetState(t.Context(), "alice", st.SessionID)
	requireCode(t, err, CodeSessionNotFound)
}

func TestMaxDuration(t *testing.T) {
	f := newFixture(t, Options{Timeout: time.Minute, MaxDuration: 3 * time.Minute})
	ctx := context.Background()
	st, err := f.eng.Start(ctx, "alice", "self.audio_speaker.set_volume", nil, StartOptions{Timeout: time.Hour})
	require.NoError(t, err)
	for i := 0; i < 5; i++ { // active all along
		f.clock.Advance(50 * time.Second)
		st, err = f.eng.Respond(ctx, "alice", st.SessionID, raw(`500`))
		if err != nil {
			break
		}
	}
	fe := requireCode(t, err, CodeSessionExpired)
	assert.Contains(t, fe.Message, "maximum of 3m0s")
	assert.Equal(t, reasonMaxDuration, fe.Data.(map[string]any)["reason"])
}

func TestPerInteractionTimeout(t *testing.T) {
	f := newFixture(t, Options{Timeout: time.Minute})
	st, err := f.eng.Start(context.Background(), "alice", "self.audio_speaker.set_volume", nil, StartOptions{Timeout: 10 * time.Second})
	require.NoError(t, err)
	f.clock.Advance(11 * time.Second)
	_, err = f.eng.GetState(t.Context(), "alice", st.SessionID)
	requireCode(t, err, CodeSessionExpired)
}

func TestSweepIsBounded(t *testing.T) {
	f := newFixture(t, Options{Timeout: time.Minute, MaxPerOwner: -1})
	for i := 0; i < 3*sweepBatch; i++ {
		start(t, f, "alice", "self.audio_speaker.set_volume", `{}`)
	}
	f.clock.Advance(2 * time.Minute)
	start(t, f, "alice", "self.get_device_status", `{}`) // sweeps sweepBatch
	mem := f.eng.store.(*memStore)
	mem.mu.Lock()
	n := len(mem.entries)
	tomb := 0
	for _, ent := range mem.entries {
		if ent.rec == nil {
			tomb++
		}
	}
	mem.mu.Unlock()
	assert.Equal(t, 3*sweepBatch+1, n)
	assert.Equal(t, sweepBatch, tomb)
	// Later sweeps remove the tombstones too.
	for i := 0; i < 10; i++ {
		f.clock.Advance(2 * time.Minute)
		start(t, f, "alice", "self.get_device_status", `{}`)
	}
	mem.mu.Lock()
	n = len(mem.entries)
	mem.mu.Unlock()
	assert.LessOrEqual(t, n, 2)
}

func TestMaxPerOwner(t *testing.T) {
	f := newFixture(t, Options{MaxPerOwner: 2})
	ctx := context.Background()
	a := start(t, f, "alice", "self.audio_speaker.set_volume", `{}`)
	start(t, f, "alice", "self.screen.set_theme", `{}`)
	_, err := f.eng.Start(ctx, "alice", "self.lamp.set", nil, StartOptions{})
	fe := requireCode(t, err, CodeTimeout)
	assert.Contains(t, fe.Message, "2 open interactions")
	assert.Contains(t, fe.Message, "interaction.cancel")
	// Others are not affected; finished interactions do not count.
	start(t, f, "bob", "self.lamp.set", `{}`)
	start(t, f, "alice", "self.get_device_status", `{}`)
	require.NoError(t, f.eng.Cancel(t.Context(), "alice", a.SessionID, ""))
	start(t, f, "alice", "self.lamp.set", `{}`)
}

func TestMaxPrompts(t *testing.T) {
	f := newFixture(t, Options{MaxPrompts: 3})
	ctx := context.Background()
	st := start(t, f, "alice", "self.audio_speaker.set_volume", `{}`) // prompt 1
	var err error
	for i := 0; i < 2; i++ { // prompts 2 and 3
		st, err = f.eng.Respond(ctx, "alice", st.SessionID, raw(`-1`))
		require.NoError(t, err)
	}
	_, err = f.eng.Respond(ctx, "alice", st.SessionID, raw(`-1`))
	fe := requireCode(t, err, CodeInvalidStateTransition)
	assert.Contains(t, fe.Message, "3 prompts")
	assert.Contains(t, fe.Message, "initialParams")
	snap, err := f.eng.GetState(t.Context(), "alice", st.SessionID)
	require.NoError(t, err)
	assert.Equal(t, StateError, snap.State)
	assert.Empty(t, f.calls.list())

	// A tool that needs more prompts than allowed is refused at once.
	f.reg.set(recordingTool("big", `{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"},"c":{"type":"string"},"d":{"type":"string"}},"required":["a","b","c","d"]}`, f.calls))
	_, err = f.eng.Start(ctx, "alice", "big", raw(`{}`), StartOptions{})
	fe = requireCode(t, err, CodeInvalidStateTransition)
	assert.Contains(t, fe.Message, "3 one interaction may show")
}

func TestLookupAfterEachAnswer(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	st := start(t, f, "alice", "self.audio_speaker.set_volume", `{}`)

	// The board went away: the answer is not consumed.
	f.reg.mu.Lock()
	saved := f.reg.tools["self.audio_speaker.set_volume"]
	delete(f.reg.tools, "self.audio_speaker.set_volume")
	f.reg.mu.Unlock()
	_, err := f.eng.Respond(ctx, "alice", st.SessionID, raw(`40`))
	require.ErrorIs(t, err, errUnknownTool)
	snap, err := f.eng.GetState(t.Context(), "alice", st.SessionID)
	require.NoError(t, err)
	assert.Equal(t, StateWaitingUser, snap.State)

	// It came back with a narrower range: the answer is checked against it.
	narrow := *saved
	narrow.InputSchema = raw(`{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":30}},"required":["volume"]}`)
	f.reg.set(&narrow)
	st, err = f.eng.Respond(ctx, "alice", st.SessionID, raw(`40`))
	require.NoError(t, err)
	assert.False(t, *st.Accepted)
	assert.Contains(t, st.Validation.Error, "maximum of 30")
	st, err = f.eng.Respond(ctx, "alice", st.SessionID, raw(`30`))
	require.NoError(t, err)
	assert.Equal(t, StateCompleted, st.State)
}

func TestCloseStopsEverything(t *testing.T) {
	f := newFixture(t, Options{})
	st := start(t, f, "alice", "self.audio_speaker.set_volume", `{}`)
	f.eng.Close()
	_, err := f.eng.GetState(t.Context(), "alice", st.SessionID)
	requireCode(t, err, CodeNotInteractive)
	_, err = f.eng.Start(context.Background(), "alice", "self.get_device_status", nil, StartOptions{})
	requireCode(t, err, CodeNotInteractive)
	assert.Empty(t, f.calls.list())
}

func TestNewEngineChecksOptions(t *testing.T) {
	_, err := NewEngine(Options{})
	require.Error(t, err)
	_, err = NewEngine(Options{Lookup: (&registry{}).lookup, Secret: []byte("short")})
	require.Error(t, err)
}

func TestWireShapes(t *testing.T) {
	f := newFixture(t, Options{})
	st := start(t, f, "alice", "self.audio_speaker.set_volume", `{}`)
	b, err := json.Marshal(st)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	assert.Equal(t, st.SessionID, m["sessionId"])
	assert.Equal(t, "waiting_user", m["state"])
	assert.Contains(t, m, "initialPrompt")
	assert.Contains(t, m, "progress")

	snap, err := f.eng.GetState(t.Context(), "alice", st.SessionID)
	require.NoError(t, err)
	b, err = json.Marshal(snap)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &m))
	for _, k := range []string{"sessionId", "state", "metadata", "history", "currentPrompt", "accumulatedData"} {
		assert.Contains(t, m, k)
	}
	md := m["metadata"].(map[string]any)
	for _, k := range []string{"createdAt", "lastActivityAt", "toolName"} {
		assert.Contains(t, md, k)
	}
	e := &Error{Code: CodeSessionNotFound, Message: "m", Data: map[string]any{"sessionId": "x"}}
	b, err = json.Marshal(e)
	require.NoError(t, err)
	assert.JSONEq(t, `{"code":-32001,"message":"m","data":{"sessionId":"x"}}`, string(b))
	assert.Equal(t, "flow: SESSION_NOT_FOUND: m", e.Error())
}
