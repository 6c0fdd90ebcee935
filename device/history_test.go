package device

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func remoteEvent(id string) Event {
	return Event{Type: EventOnline, DeviceID: id, Info: Info{Identity: Identity{DeviceID: id}, Node: "n2"}}
}

func seqs(evs []Event) []uint64 {
	var out []uint64
	for _, ev := range evs {
		out = append(out, ev.Seq)
	}
	return out
}

// TestSubscribeAfter: the history replays exactly the events after the
// requested seq, the subscription delivers the later ones, and the bound
// holds: a seq the history no longer covers is refused.
func TestSubscribeAfter(t *testing.T) {
	h := NewHub(HubConfig{EventHistory: 4}, nil)
	defer h.Close(context.Background())
	assert.Len(t, h.Epoch(), 8)
	for _, id := range []string{"a", "b", "c", "d", "e", "f"} {
		h.PublishRemote(remoteEvent(id))
	}
	assert.Equal(t, 4, h.history.len(), "the ring holds its bound")

	sub, hist := h.SubscribeAfter(SubscribeOptions{}, 3)
	defer sub.Close()
	require.True(t, hist.Complete)
	assert.Equal(t, uint64(6), hist.Seq)
	assert.Equal(t, []uint64{4, 5, 6}, seqs(hist.Replay))
	assert.Equal(t, "d", hist.Replay[0].DeviceID)
	h.PublishRemote(remoteEvent("g"))
	<-sub.C()
	assert.Equal(t, []uint64{7}, seqs(sub.Next()), "live events follow the replay with no gap and no overlap")

	for _, after := range []uint64{1, 8, 100} { // evicted, or never published
		s, hist := h.SubscribeAfter(SubscribeOptions{}, after)
		s.Close()
		assert.False(t, hist.Complete, "after %d", after)
		assert.Empty(t, hist.Replay)
	}
	s, hist := h.SubscribeAfter(SubscribeOptions{}, 7)
	s.Close()
	assert.True(t, hist.Complete, "up to date: nothing to replay")
	assert.Empty(t, hist.Replay)

	none := NewHub(HubConfig{}, nil)
	defer none.Close(context.Background())
	s, hist = none.SubscribeAfter(SubscribeOptions{}, 0)
	s.Close()
	assert.False(t, hist.Complete, "no history kept: never complete")
}

// TestSubscribeAfterCalls: calls are recorded with a history even while
// nobody subscribes to them, and replayed only to subscriptions that ask.
func TestSubscribeAfterCalls(t *testing.T) {
	h := NewHub(HubConfig{EventHistory: 16}, nil)
	defer h.Close(context.Background())
	_, err := h.CallTool(context.Background(), "aa:bb:cc:dd:ee:ff", "self.x", nil)
	require.Error(t, err)
	h.PublishRemote(remoteEvent("a"))

	s, hist := h.SubscribeAfter(SubscribeOptions{Calls: true}, 0)
	s.Close()
	require.True(t, hist.Complete)
	require.Len(t, hist.Replay, 2)
	assert.Equal(t, EventCall, hist.Replay[0].Type)
	assert.Equal(t, "self.x", hist.Replay[0].Call.Tool)

	s, hist = h.SubscribeAfter(SubscribeOptions{}, 0)
	s.Close()
	assert.Equal(t, []uint64{2}, seqs(hist.Replay))
}

// TestResyncCarriesSeq: a backlog collapsed into EventResync carries the
// seq of the last event it stands for, so the subscriber can resume after it.
func TestResyncCarriesSeq(t *testing.T) {
	h := NewHub(HubConfig{SubscriptionBuffer: 2}, nil)
	defer h.Close(context.Background())
	sub := h.Subscribe()
	defer sub.Close()
	for _, id := range []string{"a", "b", "c", "d"} {
		h.PublishRemote(remoteEvent(id))
	}
	got := sub.Next()
	require.NotEmpty(t, got)
	assert.Equal(t, EventResync, got[0].Type)
	assert.Equal(t, uint64(3), got[0].Seq)
	assert.Equal(t, uint64(4), got[len(got)-1].Seq)
}

// TestSubscribeRecent: a new subscriber gets the newest n events held,
// oldest first and stamped with when they were published, then the live
// ones with no overlap; n past what is held gives all of it.
func TestSubscribeRecent(t *testing.T) {
	h := NewHub(HubConfig{EventHistory: 4}, nil)
	defer h.Close(context.Background())
	_, err := h.CallTool(context.Background(), "aa:bb:cc:dd:ee:ff", "self.x", nil)
	require.Error(t, err)
	for _, id := range []string{"a", "b", "c"} {
		h.PublishRemote(remoteEvent(id))
	}

	sub, hist := h.SubscribeRecent(SubscribeOptions{Calls: true}, 2)
	defer sub.Close()
	assert.True(t, hist.Complete)
	assert.Equal(t, uint64(4), hist.Seq)
	assert.Equal(t, []uint64{3, 4}, seqs(hist.Replay))
	assert.False(t, hist.Replay[0].At.IsZero(), "events carry the time they were published")
	h.PublishRemote(remoteEvent("d"))
	<-sub.C()
	assert.Equal(t, []uint64{5}, seqs(sub.Next()))

	s, hist := h.SubscribeRecent(SubscribeOptions{Calls: true}, 100)
	s.Close()
	assert.Equal(t, []uint64{2, 3, 4, 5}, seqs(hist.Replay), "the ring's bound, not n")
	s, hist = h.SubscribeRecent(SubscribeOptions{}, 100)
	s.Close()
	assert.Equal(t, []uint64{2, 3, 4, 5}, seqs(hist.Replay))
	s, hist = h.SubscribeRecent(SubscribeOptions{}, 0)
	s.Close()
	assert.Empty(t, hist.Replay)

	calls := NewHub(HubConfig{EventHistory: 4}, nil)
	defer calls.Close(context.Background())
	_, _ = calls.CallTool(context.Background(), "aa:bb:cc:dd:ee:ff", "self.x", nil)
	calls.PublishRemote(remoteEvent("a"))
	s, hist = calls.SubscribeRecent(SubscribeOptions{}, 10)
	s.Close()
	assert.Equal(t, []uint64{2}, seqs(hist.Replay), "calls only to subscriptions that ask for them")
}
