// Package keyrate keeps one token bucket (golang.org/x/time/rate) per key,
// such as a client's address, in a set whose size is bounded: an outsider
// who cycles through addresses makes it hold at most Max buckets. Past
// that, new keys share one overflow bucket until idle buckets are
// reclaimed, so a flood from many addresses slows down newcomers (who
// share the overflow) instead of growing memory.
//
// A bucket that has refilled completely is worth nothing over a fresh one,
// so it is dropped at the next sweep; sweeps run lazily when the set is
// full, at most once per refill period, and need no goroutine.
package keyrate

import (
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Set is a bounded set of token buckets, one per key. It is safe for
// concurrent use.
type Set struct {
	limit rate.Limit
	burst int
	max   int
	// refill is how long an emptied bucket takes to fill up again: a
	// sweep sooner than that after the last one frees nothing new.
	refill time.Duration

	mu        sync.Mutex
	buckets   map[string]*rate.Limiter
	overflow  *rate.Limiter
	nextSweep time.Time
}

// New returns a set of buckets that refill at perSecond tokens a second up
// to burst, holding at most maxKeys of them. perSecond, burst and maxKeys
// must be positive.
func New(perSecond float64, burst, maxKeys int) *Set {
	if perSecond <= 0 || burst <= 0 || maxKeys <= 0 {
		panic("keyrate: rate, burst and size must be positive")
	}
	refill := time.Duration(float64(burst) / perSecond * float64(time.Second))
	return &Set{limit: rate.Limit(perSecond), burst: burst, max: maxKeys, refill: max(refill, time.Second),
		buckets: map[string]*rate.Limiter{}, overflow: rate.NewLimiter(rate.Limit(perSecond), burst)}
}

// Reserve takes one token from key's bucket at now. When the bucket is
// empty it takes nothing and reports how long until a token is due, for
// Retry-After. A granted reservation can be given back with
// Reservation.CancelAt (a correct guess that should not count).
func (s *Set) Reserve(key string, now time.Time) (r *rate.Reservation, ok bool, wait time.Duration) {
	lim := s.bucket(key, now)
	r = lim.ReserveN(now, 1)
	if !r.OK() {
		return nil, false, s.refill
	}
	if wait := r.DelayFrom(now); wait > 0 {
		r.CancelAt(now)
		return nil, false, wait
	}
	return r, true, 0
}

// Allow is Reserve without the reservation.
func (s *Set) Allow(key string, now time.Time) (ok bool, wait time.Duration) {
	_, ok, wait = s.Reserve(key, now)
	return ok, wait
}

// Forget drops key's bucket: its owner is gone (a session that ended), so
// the bucket only takes room that a newcomer could use. A key seen again
// later starts with a full bucket.
func (s *Set) Forget(key string) {
	s.mu.Lock()
	delete(s.buckets, key)
	s.mu.Unlock()
}

// Len reports how many keys have their own bucket.
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.buckets)
}

func (s *Set) bucket(key string, now time.Time) *rate.Limiter {
	s.mu.Lock()
	defer s.mu.Unlock()
	if lim, ok := s.buckets[key]; ok {
		return lim
	}
	if len(s.buckets) >= s.max && !now.Before(s.nextSweep) {
		for k, lim := range s.buckets {
			if lim.TokensAt(now) >= float64(s.burst) {
				delete(s.buckets, k)
			}
		}
		s.nextSweep = now.Add(s.refill)
	}
	if len(s.buckets) >= s.max {
		return s.overflow
	}
	lim := rate.NewLimiter(s.limit, s.burst)
	s.buckets[key] = lim
	return lim
}

// AddrKey is the key of a client address (an http.Request's RemoteAddr):
// its IP, and for IPv6 its /64 network, since one host usually holds a
// whole /64 and could otherwise take a fresh bucket for every address.
func AddrKey(remoteAddr string) string {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}
