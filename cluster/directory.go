package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/clip"
)

// opTimeout bounds one directory operation.
const opTimeout = 5 * time.Second

// remoteBoard is a board another node holds, as the directory says. It is
// never changed once in directory.remote (a new record makes a new one),
// so it may be read after the lock is dropped.
type remoteBoard struct {
	rev     uint64
	info    device.Info
	catalog string    // digest of its tools
	seen    time.Time // when this node first read the record
	// claimed, released: the record's flags (see Record).
	claimed, released bool
}

// ownRecord is what this node wrote for one of its own boards.
type ownRecord struct {
	rev      uint64
	deviceID string
	catalog  string
}

// directory is this node's view of the fleet directory: the records it
// wrote for its own boards, the boards other nodes hold, which nodes are
// alive, and the tool catalogs it has read or written. Its methods only
// read and change memory; the Node does the I/O around them.
// Invariant: claimed ⊆ owned, placed ⊆ alive = keys(beats), lapsed ∩ alive = ∅, and owned gains nothing once stopped.
type directory struct {
	mu      sync.Mutex
	stopped bool
	// This node's own boards.
	owned    map[string]ownRecord // key → what this node wrote for its own board
	claimed  map[string]string    // key → device id of an owned board held by claim (ShareBoards)
	lost     map[string]string    // key → device id of an own record another node deleted
	yielded  map[string]uint64    // key → generation of the local session that yielded it
	unerased map[string]ownRecord // key → own record whose delete failed (cut off); retried on resync
	// The other nodes and their boards.
	remote  map[string]*remoteBoard // key → board another node holds
	alive   map[string]time.Time    // node → when its last heartbeat arrived (local clock)
	beatRev map[string]uint64       // node → revision of its last heartbeat seen
	beats   map[string]Heartbeat    // node → its last heartbeat
	placed  map[string]int          // node → boards sent there (Placed) since its last heartbeat
	lapsed  map[string]bool         // nodes this node saw die (until they beat again)
	// Tool catalogs.
	toolsOf map[string][]device.Tool // catalog digest → tools
	stored  map[string]time.Time     // catalog digest → when this node last wrote it
}

func newDirectory() *directory {
	return &directory{owned: map[string]ownRecord{}, claimed: map[string]string{}, lost: map[string]string{},
		yielded: map[string]uint64{}, unerased: map[string]ownRecord{}, remote: map[string]*remoteBoard{},
		alive: map[string]time.Time{}, beatRev: map[string]uint64{}, beats: map[string]Heartbeat{},
		placed: map[string]int{}, lapsed: map[string]bool{}, toolsOf: map[string][]device.Tool{},
		stored: map[string]time.Time{}}
}

// stop makes the directory take no more own records.
func (d *directory) stop() {
	d.mu.Lock()
	d.stopped = true
	d.mu.Unlock()
}

// leave empties the own records for Stop: every record this node wrote,
// those whose delete failed included, and which of them are held by claim.
func (d *directory) leave() (owned map[string]ownRecord, claimed map[string]string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	owned, claimed = d.owned, d.claimed
	d.owned, d.claimed = map[string]ownRecord{}, map[string]string{}
	for key, o := range d.unerased {
		owned[key] = o
	}
	d.unerased = map[string]ownRecord{}
	return owned, claimed
}

// ownRev is the revision of this node's record for key (0: none).
func (d *directory) ownRev(key string) uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.owned[key].rev
}

// own notes the record this node wrote for one of its boards.
func (d *directory) own(key string, o ownRecord) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.unerased, key)
	if !d.stopped {
		d.owned[key] = o
	}
}

// disown forgets a board that left this node: its record, and whether it
// was held by claim (ok false: this node had no record of it).
func (d *directory) disown(key string, generation uint64) (o ownRecord, ok, claimed bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	o, ok = d.owned[key]
	_, claimed = d.claimed[key]
	delete(d.owned, key)
	delete(d.claimed, key)
	delete(d.lost, key)
	if d.yielded[key] == generation {
		delete(d.yielded, key)
	}
	return o, ok, claimed
}

// yield forgets a board another node now holds; a local session still
// open (closing) is remembered by generation, so that it is not written
// again while it closes.
func (d *directory) yield(key string, generation uint64, closing bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.owned, key)
	delete(d.claimed, key)
	delete(d.lost, key)
	if closing {
		d.yielded[key] = generation
	}
}

// hasYielded: the local session of that generation yielded the board.
func (d *directory) hasYielded(key string, generation uint64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.yielded[key] == generation && generation != 0
}

// takeUnerased hands over the own records whose delete is to be retried.
func (d *directory) takeUnerased() map[string]ownRecord {
	d.mu.Lock()
	defer d.mu.Unlock()
	left := d.unerased
	d.unerased = map[string]ownRecord{}
	return left
}

// unerasedRecord keeps a record whose delete failed, unless the board is
// this node's again or the node stopped.
func (d *directory) unerasedRecord(key string, o ownRecord) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, mine := d.owned[key]; !mine && !d.stopped {
		d.unerased[key] = o
	}
}

// takeLost hands over the own boards whose records another node deleted.
func (d *directory) takeLost() map[string]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	lost := d.lost
	d.lost = map[string]string{}
	return lost
}

// heldElsewhere: this node has no record of the board and a live node
// holds it (Claims.HeldElsewhere).
func (d *directory) heldElsewhere(key string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.owned[key].rev == 0 && d.liveHolder(key)
}

// liveHolder: another node this node sees alive holds the board's record
// and has not released it (d.mu held).
func (d *directory) liveHolder(key string) bool {
	b := d.remote[key]
	if b == nil || b.released {
		return false
	}
	_, alive := d.alive[b.info.Node]
	return alive
}

// claimOwn is what Claim knows without I/O: held, when this node has a
// record of the board (it is then held by claim too); elsewhere, when a
// live node holds it.
func (d *directory) claimOwn(key, deviceID string) (held, elsewhere bool, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return false, false, ErrStopped
	}
	if d.owned[key].rev != 0 {
		d.claimed[key] = deviceID
		return true, false, nil
	}
	return false, d.liveHolder(key), nil
}

// noteClaim notes a claim this node wrote at rev.
func (d *directory) noteClaim(key, deviceID string, rev uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return ErrStopped
	}
	d.owned[key] = ownRecord{rev: rev, deviceID: deviceID}
	d.claimed[key] = deviceID
	return nil
}

// release forgets a board held by claim and returns the revision of its
// record; false if not held by claim or stopped.
func (d *directory) release(key string) (uint64, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.claimed[key]; !ok || d.stopped {
		return 0, false
	}
	rev := d.owned[key].rev
	delete(d.claimed, key)
	delete(d.owned, key)
	return rev, true
}

// liveness: whether this node sees node alive, or saw it die.
func (d *directory) liveness(node string) (alive, lapsed bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, alive = d.alive[node]
	return alive, d.lapsed[node]
}

// heartbeat notes node alive as of now. fresh is false for a heartbeat
// already seen (a restarted watch replays the last one, which says nothing
// about the node being alive now); joined, when the node was not alive,
// with the Online events of its boards.
func (d *directory) heartbeat(node string, rev uint64, hb Heartbeat) (events []device.Event, joined, fresh bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.beatRev[node] == rev {
		return nil, false, false
	}
	d.beatRev[node] = rev
	_, was := d.alive[node]
	d.alive[node] = time.Now()
	d.beats[node] = hb
	delete(d.placed, node)
	delete(d.lapsed, node)
	if !was {
		for _, b := range d.remote {
			if b.info.Node == node {
				events = append(events, device.Event{Type: device.EventOnline, DeviceID: b.info.DeviceID, Info: b.info})
			}
		}
	}
	return events, !was, true
}

// nodeGone forgets a node and takes its boards out of the remote view;
// was: it was alive.
func (d *directory) nodeGone(node string) (was bool, gone map[string]*remoteBoard) {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, was = d.alive[node]
	delete(d.alive, node)
	delete(d.beats, node)
	delete(d.placed, node)
	d.lapsed[node] = true
	gone = map[string]*remoteBoard{}
	for key, b := range d.remote {
		if b.info.Node == node {
			gone[key] = b
			delete(d.remote, key)
		}
	}
	return was, gone
}

// overdue finds the nodes whose last heartbeat is older than deadAfter
// and, with orphans set, the boards whose node this node has not seen
// alive for offlineAfter since it first read their record.
func (d *directory) overdue(now time.Time, deadAfter, offlineAfter time.Duration, orphans bool) (dead, orphaned []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for node, seen := range d.alive {
		if now.Sub(seen) > deadAfter {
			dead = append(dead, node)
		}
	}
	if orphans {
		for key, b := range d.remote {
			if _, ok := d.alive[b.info.Node]; !ok && now.Sub(b.seen) > offlineAfter {
				orphaned = append(orphaned, key)
			}
		}
	}
	return dead, orphaned
}

// forgetDeaths bounds lapsed: node ids are not reused, so old deaths are
// forgotten.
func (d *directory) forgetDeaths() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.lapsed) > 1024 {
		d.lapsed = map[string]bool{}
	}
}

// removed takes a deleted record's board out of the remote view. shown:
// its node is alive (the board was listed). repair: the record was this
// node's own, deleted by another node that took this node for dead; it is
// noted in lost, to be written again.
func (d *directory) removed(key string, rev uint64) (b *remoteBoard, shown, repair bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b = d.remote[key]
	delete(d.remote, key)
	_, shown = d.alive[nodeOf(b)]
	if o, mine := d.owned[key]; mine && rev > o.rev {
		d.lost[key] = o.deviceID
		repair = true
	}
	return b, shown, repair
}

// dropRemote takes a board out of the remote view and returns it (nil if
// it was not there).
func (d *directory) dropRemote(key string) *remoteBoard {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.remote[key]
	delete(d.remote, key)
	return b
}

// putRemote puts a board another node holds into the remote view, keeping
// when this node first saw it on that node. old is what it replaces;
// shown: its node is alive.
func (d *directory) putRemote(key string, b *remoteBoard) (old *remoteBoard, shown bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	old = d.remote[key]
	b.seen = time.Now()
	if old != nil && old.info.Node == b.info.Node {
		b.seen = old.seen
	}
	d.remote[key] = b
	_, shown = d.alive[b.info.Node]
	return old, shown
}

// devices are the boards live nodes hold, released ones left out.
func (d *directory) devices() []device.Info {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]device.Info, 0, len(d.remote))
	for _, b := range d.remote {
		if _, ok := d.alive[b.info.Node]; ok && !b.released {
			info := b.info
			out = append(out, info)
		}
	}
	return out
}

// device is one board a live node holds, unless released.
func (d *directory) device(key string) (device.Info, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.remote[key]
	if !ok || b.released {
		return device.Info{}, false
	}
	if _, alive := d.alive[b.info.Node]; !alive {
		return device.Info{}, false
	}
	return b.info, true
}

// liveBeats are the last heartbeats of the nodes seen within deadAfter,
// each Boards raised by the boards placed there since.
func (d *directory) liveBeats(now time.Time, deadAfter time.Duration) []Heartbeat {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []Heartbeat
	for node, hb := range d.beats {
		seen, ok := d.alive[node]
		if !ok || now.Sub(seen) > deadAfter {
			continue
		}
		hb.Boards += d.placed[node]
		out = append(out, hb)
	}
	return out
}

// place counts a board sent to node, if its heartbeat is known.
func (d *directory) place(node string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.beats[node]; ok {
		d.placed[node]++
	}
}

// storedAt is when this node last wrote the catalog (false: never).
func (d *directory) storedAt(digest string) (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	at, ok := d.stored[digest]
	return at, ok
}

// wrote notes a catalog this node wrote at a time.
func (d *directory) wrote(digest string, at time.Time, tools []device.Tool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stored[digest] = at
	d.toolsOf[digest] = tools
}

// tools is the cached tool list of a catalog.
func (d *directory) tools(digest string) ([]device.Tool, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	tools, ok := d.toolsOf[digest]
	return tools, ok
}

// read caches a catalog read from the bucket.
func (d *directory) read(digest string, tools []device.Tool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.toolsOf[digest] = tools
}

// forget drops a deleted catalog from the cache.
func (d *directory) forget(digest string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.toolsOf, digest)
}

// publishLocal writes this node's boards to the directory as the Hub's
// events say they change, in order: online and tools changed put the
// board's record, offline deletes it (only if this node still owns it).
func (n *Node) publishLocal(sub *device.Subscription) {
	defer sub.Close()
	n.resyncLocal()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-n.resync:
			n.resyncLocal()
		case <-n.repairs:
			n.repairLost()
		case <-sub.C():
			for _, ev := range sub.Next() {
				if ev.Info.Node != "" {
					continue // another node's board, relayed by this node
				}
				switch ev.Type {
				case device.EventOnline, device.EventToolsChanged:
					n.putBoard(ev.Info)
				case device.EventOffline:
					n.deleteBoard(ev.Info)
				case device.EventResync:
					n.resyncLocal()
				}
			}
		}
	}
}

// resyncLocal writes every local board again: at start, after a lost
// backlog, and when NATS comes back (the others may have cleaned this
// node's boards up while it was cut off).
func (n *Node) resyncLocal() {
	n.eraseLeft()
	for _, s := range n.hub.Sessions() {
		info := s.Info()
		if info.State != device.StateClosed {
			n.putBoard(info)
		}
	}
}

// eraseLeft deletes the records of boards that left this node while their
// delete could not be written (cut off from NATS): otherwise the fleet
// would list them on this node for good. A board that is back on this node
// meanwhile is left to the resync's put.
func (n *Node) eraseLeft() {
	for key, o := range n.dir.takeUnerased() {
		if _, back := n.hub.Session(o.deviceID); back {
			continue
		}
		n.erase(key, o)
	}
}

// erase deletes one of this node's records, conditional on the revision
// it wrote; a failure other than a newer revision is retried on resync.
func (n *Node) erase(key string, o ownRecord) {
	err := errors.New("cut off from NATS")
	if n.nc.IsConnected() {
		ctx, cancel := context.WithTimeout(n.ctx, opTimeout)
		err = n.boards.Delete(ctx, key, jetstream.LastRevision(o.rev))
		cancel()
	}
	if err == nil || isWrongSequence(err) || n.ctx.Err() != nil {
		return
	}
	if n.nc.IsConnected() {
		n.obs.DirectoryWriteFailed("boards")
	}
	n.dir.unerasedRecord(key, o)
	n.dirty.Store(true)
}

// repairLost writes again the records of this node's boards that another
// node deleted, taking this node for dead (a partition longer than the
// offline window, seen from the other side).
func (n *Node) repairLost() {
	for _, id := range n.dir.takeLost() {
		if s, ok := n.hub.Session(id); ok {
			if info := s.Info(); info.State != device.StateClosed {
				n.putBoard(info)
			}
		}
	}
}

// storeCatalog makes sure the catalogs bucket holds a tool list and
// returns its digest. A digest this node wrote less than a quarter of
// CatalogGrace ago is trusted; an older one is written again (a Put, which
// bumps its revision), so the catalog GC, which deletes only at the
// revision it saw unreferenced a whole grace period earlier, never deletes
// a catalog a record is about to reference.
func (n *Node) storeCatalog(ctx context.Context, tools []device.Tool) string {
	if len(tools) == 0 {
		return ""
	}
	d, data := digest(tools)
	at, known := n.dir.storedAt(d)
	if known && time.Since(at) < n.cfg.CatalogGrace/4 {
		return d
	}
	now := time.Now()
	if _, err := n.catalogs.Put(ctx, d, data); err != nil {
		n.obs.DirectoryWriteFailed("catalogs")
		n.dirty.Store(true)
		n.log.Warn("could not store a tool catalog; other nodes see the board without tools until the next try", zap.Error(err))
		return d
	}
	n.dir.wrote(d, now, tools)
	return d
}

// putBoard records that this node holds a board. A board whose record
// another node wrote after ours was taken over there (the newest
// connection wins): this node yields. A new local session overwrites
// whatever record exists, by compare-and-set on its revision.
func (n *Node) putBoard(info device.Info) {
	if !n.nc.IsConnected() {
		// Cut off from NATS: written again when it returns.
		n.dirty.Store(true)
		return
	}
	key := keyFor(info.DeviceID)
	if n.dir.hasYielded(key, info.Generation) {
		// This session yielded the board to a newer connection elsewhere
		// and is closing: writing it now would take the board back.
		return
	}
	ctx, cancel := context.WithTimeout(n.ctx, opTimeout)
	defer cancel()
	rec := Record{Node: n.cfg.NodeID, DeviceID: info.DeviceID, ClientID: info.ClientID, Transport: info.Transport,
		HasMCP: info.HasMCP, State: info.State.String(), Board: info.Board, FirmwareVersion: info.FirmwareVersion,
		Catalog: n.storeCatalog(ctx, info.Tools), ConnectedAt: info.ConnectedAt, ReadyAt: info.ReadyAt,
		Generation: info.Generation, Claimed: n.sharedTransport(info.Transport)}
	data, _ := json.Marshal(rec)
	own := func(rev uint64) {
		n.dir.own(key, ownRecord{rev: rev, deviceID: info.DeviceID, catalog: rec.Catalog})
	}
	var err error
	for attempt := 0; attempt < 4 && ctx.Err() == nil; attempt++ {
		mine := n.dir.ownRev(key)
		var entry jetstream.KeyValueEntry
		var rev uint64
		entry, err = n.boards.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			rev, err = n.boards.Create(ctx, key, data)
		case err != nil:
			continue
		default:
			var cur Record
			_ = json.Unmarshal(entry.Value(), &cur)
			if cur.Node != n.cfg.NodeID && mine != 0 && entry.Revision() > mine {
				n.yield(info.DeviceID, cur.Node)
				return
			}
			if cur.Node == n.cfg.NodeID && bytes.Equal(entry.Value(), data) {
				// Already there (a resync after a short cut): no write,
				// so no event on every node for nothing.
				own(entry.Revision())
				return
			}
			// A board held by claim goes to whoever claimed it first: a live
			// holder is never overwritten, whatever connected last.
			if rec.Claimed && n.heldByOther(ctx, cur) {
				n.yield(info.DeviceID, cur.Node)
				return
			}
			rev, err = n.boards.Update(ctx, key, data, entry.Revision())
			if err == nil && cur.Node != n.cfg.NodeID {
				n.log.Info("board taken over from another node (it connected here more recently)",
					zap.String("device_id", info.DeviceID), zap.String("previous_node", cur.Node))
			}
		}
		if err == nil {
			own(rev)
			return
		}
	}
	if n.ctx.Err() == nil {
		n.obs.DirectoryWriteFailed("boards")
		n.dirty.Store(true)
		n.log.Warn("could not write a board to the fleet directory; retrying with the next heartbeat",
			zap.String("device_id", info.DeviceID), zap.Error(err))
	}
}

// deleteBoard removes a board this node held, unless another node has
// taken it over since (the delete is conditional on our revision).
// A board held by claim whose session ended because this bridge shuts
// down is handed over instead: it is still connected to the shared broker,
// and a survivor adopts it at once.
func (n *Node) deleteBoard(info device.Info) {
	key := keyFor(info.DeviceID)
	o, ok, claimed := n.dir.disown(key, info.Generation)
	if !ok {
		return
	}
	if claimed && info.CloseCause == device.CauseShutdown {
		ctx, cancel := context.WithTimeout(n.ctx, opTimeout)
		defer cancel()
		n.handOver(ctx, key, info.DeviceID, o.rev)
		return
	}
	n.erase(key, o)
}

// yield closes this node's connection of a board that connected to
// another node more recently (a duplicated MAC, or a board that moved
// while this node still held a stale connection).
func (n *Node) yield(deviceID, other string) {
	key := keyFor(deviceID)
	s, ok := n.hub.Session(deviceID)
	var generation uint64
	if ok {
		generation = s.Info().Generation
	}
	n.dir.yield(key, generation, ok)
	if !ok {
		return
	}
	n.log.Warn("the same device id connected to another node more recently; the newest connection wins, closing this node's",
		zap.String("device_id", deviceID), zap.String("this_node", n.cfg.NodeID), zap.String("winning_node", other),
		zap.String("remote", s.Info().RemoteAddr))
	s.Close(fmt.Errorf("%w: it connected to node %s after node %s", device.ErrReplaced, other, n.cfg.NodeID))
}

// watch follows a bucket; apply sees every put and delete, starting with
// the current values. After a reconnect the watch starts over (replaying
// the current values), since a restarted server may not resume it.
// synced, when set, is true once the current values were all delivered.
func (n *Node) watch(name string, kv jetstream.KeyValue, apply func(jetstream.KeyValueEntry), synced *atomic.Bool) error {
	setSynced := func(v bool) {
		if synced != nil {
			synced.Store(v)
		}
	}
	w, err := kv.WatchAll(n.ctx)
	if err != nil {
		return fmt.Errorf("cluster: watch %s: %w", name, err)
	}
	again := make(chan struct{}, 1)
	n.rewatchMu.Lock()
	n.rewatch = append(n.rewatch, again)
	n.rewatchMu.Unlock()
	n.goOwned(func() {
		defer func() {
			if w != nil {
				_ = w.Stop()
			}
		}()
		var updates <-chan jetstream.KeyValueEntry
		if w != nil {
			updates = w.Updates()
		}
		retry := time.NewTimer(time.Hour)
		defer retry.Stop()
		for {
			select {
			case <-n.ctx.Done():
				return
			case <-again:
			case <-retry.C:
			case e, ok := <-updates:
				if !ok {
					updates = nil
					setSynced(false)
					retry.Reset(time.Second)
					continue
				}
				if e == nil { // the end of the initial values
					setSynced(true)
					continue
				}
				apply(e)
				continue
			}
			setSynced(false)
			if w != nil {
				_ = w.Stop()
			}
			w, updates = nil, nil
			nw, err := kv.WatchAll(n.ctx)
			if err != nil {
				n.log.Debug("watch not restarted yet", zap.String("bucket", name), zap.Error(err))
				retry.Reset(time.Second)
				continue
			}
			w, updates = nw, nw.Updates()
		}
	})
	return nil
}

// onHeartbeat notes a node alive (by this node's clock, so clocks need not
// agree) or gone (a clean Stop deletes its key).
func (n *Node) onHeartbeat(e jetstream.KeyValueEntry) {
	node := e.Key()
	if node == n.cfg.NodeID {
		return
	}
	if e.Operation() != jetstream.KeyValuePut {
		n.nodeDead(node, "left the fleet")
		return
	}
	var hb Heartbeat
	if err := json.Unmarshal(e.Value(), &hb); err != nil {
		n.log.Debug("unreadable heartbeat", zap.String("peer", node), zap.Error(err))
	}
	hb.Node = node
	events, joined, fresh := n.dir.heartbeat(node, e.Revision(), hb)
	if !fresh {
		return
	}
	if joined {
		n.log.Info("node joined the fleet", zap.String("peer", node), zap.Int("boards", len(events)))
	}
	n.announce(events)
}

// onBoard keeps the remote view in step with the directory.
func (n *Node) onBoard(e jetstream.KeyValueEntry) {
	key := e.Key()
	if e.Operation() != jetstream.KeyValuePut {
		b, shown, repair := n.dir.removed(key, e.Revision())
		if repair {
			// Another node deleted the record of a board this node still
			// holds: it took this node for dead. Write it again.
			wake(n.repairs)
		}
		if b != nil && shown && !b.released {
			n.announce([]device.Event{offline(b.info, "the board went offline")})
		}
		return
	}
	var rec Record
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		n.unreadable.Warn(n.log, "unreadable fleet directory entry", clip.Field("key", key), clip.Error(err))
		return
	}
	// A record is about the board its key names, in canonical form: any
	// other spelling of a MAC would list it twice, and a record filed
	// under another board's key would stand in for that board.
	rec.DeviceID = device.NormalizeID(rec.DeviceID)
	if rec.DeviceID == "" || keyFor(rec.DeviceID) != key {
		n.badRecords.Warn(n.log, "ignored a fleet directory entry whose device id does not match its key",
			clip.Field("key", key), clip.Field("device_id", rec.DeviceID), clip.Field("node", rec.Node))
		return
	}
	if rec.Node == n.cfg.NodeID {
		n.dir.dropRemote(key)
		return
	}
	if mine := n.dir.ownRev(key); mine != 0 && e.Revision() > mine {
		n.yield(rec.DeviceID, rec.Node)
	}
	info := device.Info{Identity: device.Identity{DeviceID: rec.DeviceID, ClientID: rec.ClientID, Transport: rec.Transport,
		HasMCP: rec.HasMCP}, State: parseState(rec.State), Board: rec.Board, FirmwareVersion: rec.FirmwareVersion,
		Tools: n.catalog(rec.Catalog), ConnectedAt: rec.ConnectedAt, ReadyAt: rec.ReadyAt, Generation: rec.Generation,
		Node: rec.Node}
	b := &remoteBoard{rev: e.Revision(), info: info, catalog: rec.Catalog, claimed: rec.Claimed, released: rec.Released}
	old, shown := n.dir.putRemote(key, b)
	wasShown := shown && old != nil && !old.released
	if rec.Released {
		n.claims.offer(key, b) // its holder is stopping; one survivor takes it
		if wasShown {
			n.announce([]device.Event{offline(old.info, "node "+rec.Node+" handed the board over")})
		}
		return
	}
	if !shown {
		return // announced when its node's heartbeat arrives
	}
	t := device.EventToolsChanged
	if old == nil || old.released || old.info.Node != rec.Node || old.info.Generation != rec.Generation {
		t = device.EventOnline
	}
	n.announce([]device.Event{{Type: t, DeviceID: info.DeviceID, Info: info}})
}

func nodeOf(b *remoteBoard) string {
	if b == nil {
		return ""
	}
	return b.info.Node
}

func offline(info device.Info, reason string) device.Event {
	info.State, info.CloseReason, info.ClosedAt = device.StateClosed, reason, time.Now()
	info.CloseCause = device.CauseDisconnected
	return device.Event{Type: device.EventOffline, DeviceID: info.DeviceID, Info: info}
}

func parseState(s string) device.State {
	for st := device.StateConnected; st <= device.StateClosed; st++ {
		if st.String() == s {
			return st
		}
	}
	return device.StateConnected
}

// catalog returns the tools stored under a digest (cached: identical
// boards share one entry).
func (n *Node) catalog(d string) []device.Tool {
	if d == "" {
		return nil
	}
	tools, ok := n.dir.tools(d)
	if ok {
		return tools
	}
	ctx, cancel := context.WithTimeout(n.ctx, opTimeout)
	defer cancel()
	e, err := n.catalogs.Get(ctx, d)
	if err != nil {
		n.missing.Warn(n.log, "tool catalog missing from the fleet directory", clip.Field("digest", d), clip.Error(err))
		return nil
	}
	if err := json.Unmarshal(e.Value(), &tools); err != nil {
		return nil
	}
	n.dir.read(d, tools)
	return tools
}

func (n *Node) announce(events []device.Event) {
	for _, ev := range events {
		n.hub.PublishRemote(ev)
	}
}

// heartbeats writes this node's liveness key and finds nodes whose own
// heartbeats lapsed.
func (n *Node) heartbeats() {
	beat := time.NewTicker(n.cfg.OfflineAfter / 5)
	defer beat.Stop()
	check := time.NewTicker(n.cfg.OfflineAfter / 10)
	defer check.Stop()
	n.beat()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-beat.C:
			n.beat()
		case <-n.reconnected:
			// Heartbeat first, so that the others see this node alive
			// before its boards come back, then write them all again: the
			// others may have cleaned them up meanwhile.
			n.beat()
			n.askResync()
		case <-check.C:
			n.reap()
		}
	}
}

func (n *Node) beat() {
	ctx, cancel := context.WithTimeout(n.ctx, opTimeout)
	defer cancel()
	data, _ := json.Marshal(n.self())
	if _, err := n.nodes.Put(ctx, n.cfg.NodeID, data); err != nil {
		if n.ctx.Err() == nil {
			n.obs.DirectoryWriteFailed("nodes")
			n.log.Debug("heartbeat not written", zap.Error(err))
		}
		return
	}
	if n.dirty.CompareAndSwap(true, false) {
		n.askResync()
	}
}

// deadAfter: a node is dead once about three heartbeats are missing, so
// its boards are shown offline well within OfflineAfter.
func (n *Node) deadAfter() time.Duration { return n.cfg.OfflineAfter * 2 / 3 }

// reap declares nodes dead whose heartbeats lapsed, and cleans up records
// whose owner is not alive (nodes that died before this one started).
func (n *Node) reap() {
	now := time.Now()
	dead, orphans := n.dir.overdue(now, n.deadAfter(), n.cfg.OfflineAfter, now.Sub(n.started) > n.cfg.OfflineAfter)
	for _, node := range dead {
		n.nodeDead(node, "its heartbeat lapsed")
	}
	for _, key := range orphans {
		if b := n.dir.dropRemote(key); b != nil {
			n.cleanUp(key, b)
		}
	}
	n.dir.forgetDeaths()
}

// nodeDead shows a node's boards offline and deletes their records (each
// delete conditional on the revision seen, so a board that meanwhile
// connected elsewhere is left alone).
func (n *Node) nodeDead(node, why string) {
	was, gone := n.dir.nodeGone(node)
	n.router.fail(node, fmt.Errorf("%w: node %s %s while the call ran; its outcome is unknown", device.ErrOffline, node, why))
	if !was && len(gone) == 0 {
		return
	}
	n.log.Warn("node left the fleet; its boards are offline until they reconnect to a live node",
		zap.String("peer", node), zap.String("why", why), zap.Int("boards", len(gone)))
	keys := make([]string, 0, len(gone))
	for k := range gone {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		if was && !gone[key].released {
			n.announce([]device.Event{offline(gone[key].info, "node "+node+" "+why)})
		}
		n.cleanUp(key, gone[key])
	}
}

// cleanUp deletes the record of a board whose holder is gone, conditional
// on the revision seen. A board held by claim is still connected to the
// shared broker: it is adopted instead (by a node that shares, or left for
// one).
func (n *Node) cleanUp(key string, b *remoteBoard) {
	if !n.nc.IsConnected() {
		// A node cut off from NATS cannot tell a dead node from its own
		// cut: it shows the boards offline but leaves the records to the
		// nodes that still see the directory.
		return
	}
	if b.claimed {
		n.claims.offer(key, b)
		return
	}
	ctx, cancel := context.WithTimeout(n.ctx, opTimeout)
	defer cancel()
	_ = n.boards.Delete(ctx, key, jetstream.LastRevision(b.rev))
}

// Devices lists the boards other live nodes hold (device.Remote).
func (n *Node) Devices() []device.Info { return n.dir.devices() }

// Device finds a board another live node holds (device.Remote).
func (n *Node) Device(deviceID string) (device.Info, bool) { return n.dir.device(keyFor(deviceID)) }

// self is this node's heartbeat as of now.
func (n *Node) self() Heartbeat {
	hb := Heartbeat{Node: n.cfg.NodeID, Started: n.started, Boards: len(n.hub.Sessions())}
	if n.cfg.Advertise != nil {
		hb.Endpoints = n.cfg.Advertise()
	}
	return hb
}

// Nodes lists the live nodes of the fleet, this one included, sorted by
// id: this node as of now, the others as of their last heartbeat, each
// Boards raised by the boards this node sent there (Placed) since. A node
// whose heartbeat is older than the dead-after limit is left out even
// before the reaper notices.
func (n *Node) Nodes() []Heartbeat {
	self := n.self()
	now := time.Now()
	out := append([]Heartbeat{self}, n.dir.liveBeats(now, n.deadAfter())...)
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}

// Placed notes that this node sent a board to node (an OTA answer pointing
// there), so that a burst of boots spreads before that node's next
// heartbeat counts the board.
func (n *Node) Placed(node string) {
	if node == n.cfg.NodeID {
		return
	}
	n.dir.place(node)
}
