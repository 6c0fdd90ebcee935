package metrics

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/device"
)

// fakeClock is a clock a test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestRecentIntervals: calls land in the interval they ended in; each
// interval has its counts and percentiles; the snapshot always spans the
// whole window, oldest first, empty intervals included.
func TestRecentIntervals(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)} // on a 10 s boundary
	r := NewRecent(10*time.Second, time.Minute, clk.now)
	young := r.Snapshot().LastMinute
	assert.Equal(t, 1.0, young.Seconds, "a ring just started covers at least 1 s")
	clk.add(2 * time.Minute) // old enough for a whole minute

	for i := range 100 { // 1..100 ms, two of them failing
		r.Record(time.Duration(i+1)*time.Millisecond, i%50 == 0)
	}
	clk.add(10 * time.Second)
	r.Record(3*time.Second, true)
	clk.add(2 * time.Second)

	s := r.Snapshot()
	assert.Equal(t, 10.0, s.IntervalS)
	assert.Equal(t, 60.0, s.WindowS)
	require.Len(t, s.Intervals, 6)
	for i := 1; i < len(s.Intervals); i++ {
		assert.Equal(t, 10*time.Second, s.Intervals[i].Start.Sub(s.Intervals[i-1].Start), "evenly spaced")
	}
	last, prev := s.Intervals[5], s.Intervals[4]
	assert.Equal(t, clk.now().Add(-2*time.Second).UTC(), last.Start, "the last interval is the running one")
	assert.EqualValues(t, 1, last.Calls)
	assert.EqualValues(t, 1, last.Errors)
	assert.Equal(t, 3000.0, *last.P50MS, "one call: its own duration")
	assert.EqualValues(t, 100, prev.Calls)
	assert.EqualValues(t, 2, prev.Errors)
	assert.InDelta(t, 50, *prev.P50MS, 50*0.13, "p50 within the bucket's precision")
	assert.InDelta(t, 99, *prev.P99MS, 99*0.13)
	for _, iv := range s.Intervals[:4] {
		assert.Zero(t, iv.Calls)
		assert.Nil(t, iv.P50MS, "no calls, no percentile")
	}
	assert.EqualValues(t, 101, s.LastMinute.Calls)
	assert.EqualValues(t, 3, s.LastMinute.Errors)
	assert.Equal(t, 52.0, s.LastMinute.Seconds, "five whole intervals and 2 s of the running one")
	assert.InDelta(t, 101.0/52, s.LastMinute.RatePerS, 0.001)
	assert.InDelta(t, 100, *s.LastMinute.P99MS, 100*0.13, "the 100th of 101 calls")

	r = NewRecent(10*time.Second, time.Minute, clk.now)
	clk.add(5 * time.Second)
	r.Record(time.Millisecond, false)
	assert.Equal(t, 5.0, r.Snapshot().LastMinute.Seconds, "a bridge 5 s old: its minute is 5 s long")
	assert.Equal(t, 0.2, r.Snapshot().LastMinute.RatePerS)
}

// TestRecentRotation: an interval that fell out of the window is gone,
// although its slot is reused only when a later call lands in it; memory
// stays at one slot per interval of the window.
func TestRecentRotation(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	r := NewRecent(10*time.Second, 30*time.Second, clk.now)
	require.Len(t, r.slots, 3)

	r.Record(time.Millisecond, false)
	clk.add(20 * time.Second)
	s := r.Snapshot()
	assert.EqualValues(t, 1, s.Intervals[0].Calls, "20 s later the call is still in the window")

	clk.add(10 * time.Second) // the call's slot is now the running one's, untouched
	s = r.Snapshot()
	for _, iv := range s.Intervals {
		assert.Zero(t, iv.Calls, "30 s later the call left the window")
	}
	r.Record(2*time.Millisecond, true) // reuses the slot
	s = r.Snapshot()
	assert.EqualValues(t, 1, s.Intervals[2].Calls)
	assert.EqualValues(t, 1, s.Intervals[2].Errors)
	assert.Equal(t, 2.0, *s.Intervals[2].P50MS, "the old call's counts were dropped with it")

	for range 1000 { // far past the window: still three slots, three intervals
		clk.add(7 * time.Second)
		r.Record(time.Millisecond, false)
	}
	assert.Len(t, r.slots, 3)
	assert.Len(t, r.Snapshot().Intervals, 3)
}

// TestRecentBuckets: durations map to buckets in order, from the smallest
// to the overflow one, and an estimate stays within its bucket.
func TestRecentBuckets(t *testing.T) {
	assert.Equal(t, 0, recentBucket(0))
	assert.Equal(t, 0, recentBucket(recentMin))
	assert.Equal(t, recentBuckets-1, recentBucket(time.Hour))
	prev := 0
	for d := time.Microsecond; d < 200*time.Second; d = d * 11 / 10 {
		b := recentBucket(d)
		assert.GreaterOrEqual(t, b, prev, d.String())
		prev = b
	}
	assert.Equal(t, recentBuckets-1, prev, "200 s reaches the overflow bucket")
	var s recentSlot
	s.calls, s.min, s.max = 1, time.Millisecond, time.Hour
	s.hist[recentBucket(7*time.Millisecond)] = 1
	assert.InDelta(t, 7, *s.quantileMS(0.5), 7*0.13)
}

// TestCallDoneFeedsRecent: every call the Hub reports lands in the ring,
// failures counted as errors.
func TestCallDoneFeedsRecent(t *testing.T) {
	m := New(Options{})
	m.CallDone("websocket", "", 4*time.Millisecond)
	m.CallDone("", device.CodeUnknownDevice, time.Millisecond)
	s := m.Recent().Snapshot()
	assert.EqualValues(t, 2, s.LastMinute.Calls)
	assert.EqualValues(t, 1, s.LastMinute.Errors)
	assert.Len(t, s.Intervals, int(DefaultRecentWindow/DefaultRecentInterval))
}
