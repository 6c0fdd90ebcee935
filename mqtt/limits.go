package mqtt

// This file bounds what one board may publish, so that a board flooding
// its broker costs only itself. The embedded broker applies the limits
// where a flood starts (package mqtt/broker, before a message is routed);
// the gateway applies them to boards behind an external broker, where all
// the bridge can do is drop.

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Defaults for BoardLimits. Replies to the bridge's own requests do not
// count (each request the board is sent lets it send one message more), so
// the rate bounds what a board sends unasked: hello, listen, abort and
// goodbye, a few per conversation; its audio goes over UDP, not MQTT.
// Twenty a second, sustained, is far beyond that.
const (
	DefaultBoardRate  = 20
	DefaultBoardBurst = 100
	// DefaultFloodGrace is how long a board may stay over its rate before
	// it is cut off.
	DefaultFloodGrace = 10 * time.Second
)

// ErrPublishFlood is the close reason of a board cut off for publishing
// over its rate for longer than the flood grace.
var ErrPublishFlood = errors.New("board kept publishing over its MQTT rate limit")

// BoardLimits bounds one board's uplink publishes (key mqtt.board_limits).
// Every message the bridge sends a board (a request, mostly) allows it one
// message beyond these limits, so that the bridge's own traffic never
// makes a board go over them.
type BoardLimits struct {
	// Rate is how many messages per second a board may publish, sustained.
	Rate float64 `yaml:"rate"`
	// Burst is how many it may publish at once above Rate.
	Burst int `yaml:"burst"`
	// FloodGrace is how long a board may keep publishing over its rate
	// (its excess dropped) before it is cut off for the same time: the
	// embedded broker disconnects it and refuses it reconnecting, the
	// gateway behind an external broker closes its session and ignores
	// its messages.
	FloodGrace time.Duration `yaml:"flood_grace"`
}

// WithDefaults fills zero fields.
func (l BoardLimits) WithDefaults() BoardLimits {
	if !(l.Rate > 0) || math.IsInf(l.Rate, 0) { // NaN and negative values too
		l.Rate = DefaultBoardRate
	}
	// max(x, 0): a negative value here has always meant the default too.
	l.Burst = cmp.Or(max(l.Burst, 0), DefaultBoardBurst)
	l.FloodGrace = cmp.Or(max(l.FloodGrace, 0), DefaultFloodGrace)
	return l
}

// String describes the limits for log lines and close reasons.
func (l BoardLimits) String() string {
	return fmt.Sprintf("%g messages/s, burst %d, flood grace %v", l.Rate, l.Burst, l.FloodGrace)
}

// Verdict is what a PublishGuard decides about one message.
type Verdict int

// Verdicts.
const (
	// Admit: within the board's rate.
	Admit Verdict = iota
	// Drop: over the rate; drop this message, keep the board.
	Drop
	// CutOff: over the rate for longer than the flood grace; drop the
	// message and cut the board off.
	CutOff
)

// PublishGuard applies BoardLimits to one board's messages. It is safe
// for concurrent use.
type PublishGuard struct {
	lim   *rate.Limiter
	grace time.Duration
	// gap: refusals further apart than this are separate episodes, so a
	// board that overran its burst once, long ago, starts afresh.
	gap time.Duration
	// credits are messages the board may send beyond the rate: one per
	// message the bridge sent it, at most maxCredits banked.
	credits    atomic.Int64
	maxCredits int64

	mu                  sync.Mutex
	overSince, lastDrop time.Time // the current episode of refusals
}

// NewGuard returns a guard for one board (l with defaults filled).
func (l BoardLimits) NewGuard() *PublishGuard {
	l = l.WithDefaults()
	return &PublishGuard{
		lim:        rate.NewLimiter(rate.Limit(l.Rate), l.Burst),
		grace:      l.FloodGrace,
		gap:        max(time.Second, time.Duration(2*float64(time.Second)/l.Rate)),
		maxCredits: int64(l.Burst),
	}
}

// Credit lets the board send one message beyond its rate: the bridge has
// just sent it one (a request it will answer). Credits are capped at the
// burst, so requests the board never answered do not bank up.
func (g *PublishGuard) Credit() {
	for {
		c := g.credits.Load()
		if c >= g.maxCredits || g.credits.CompareAndSwap(c, c+1) {
			return
		}
	}
}

// Check decides about one message arriving at now.
func (g *PublishGuard) Check(now time.Time) Verdict {
	for c := g.credits.Load(); c > 0; c = g.credits.Load() {
		if g.credits.CompareAndSwap(c, c-1) {
			return Admit
		}
	}
	if g.lim.AllowN(now, 1) {
		return Admit
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.lastDrop.IsZero() || now.Sub(g.lastDrop) > g.gap {
		g.overSince = now
	}
	g.lastDrop = now
	if now.Sub(g.overSince) >= g.grace {
		return CutOff
	}
	return Drop
}

// Departures is implemented by a Presence that can say why it ended a
// board's connection: the embedded broker, for a board it cut off for
// flooding. The gateway closes the board's session with that reason
// instead of a plain disconnect.
type Departures interface {
	// Departure is the reason the connection gen of the board ended, or
	// nil when the board left on its own.
	Departure(deviceID string, gen uint64) error
}
