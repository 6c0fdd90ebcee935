package tools

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// rateLimiter keeps one golang.org/x/time/rate limiter per key (a session,
// or a client address for requests outside a session). Idle limiters are
// reclaimed lazily when the set grows, so it needs no goroutine.
type rateLimiter struct {
	limit rate.Limit
	burst int

	mu        sync.Mutex
	limiters  map[string]*rate.Limiter
	sweepSize int // size at which the next sweep runs
}

const minSweepSize = 1024

func newRateLimiter(perSecond float64, burst int) *rateLimiter {
	return &rateLimiter{limit: rate.Limit(perSecond), burst: burst, limiters: map[string]*rate.Limiter{}, sweepSize: minSweepSize}
}

// allow takes one token for key. When none is left it reports how long
// until one is, for Retry-After.
func (l *rateLimiter) allow(key string, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	lim := l.limiters[key]
	if lim == nil {
		if len(l.limiters) >= l.sweepSize {
			l.sweep(now)
		}
		lim = rate.NewLimiter(l.limit, l.burst)
		l.limiters[key] = lim
	}
	l.mu.Unlock()
	r := lim.ReserveN(now, 1)
	if !r.OK() {
		return false, time.Second
	}
	if wait := r.DelayFrom(now); wait > 0 {
		r.CancelAt(now) // refused: give the token back
		return false, wait
	}
	return true, 0
}

// sweep drops limiters whose bucket has refilled completely: their owner
// has been idle long enough that forgetting them changes nothing.
func (l *rateLimiter) sweep(now time.Time) {
	for k, lim := range l.limiters {
		if lim.TokensAt(now) >= float64(l.burst) {
			delete(l.limiters, k)
		}
	}
	l.sweepSize = max(minSweepSize, 2*len(l.limiters))
}

func (l *rateLimiter) forget(key string) {
	l.mu.Lock()
	delete(l.limiters, key)
	l.mu.Unlock()
}
