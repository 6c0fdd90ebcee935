package cluster

// This file arbitrates boards that reach every node at once: MQTT boards
// behind one external broker that all nodes subscribe to. Each such board
// is held by exactly one node, by claim in the boards bucket, and moves to
// one survivor when its node dies or stops, without waiting for the board
// to speak.

import (
	"context"
	"encoding/json"
	"errors"
	"hash/fnv"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device"
)

// ErrStopped: the node has left the fleet.
var ErrStopped = errors.New("cluster: node stopped")

// shared is what ShareBoards configured.
type shared struct {
	transport string
	adopt     func(deviceID string)
}

// candidate is a board this node may adopt: its holder died, stopped or
// released it. rev is the revision seen; the adoption is a compare-and-set
// on it, so exactly one survivor wins.
type candidate struct {
	deviceID string
	rev      uint64
}

// Claims is the fleet's side of a shared broker: it tells the transport
// which boards this node holds (mqtt.Owner) and hands it boards to adopt.
// Get it from Node.ShareBoards.
type Claims struct{ n *Node }

// ShareBoards makes this node hold the boards of one transport by claim:
// boards that every node hears (MQTT through one shared broker). A board
// is claimed in the boards bucket when a node first hears it (Create, so
// one node wins) and nobody else serves it while that node is alive.
// When the holder dies (its heartbeat lapses), stops or hands a board
// over, one survivor takes the record over by compare-and-set on the
// revision it saw and calls adopt, which must not block, so that the
// transport initializes the board without hearing from it. Boards of
// other transports keep the newest-connection-wins rule.
//
// Call it once, before the transport starts; adopt may be called at once.
func (n *Node) ShareBoards(transport string, adopt func(deviceID string)) *Claims {
	n.mu.Lock()
	if n.share != nil || n.stopped {
		n.mu.Unlock()
		return &Claims{n}
	}
	n.share = &shared{transport: transport, adopt: adopt}
	n.mu.Unlock()
	n.goOwned(n.claimWork)
	n.log.Info("boards of this transport are held by claim (shared broker)", zap.String("transport", transport))
	return &Claims{n}
}

// HeldElsewhere reports from memory whether another live node holds the
// board (mqtt.Owner). No I/O: it runs for every message of such a board.
func (c *Claims) HeldElsewhere(deviceID string) bool {
	n := c.n
	key := keyFor(deviceID)
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.owned[key].rev == 0 && n.liveHolder(key)
}

// liveHolder: another node this node sees alive holds the board's record
// and has not released it (n.mu held).
func (n *Node) liveHolder(key string) bool {
	b := n.remote[key]
	if b == nil || b.released {
		return false
	}
	_, alive := n.alive[b.info.Node]
	return alive
}

// Claim makes this node the board's holder: at once if it holds it
// already, false at once if a live node it knows of holds it, else by
// Create on the board's key, or compare-and-set over a record whose
// holder is not alive or released it (mqtt.Owner).
func (c *Claims) Claim(ctx context.Context, deviceID string) (bool, error) {
	n := c.n
	key := keyFor(deviceID)
	n.mu.Lock()
	if n.stopped {
		n.mu.Unlock()
		return false, ErrStopped
	}
	delete(n.releases, key) // a release not yet done is void: the board is wanted again
	if n.owned[key].rev != 0 {
		n.claimed[key] = deviceID
		n.mu.Unlock()
		return true, nil
	}
	if n.liveHolder(key) {
		n.mu.Unlock()
		return false, nil
	}
	n.mu.Unlock()
	return n.take(ctx, key, deviceID, 0)
}

// Release gives up a board whose link closed (mqtt.Owner): its record is
// deleted, conditional on this node's revision, by the claims goroutine.
func (c *Claims) Release(deviceID string) {
	n := c.n
	key := keyFor(deviceID)
	n.mu.Lock()
	if _, ok := n.claimed[key]; !ok || n.stopped {
		n.mu.Unlock()
		return
	}
	n.releases[key] = n.owned[key].rev
	delete(n.claimed, key)
	delete(n.owned, key)
	n.mu.Unlock()
	n.signalClaims()
}

// sharedTransport reports whether boards of this transport are held by claim.
func (n *Node) sharedTransport(transport string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.share != nil && n.share.transport == transport
}

func (n *Node) signalClaims() { wake(n.claimC) }

// offerAdoption notes a board this node may adopt (n.mu held). Without
// ShareBoards it does nothing: the record stays for a node that shares.
func (n *Node) offerAdoption(key string, b *remoteBoard) {
	if n.share == nil || b == nil {
		return
	}
	n.candidates[key] = candidate{deviceID: b.info.DeviceID, rev: b.rev}
	n.signalClaims()
}

// claimRecord is the record a node writes when it claims a board, before
// the board's session says more (putBoard then fills it in).
func (n *Node) claimRecord(deviceID string, released bool) []byte {
	n.mu.Lock()
	transport := ""
	if n.share != nil {
		transport = n.share.transport
	}
	n.mu.Unlock()
	state := device.StateConnected
	if released {
		state = device.StateClosed
	}
	data, _ := json.Marshal(Record{Node: n.cfg.NodeID, DeviceID: deviceID, Transport: transport, HasMCP: true,
		State: state.String(), ConnectedAt: time.Now(), Claimed: true, Released: released})
	return data
}

// take writes this node's claim on a board. With seen set it is an
// adoption: a compare-and-set on that revision, which only one node wins.
// Otherwise it creates the record, or takes over one held by this node, by
// a node that is not alive, or released.
func (n *Node) take(ctx context.Context, key, deviceID string, seen uint64) (bool, error) {
	data := n.claimRecord(deviceID, false)
	var rev uint64
	var err error
	if seen != 0 {
		rev, err = n.boards.Update(ctx, key, data, seen)
		if err != nil {
			return false, nil // another survivor won, or the board moved
		}
	} else {
		won := false
		for attempt := 0; attempt < 3 && !won; attempt++ {
			var e jetstream.KeyValueEntry
			e, err = n.boards.Get(ctx, key)
			switch {
			case errors.Is(err, jetstream.ErrKeyNotFound):
				rev, err = n.boards.Create(ctx, key, data)
			case err != nil:
				return false, err
			default:
				var cur Record
				_ = json.Unmarshal(e.Value(), &cur)
				if n.heldByOther(ctx, cur) {
					return false, nil
				}
				rev, err = n.boards.Update(ctx, key, data, e.Revision())
			}
			won = err == nil
			if ctx.Err() != nil {
				break
			}
		}
		if !won {
			if isWrongSequence(err) {
				return false, nil // raced and lost; the winner's record is on its way
			}
			return false, err
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped {
		return false, ErrStopped
	}
	n.owned[key] = ownRecord{rev: rev, deviceID: deviceID}
	n.claimed[key] = deviceID
	return true, nil
}

// isWrongSequence: a compare-and-set lost to another writer.
func isWrongSequence(err error) bool {
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists)
}

// heldByOther: the record is another node's, not released, and that node
// is alive: a claim never takes it.
func (n *Node) heldByOther(ctx context.Context, cur Record) bool {
	return cur.Node != n.cfg.NodeID && !cur.Released && n.holderAlive(ctx, cur.Node)
}

// holderAlive: a node this node saw alive is; one it saw lapse is not; one
// it never heard of (it just started, or the watch lags) is asked of the
// nodes bucket, so a fresh node never takes a live node's board.
func (n *Node) holderAlive(ctx context.Context, node string) bool {
	n.mu.Lock()
	_, alive := n.alive[node]
	lapsed := n.lapsed[node]
	n.mu.Unlock()
	if alive || lapsed {
		return alive
	}
	_, err := n.nodes.Get(ctx, node)
	return !errors.Is(err, jetstream.ErrKeyNotFound)
}

// claimWork runs releases and adoptions off the watch and heartbeat
// goroutines.
func (n *Node) claimWork() {
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-n.claimC:
		}
		n.mu.Lock()
		releases, cands := n.releases, n.candidates
		n.releases, n.candidates = map[string]uint64{}, map[string]candidate{}
		adopt := n.share.adopt
		n.mu.Unlock()
		for key, rev := range releases {
			if rev != 0 {
				ctx, cancel := context.WithTimeout(n.ctx, opTimeout)
				_ = n.boards.Delete(ctx, key, jetstream.LastRevision(rev))
				cancel()
			}
		}
		// Each survivor tries the boards in its own order, so that they
		// share a dead node's boards instead of racing for each in turn.
		keys := make([]string, 0, len(cands))
		for k := range cands {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return n.rank(keys[i]) < n.rank(keys[j]) })
		for _, key := range keys {
			if n.ctx.Err() != nil {
				return
			}
			c := cands[key]
			n.mu.Lock()
			mine := n.owned[key].rev != 0
			n.mu.Unlock()
			if mine {
				continue
			}
			ctx, cancel := context.WithTimeout(n.ctx, opTimeout)
			ok, _ := n.take(ctx, key, c.deviceID, c.rev)
			cancel()
			if ok {
				n.log.Info("adopted a board whose node left the fleet", zap.String("device_id", c.deviceID))
				adopt(c.deviceID)
			}
		}
	}
}

func (n *Node) rank(key string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(n.cfg.NodeID))
	_, _ = h.Write([]byte(key))
	return h.Sum32()
}

// handOver marks a board this node gives up while it is still connected
// (this node stops): a survivor adopts it at once.
func (n *Node) handOver(ctx context.Context, key, deviceID string, rev uint64) {
	if _, err := n.boards.Update(ctx, key, n.claimRecord(deviceID, true), rev); err != nil {
		n.log.Debug("board not handed over (another node holds it now)", zap.String("device_id", deviceID), zap.Error(err))
	}
}
