package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/device"
)

// catalogsBucket opens the fleet's catalogs bucket on a connection of the
// test's own.
func catalogsBucket(t *testing.T, url string) jetstream.KeyValue {
	t.Helper()
	nc := connectAsFleet(t, url)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := js.KeyValue(context.Background(), DefaultPrefix+"_catalogs")
	require.NoError(t, err)
	return kv
}

func exists(t *testing.T, kv jetstream.KeyValue, key string) bool {
	t.Helper()
	_, err := kv.Get(context.Background(), key)
	if err != nil {
		require.ErrorIs(t, err, jetstream.ErrKeyNotFound)
		return false
	}
	return true
}

// TestCatalogGCPasses drives the GC pass by pass on a logical clock (the
// node's own loop waits an hour): an orphan digest is deleted once it stayed
// unreferenced, at one revision, for the grace period; a digest written
// for a record not visible yet is kept, as is one a node wrote again
// meanwhile, and a referenced one.
func TestCatalogGCPasses(t *testing.T) {
	const grace = time.Minute
	url := startNATS(t)
	cfg := func(id string) Config {
		return Config{URL: url, NodeID: id, OfflineAfter: 1500 * time.Millisecond, CatalogGCInterval: time.Hour, CatalogGrace: grace,
			Auth: fleetAuth}
	}
	a, b := startNodeCfg(t, cfg("a")), startNodeCfg(t, cfg("b"))
	kv := catalogsBucket(t, url)
	ctx := context.Background()

	// b stores the catalog of a board it is about to write: the record is
	// not in the directory yet.
	var list []device.Tool
	require.NoError(t, json.Unmarshal([]byte(tools), &list))
	writing := b.node.storeCatalog(ctx, list)
	_, err := kv.Put(ctx, "orphan", []byte(`[]`))
	require.NoError(t, err)
	_, err = kv.Put(ctx, "touched", []byte(`[]`))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return a.node.synced.Load() && a.node.gcLeader() && !b.node.gcLeader() },
		10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { a.node.dir.mu.Lock(); defer a.node.dir.mu.Unlock(); return len(a.node.dir.alive) == 1 },
		10*time.Second, 10*time.Millisecond)
	require.False(t, b.node.gcLeader(), "only the lowest id collects")

	marks := map[string]gcMark{}
	t0 := time.Now()
	require.Empty(t, a.node.gcCatalogs(marks, t0), "nothing is deleted at first sight")
	require.Contains(t, marks, "orphan")
	require.Contains(t, marks, writing)

	// The record arrives; another node writes "touched" again (a node
	// whose cache of it had gone stale, about to reference it).
	b.attach(t, "bb:00:00:00:00:01", nil)
	require.Eventually(t, func() bool { return readyIDs(a.hub)["bb:00:00:00:00:01"] == "b" }, 10*time.Second, 10*time.Millisecond)
	_, err = kv.Put(ctx, "touched", []byte(`[]`))
	require.NoError(t, err)

	require.Empty(t, a.node.gcCatalogs(marks, t0.Add(grace/2)), "not before the grace period")
	deleted := a.node.gcCatalogs(marks, t0.Add(grace+time.Second))
	require.Equal(t, []string{"orphan"}, deleted)
	require.False(t, exists(t, kv, "orphan"))
	require.True(t, exists(t, kv, writing), "referenced by the record written meanwhile")
	require.True(t, exists(t, kv, "touched"), "written again during the grace period")

	// "touched" is collected a grace period after its last write; the
	// referenced catalog never is.
	require.Equal(t, []string{"touched"}, a.node.gcCatalogs(marks, t0.Add(2*grace+2*time.Second)))
	require.Empty(t, a.node.gcCatalogs(marks, t0.Add(10*grace)))
	require.True(t, exists(t, kv, writing))
	res, err := a.hub.CallTool(ctx, "bb:00:00:00:00:01", "self.get_device_status", nil)
	require.NoError(t, err)
	require.Equal(t, "bb:00:00:00:00:01", res.Text())
}

// TestCatalogGCLoop: the node's own loop, with a short grace, deletes an
// orphan digest and keeps the one a board references; once that board
// leaves, its catalog goes too, and a board of the same tools connecting
// later still shows its tools on every node.
func TestCatalogGCLoop(t *testing.T) {
	url := startNATS(t)
	cfg := func(id string) Config {
		return Config{URL: url, NodeID: id, OfflineAfter: 1500 * time.Millisecond, Auth: fleetAuth,
			CatalogGCInterval: 100 * time.Millisecond, CatalogGrace: 400 * time.Millisecond}
	}
	a, b := startNodeCfg(t, cfg("a")), startNodeCfg(t, cfg("b"))
	kv := catalogsBucket(t, url)
	ctx := context.Background()
	b.attach(t, "bb:00:00:00:00:01", nil)
	require.Eventually(t, func() bool { return readyIDs(a.hub)["bb:00:00:00:00:01"] == "b" }, 10*time.Second, 10*time.Millisecond)
	used, _ := a.hub.Device("bb:00:00:00:00:01")
	d, _ := digest(used.Tools)
	_, err := kv.Put(ctx, "orphan", []byte(`[]`))
	require.NoError(t, err)

	require.Eventually(t, func() bool { return !exists(t, kv, "orphan") }, 20*time.Second, 20*time.Millisecond)
	require.True(t, exists(t, kv, d), "referenced by bb:00:00:00:00:01")

	// The only board of those tools leaves: its catalog goes too. A board
	// with the same tools connecting later stores it again, so every node
	// sees its tools.
	s, ok := b.hub.Session("bb:00:00:00:00:01")
	require.True(t, ok)
	s.Close(errors.New("bye"))
	require.Eventually(t, func() bool { return !exists(t, kv, d) }, 20*time.Second, 20*time.Millisecond)
	b.attach(t, "bb:00:00:00:00:02", nil)
	require.Eventually(t, func() bool { return readyIDs(a.hub)["bb:00:00:00:00:02"] == "b" }, 10*time.Second, 10*time.Millisecond)
	require.True(t, exists(t, kv, d))
}
