package metrics

// This file keeps the recent past of tool calls in a fixed ring of short
// intervals (by default 10 s each, for the last 15 minutes): calls,
// failures and their latency percentiles, per interval. The web console
// draws its plots from it (GET /api/stats/recent), so a page opened now
// shows the last minutes, not only what happened since it opened.
// Prometheus (/metrics) remains the place for anything longer.

import (
	"math"
	"sync"
	"time"
)

// Defaults of the recent-calls ring.
const (
	DefaultRecentInterval = 10 * time.Second
	DefaultRecentWindow   = 15 * time.Minute
)

// Latency buckets of one interval: geometric, from recentMin by a factor
// of recentGrowth, so a percentile is known to within about 12 %; the
// last bucket holds everything slower.
const (
	recentMin     = 50 * time.Microsecond
	recentGrowth  = 1.25
	recentBuckets = 68 // 50 µs · 1.25^66 ≈ 125 s, then the overflow bucket
)

// recentSlot is one interval's counts. index is the interval it holds
// (time since the epoch divided by the interval length); a slot whose
// index is not the one asked for is stale and reads as empty.
type recentSlot struct {
	index    int64
	calls    int64
	errors   int64
	min, max time.Duration
	hist     [recentBuckets]uint32
}

// Recent is the ring. Its memory is fixed at creation (window / interval
// slots); Record and Snapshot are safe for concurrent use.
type Recent struct {
	interval time.Duration
	now      func() time.Time
	start    time.Time // the ring began counting: no minute reaches back further

	mu    sync.Mutex
	slots []recentSlot
}

// NewRecent keeps window of calls in slots of interval (defaults for zero
// or negative values; window is rounded up to whole intervals). now is the
// clock, nil for time.Now.
func NewRecent(interval, window time.Duration, now func() time.Time) *Recent {
	if interval <= 0 {
		interval = DefaultRecentInterval
	}
	if window <= 0 {
		window = DefaultRecentWindow
	}
	if now == nil {
		now = time.Now
	}
	n := int((window + interval - 1) / interval)
	r := &Recent{interval: interval, now: now, start: now(), slots: make([]recentSlot, n)}
	for i := range r.slots {
		r.slots[i].index = -1
	}
	return r
}

// Record counts one finished call: how long it took and whether it failed.
func (r *Recent) Record(took time.Duration, failed bool) {
	idx := r.now().UnixNano() / int64(r.interval)
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &r.slots[idx%int64(len(r.slots))]
	if s.index != idx {
		*s = recentSlot{index: idx}
	}
	s.calls++
	if failed {
		s.errors++
	}
	if s.calls == 1 || took < s.min {
		s.min = took
	}
	s.max = max(s.max, took)
	s.hist[recentBucket(took)]++
}

// recentBucket is the bucket of a duration.
func recentBucket(d time.Duration) int {
	if d <= recentMin {
		return 0
	}
	b := int(math.Ceil(math.Log(float64(d)/float64(recentMin)) / math.Log(recentGrowth)))
	return min(b, recentBuckets-1)
}

// RecentInterval is one interval of a snapshot. Start is when it began;
// the last interval of a snapshot is still running. P50MS and P99MS are
// absent when there was no call.
type RecentInterval struct {
	Start  time.Time `json:"start"`
	Calls  int64     `json:"calls"`
	Errors int64     `json:"errors"`
	P50MS  *float64  `json:"p50_ms,omitempty"`
	P99MS  *float64  `json:"p99_ms,omitempty"`
}

// RecentSummary sums the intervals of the last minute (the running one
// included): what the console's header shows. Seconds is the time they
// cover: less than a minute while the bridge is younger than that.
type RecentSummary struct {
	Seconds  float64  `json:"seconds"`
	Calls    int64    `json:"calls"`
	Errors   int64    `json:"errors"`
	RatePerS float64  `json:"rate_per_s"`
	P50MS    *float64 `json:"p50_ms,omitempty"`
	P99MS    *float64 `json:"p99_ms,omitempty"`
}

// RecentSnapshot is GET /api/stats/recent: every interval of the window,
// oldest first, empty ones included, so that the intervals are evenly
// spaced.
type RecentSnapshot struct {
	IntervalS  float64          `json:"interval_s"`
	WindowS    float64          `json:"window_s"`
	Now        time.Time        `json:"now"`
	Intervals  []RecentInterval `json:"intervals"`
	LastMinute RecentSummary    `json:"last_minute"`
}

// Snapshot reads the ring.
func (r *Recent) Snapshot() RecentSnapshot {
	now := r.now()
	cur := now.UnixNano() / int64(r.interval)
	n := int64(len(r.slots))
	snap := RecentSnapshot{IntervalS: r.interval.Seconds(), WindowS: (time.Duration(n) * r.interval).Seconds(), Now: now.UTC(),
		Intervals: make([]RecentInterval, 0, n)}
	// The last minute: whole intervals back from the running one.
	recentN := min(n, max(1, int64(time.Minute/r.interval)))
	var minute recentSlot
	r.mu.Lock()
	defer r.mu.Unlock()
	for idx := cur - n + 1; idx <= cur; idx++ {
		iv := RecentInterval{Start: time.Unix(0, idx*int64(r.interval)).UTC()}
		if idx >= 0 {
			if s := &r.slots[idx%n]; s.index == idx {
				iv.Calls, iv.Errors = s.calls, s.errors
				iv.P50MS, iv.P99MS = s.quantileMS(0.5), s.quantileMS(0.99)
				if idx > cur-recentN {
					minute.merge(s)
				}
			}
		}
		snap.Intervals = append(snap.Intervals, iv)
	}
	// The running interval counts only as far as it has run, and a bridge
	// that started less than a minute ago only since it started.
	secs := (time.Duration(recentN-1)*r.interval + time.Duration(now.UnixNano()-cur*int64(r.interval))).Seconds()
	secs = max(min(secs, now.Sub(r.start).Seconds()), 1)
	snap.LastMinute = RecentSummary{Seconds: math.Round(secs*10) / 10, Calls: minute.calls, Errors: minute.errors,
		RatePerS: math.Round(float64(minute.calls)/secs*1000) / 1000,
		P50MS:    minute.quantileMS(0.5), P99MS: minute.quantileMS(0.99)}
	return snap
}

// merge adds o's counts to s.
func (s *recentSlot) merge(o *recentSlot) {
	if o.calls == 0 {
		return
	}
	if s.calls == 0 || o.min < s.min {
		s.min = o.min
	}
	s.max = max(s.max, o.max)
	s.calls += o.calls
	s.errors += o.errors
	for i, c := range o.hist {
		s.hist[i] += c
	}
}

// quantileMS estimates the q quantile in milliseconds: the geometric
// middle of the bucket it falls in, kept within the slot's fastest and
// slowest call. Nil without calls.
func (s *recentSlot) quantileMS(q float64) *float64 {
	if s.calls == 0 {
		return nil
	}
	rank := int64(math.Ceil(q * float64(s.calls)))
	var seen int64
	b := recentBuckets - 1
	for i, c := range s.hist {
		seen += int64(c)
		if seen >= rank {
			b = i
			break
		}
	}
	v := float64(recentMin)
	if b > 0 {
		v *= math.Pow(recentGrowth, float64(b)-0.5)
	}
	d := min(max(time.Duration(v), s.min), s.max)
	ms := math.Round(float64(d.Microseconds())) / 1000
	return &ms
}
