package mqtt

// This file is the supervisor goroutine: connection changes, presence,
// discovery and periodic housekeeping all run on it, one at a time.

import (
	"time"

	"go.uber.org/zap"
)

func (g *Gateway) supervise() {
	tick := time.NewTicker(g.tickInterval())
	defer tick.Stop()
	var presenceC <-chan struct{}
	if g.presence != nil {
		presenceC = g.presence.Changed()
	}
	for {
		select {
		case <-g.ctx.Done():
			return
		case <-g.wake:
			g.syncConnection()
		case <-presenceC:
			if g.subscribed {
				g.reconcile(false)
			}
		case <-g.discover.ready:
			for _, d := range g.discover.take(discoveryBatch) {
				g.handleDiscovery(d)
			}
		case <-g.ownerC:
			g.ownerWork()
		case <-tick.C:
			g.syncConnection()
			g.housekeeping()
		}
	}
}

// tickInterval paces housekeeping: recovery needs no finer resolution
// than a fraction of the reconnect interval.
func (g *Gateway) tickInterval() time.Duration {
	t := time.Second
	if m := g.cfg.MaxReconnectInterval / 2; m < t {
		t = m
	}
	return max(t, 20*time.Millisecond)
}

// syncConnection reacts to connection changes. paho calls its handlers on
// fresh goroutines, so a loss can be reported after the reconnect it
// caused; counting both and comparing keeps the outcome right either way.
func (g *Gateway) syncConnection() {
	if n := g.losses.Load(); n != g.handledLosses {
		g.handledLosses = n
		g.subscribed = false
		g.dropAllLinks()
	}
	connects := g.connects.Load()
	if (g.subscribed && connects == g.subscribedAt) || !g.client.IsConnectionOpen() {
		return
	}
	tok := g.client.Subscribe(g.up.Filter(), 0, g.onMessage)
	if !tok.WaitTimeout(g.cfg.WriteTimeout) || tok.Error() != nil {
		g.warns.subscribe.Warn(g.log, "subscribing to the uplink topics failed; will retry", zap.String("filter", g.up.Filter()), zap.Error(tok.Error()))
		return
	}
	first := g.subscribedAt == 0
	g.subscribed, g.subscribedAt = true, connects
	if g.probe != nil {
		g.probe.reset()
		g.probePlugin()
	}
	g.readyMu.Do(func() { close(g.ready) })
	if first {
		g.log.Info("connected to the MQTT broker", zap.String("broker", redactURL(g.cfg.Broker)), zap.String("subscribed", g.up.Filter()))
	} else {
		g.log.Info("reconnected to the MQTT broker; recovering boards", zap.String("broker", redactURL(g.cfg.Broker)),
			zap.Int("boards", len(g.recovering)))
	}
	if g.presence != nil {
		g.recovering = map[string]*recovery{}
		g.reconcile(true)
		return
	}
	g.recoverUntil = time.Now().Add(g.cfg.RecoverWindow)
	for _, r := range g.recovering {
		r.next, r.backoff = time.Time{}, 0
	}
	g.runRecovery()
}

func (g *Gateway) housekeeping() {
	if !g.subscribed {
		return
	}
	g.probePlugin()
	if g.presence == nil {
		g.runRecovery()
		return
	}
	g.retryFailed(time.Now())
}
