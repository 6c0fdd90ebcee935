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
	"sync"
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

// claimState is what ShareBoards set up and the work queue of the claims
// goroutine (claimWork). Which boards this node holds by claim is part of
// the directory (directory.claimed), since a claim is a flag on one of the
// node's own records. Invariant: share is set at most once, never after
// stop, and only claimWork empties releases and candidates.
type claimState struct {
	mu      sync.Mutex
	stopped bool
	share   *shared // nil: this node holds no board by claim
	// releases: key → revision to delete; candidates: boards to adopt.
	releases   map[string]uint64
	candidates map[string]candidate
	// work wakes claimWork.
	work chan struct{}
}

func newClaims() *claimState {
	return &claimState{releases: map[string]uint64{}, candidates: map[string]candidate{}, work: make(chan struct{}, 1)}
}

// start records what ShareBoards configured and runs launch, both under
// the lock; false (and launch not run) if already done or stopped. launch
// adds the claims goroutine to the Node's wait group: under the lock, a
// Stop that begins meanwhile either comes first (nothing starts) or
// finds the goroutine counted before it waits.
func (c *claimState) start(s *shared, launch func()) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.share != nil || c.stopped {
		return false
	}
	c.share = s
	launch()
	return true
}

func (c *claimState) stop() {
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
}

// transport is the one held by claim ("" without ShareBoards).
func (c *claimState) transport() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.share == nil {
		return ""
	}
	return c.share.transport
}

// holds reports whether boards of transport are held by claim.
func (c *claimState) holds(transport string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.share != nil && c.share.transport == transport
}

// unrelease voids a release not yet done: the board is wanted again.
func (c *claimState) unrelease(key string) {
	c.mu.Lock()
	delete(c.releases, key)
	c.mu.Unlock()
}

// release queues the delete of a given-up board's record at rev.
func (c *claimState) release(key string, rev uint64) {
	c.mu.Lock()
	c.releases[key] = rev
	c.mu.Unlock()
	wake(c.work)
}

// offer notes a board this node may adopt. Without ShareBoards it does
// nothing: the record stays for a node that shares.
func (c *claimState) offer(key string, b *remoteBoard) {
	if b == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.share == nil {
		return
	}
	c.candidates[key] = candidate{deviceID: b.info.DeviceID, rev: b.rev}
	wake(c.work)
}

// next hands claimWork what was queued since its last round.
func (c *claimState) next() (releases map[string]uint64, cands map[string]candidate, adopt func(string)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	releases, cands = c.releases, c.candidates
	c.releases, c.candidates = map[string]uint64{}, map[string]candidate{}
	return releases, cands, c.share.adopt
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
	if !n.claims.start(&shared{transport: transport, adopt: adopt}, func() { n.goOwned(n.claimWork) }) {
		return &Claims{n}
	}
	n.log.Info("boards of this transport are held by claim (shared broker)", zap.String("transport", transport))
	return &Claims{n}
}

// HeldElsewhere reports from memory whether another live node holds the
// board (mqtt.Owner). No I/O: it runs for every message of such a board.
func (c *Claims) HeldElsewhere(deviceID string) bool {
	return c.n.dir.heldElsewhere(keyFor(deviceID))
}

// Claim makes this node the board's holder: at once if it holds it
// already, false at once if a live node it knows of holds it, else by
// Create on the board's key, or compare-and-set over a record whose
// holder is not alive or released it (mqtt.Owner).
func (c *Claims) Claim(ctx context.Context, deviceID string) (bool, error) {
	n := c.n
	key := keyFor(deviceID)
	// Voided before the directory is asked: a release queued meanwhile
	// deletes only at the revision it names, which a new claim replaces.
	n.claims.unrelease(key)
	held, elsewhere, err := n.dir.claimOwn(key, deviceID)
	if err != nil || held || elsewhere {
		return held, err
	}
	return n.take(ctx, key, deviceID, 0)
}

// Release gives up a board whose link closed (mqtt.Owner): its record is
// deleted, conditional on this node's revision, by the claims goroutine.
func (c *Claims) Release(deviceID string) {
	n := c.n
	key := keyFor(deviceID)
	if rev, ok := n.dir.release(key); ok {
		n.claims.release(key, rev)
	}
}

// sharedTransport reports whether boards of this transport are held by claim.
func (n *Node) sharedTransport(transport string) bool {
	return n.claims.holds(transport)
}

// claimRecord is the record a node writes when it claims a board, before
// the board's session says more (putBoard then fills it in).
func (n *Node) claimRecord(deviceID string, released bool) []byte {
	transport := n.claims.transport()
	state := device.StateConnected
	if released {
		state = device.StateClosed
	}
	rec := Record{Node: n.cfg.NodeID, DeviceID: deviceID, Transport: transport, HasMCP: true,
		State: state.String(), ConnectedAt: time.Now(), Claimed: true, Released: released}
	if n.cfg.Alias != nil {
		rec.Alias = n.cfg.Alias(deviceID) // "" until a session names it, unless it was here a moment ago
	}
	data, _ := json.Marshal(rec)
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
	if err := n.dir.noteClaim(key, deviceID, rev); err != nil {
		return false, err
	}
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
	alive, lapsed := n.dir.liveness(node)
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
		case <-n.claims.work:
		}
		releases, cands, adopt := n.claims.next()
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
			if n.dir.ownRev(key) != 0 {
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
