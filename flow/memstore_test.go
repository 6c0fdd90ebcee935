package flow

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// A store is driven here as the Engine drives it, with records the state
// machine would produce: waiting for an answer, or finished.

func newRecord(c *clock) *record {
	now := nowMS(c.Now())
	return &record{ID: newID(), Tool: "self.audio_speaker.set_volume", State: StateActive, Created: now, Last: now,
		Timeout: time.Minute.Milliseconds(), Args: map[string]json.RawMessage{}}
}

// waiting is the state machine's work after presenting a prompt.
func waiting(rec *record) *record {
	w := rec.clone()
	w.State, w.Turns, w.Current = StateWaitingUser, w.Turns+1, &Prompt{Property: "volume", Type: PromptNumber}
	return w
}

func newTestMemStore(c *clock, maxPerOwner int) *memStore {
	return newMemStore(time.Minute, maxPerOwner, 5*time.Minute, c.Now, zap.NewNop())
}

// startMem opens an interaction for owner that waits for an answer, and
// returns its sessionId.
func startMem(t *testing.T, m *memStore, c *clock, owner string) string {
	t.Helper()
	rec := newRecord(c)
	ent, err := m.open(owner, rec, 1, nowMS(c.Now()), func() {})
	require.NoError(t, err)
	id, _, _, err := m.commit(t.Context(), owner, ent, waiting(rec), &Step{}, nil)
	require.NoError(t, err)
	return id
}

func TestMemStoreOwnerLimit(t *testing.T) {
	c := newClock()
	m := newTestMemStore(c, 2)
	a := startMem(t, m, c, "alice")
	startMem(t, m, c, "alice")
	_, err := m.open("alice", newRecord(c), 1, nowMS(c.Now()), func() {})
	requireCode(t, err, CodeTimeout)
	// What needs no prompt runs at once (and ends) and is not refused;
	// others' are not counted against alice.
	rec := newRecord(c)
	ent, err := m.open("alice", rec, 0, nowMS(c.Now()), func() {})
	require.NoError(t, err)
	done := rec.clone()
	done.State = StateCompleted
	_, _, _, err = m.commit(t.Context(), "alice", ent, done, &Step{State: StateCompleted}, nil)
	require.NoError(t, err)
	startMem(t, m, c, "bob")

	// A finished interaction no longer counts.
	ent, work, err := m.acquire("alice", a, func() {})
	require.NoError(t, err)
	work.State = StateCompleted
	_, _, _, err = m.commit(t.Context(), "alice", ent, work, &Step{State: StateCompleted}, nil)
	require.NoError(t, err)
	startMem(t, m, c, "alice")
}

func TestMemStoreAcquireIsExclusive(t *testing.T) {
	c := newClock()
	m := newTestMemStore(c, -1)
	id := startMem(t, m, c, "alice")

	_, _, err := m.acquire("bob", id, func() {})
	requireCode(t, err, CodeSessionNotFound)
	ent, work, err := m.acquire("alice", id, func() {})
	require.NoError(t, err)
	assert.Equal(t, StateProcessing, work.State)
	_, _, err = m.acquire("alice", id, func() {})
	requireCode(t, err, CodeInvalidStateTransition)
	snap, err := m.get(t.Context(), "alice", id)
	require.NoError(t, err)
	assert.Equal(t, StateProcessing, snap.State)

	// Released (the answer could not be handled): it waits again.
	m.release(ent)
	snap, err = m.get(t.Context(), "alice", id)
	require.NoError(t, err)
	assert.Equal(t, StateWaitingUser, snap.State)
	_, _, err = m.acquire("alice", id, func() {})
	require.NoError(t, err)
}

func TestMemStoreCancelWhileProcessing(t *testing.T) {
	c := newClock()
	m := newTestMemStore(c, -1)
	id := startMem(t, m, c, "alice")
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	ent, work, err := m.acquire("alice", id, stop)
	require.NoError(t, err)

	require.NoError(t, m.cancel(t.Context(), "alice", id, "stop"))
	assert.ErrorIs(t, ctx.Err(), context.Canceled, "the running answer is stopped")
	requireCode(t, m.cancel(t.Context(), "alice", id, "again"), CodeAlreadyCancelled)

	// Its outcome is discarded at commit; the cancelled record stays.
	work.State = StateCompleted
	gotID, rec, step, err := m.commit(t.Context(), "alice", ent, work, &Step{State: StateCompleted}, nil)
	require.NoError(t, err)
	assert.Equal(t, id, gotID)
	assert.Equal(t, StateCancelled, step.State)
	assert.Contains(t, step.Summary, "stop")
	assert.Equal(t, StateCancelled, rec.State)
	assert.Equal(t, map[State]int{StateCancelled: 1}, m.counts(nowMS(c.Now())))
}

func TestMemStoreExpiry(t *testing.T) {
	c := newClock()
	m := newTestMemStore(c, 1)
	id := startMem(t, m, c, "alice")
	c.Advance(61 * time.Second)
	assert.Empty(t, m.counts(nowMS(c.Now())), "expired, not yet swept: not counted")

	// Touching it expires it: a tombstone answers, and frees the slot.
	_, err := m.get(t.Context(), "alice", id)
	fe := requireCode(t, err, CodeSessionExpired)
	assert.Equal(t, reasonInactive, fe.Data.(map[string]any)["reason"])
	startMem(t, m, c, "alice")

	// Sweeps drop the tombstone one timeout later.
	c.Advance(2 * time.Minute)
	_, err = m.open("bob", newRecord(c), 0, nowMS(c.Now()), func() {})
	require.NoError(t, err)
	_, err = m.get(t.Context(), "alice", id)
	requireCode(t, err, CodeSessionNotFound)
}

func TestMemStoreClose(t *testing.T) {
	c := newClock()
	m := newTestMemStore(c, -1)
	id := startMem(t, m, c, "alice")
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	ent, work, err := m.acquire("alice", id, stop)
	require.NoError(t, err)

	m.close()
	assert.ErrorIs(t, ctx.Err(), context.Canceled, "close stops what runs")
	_, _, _, err = m.commit(t.Context(), "alice", ent, work, &Step{}, nil)
	requireCode(t, err, CodeNotInteractive)
	_, err = m.open("alice", newRecord(c), 1, nowMS(c.Now()), func() {})
	requireCode(t, err, CodeNotInteractive)
	_, err = m.get(t.Context(), "alice", id)
	requireCode(t, err, CodeNotInteractive)
	requireCode(t, m.cancel(t.Context(), "alice", id, ""), CodeNotInteractive)
}
