package cluster

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// catalogGC deletes tool catalogs that no board record references. One
// node does it at a time: the one with the lowest id among the nodes it
// sees alive (two nodes doing it at once during a change of view is
// harmless: every delete is conditional). It is cheap: it reads the
// catalogs bucket's keys (one per board model and firmware) and this
// node's in-memory view of the directory.
func (n *Node) catalogGC() {
	tick := time.NewTicker(n.cfg.CatalogGCInterval)
	defer tick.Stop()
	marks := map[string]gcMark{}
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-tick.C:
			n.gcCatalogs(marks, time.Now())
		}
	}
}

// gcMark: a catalog seen unreferenced, at a revision, since a time.
type gcMark struct {
	rev   uint64
	since time.Time
}

// gcCatalogs runs one GC pass at time now (marks carry over between
// passes). A digest is deleted only when it was unreferenced, at the same
// revision, in two passes at least CatalogGrace apart, each made with a
// complete view of the directory, and the delete is conditional on that
// revision. A node that stores a catalog writes it again (a new revision)
// unless it wrote it less than CatalogGrace/4 ago, and writes the record
// referencing it within opTimeout: so a catalog written for a record not
// yet visible is never deleted. It returns the digests it deleted.
func (n *Node) gcCatalogs(marks map[string]gcMark, now time.Time) []string {
	if !n.gcLeader() || !n.nc.IsConnected() || !n.synced.Load() {
		clear(marks) // a pass without a complete view proves nothing
		return nil
	}
	ctx, cancel := context.WithTimeout(n.ctx, opTimeout)
	defer cancel()
	lister, err := n.catalogs.ListKeys(ctx)
	if err != nil {
		n.log.Debug("catalog GC: keys not listed", zap.Error(err))
		return nil
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	used := n.dir.usedCatalogs()
	var deleted []string
	for _, d := range keys {
		if used[d] {
			delete(marks, d)
			continue
		}
		e, err := n.catalogs.Get(ctx, d)
		if err != nil {
			delete(marks, d)
			continue
		}
		m, ok := marks[d]
		if !ok || m.rev != e.Revision() {
			marks[d] = gcMark{rev: e.Revision(), since: now}
			continue
		}
		if now.Sub(m.since) < n.cfg.CatalogGrace || !n.synced.Load() {
			continue
		}
		delete(marks, d)
		if err := n.catalogs.Delete(ctx, d, jetstream.LastRevision(m.rev)); err != nil {
			if !isWrongSequence(err) {
				n.log.Debug("catalog GC: delete failed", zap.String("digest", d), zap.Error(err))
			}
			continue
		}
		n.dir.forget(d)
		deleted = append(deleted, d)
	}
	present := make(map[string]bool, len(keys))
	for _, d := range keys {
		present[d] = true
	}
	for d := range marks {
		if !present[d] {
			delete(marks, d) // gone meanwhile
		}
	}
	if len(deleted) > 0 {
		n.log.Info("deleted tool catalogs no board references", zap.Int("catalogs", len(deleted)))
	}
	return deleted
}

// gcLeader: this node has the lowest id among the nodes it sees alive.
func (n *Node) gcLeader() bool { return n.dir.lowest(n.cfg.NodeID) }

// usedCatalogs are the digests the records reference: this node's and the
// others'.
func (d *directory) usedCatalogs() map[string]bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	used := map[string]bool{}
	for _, o := range d.owned {
		used[o.catalog] = true
	}
	for _, b := range d.remote {
		used[b.catalog] = true
	}
	return used
}

// lowest: no node seen alive has an id below self.
func (d *directory) lowest(self string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for node := range d.alive {
		if node < self {
			return false
		}
	}
	return true
}
