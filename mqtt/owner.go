package mqtt

// This file lets several bridges share one external broker: an Owner
// (the fleet, in cluster/) decides which bridge serves which board, and
// the gateway attaches only the boards it holds.

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"
)

// notOwnedRetry is how long the gateway takes a refused claim as the
// answer for a board before asking the Owner again. It only covers the
// moments before the Owner's own view (HeldElsewhere) catches up.
const notOwnedRetry = time.Second

// Owner arbitrates boards between bridges that share one external broker.
// Every bridge subscribed to the uplink wildcard hears every board; with an
// Owner set, a gateway serves a board only while the Owner says it holds
// it, so each board has exactly one bridge talking to it. cluster.Node
// implements it over the fleet directory; this package knows only the
// interface.
//
// The Owner also hands boards over: when the bridge that held a board dies
// or stops, it tells one survivor's gateway to take the board on through
// Gateway.Adopt, without waiting for the board to speak.
type Owner interface {
	// HeldElsewhere reports, from memory and at once, whether another live
	// bridge holds the board. The gateway asks for every uplink message of a
	// board it has no link for, on paho's callback, so it must not do I/O.
	HeldElsewhere(deviceID string) bool
	// Claim makes this bridge the board's holder, or reports false when
	// another live bridge holds it. The gateway asks before it attaches a
	// board: on the board's first message, when recovering it after a
	// broker reconnect, and on Adopt. It runs on the gateway's supervisor
	// and must honour ctx.
	Claim(ctx context.Context, deviceID string) (bool, error)
	// Release gives up a board whose link closed while the gateway runs
	// (and that no newer link replaced). It must not block: the Owner does
	// any I/O on its own time. On Close the gateway releases nothing: a
	// bridge that stops hands its boards over (the Owner's business).
	Release(deviceID string)
}

// ErrOwnerWithPresence: an Owner makes sense only for an external broker
// shared by several bridges; the embedded broker is each bridge's own.
var ErrOwnerWithPresence = errors.New("mqtt: an owner applies to a shared external broker, not to the embedded one")

// SetOwner makes the gateway serve only the boards o says it holds. Call
// it before Start; nil (the default) serves every board it hears.
func (g *Gateway) SetOwner(o Owner) error {
	if o != nil && g.presence != nil {
		return ErrOwnerWithPresence
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.client != nil || g.closed {
		return errors.New("mqtt: SetOwner after Start")
	}
	g.owner = o
	return nil
}

// Adopt takes a board on that this gateway has not heard from: the Owner
// made this bridge its holder because the previous one died or stopped.
// The board is initialized at once (or, while the broker connection is
// down, once it is back). It never blocks; requests for one board
// coalesce.
func (g *Gateway) Adopt(deviceID string) {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return
	}
	g.adopt[deviceID] = struct{}{}
	g.mu.Unlock()
	g.signalOwner()
}

// released queues a Release for the supervisor, which checks that no newer
// link took the board's place before telling the Owner.
func (g *Gateway) released(deviceID string) {
	g.release[deviceID] = struct{}{} // g.mu held by the caller
	g.signalOwner()
}

func (g *Gateway) signalOwner() {
	select {
	case g.ownerC <- struct{}{}:
	default:
	}
}

// ownerWork runs on the supervisor: adoptions and releases queued since
// the last time.
func (g *Gateway) ownerWork() {
	g.mu.Lock()
	adopt, release := g.adopt, g.release
	g.adopt, g.release = map[string]struct{}{}, map[string]struct{}{}
	g.mu.Unlock()
	for id := range release {
		if g.lookup(id) == nil {
			g.owner.Release(id)
		}
	}
	for id := range adopt {
		if g.lookup(id) != nil {
			continue // serving it already
		}
		delete(g.notOwned, id)
		g.stats.adopted.Add(1)
		if !g.subscribed {
			// Brought in by recovery once the broker connection is back.
			g.recovering[id] = &recovery{}
			continue
		}
		if ok, _ := g.claim(id); ok {
			g.attach(Board{DeviceID: id, Key: TopicKey(id)}, "adopted: the bridge that held it left the fleet")
		}
	}
}

// claim asks the Owner whether this gateway may serve a board; without an
// Owner it always may. A refusal is remembered for notOwnedRetry; an error
// (the fleet unreachable) is logged and returned, so the caller may retry.
func (g *Gateway) claim(deviceID string) (bool, error) {
	if g.owner == nil {
		return true, nil
	}
	now := time.Now()
	if until, ok := g.notOwned[deviceID]; ok {
		if now.Before(until) {
			g.stats.notOwned.Add(1)
			return false, nil
		}
		delete(g.notOwned, deviceID)
	}
	ctx, cancel := context.WithTimeout(g.ctx, g.cfg.WriteTimeout)
	defer cancel()
	ok, err := g.owner.Claim(ctx, deviceID)
	if err != nil {
		if g.ctx.Err() == nil {
			g.warns.claim.Warn(g.log, "could not claim a board in the fleet; not serving it for now", zap.String("device_id", deviceID),
				zap.String("transport", TransportName), zap.Error(err))
		}
		return false, err
	}
	if !ok {
		g.stats.notOwned.Add(1)
		if len(g.notOwned) >= 4096 {
			for id, until := range g.notOwned {
				if now.After(until) {
					delete(g.notOwned, id)
				}
			}
		}
		g.notOwned[deviceID] = now.Add(notOwnedRetry)
		if ce := g.log.Check(zap.DebugLevel, "board held by another bridge; ignoring it"); ce != nil {
			ce.Write(zap.String("device_id", deviceID))
		}
	}
	return ok, nil
}
