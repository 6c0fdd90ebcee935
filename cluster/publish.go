package cluster

// This file writes this node's own boards to the directory, as the Hub's
// events say they change, and yields a board to a node it connected to
// more recently.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device"
)

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
	if n.cfg.Alias != nil {
		rec.Alias = n.cfg.Alias(info.DeviceID)
	}
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
