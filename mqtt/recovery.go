package mqtt

// This file brings boards back after the broker connection drops.

import (
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device"
)

type recovery struct {
	next    time.Time
	backoff time.Duration
}

// dropAllLinks closes every link because the broker connection is gone,
// remembering which boards to bring back.
func (g *Gateway) dropAllLinks() {
	g.mu.Lock()
	list := make([]*link, 0, len(g.links))
	for _, l := range g.links {
		list = append(list, l)
	}
	g.mu.Unlock()
	for _, l := range list {
		if l.Closed() {
			continue
		}
		g.recovering[l.board.DeviceID] = &recovery{}
		l.Close(device.Closing(device.CauseBrokerLost, ErrBrokerConnectionLost))
	}
}

// runRecovery re-initializes boards that were online when the broker
// connection dropped. With an external broker nothing announces them when
// they come back, and a current-firmware board does not publish until a
// conversation starts, so the bridge reaches out, with back-off, for
// RecoverWindow.
func (g *Gateway) runRecovery() {
	if len(g.recovering) == 0 {
		return
	}
	now := time.Now()
	if now.After(g.recoverUntil) {
		for id := range g.recovering {
			g.log.Warn("gave up recovering a board after the broker reconnect; it returns when it next publishes",
				zap.String("device_id", id), zap.Duration("window", g.cfg.RecoverWindow))
		}
		g.recovering = map[string]*recovery{}
		return
	}
	for id, r := range g.recovering {
		if l := g.lookup(id); l != nil {
			if l.ready() {
				delete(g.recovering, id)
				g.stats.recovered.Add(1)
				l.log.Info("board recovered after the broker reconnect")
			}
			continue
		}
		if now.Before(r.next) {
			continue
		}
		r.backoff = min(max(2*r.backoff, 500*time.Millisecond), 30*time.Second)
		r.next = now.Add(r.backoff)
		ok, err := g.claim(id)
		if err != nil {
			continue // the fleet is unreachable; try again after the back-off
		}
		if !ok {
			delete(g.recovering, id)
			g.log.Info("not recovering a board another bridge holds now", zap.String("device_id", id))
			continue
		}
		g.attach(Board{DeviceID: id, Key: TopicKey(id)}, "recovering after reconnect")
	}
}
