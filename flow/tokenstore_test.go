package flow

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

func newTestTokenStore(c *clock, spent SpentStore) *tokenStore {
	return newTokenStore(secret, spent, time.Minute, c.Now, zap.NewNop())
}

// startToken opens an interaction for owner that waits for an answer, and
// returns its first token.
func startToken(t *testing.T, s *tokenStore, c *clock, owner string) string {
	t.Helper()
	rec := newRecord(c)
	ent, err := s.open(owner, rec, 1, nowMS(c.Now()), func() {})
	require.NoError(t, err)
	assert.Nil(t, ent, "nothing is kept for a waiting interaction")
	tok, _, _, err := s.commit(t.Context(), owner, nil, waiting(rec), &Step{}, nil)
	require.NoError(t, err)
	return tok
}

// answerToken acquires and claims tok, and commits the next waiting step.
func answerToken(t *testing.T, s *tokenStore, owner, tok string) string {
	t.Helper()
	ent, work, err := s.acquire(owner, tok, func() {})
	require.NoError(t, err)
	require.NoError(t, s.claim(t.Context(), tok, ent, work))
	next, _, _, err := s.commit(t.Context(), owner, ent, waiting(work), &Step{}, nil)
	require.NoError(t, err)
	return next
}

func TestTokenStoreEachStepOnce(t *testing.T) {
	c := newClock()
	s := newTestTokenStore(c, NewMemorySpent(0, c.Now))
	tok := startToken(t, s, c, "alice")
	next := answerToken(t, s, "alice", tok)
	assert.NotEqual(t, tok, next)
	assert.Empty(t, s.counts(nowMS(c.Now())), "a waiting interaction leaves no marker")

	// The answered token acquires (it verifies) but cannot be claimed.
	ent, work, err := s.acquire("alice", tok, func() {})
	require.NoError(t, err)
	requireCode(t, s.claim(t.Context(), tok, ent, work), CodeInvalidStateTransition)
	s.release(ent)
	answerToken(t, s, "alice", next)
}

func TestTokenStoreMarkers(t *testing.T) {
	c := newClock()
	s := newTestTokenStore(c, NewMemorySpent(0, c.Now))
	tok := startToken(t, s, c, "alice")

	// While an answer is processed here, the same token is refused at once,
	// and getState says processing.
	ent, _, err := s.acquire("alice", tok, func() {})
	require.NoError(t, err)
	_, _, err = s.acquire("alice", tok, func() {})
	requireCode(t, err, CodeInvalidStateTransition)
	snap, err := s.get(t.Context(), "alice", tok)
	require.NoError(t, err)
	assert.Equal(t, StateProcessing, snap.State)
	assert.Equal(t, map[State]int{StateProcessing: 1}, s.counts(nowMS(c.Now())))

	// Released before its step was spent (the tool could not be found):
	// the marker goes, and the token can be answered.
	s.release(ent)
	assert.Empty(t, s.counts(nowMS(c.Now())))
	ent, work, err := s.acquire("alice", tok, func() {})
	require.NoError(t, err)
	require.NoError(t, s.claim(t.Context(), tok, ent, work))

	// The end is kept as a marker, and in the SpentStore.
	work.State = StateCompleted
	final, rec, _, err := s.commit(t.Context(), "alice", ent, work, &Step{State: StateCompleted}, nil)
	require.NoError(t, err)
	assert.Equal(t, StateCompleted, rec.State)
	assert.Equal(t, map[State]int{StateCompleted: 1}, s.counts(nowMS(c.Now())))
	snap, err = s.get(t.Context(), "alice", tok)
	require.NoError(t, err)
	assert.Equal(t, StateCompleted, snap.State, "an earlier token reads as the end")
	requireCode(t, s.cancel(t.Context(), "alice", final, "late"), CodeInvalidStateTransition)
}

func TestTokenStoreCancelAcrossReplicas(t *testing.T) {
	c := newClock()
	spent := NewMemorySpent(0, c.Now)
	a, b := newTestTokenStore(c, spent), newTestTokenStore(c, spent)
	tok := startToken(t, a, c, "alice")

	// Replica a processes an answer; b cancels with the same token.
	ent, work, err := a.acquire("alice", tok, func() {})
	require.NoError(t, err)
	require.NoError(t, a.claim(t.Context(), tok, ent, work))
	require.NoError(t, b.cancel(t.Context(), "alice", tok, "stop"))
	requireCode(t, b.cancel(t.Context(), "alice", tok, "again"), CodeAlreadyCancelled)

	// a could not be stopped, but its outcome is discarded.
	work.State = StateCompleted
	_, rec, step, err := a.commit(t.Context(), "alice", ent, work, &Step{State: StateCompleted}, nil)
	require.NoError(t, err)
	assert.Equal(t, StateCancelled, step.State)
	assert.Equal(t, StateCancelled, rec.State)
	snap, err := a.get(t.Context(), "alice", tok)
	require.NoError(t, err)
	assert.Equal(t, StateCancelled, snap.State)
}

func TestTokenStoreCancelStopsLocalAnswer(t *testing.T) {
	c := newClock()
	s := newTestTokenStore(c, NewMemorySpent(0, c.Now))
	tok := startToken(t, s, c, "alice")
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	ent, work, err := s.acquire("alice", tok, stop)
	require.NoError(t, err)
	require.NoError(t, s.claim(t.Context(), tok, ent, work))

	require.NoError(t, s.cancel(t.Context(), "alice", tok, "stop"))
	assert.ErrorIs(t, ctx.Err(), context.Canceled)
	work.State = StateCompleted
	_, rec, step, err := s.commit(t.Context(), "alice", ent, work, &Step{State: StateCompleted}, nil)
	require.NoError(t, err)
	assert.Equal(t, StateCancelled, step.State)
	assert.Contains(t, step.Summary, "stop")
	assert.Equal(t, "stop", rec.Reason)
}

func TestTokenStoreOwnerAndExpiry(t *testing.T) {
	c := newClock()
	s := newTestTokenStore(c, NewMemorySpent(0, c.Now))
	tok := startToken(t, s, c, "alice")
	_, _, err := s.acquire("bob", tok, func() {})
	requireCode(t, err, CodeSessionNotFound)
	_, err = s.get(t.Context(), "bob", tok)
	requireCode(t, err, CodeSessionNotFound)
	requireCode(t, s.cancel(t.Context(), "bob", tok, ""), CodeSessionNotFound)

	c.Advance(61 * time.Second)
	_, _, err = s.acquire("alice", tok, func() {})
	requireCode(t, err, CodeSessionExpired)
}

func TestTokenStoreClose(t *testing.T) {
	c := newClock()
	s := newTestTokenStore(c, NewMemorySpent(0, c.Now))
	tok := startToken(t, s, c, "alice")
	ent, work, err := s.acquire("alice", tok, func() {})
	require.NoError(t, err)
	s.close()
	_, _, _, err = s.commit(t.Context(), "alice", ent, work, &Step{}, nil)
	requireCode(t, err, CodeNotInteractive)
	_, err = s.open("alice", newRecord(c), 1, nowMS(c.Now()), func() {})
	requireCode(t, err, CodeNotInteractive)
	_, err = s.get(t.Context(), "alice", tok)
	requireCode(t, err, CodeNotInteractive)
}
