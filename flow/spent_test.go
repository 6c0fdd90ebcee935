package flow

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMemorySpentExpiry(t *testing.T) {
	c := newClock()
	m := NewMemorySpent(0, c.Now)
	ctx := t.Context()
	until := c.Now().Add(time.Minute)

	first, prior, err := m.Spend(ctx, "k", UseAnswered, until)
	require.NoError(t, err)
	assert.True(t, first)
	assert.Empty(t, prior)
	first, prior, err = m.Spend(ctx, "k", UseCancelled, until)
	require.NoError(t, err)
	assert.False(t, first)
	assert.Equal(t, UseAnswered, prior, "the first use is kept")
	use, err := m.Spent(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, UseAnswered, use)
	use, err = m.Spent(ctx, "other")
	require.NoError(t, err)
	assert.Empty(t, use)

	// Live up to and including its expiry (a token is still accepted at
	// its deadline), gone after.
	c.Advance(time.Minute)
	first, _, err = m.Spend(ctx, "k", UseAnswered, until)
	require.NoError(t, err)
	assert.False(t, first)
	c.Advance(time.Millisecond)
	use, err = m.Spent(ctx, "k")
	require.NoError(t, err)
	assert.Empty(t, use)
	assert.Equal(t, 0, m.Len())
	first, _, err = m.Spend(ctx, "k", UseAnswered, c.Now().Add(time.Minute))
	require.NoError(t, err)
	assert.True(t, first)
}

func TestMemorySpentBound(t *testing.T) {
	c := newClock()
	m := NewMemorySpent(3, c.Now)
	ctx := t.Context()
	for i := range 3 {
		first, _, err := m.Spend(ctx, fmt.Sprint("k", i), UseAnswered, c.Now().Add(time.Duration(i+1)*time.Minute))
		require.NoError(t, err)
		require.True(t, first)
	}
	// Full: refused rather than forgetting a live entry; a key already
	// there is still answered.
	_, _, err := m.Spend(ctx, "k3", UseAnswered, c.Now().Add(time.Hour))
	require.ErrorIs(t, err, ErrSpentFull)
	first, prior, err := m.Spend(ctx, "k0", UseAnswered, c.Now().Add(time.Hour))
	require.NoError(t, err)
	assert.False(t, first)
	assert.Equal(t, UseAnswered, prior)

	// Once the earliest entry expires there is room again.
	c.Advance(time.Minute + time.Millisecond)
	first, _, err = m.Spend(ctx, "k3", UseAnswered, c.Now().Add(time.Hour))
	require.NoError(t, err)
	assert.True(t, first)
	assert.Equal(t, 3, m.Len())
	use, err := m.Spent(ctx, "k0")
	require.NoError(t, err)
	assert.Empty(t, use)
}

func TestMemorySpentConcurrent(t *testing.T) {
	m := NewMemorySpent(0, nil)
	const n = 64
	var wins atomic.Int32
	var wg sync.WaitGroup
	priors := make(chan string, n)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			first, prior, err := m.Spend(context.Background(), "same", fmt.Sprint("use", i), time.Now().Add(time.Minute))
			assert.NoError(t, err)
			if first {
				wins.Add(1)
				return
			}
			priors <- prior
		})
	}
	close(start)
	wg.Wait()
	close(priors)
	assert.Equal(t, int32(1), wins.Load(), "exactly one first spend")
	winner, err := m.Spent(context.Background(), "same")
	require.NoError(t, err)
	for p := range priors {
		assert.Equal(t, winner, p, "every loser sees the winner's use")
	}
}

// replicas are two engines with the same secret and one shared store: a
// fleet of two bridges, as far as flow/ can tell.
func replicas(t *testing.T, store SpentStore) (*fixture, *Engine) {
	t.Helper()
	f := newFixture(t, Options{Secret: secret, Spent: store})
	other, err := NewEngine(Options{Lookup: f.reg.lookup, Now: f.clock.Now, Secret: secret, Spent: store})
	require.NoError(t, err)
	t.Cleanup(other.Close)
	return f, other
}

func TestTokenReplayOnAnotherReplica(t *testing.T) {
	f, other := replicas(t, NewMemorySpent(0, newClock().Now))
	ctx := t.Context()

	// Answered (and run) on one replica; the same token on the other runs
	// nothing.
	st := start(t, f, "alice", "self.audio_speaker.set_volume", `{}`)
	done, err := f.eng.Respond(ctx, "alice", st.SessionID, raw(`40`))
	require.NoError(t, err)
	require.Equal(t, StateCompleted, done.State)
	_, err = other.Respond(ctx, "alice", st.SessionID, raw(`41`))
	fe := requireCode(t, err, CodeInvalidStateTransition)
	assert.Contains(t, fe.Message, "completed")
	assert.Equal(t, []string{`{"volume":40}`}, f.calls.list())
	requireCode(t, other.Cancel(ctx, "alice", st.SessionID, ""), CodeInvalidStateTransition)
	snap, err := other.GetState(ctx, "alice", st.SessionID)
	require.NoError(t, err)
	assert.Equal(t, StateCompleted, snap.State, "the end is known on every replica")

	// An intermediate token is consumed by its answer, refused ones
	// included: replaying it elsewhere is refused, and the interaction
	// goes on with the latest token only.
	f.reg.set(recordingTool("wizard", `{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0,"maximum":150}},"required":["name","age"]}`, f.calls))
	st = start(t, f, "alice", "wizard", `{}`)
	tok1 := st.SessionID
	st, err = f.eng.Respond(ctx, "alice", tok1, raw(`"Ann"`))
	require.NoError(t, err)
	tok2 := st.SessionID
	_, err = other.Respond(ctx, "alice", tok1, raw(`"Bob"`))
	fe = requireCode(t, err, CodeInvalidStateTransition)
	assert.Contains(t, fe.Message, "already answered")
	assert.Contains(t, fe.Message, "latest")
	st, err = other.Respond(ctx, "alice", tok2, raw(`200`))
	require.NoError(t, err)
	require.False(t, *st.Accepted)
	_, err = f.eng.Respond(ctx, "alice", tok2, raw(`42`))
	requireCode(t, err, CodeInvalidStateTransition)
	tok3 := st.SessionID

	// Cancelled with an old token on one replica: the interaction is
	// cancelled everywhere; a second cancel is ALREADY_CANCELLED.
	require.NoError(t, other.Cancel(ctx, "alice", tok1, "changed my mind"))
	_, err = f.eng.Respond(ctx, "alice", tok3, raw(`42`))
	fe = requireCode(t, err, CodeInvalidStateTransition)
	assert.Contains(t, fe.Message, "cancelled")
	requireCode(t, f.eng.Cancel(ctx, "alice", tok3, ""), CodeAlreadyCancelled)
	requireCode(t, other.Cancel(ctx, "alice", tok3, ""), CodeAlreadyCancelled)
	snap, err = f.eng.GetState(ctx, "alice", tok3)
	require.NoError(t, err)
	assert.Equal(t, StateCancelled, snap.State)
	assert.Nil(t, snap.CurrentPrompt)
	assert.Len(t, f.calls.list(), 1, "only the first set_volume ran")

	// Cancel with the current token on one replica, then on the other.
	st = start(t, f, "alice", "self.audio_speaker.set_volume", `{}`)
	require.NoError(t, f.eng.Cancel(ctx, "alice", st.SessionID, ""))
	requireCode(t, other.Cancel(ctx, "alice", st.SessionID, ""), CodeAlreadyCancelled)
	_, err = other.Respond(ctx, "alice", st.SessionID, raw(`40`))
	requireCode(t, err, CodeInvalidStateTransition)
	assert.Len(t, f.calls.list(), 1)
}

// TestTokenConcurrentReplay: the same token answered on two replicas at
// once runs the tool once.
func TestTokenConcurrentReplay(t *testing.T) {
	f, other := replicas(t, NewMemorySpent(0, newClock().Now))
	engines := []*Engine{f.eng, other}
	for range 20 {
		st := start(t, f, "alice", "self.audio_speaker.set_volume", `{}`)
		var ok atomic.Int32
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				step, err := engines[i%2].Respond(context.Background(), "alice", st.SessionID, raw(`40`))
				if err == nil {
					assert.Equal(t, StateCompleted, step.State)
					ok.Add(1)
					return
				}
				var fe *Error
				assert.True(t, errors.As(err, &fe) && fe.Code == CodeInvalidStateTransition, "%v", err)
			})
		}
		wg.Wait()
		assert.Equal(t, int32(1), ok.Load())
	}
	assert.Len(t, f.calls.list(), 20)
}

// TestTokenCancelOnAnotherReplicaWhileRunning: a cancel elsewhere cannot
// stop the call, but its outcome is discarded, as for a local cancel.
func TestTokenCancelOnAnotherReplicaWhileRunning(t *testing.T) {
	f, other := replicas(t, NewMemorySpent(0, newClock().Now))
	b := newBlockingTool(f, "slow", volumeSchema)
	st := start(t, f, "alice", "slow", `{}`)
	done := make(chan *Step, 1)
	go func() {
		got, err := f.eng.Respond(context.Background(), "alice", st.SessionID, raw(`40`))
		assert.NoError(t, err)
		done <- got
	}()
	<-b.started
	require.NoError(t, other.Cancel(t.Context(), "alice", st.SessionID, "stop"))
	requireCode(t, other.Cancel(t.Context(), "alice", st.SessionID, "stop"), CodeAlreadyCancelled)
	close(b.release)
	got := <-done
	assert.Equal(t, StateCancelled, got.State)
	assert.Contains(t, got.Summary, "discarded")
	snap, err := other.GetState(t.Context(), "alice", got.SessionID)
	require.NoError(t, err)
	assert.Equal(t, StateCancelled, snap.State)
}

// flakyStore fails while down is set.
type flakyStore struct {
	SpentStore
	down atomic.Bool
}

var errDown = errors.New("nats: no responders available for request")

func (s *flakyStore) Spend(ctx context.Context, key, use string, until time.Time) (bool, string, error) {
	if s.down.Load() {
		return false, "", errDown
	}
	return s.SpentStore.Spend(ctx, key, use, until)
}

func (s *flakyStore) Spent(ctx context.Context, key string) (string, error) {
	if s.down.Load() {
		return "", errDown
	}
	return s.SpentStore.Spent(ctx, key)
}

// TestTokenReplayStoreDown: without its store the engine fails closed,
// with a retryable error, and consumes nothing.
func TestTokenReplayStoreDown(t *testing.T) {
	store := &flakyStore{SpentStore: NewMemorySpent(0, nil)}
	f := newFixture(t, Options{Secret: secret, Spent: store})
	ctx := t.Context()
	st := start(t, f, "alice", "self.audio_speaker.set_volume", `{}`)

	store.down.Store(true)
	_, err := f.eng.Respond(ctx, "alice", st.SessionID, raw(`40`))
	require.ErrorIs(t, err, ErrReplayCheck)
	require.ErrorContains(t, err, "retry")
	require.ErrorContains(t, err, errDown.Error())
	require.ErrorIs(t, f.eng.Cancel(ctx, "alice", st.SessionID, ""), ErrReplayCheck)
	_, err = f.eng.GetState(ctx, "alice", st.SessionID)
	require.ErrorIs(t, err, ErrReplayCheck)
	assert.Empty(t, f.calls.list(), "nothing runs without the check")

	store.down.Store(false)
	done, err := f.eng.Respond(ctx, "alice", st.SessionID, raw(`40`))
	require.NoError(t, err, "the failed attempt consumed nothing")
	assert.Equal(t, StateCompleted, done.State)
	assert.Len(t, f.calls.list(), 1)
}
