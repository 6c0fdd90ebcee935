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

// reconcile makes the links match the presence source: a link for every
// connected board (one attempt per connection, unless forced), none for a
// board that left.
func (g *Gateway) reconcile(force bool) {
	boards := g.presence.Boards()
	present := make(map[string]bool, len(boards))
	for _, b := range boards {
		present[b.DeviceID] = true
		l := g.lookup(b.DeviceID)
		if l != nil && l.board.Gen == b.Gen {
			continue
		}
		if !force && l == nil && g.attemptedGen[b.DeviceID] == b.Gen {
			continue // tried this connection already; it failed to initialize
		}
		g.attemptedGen[b.DeviceID] = b.Gen
		g.stats.reconciled.Add(1)
		g.attach(b, "connected to the broker")
	}
	for id := range g.attemptedGen {
		if !present[id] {
			delete(g.attemptedGen, id)
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
		g.attemptedGen[b.DeviceID] = b.Gen
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
