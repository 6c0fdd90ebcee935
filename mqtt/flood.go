package mqtt

// This file applies BoardLimits in the gateway. Behind the embedded broker
// the broker has already done it, before a flood cost anything; behind an
// external broker every message reaches the gateway, which can only drop:
// a board over its rate loses its excess, and one over it for the whole
// flood grace has its session closed and its messages ignored for as long.
// Either way a board's messages then wait in its own bounded inbox,
// drained by its own goroutine, so what it sends never queues ahead of
// another board's.

import (
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device"
)

// maxMuted bounds the boards remembered as cut off. Each entry took a
// board link that flooded for the whole grace; past the bound a further
// board is still cut off, only heard again sooner.
const maxMuted = 4096

// muteList holds the boards cut off for flooding, until when.
type muteList struct {
	mu    sync.Mutex
	until map[string]time.Time
}

func (m *muteList) add(id string, until time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.until == nil {
		m.until = map[string]time.Time{}
	}
	if len(m.until) >= maxMuted {
		now := time.Now()
		for k, t := range m.until {
			if now.After(t) {
				delete(m.until, k)
			}
		}
		if len(m.until) >= maxMuted {
			return
		}
	}
	m.until[id] = until
}

func (m *muteList) has(id string, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.until[id]
	if ok && !now.Before(t) {
		delete(m.until, id)
		return false
	}
	return ok
}

// admit applies the board limits to one uplink message of board id (l is
// its live link, if any). It runs on paho's router goroutine.
func (g *Gateway) admit(id string, l *link) bool {
	if g.presence != nil {
		return true // the embedded broker limits boards where they publish
	}
	now := time.Now()
	if l == nil {
		if g.muted.has(id, now) {
			g.stats.muted.Add(1)
			return false
		}
		return true
	}
	switch l.guard.Check(now) {
	case Drop:
		g.stats.rateLimited.Add(1)
		g.warns.rateLimited.Warn(g.log, "board is publishing over its rate; dropping its excess",
			zap.String("device_id", id), zap.String("transport", TransportName), zap.Stringer("limit", g.cfg.BoardLimits))
		return false
	case CutOff:
		g.stats.rateLimited.Add(1)
		g.cutOff(l, now)
		return false
	}
	return true
}

// cutOff closes the session of a board that stayed over its rate for the
// whole grace, and ignores the board for as long.
func (g *Gateway) cutOff(l *link, now time.Time) {
	lim := g.cfg.BoardLimits
	g.muted.add(l.board.DeviceID, now.Add(lim.FloodGrace))
	if l.Closed() {
		return
	}
	g.stats.cutOff.Add(1)
	g.warns.cutOff.Warn(g.log, "closed the session of a board that kept publishing over its rate; ignoring it for a while",
		zap.String("device_id", l.board.DeviceID), zap.String("transport", TransportName), zap.Stringer("limit", lim))
	reason := fmt.Errorf("%w (%s); ignored for %v", ErrPublishFlood, lim, lim.FloodGrace)
	l.Close(device.Closing(device.CauseRefused, reason))
}

// departure is why a board the presence source no longer lists left: the
// broker's own reason when it cut the board off, else a disconnect.
func (g *Gateway) departure(b Board) error {
	if d, ok := g.presence.(Departures); ok {
		if err := d.Departure(b.DeviceID, b.Gen); err != nil {
			return device.Closing(device.CauseRefused, err)
		}
	}
	return device.Closing(device.CauseDisconnected, ErrBoardDisconnected)
}
