package tools

import (
	"sync"
	"time"
)

// rateLimiter is a set of token buckets, one per key (a session, or a
// client address for requests outside a session). Idle buckets are
// reclaimed lazily when the set grows, so it needs no goroutine.
type rateLimiter struct {
	rate  float64 // tokens per second
	burst float64

	mu        sync.Mutex
	buckets   map[string]*bucket
	sweepSize int // size at which the next sweep runs
}

type bucket struct {
	tokens float64
	last   time.Time
}

const minSweepSize = 1024

func newRateLimiter(rate float64, burst int) *rateLimiter {
	return &rateLimiter{rate: rate, burst: float64(burst), buckets: map[string]*bucket{}, sweepSize: minSweepSize}
}

// allow takes one token for key. When none is left it reports how long
// until one is.
func (l *rateLimiter) allow(key string, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[key]
	if b == nil {
		if len(l.buckets) >= l.sweepSize {
			l.sweep(now)
		}
		b = &bucket{tokens: l.burst, last: now}
		l.buckets[key] = b
	}
	b.tokens = min(l.burst, b.tokens+now.Sub(b.last).Seconds()*l.rate)
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
}

// sweep drops buckets that have refilled completely (their owner has been
// idle long enough that forgetting them changes nothing).
func (l *rateLimiter) sweep(now time.Time) {
	full := time.Duration(l.burst / l.rate * float64(time.Second))
	for k, b := range l.buckets {
		if now.Sub(b.last) >= full {
			delete(l.buckets, k)
		}
	}
	l.sweepSize = max(minSweepSize, 2*len(l.buckets))
}

func (l *rateLimiter) forget(key string) {
	l.mu.Lock()
	delete(l.buckets, key)
	l.mu.Unlock()
}
