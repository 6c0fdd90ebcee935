package mqtt

// This file finds boards: from the presence source (the embedded broker)
// when there is one, else from the first message of a board without a link.

import (
	"time"

	"go.uber.org/zap"
)

// discovery is an uplink message from a board without a live link.
type discovery struct {
	deviceID, key string
	payload       []byte
}

// attempt is what the gateway tried with one connection of a board the
// presence source lists: when, and how many times in a row it failed to
// initialize.
type attempt struct {
	gen   uint64
	at    time.Time
	tries int
}

// maxRetryBackoff caps the wait between two tries to initialize a board
// that stays connected but failed to (a reply past devices.request_timeout
// on a loaded bridge, a board busy for a while).
const maxRetryBackoff = 5 * time.Minute

// due reports whether a board that failed to initialize may be tried
// again: after mqtt.rediscover_interval, doubling with each failure.
func (a attempt) due(now time.Time, interval time.Duration) bool {
	return now.Sub(a.at) >= min(interval<<min(a.tries-1, 16), maxRetryBackoff)
}

// reconcile makes the links match the presence source: a link for every
// connected board, none for a board that left. A board whose
// initialization failed is tried again, with back-off, while it stays
// connected (firmware sends nothing unasked, so it would otherwise wait
// for its next reconnect); force tries every board at once.
func (g *Gateway) reconcile(force bool) {
	boards := g.presence.Boards()
	present := make(map[string]bool, len(boards))
	now := time.Now()
	for _, b := range boards {
		present[b.DeviceID] = true
		g.tryAttach(b, now, force)
	}
	for id := range g.attempted {
		if !present[id] {
			delete(g.attempted, id)
		}
	}
	g.mu.Lock()
	var gone []*link
	for id, l := range g.links {
		if !present[id] {
			gone = append(gone, l)
		}
	}
	g.mu.Unlock()
	for _, l := range gone {
		l.Close(g.departure(l.board))
	}
}

// tryAttach attaches a board the presence source lists, unless it has a
// live link or failed to initialize too recently.
func (g *Gateway) tryAttach(b Board, now time.Time, force bool) {
	l := g.lookup(b.DeviceID)
	if l != nil && l.board.Gen == b.Gen {
		return
	}
	a, tried := g.attempted[b.DeviceID]
	tries := 1
	if tried && a.gen == b.Gen && l == nil {
		if !force && !a.due(now, g.cfg.RediscoverInterval) {
			return
		}
		tries = a.tries + 1
	}
	g.attempted[b.DeviceID] = attempt{gen: b.Gen, at: now, tries: tries}
	g.stats.reconciled.Add(1)
	why := "connected to the broker"
	if tries > 1 {
		why = "connected, initialization failed before; trying again"
	}
	g.attach(b, why)
}

// retryFailed tries again the boards still connected whose initialization
// failed, once their back-off is over (called on the supervisor's tick).
func (g *Gateway) retryFailed(now time.Time) {
	for id, a := range g.attempted {
		if g.lookup(id) != nil || !a.due(now, g.cfg.RediscoverInterval) {
			continue
		}
		if b, ok := g.presence.Board(id); ok && b.Gen == a.gen {
			g.tryAttach(b, now, false)
		} else if !ok {
			delete(g.attempted, id)
		}
	}
}

func (g *Gateway) handleDiscovery(d discovery) {
	if l := g.lookup(d.deviceID); l != nil && l.deliver(d.payload) {
		return
	}
	if !g.subscribed {
		return // the broker connection is being rebuilt; recovery takes over
	}
	b := Board{DeviceID: d.deviceID, Key: d.key}
	if g.presence != nil {
		pb, ok := g.presence.Board(d.deviceID)
		if !ok {
			g.stats.unattrib.Add(1)
			g.log.Debug("dropped a message from a board the broker does not list", zap.String("device_id", d.deviceID))
			return
		}
		b = pb
	}
	now := time.Now()
	if t, ok := g.lastDiscovery[d.deviceID]; ok && now.Sub(t) < g.cfg.RediscoverInterval {
		g.stats.unattrib.Add(1)
		return // it failed to initialize moments ago; do not hammer it
	}
	if ok, err := g.claim(d.deviceID); !ok {
		if err != nil {
			g.lastDiscovery[d.deviceID] = now // ask the fleet again later, not per message
		}
		return
	}
	g.lastDiscovery[d.deviceID] = now
	g.pruneDiscoveries(now)
	g.stats.discovered.Add(1)
	if g.presence != nil {
		g.attempted[b.DeviceID] = attempt{gen: b.Gen, at: now, tries: 1}
	}
	if l := g.attach(b, "first heard from"); l != nil {
		l.deliver(d.payload)
	}
}

func (g *Gateway) pruneDiscoveries(now time.Time) {
	if len(g.lastDiscovery) < 1024 {
		return
	}
	for id, t := range g.lastDiscovery {
		if now.Sub(t) >= g.cfg.RediscoverInterval {
			delete(g.lastDiscovery, id)
		}
	}
}
