package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/clip"
)

// opTimeout bounds one directory operation.
const opTimeout = 5 * time.Second

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
	n.mu.Lock()
	left := n.unerased
	n.unerased = map[string]ownRecord{}
	n.mu.Unlock()
	for key, o := range left {
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
	n.mu.Lock()
	if _, mine := n.owned[key]; !mine && !n.stopped {
		n.unerased[key] = o
	}
	n.mu.Unlock()
	n.dirty.Store(true)
}

// repairLost writes again the records of this node's boards that another
// node deleted, taking this node for dead (a partition longer than the
// offline window, seen from the other side).
func (n *Node) repairLost() {
	n.mu.Lock()
	lost := n.lost
	n.lost = map[string]string{}
	n.mu.Unlock()
	for _, id := range lost {
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
	n.mu.Lock()
	at, known := n.stored[d]
	n.mu.Unlock()
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
	n.mu.Lock()
	n.stored[d] = now
	n.toolsOf[d] = tools
	n.mu.Unlock()
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
	n.mu.Lock()
	lost := n.yielded[key] == info.Generation && info.Generation != 0
	n.mu.Unlock()
	if lost {
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
		n.mu.Lock()
		delete(n.unerased, key)
		if !n.stopped {
			n.owned[key] = ownRecord{rev: rev, deviceID: info.DeviceID, catalog: rec.Catalog}
		}
		n.mu.Unlock()
	}
	var err error
	for attempt := 0; attempt < 4 && ctx.Err() == nil; attempt++ {
		n.mu.Lock()
		mine := n.owned[key].rev
		n.mu.Unlock()
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
	n.mu.Lock()
	o, ok := n.owned[key]
	_, claimed := n.claimed[key]
	delete(n.owned, key)
	delete(n.claimed, key)
	delete(n.lost, key)
	if n.yielded[key] == info.Generation {
		delete(n.yielded, key)
	}
	n.mu.Unlock()
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
	n.mu.Lock()
	delete(n.owned, key)
	delete(n.claimed, key)
	delete(n.lost, key)
	if ok {
		n.yielded[key] = s.Info().Generation
	}
	n.mu.Unlock()
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
	n.mu.Lock()
	n.rewatch = append(n.rewatch, again)
	n.mu.Unlock()
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
	n.mu.Lock()
	if n.beatRev[node] == e.Revision() {
		// The same heartbeat again: a restarted watch replays the last
		// one, which says nothing about the node being alive now.
		n.mu.Unlock()
		return
	}
	n.beatRev[node] = e.Revision()
	_, was := n.alive[node]
	n.alive[node] = time.Now()
	n.beats[node] = hb
	delete(n.placed, node)
	delete(n.lapsed, node)
	var events []device.Event
	if !was {
		for _, b := range n.remote {
			if b.info.Node == node {
				events = append(events, device.Event{Type: device.EventOnline, DeviceID: b.info.DeviceID, Info: b.info})
			}
		}
	}
	n.mu.Unlock()
	if !was {
		n.log.Info("node joined the fleet", zap.String("peer", node), zap.Int("boards", len(events)))
	}
	n.announce(events)
}

// onBoard keeps the remote view in step with the directory.
func (n *Node) onBoard(e jetstream.KeyValueEntry) {
	key := e.Key()
	if e.Operation() != jetstream.KeyValuePut {
		n.mu.Lock()
		b := n.remote[key]
		delete(n.remote, key)
		_, shown := n.alive[nodeOf(b)]
		if o, mine := n.owned[key]; mine && e.Revision() > o.rev {
			// Another node deleted the record of a board this node still
			// holds: it took this node for dead. Write it again.
			n.lost[key] = o.deviceID
			wake(n.repairs)
		}
		n.mu.Unlock()
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
		n.mu.Lock()
		delete(n.remote, key)
		n.mu.Unlock()
		return
	}
	n.mu.Lock()
	mine := n.owned[key].rev
	n.mu.Unlock()
	if mine != 0 && e.Revision() > mine {
		n.yield(rec.DeviceID, rec.Node)
	}
	info := device.Info{Identity: device.Identity{DeviceID: rec.DeviceID, ClientID: rec.ClientID, Transport: rec.Transport,
		HasMCP: rec.HasMCP}, State: parseState(rec.State), Board: rec.Board, FirmwareVersion: rec.FirmwareVersion,
		Tools: n.catalog(rec.Catalog), ConnectedAt: rec.ConnectedAt, ReadyAt: rec.ReadyAt, Generation: rec.Generation,
		Node: rec.Node}
	n.mu.Lock()
	old := n.remote[key]
	seen := time.Now()
	if old != nil && old.info.Node == rec.Node {
		seen = old.seen
	}
	b := &remoteBoard{rev: e.Revision(), info: info, catalog: rec.Catalog, seen: seen, claimed: rec.Claimed, released: rec.Released}
	n.remote[key] = b
	_, shown := n.alive[rec.Node]
	wasShown := shown && old != nil && !old.released
	if rec.Released {
		n.offerAdoption(key, b) // its holder is stopping; one survivor takes it
	}
	n.mu.Unlock()
	if rec.Released {
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
	n.mu.Lock()
	tools, ok := n.toolsOf[d]
	n.mu.Unlock()
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
	n.mu.Lock()
	n.toolsOf[d] = tools
	n.mu.Unlock()
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
	var dead []string
	var orphans []string
	n.mu.Lock()
	for node, seen := range n.alive {
		if now.Sub(seen) > n.deadAfter() {
			dead = append(dead, node)
		}
	}
	if now.Sub(n.started) > n.cfg.OfflineAfter {
		for key, b := range n.remote {
			if _, ok := n.alive[b.info.Node]; !ok && now.Sub(b.seen) > n.cfg.OfflineAfter {
				orphans = append(orphans, key)
			}
		}
	}
	n.mu.Unlock()
	for _, node := range dead {
		n.nodeDead(node, "its heartbeat lapsed")
	}
	for _, key := range orphans {
		n.mu.Lock()
		b := n.remote[key]
		delete(n.remote, key)
		n.mu.Unlock()
		if b != nil {
			n.cleanUp(key, b)
		}
	}
	n.mu.Lock()
	if len(n.lapsed) > 1024 {
		n.lapsed = map[string]bool{} // node ids are not reused; forget old deaths
	}
	n.mu.Unlock()
}

// nodeDead shows a node's boards offline and deletes their records (each
// delete conditional on the revision seen, so a board that meanwhile
// connected elsewhere is left alone).
func (n *Node) nodeDead(node, why string) {
	n.mu.Lock()
	_, was := n.alive[node]
	delete(n.alive, node)
	delete(n.beats, node)
	delete(n.placed, node)
	n.lapsed[node] = true
	gone := map[string]*remoteBoard{}
	for key, b := range n.remote {
		if b.info.Node == node {
			gone[key] = b
			delete(n.remote, key)
		}
	}
	n.mu.Unlock()
	n.failOutgoing(node, fmt.Errorf("%w: node %s %s while the call ran; its outcome is unknown", device.ErrOffline, node, why))
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
		n.mu.Lock()
		n.offerAdoption(key, b)
		n.mu.Unlock()
		return
	}
	ctx, cancel := context.WithTimeout(n.ctx, opTimeout)
	defer cancel()
	_ = n.boards.Delete(ctx, key, jetstream.LastRevision(b.rev))
}

// Devices lists the boards other live nodes hold (device.Remote).
func (n *Node) Devices() []device.Info {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]device.Info, 0, len(n.remote))
	for _, b := range n.remote {
		if _, ok := n.alive[b.info.Node]; ok && !b.released {
			info := b.info
			out = append(out, info)
		}
	}
	return out
}

// Device finds a board another live node holds (device.Remote).
func (n *Node) Device(deviceID string) (device.Info, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	b, ok := n.remote[keyFor(deviceID)]
	if !ok || b.released {
		return device.Info{}, false
	}
	if _, alive := n.alive[b.info.Node]; !alive {
		return device.Info{}, false
	}
	return b.info, true
}

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
	n.mu.Lock()
	out := []Heartbeat{self}
	for node, hb := range n.beats {
		seen, ok := n.alive[node]
		if !ok || now.Sub(seen) > n.deadAfter() {
			continue
		}
		hb.Boards += n.placed[node]
		out = append(out, hb)
	}
	n.mu.Unlock()
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
	n.mu.Lock()
	if _, ok := n.beats[node]; ok {
		n.placed[node]++
	}
	n.mu.Unlock()
}
