package taskstore

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newStore(t *testing.T, opts Options) *Store {
	t.Helper()
	if opts.MaxTasks == 0 {
		opts.MaxTasks = 16
	}
	if opts.MaxPerOwner == 0 {
		opts.MaxPerOwner = 8
	}
	s := New(opts)
	t.Cleanup(s.Close)
	return s
}

// block is work that waits until its task is cancelled or release closes,
// then completes with "done".
func block(release <-chan struct{}) func(*Run) {
	return func(r *Run) {
		select {
		case <-release:
			r.Complete(json.RawMessage(`"done"`), "finished")
		case <-r.Context().Done():
		}
	}
}

func wait(t *testing.T, s *Store, owner, id string) Snapshot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	snap, err := s.Wait(ctx, owner, id)
	require.NoError(t, err)
	return snap
}

func TestLifecycle(t *testing.T) {
	s := newStore(t, Options{})
	release := make(chan struct{})
	snap, err := s.Start("alice", time.Minute, "running", block(release))
	require.NoError(t, err)
	assert.Len(t, snap.ID, 32, "128 random bits in hex")
	assert.Equal(t, Working, snap.Status)
	assert.Equal(t, "running", snap.Message)
	assert.Equal(t, time.Minute, snap.TTL)

	got, err := s.Get("alice", snap.ID)
	require.NoError(t, err, "a task can be looked up as soon as Start returns")
	assert.Equal(t, Working, got.Status)

	close(release)
	done := wait(t, s, "alice", snap.ID)
	assert.Equal(t, Completed, done.Status)
	assert.JSONEq(t, `"done"`, string(done.Result))
	assert.False(t, done.Updated.Before(done.Created))

	_, err = s.Cancel("alice", snap.ID, "too late")
	assert.ErrorIs(t, err, ErrTerminal, "an ended task stays as it ended")
	again, _ := s.Get("alice", snap.ID)
	assert.Equal(t, Completed, again.Status)
}

func TestOtherOwnersSeeNothing(t *testing.T) {
	s := newStore(t, Options{})
	snap, err := s.Start("alice", time.Minute, "", block(nil))
	require.NoError(t, err)
	_, err = s.Get("mallory", snap.ID)
	assert.ErrorIs(t, err, ErrNotFound)
	_, err = s.Cancel("mallory", snap.ID, "")
	assert.ErrorIs(t, err, ErrNotFound)
	assert.ErrorIs(t, s.Update("mallory", snap.ID, nil), ErrNotFound)
	_, err = s.Wait(context.Background(), "mallory", snap.ID)
	assert.ErrorIs(t, err, ErrNotFound)
	page, _ := s.List("mallory", "", 10)
	assert.Empty(t, page)
	got, err := s.Get("alice", snap.ID)
	require.NoError(t, err)
	assert.Equal(t, Working, got.Status, "the owner's task is untouched")
}

func TestCancelStopsTheWork(t *testing.T) {
	s := newStore(t, Options{})
	stopped := make(chan error, 1)
	snap, err := s.Start("alice", time.Minute, "", func(r *Run) {
		<-r.Context().Done()
		stopped <- context.Cause(r.Context())
		r.Complete(json.RawMessage(`"late"`), "") // too late: the task stays cancelled
	})
	require.NoError(t, err)
	c, err := s.Cancel("alice", snap.ID, "by the client")
	require.NoError(t, err)
	assert.Equal(t, Cancelled, c.Status)
	assert.Equal(t, "by the client", c.Message)
	select {
	case cause := <-stopped:
		assert.ErrorIs(t, cause, errCancelled)
	case <-time.After(10 * time.Second):
		t.Fatal("the work was not told to stop")
	}
	done := wait(t, s, "alice", snap.ID)
	assert.Equal(t, Cancelled, done.Status)
	assert.Nil(t, done.Result)
}

func TestLimits(t *testing.T) {
	s := newStore(t, Options{MaxTasks: 3, MaxPerOwner: 2})
	for range 2 {
		_, err := s.Start("alice", time.Minute, "", block(nil))
		require.NoError(t, err)
	}
	_, err := s.Start("alice", time.Minute, "", block(nil))
	var le *LimitError
	require.ErrorAs(t, err, &le)
	assert.True(t, le.PerOwner)
	assert.Equal(t, 2, le.Limit)

	_, err = s.Start("bob", time.Minute, "", block(nil))
	require.NoError(t, err)
	_, err = s.Start("carol", time.Minute, "", block(nil))
	require.ErrorAs(t, err, &le)
	assert.False(t, le.PerOwner, "the bound on all tasks")
	assert.Equal(t, 3, s.Len())
}

func TestExpiry(t *testing.T) {
	s := newStore(t, Options{MaxTasks: 1, MaxPerOwner: 1})
	stopped := make(chan error, 1)
	snap, err := s.Start("alice", 10*time.Millisecond, "", func(r *Run) {
		<-r.Context().Done()
		stopped <- context.Cause(r.Context())
	})
	require.NoError(t, err)
	assert.Equal(t, MinTTL, snap.TTL, "a shorter life is raised to MinTTL")
	select {
	case cause := <-stopped:
		assert.ErrorIs(t, cause, errExpired, "a task still running at its ttl is cancelled")
	case <-time.After(10 * time.Second):
		t.Fatal("the task's work outlived its ttl")
	}
	require.Eventually(t, func() bool {
		_, err := s.Get("alice", snap.ID)
		return errors.Is(err, ErrNotFound)
	}, 10*time.Second, 10*time.Millisecond, "an expired task is gone")
	// Its room is free again.
	_, err = s.Start("alice", time.Minute, "", block(nil))
	require.NoError(t, err)
}

func TestExpiredRecordsMakeRoom(t *testing.T) {
	s := newStore(t, Options{MaxTasks: 1, MaxPerOwner: 1})
	snap, err := s.Start("alice", MinTTL, "", func(r *Run) { r.Complete(json.RawMessage(`1`), "") })
	require.NoError(t, err)
	wait(t, s, "alice", snap.ID)
	_, err = s.Start("bob", time.Minute, "", block(nil))
	var le *LimitError
	require.ErrorAs(t, err, &le, "a finished task holds its room until it expires")
	require.Eventually(t, func() bool {
		_, err := s.Start("bob", time.Minute, "", block(nil))
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "the expired task is dropped to make room")
}

func TestAskAndPartialUpdates(t *testing.T) {
	s := newStore(t, Options{})
	got := make(chan map[string]json.RawMessage, 1)
	snap, err := s.Start("alice", time.Minute, "working", func(r *Run) {
		answers, err := r.Ask(map[string]json.RawMessage{"a": json.RawMessage(`{"q":1}`), "b": json.RawMessage(`{"q":2}`)}, "two questions")
		if err != nil {
			return
		}
		got <- answers
		r.Complete(json.RawMessage(`"ok"`), "")
	})
	require.NoError(t, err)
	var asked Snapshot
	require.Eventually(t, func() bool {
		asked, _ = s.Get("alice", snap.ID)
		return asked.Status == InputRequired
	}, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, "two questions", asked.Message)
	assert.Len(t, asked.Input, 2)

	// An unknown key is ignored; a known one is taken and withdrawn.
	require.NoError(t, s.Update("alice", snap.ID, map[string]json.RawMessage{"zz": json.RawMessage(`1`), "a": json.RawMessage(`"A"`)}))
	partial, err := s.Get("alice", snap.ID)
	require.NoError(t, err)
	assert.Equal(t, InputRequired, partial.Status, "still waiting for b")
	assert.Equal(t, []string{"b"}, keys(partial.Input))
	// Answering a withdrawn key again changes nothing.
	require.NoError(t, s.Update("alice", snap.ID, map[string]json.RawMessage{"a": json.RawMessage(`"again"`)}))

	require.NoError(t, s.Update("alice", snap.ID, map[string]json.RawMessage{"b": json.RawMessage(`"B"`)}))
	select {
	case answers := <-got:
		assert.Equal(t, map[string]json.RawMessage{"a": json.RawMessage(`"A"`), "b": json.RawMessage(`"B"`)}, answers)
	case <-time.After(10 * time.Second):
		t.Fatal("the work never got its answers")
	}
	done := wait(t, s, "alice", snap.ID)
	assert.Equal(t, Completed, done.Status)
	assert.Nil(t, done.Input)
}

func keys(m map[string]json.RawMessage) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestCancelWhileAsking(t *testing.T) {
	s := newStore(t, Options{})
	askErr := make(chan error, 1)
	snap, err := s.Start("alice", time.Minute, "", func(r *Run) {
		_, err := r.Ask(map[string]json.RawMessage{"a": json.RawMessage(`{}`)}, "?")
		askErr <- err
	})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		g, _ := s.Get("alice", snap.ID)
		return g.Status == InputRequired
	}, 10*time.Second, 5*time.Millisecond)
	_, err = s.Cancel("alice", snap.ID, "no")
	require.NoError(t, err)
	select {
	case err := <-askErr:
		assert.ErrorIs(t, err, errCancelled)
	case <-time.After(10 * time.Second):
		t.Fatal("Ask did not return on cancel")
	}
	g, _ := s.Get("alice", snap.ID)
	assert.Equal(t, Cancelled, g.Status)
	assert.Nil(t, g.Input)
}

func TestWorkThatEndsWithoutAResultFails(t *testing.T) {
	s := newStore(t, Options{})
	snap, err := s.Start("alice", time.Minute, "", func(*Run) {})
	require.NoError(t, err)
	done := wait(t, s, "alice", snap.ID)
	assert.Equal(t, Failed, done.Status)
	require.NotNil(t, done.Error)
	assert.EqualValues(t, -32603, done.Error.Code)

	snap, err = s.Start("alice", time.Minute, "", func(*Run) { panic("boom") })
	require.NoError(t, err)
	done = wait(t, s, "alice", snap.ID)
	assert.Equal(t, Failed, done.Status)
	assert.Contains(t, done.Error.Message, "boom")
}

func TestListPages(t *testing.T) {
	s := newStore(t, Options{})
	var ids []string
	for range 5 {
		snap, err := s.Start("alice", time.Minute, "", block(nil))
		require.NoError(t, err)
		ids = append(ids, snap.ID)
	}
	_, err := s.Start("bob", time.Minute, "", block(nil))
	require.NoError(t, err)
	var seen []string
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 5)
		page, next := s.List("alice", cursor, 2)
		for _, p := range page {
			seen = append(seen, p.ID)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	assert.ElementsMatch(t, ids, seen, "every task of alice's, once, and none of bob's")
	page, next := s.List("alice", "not-a-cursor", 2)
	assert.Empty(t, page)
	assert.Empty(t, next)
}

func TestPrefixAndClose(t *testing.T) {
	s := New(Options{MaxTasks: 4, MaxPerOwner: 4, Prefix: func() string { return "node-a" }})
	stopped := make(chan struct{})
	snap, err := s.Start("alice", time.Minute, "", func(r *Run) {
		<-r.Context().Done()
		close(stopped)
	})
	require.NoError(t, err)
	assert.Regexp(t, `^node-a\.[0-9a-f]{32}$`, snap.ID)
	s.Close() // waits for the work
	select {
	case <-stopped:
	default:
		t.Fatal("Close returned before the task's work ended")
	}
	_, err = s.Start("alice", time.Minute, "", block(nil))
	assert.ErrorIs(t, err, ErrClosed)
	s.Close() // idempotent
}

func TestWaitEndsWithItsContext(t *testing.T) {
	s := newStore(t, Options{})
	snap, err := s.Start("alice", time.Minute, "", block(nil))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = s.Wait(ctx, "alice", snap.ID)
	assert.ErrorIs(t, err, context.Canceled)
}
