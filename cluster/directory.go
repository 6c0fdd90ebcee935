package cluster

import (
	"sync"
	"time"

	"github.com/devicebridge/devicebridge/device"
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

// overdueNow: node is alive in this view and its last heartbeat arrived more
// than deadAfter before now.
func (d *directory) overdueNow(node string, now time.Time, deadAfter time.Duration) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	seen, ok := d.alive[node]
	return ok && now.Sub(seen) > deadAfter
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
