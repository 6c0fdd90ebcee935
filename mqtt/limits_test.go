package mqtt

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestPublishGuard: within the rate everything passes; over it the excess
// is dropped; over it for the whole grace the board is cut off; a board
// that overran once and calmed down starts afresh.
func TestPublishGuard(t *testing.T) {
	g := BoardLimits{Rate: 10, Burst: 5, FloodGrace: 3 * time.Second}.NewGuard()
	t0 := time.Unix(1000, 0)
	for i := range 5 {
		assert.Equal(t, Admit, g.Check(t0), "burst %d", i)
	}
	assert.Equal(t, Drop, g.Check(t0))
	// Ten a second, sustained, pass.
	for i := range 50 {
		assert.Equal(t, Admit, g.Check(t0.Add(time.Duration(i+1)*100*time.Millisecond)))
	}
	// Twenty a second: half dropped, cut off once the grace is over.
	start := t0.Add(10 * time.Second)
	var (
		last            Verdict
		at, firstDrop   time.Duration
		admitted, drops int
	)
	for i := range 200 {
		at = time.Duration(i) * 50 * time.Millisecond
		switch last = g.Check(start.Add(at)); last {
		case Admit:
			if drops > 0 {
				admitted++
			}
		case Drop:
			if drops == 0 {
				firstDrop = at
			}
			drops++
		}
		if last == CutOff {
			break
		}
	}
	assert.Equal(t, CutOff, last)
	assert.Equal(t, 3*time.Second, at-firstDrop, "cut off after the grace")
	assert.InDelta(t, drops, admitted, 2, "half of twenty a second dropped")

	// An overrun long ago does not count towards a new one.
	h := BoardLimits{Rate: 10, Burst: 1, FloodGrace: 3 * time.Second}.NewGuard()
	assert.Equal(t, Admit, h.Check(t0))
	assert.Equal(t, Drop, h.Check(t0))
	later := t0.Add(10 * time.Second)
	assert.Equal(t, Admit, h.Check(later))
	assert.Equal(t, Drop, h.Check(later))
}

// TestPublishGuardCredits: every message the bridge sends a board lets it
// answer beyond its rate; credits bank up to the burst, no further.
func TestPublishGuardCredits(t *testing.T) {
	g := BoardLimits{Rate: 1, Burst: 3, FloodGrace: time.Hour}.NewGuard()
	t0 := time.Unix(1000, 0)
	for range 3 {
		assert.Equal(t, Admit, g.Check(t0))
	}
	assert.Equal(t, Drop, g.Check(t0))
	for range 50 {
		g.Credit()
		assert.Equal(t, Admit, g.Check(t0), "a reply to a request")
	}
	for range 10 {
		g.Credit() // requests never answered
	}
	for range 3 {
		assert.Equal(t, Admit, g.Check(t0))
	}
	assert.Equal(t, Drop, g.Check(t0), "no more than the burst banked")
}

// TestBoardLimitsDefaults: zero, negative and NaN limits fall back to the
// defaults, so the package never builds a limiter that admits nothing or
// everything (the bridge's configuration refuses such values at start).
func TestBoardLimitsDefaults(t *testing.T) {
	want := BoardLimits{Rate: DefaultBoardRate, Burst: DefaultBoardBurst, FloodGrace: DefaultFloodGrace}
	for _, l := range []BoardLimits{{}, {Rate: -1, Burst: -1, FloodGrace: -time.Second}, {Rate: math.NaN()}, {Rate: math.Inf(1)}} {
		assert.Equal(t, want, l.WithDefaults())
	}
	c := Config{InboxSize: -1}.WithDefaults()
	assert.Equal(t, DefaultInboxSize, c.InboxSize)
}
