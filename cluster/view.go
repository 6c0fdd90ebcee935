package cluster

// This file keeps the remote view: it watches the nodes and boards
// buckets, writes this node's heartbeat, declares lapsed nodes dead, and
// answers the Hub (device.Remote) and OTA placement from memory.

import (
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
	if e.Key() == n.cfg.NodeID {
		return
	}
	if e.Operation() != jetstream.KeyValuePut {
		n.nodeDead(e.Key(), "left the fleet")
		return
	}
	n.noteBeat(e)
}

// noteBeat notes a heartbeat read from the nodes bucket; fresh is false
// for one already seen.
func (n *Node) noteBeat(e jetstream.KeyValueEntry) (fresh bool) {
	node := e.Key()
	var hb Heartbeat
	if err := json.Unmarshal(e.Value(), &hb); err != nil {
		n.log.Debug("unreadable heartbeat", zap.String("peer", node), zap.Error(err))
	}
	hb.Node = node
	events, joined, fresh := n.dir.heartbeat(node, e.Revision(), hb)
	if !fresh {
		return false
	}
	if joined {
		n.log.Info("node joined the fleet", zap.String("peer", node), zap.Int("boards", len(events)))
	}
	n.announce(events)
	return true
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
	if len(rec.Alias) <= maxRecordAlias {
		info.HolderAlias = rec.Alias
	}
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

// maxRecordAlias bounds the alias a record may carry (aliases are at most
// 24 characters; a longer one is ignored, and the board named by this
// node's rule).
const maxRecordAlias = 64

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

// heartbeats writes this node's liveness key. It does nothing else, so
// that nothing this node does delays its heartbeat: the reaper, which
// reads and deletes in the directory when a node dies, runs beside it. A
// survivor whose beats waited for those deletes would, under load, be
// taken for dead in turn.
func (n *Node) heartbeats() {
	interval := n.cfg.OfflineAfter / 5
	beat := time.NewTicker(interval)
	defer beat.Stop()
	n.beat(interval)
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-beat.C:
			n.beat(interval)
		case <-n.reconnected:
			// Heartbeat first, so that the others see this node alive
			// before its boards come back, then write them all again: the
			// others may have cleaned them up meanwhile. (Waiting for
			// this one's acknowledgement keeps that order.)
			n.beat(opTimeout)
			n.askResync()
		}
	}
}

// reaper finds the nodes whose heartbeats lapsed, ten times per window.
func (n *Node) reaper() {
	check := time.NewTicker(n.cfg.OfflineAfter / 10)
	defer check.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-check.C:
			n.reap()
		}
	}
}

// beat writes this node's heartbeat and waits up to wait for NATS to
// acknowledge it. The loop waits one heartbeat interval at most, so that
// slow acknowledgements do not space the beats out: beats a round trip
// apart, under load, make the others take a live node for dead. A beat not
// acknowledged in time may still land; it counts as a failed write.
func (n *Node) beat(wait time.Duration) {
	ctx, cancel := context.WithTimeout(n.ctx, wait)
	defer cancel()
	data, _ := json.Marshal(n.self())
	if _, err := n.nodes.Put(ctx, n.cfg.NodeID, data); err != nil {
		if n.ctx.Err() == nil {
			n.obs.DirectoryWriteFailed("nodes")
			n.log.Debug("heartbeat not written, or not acknowledged in time", zap.Error(err))
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
		// A heartbeat the watch delivered while the directory was read
		// counts too.
		if n.stillBeating(node) || !n.dir.overdueNow(node, time.Now(), n.deadAfter()) {
			continue
		}
		n.nodeDead(node, "its heartbeat lapsed")
	}
	for _, key := range orphans {
		if b := n.dir.dropRemote(key); b != nil {
			n.cleanUp(key, b)
		}
	}
	n.dir.forgetDeaths()
}

// stillBeating asks the directory before a node whose heartbeat lapsed is
// declared dead: a heartbeat this node has not seen yet means that the
// node lives and only this node's view of it lags (its watch is behind, or
// this node itself was paused: starved of CPU, a stopped VM). It is noted
// as a heartbeat. Without that check, a node that lags would take its
// healthy peers for dead, end the calls routed to them as offline and
// delete their records. The read is bounded by one heartbeat interval, so
// that a dead node's boards still go offline within the window; a node
// that cannot read the directory cannot tell, and decides on what it saw.
func (n *Node) stillBeating(node string) bool {
	if !n.nc.IsConnected() {
		return false
	}
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.OfflineAfter/5)
	defer cancel()
	e, err := n.nodes.Get(ctx, node)
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyNotFound) && n.ctx.Err() == nil {
			n.log.Debug("could not read a lapsed node's heartbeat", zap.String("peer", node), zap.Error(err))
		}
		return false
	}
	if !n.noteBeat(e) {
		return false
	}
	n.log.Debug("a lapsed node's heartbeat was in the directory; this node's view lagged", zap.String("peer", node))
	return true
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
