package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/device"
)

// These tests put ONE node (x) behind a TCP proxy to NATS, while the other
// nodes (a, b) connect directly, and cut x off: the partition of issue 13
// ("a node cut off from NATS keeps serving its own boards and re-registers
// when NATS returns").

// startNodeWith is startNode with a chosen offline window.
func startNodeWith(t testing.TB, url, id string, offlineAfter time.Duration) *node {
	t.Helper()
	return startNodeCfg(t, Config{URL: url, NodeID: id, OfflineAfter: offlineAfter, Auth: fleetAuth})
}

// startNodeCfg is startNode with a configuration of the test's own.
func startNodeCfg(t testing.TB, cfg Config) *node {
	t.Helper()
	hub := device.NewHub(device.HubConfig{ReadyWait: 2 * time.Second}, nil)
	n, err := Start(context.Background(), cfg, hub, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		n.Stop(ctx)
		ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, hub.Close(ctx))
	})
	return &node{hub: hub, node: n}
}

// fleet is the nodes of a test by id.
type fleet map[string]*node

// consistent reports whether every node lists exactly the boards of
// holders, each once, ready with its tools, held by the right node; it
// explains the first difference.
func (f fleet) consistent(holders map[string]string) (bool, string) {
	ids := make([]string, 0, len(f))
	for id := range f {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		seen := map[string]int{}
		for _, i := range f[id].hub.Devices() {
			seen[i.DeviceID]++
			holder := i.Node
			if holder == "" {
				holder = id
			}
			if want, ok := holders[i.DeviceID]; !ok || holder != want {
				return false, fmt.Sprintf("node %s lists %s on %q, want %q", id, i.DeviceID, holder, holders[i.DeviceID])
			}
			if i.State != device.StateReady || len(i.Tools) != 3 {
				return false, fmt.Sprintf("node %s lists %s %s with %d tools", id, i.DeviceID, i.State, len(i.Tools))
			}
		}
		for mac := range holders {
			if seen[mac] != 1 {
				return false, fmt.Sprintf("node %s lists %s %d times", id, mac, seen[mac])
			}
		}
	}
	return true, ""
}

// requireConsistent waits until the fleet is consistent, and checks that
// the directory itself says the same.
func requireConsistent(t *testing.T, f fleet, d *dirWatch, holders map[string]string) {
	t.Helper()
	var mu sync.Mutex
	var why string
	if !assert.Eventually(t, func() bool {
		ok, w := f.consistent(holders)
		if ok {
			ok, w = d.holds(holders)
		}
		mu.Lock()
		why = w
		mu.Unlock()
		return ok
	}, 20*time.Second, 20*time.Millisecond) {
		mu.Lock()
		defer mu.Unlock()
		for id, n := range f {
			n.node.dir.mu.Lock()
			for k, b := range n.node.dir.remote {
				t.Logf("%s: remote %s rev %d node %s state %s", id, k, b.rev, b.info.Node, b.info.State)
			}
			t.Logf("%s: alive %v owned %v", id, n.node.dir.alive, n.node.dir.owned)
			n.node.dir.mu.Unlock()
		}
		d.mu.Lock()
		t.Logf("dir %+v writes %v", d.recs, d.writes)
		d.mu.Unlock()
		require.FailNow(t, "fleet not consistent", why)
	}
}

// dirWatch reads the fleet's buckets directly (its own NATS connection) and
// counts every write to each board key and heartbeat, so a test can bound
// how often records were rewritten.
type dirWatch struct {
	nc            *nats.Conn
	boards, nodes jetstream.KeyValue

	mu     sync.Mutex
	writes map[string]int // board key → puts and deletes seen
	beats  map[string]int // node → heartbeats seen
	recs   map[string]Record
}

func watchDirectory(t *testing.T, url string) *dirWatch {
	t.Helper()
	nc := connectAsFleet(t, url)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := context.Background()
	d := &dirWatch{nc: nc, writes: map[string]int{}, beats: map[string]int{}, recs: map[string]Record{}}
	d.boards, err = js.KeyValue(ctx, DefaultPrefix+"_boards")
	require.NoError(t, err)
	d.nodes, err = js.KeyValue(ctx, DefaultPrefix+"_nodes")
	require.NoError(t, err)
	wctx, cancel := context.WithCancel(ctx)
	bw, err := d.boards.WatchAll(wctx)
	require.NoError(t, err)
	nw, err := d.nodes.WatchAll(wctx)
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for e := range bw.Updates() {
			if e == nil {
				continue
			}
			d.mu.Lock()
			d.writes[e.Key()]++
			if e.Operation() == jetstream.KeyValuePut {
				var r Record
				_ = json.Unmarshal(e.Value(), &r)
				d.recs[e.Key()] = r
			} else {
				delete(d.recs, e.Key())
			}
			d.mu.Unlock()
		}
	}()
	go func() {
		defer wg.Done()
		for e := range nw.Updates() {
			if e != nil && e.Operation() == jetstream.KeyValuePut {
				d.mu.Lock()
				d.beats[e.Key()]++
				d.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = bw.Stop()
		_ = nw.Stop()
		nc.Close()
		wg.Wait()
	})
	return d
}

// holds reports whether the directory has exactly the records of holders.
func (d *dirWatch) holds(holders map[string]string) (bool, string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.recs) != len(holders) {
		return false, fmt.Sprintf("directory has %d records, want %d", len(d.recs), len(holders))
	}
	for mac, node := range holders {
		if r, ok := d.recs[keyFor(mac)]; !ok || r.Node != node {
			return false, fmt.Sprintf("directory has %s on %q, want %q", mac, r.Node, node)
		}
	}
	return true, ""
}

// ready reports whether the directory has a board ready with its tools.
func (d *dirWatch) ready(mac string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, ok := d.recs[keyFor(mac)]
	return ok && r.State == device.StateReady.String() && r.Catalog != ""
}

// has reports whether the directory has a record for a board.
func (d *dirWatch) has(mac string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.recs[keyFor(mac)]
	return ok
}

func (d *dirWatch) writesTo(mac string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.writes[keyFor(mac)]
}

func (d *dirWatch) beatsOf(node string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.beats[node]
}

// waitBeats waits until node has written n more heartbeats: a logical clock
// for "a while later", independent of the machine's speed.
func (d *dirWatch) waitBeats(t *testing.T, node string, n int) {
	t.Helper()
	from := d.beatsOf(node)
	require.Eventually(t, func() bool { return d.beatsOf(node) >= from+n }, 30*time.Second, 20*time.Millisecond,
		"node %s wrote %d heartbeats", node, n)
}

// partitioned starts NATS, nodes a and b on it directly and node x behind
// a proxy, all with the given offline window.
func partitioned(t *testing.T, offlineAfter time.Duration) (fleet, *proxy, *dirWatch) {
	url := startNATS(t)
	p := startProxy(t, strings.TrimPrefix(url, "nats://"))
	f := fleet{
		"a": startNodeWith(t, url, "a", offlineAfter),
		"b": startNodeWith(t, url, "b", offlineAfter),
		"x": startNodeWith(t, p.URL(), "x", offlineAfter),
	}
	return f, p, watchDirectory(t, url)
}

func status(ctx context.Context, h *device.Hub, mac string) error {
	res, err := h.CallTool(ctx, mac, "self.get_device_status", nil)
	if err == nil && res.Text() != mac {
		err = fmt.Errorf("%s answered %q", mac, res.Text())
	}
	return err
}

var partitionBoards = map[string]string{
	"aa:00:00:00:00:01": "a",
	"bb:00:00:00:00:01": "b",
	"ee:00:00:00:00:01": "x",
	"ee:00:00:00:00:02": "x",
}

func attachAll(t *testing.T, f fleet, holders map[string]string) {
	t.Helper()
	for mac, id := range holders {
		f[id].attach(t, mac, nil)
	}
}

// TestShortPartition: x is cut off for less than the offline window. Its
// own boards keep answering; its calls to remote boards fail at once as
// offline, and so do the others' calls to its boards; a and b keep
// working with each other, and the fleet changes meanwhile. After NATS
// returns, routed calls work both ways and every node lists every board
// once, with its holder, x included (its restarted watches caught up).
func TestShortPartition(t *testing.T) {
	// A window far longer than the cut: nobody declares anyone dead.
	f, p, dir := partitioned(t, 20*time.Second)
	attachAll(t, f, partitionBoards)
	requireConsistent(t, f, dir, partitionBoards)

	p.Cut()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.Eventually(t, func() bool { return !f["x"].node.nc.IsConnected() }, 10*time.Second, 10*time.Millisecond)
	for range 3 {
		require.NoError(t, status(ctx, f["x"].hub, "ee:00:00:00:00:01"), "x serves its own boards while cut off")
		require.NoError(t, status(ctx, f["a"].hub, "bb:00:00:00:00:01"), "a and b keep working with each other")
		require.NoError(t, status(ctx, f["b"].hub, "aa:00:00:00:00:01"))
		// Remote calls from x fail as offline, long before the call's
		// 30 s deadline (the error would be canceled if they hung).
		err := status(ctx, f["x"].hub, "aa:00:00:00:00:01")
		require.Equal(t, device.CodeOffline, device.CodeOf(err), "%v", err)
		// The others' calls to x's boards find no responder: offline.
		err = status(ctx, f["a"].hub, "ee:00:00:00:00:02")
		require.Equal(t, device.CodeOffline, device.CodeOf(err), "%v", err)
	}
	require.NoError(t, ctx.Err(), "no call waited for its deadline")
	// The fleet changes while x cannot see it: a board leaves b, another
	// joins a; and one of x's boards leaves x, which x cannot write.
	s, ok := f["b"].hub.Session("bb:00:00:00:00:01")
	require.True(t, ok)
	s.Close(errors.New("bye"))
	f["a"].attach(t, "aa:00:00:00:00:07", nil)
	s, ok = f["x"].hub.Session("ee:00:00:00:00:02")
	require.True(t, ok)
	s.Close(errors.New("bye"))
	holders := map[string]string{"aa:00:00:00:00:07": "a"}
	for mac, id := range partitionBoards {
		if mac != "bb:00:00:00:00:01" && mac != "ee:00:00:00:00:02" {
			holders[mac] = id
		}
	}
	require.Eventually(t, func() bool { return dir.ready("aa:00:00:00:00:07") && !dir.has("bb:00:00:00:00:01") },
		10*time.Second, 10*time.Millisecond)
	before := dir.writesTo("ee:00:00:00:00:01")

	p.Restore()
	require.Eventually(t, func() bool {
		return status(ctx, f["x"].hub, "aa:00:00:00:00:01") == nil && status(ctx, f["a"].hub, "ee:00:00:00:00:01") == nil &&
			status(ctx, f["b"].hub, "ee:00:00:00:00:01") == nil && status(ctx, f["x"].hub, "aa:00:00:00:00:07") == nil
	}, 20*time.Second, 50*time.Millisecond, "routed calls work both ways after NATS returns")
	requireConsistent(t, f, dir, holders)
	// A short cut costs no directory write: x's records were still right.
	dir.waitBeats(t, "x", 2)
	require.Equal(t, before, dir.writesTo("ee:00:00:00:00:01"), "x rewrote an unchanged record")
	requireConsistent(t, f, dir, holders)
}

// TestLongPartition: x is cut off for longer than the offline window. The
// others show its boards offline and delete its records; x keeps serving
// its boards and shows the remote ones offline too. When NATS returns, x
// registers again and every node lists every board with its holder, with
// no fight over the records.
func TestLongPartition(t *testing.T) {
	const window = 3 * time.Second
	f, p, dir := partitioned(t, window)
	attachAll(t, f, partitionBoards)
	requireConsistent(t, f, dir, partitionBoards)
	subA := f["a"].hub.Subscribe()
	defer subA.Close()

	p.Cut()
	ctx := context.Background()
	require.Eventually(t, func() bool {
		_, seenA := f["a"].hub.Device("ee:00:00:00:00:01")
		_, seenB := f["b"].hub.Device("ee:00:00:00:00:02")
		return !seenA && !seenB && !dir.has("ee:00:00:00:00:01") && !dir.has("ee:00:00:00:00:02")
	}, 4*window, 10*time.Millisecond, "x's boards offline elsewhere and its records cleaned up")
	// Subscribers of a were told.
	require.Eventually(t, func() bool {
		for _, ev := range subA.Next() {
			if ev.Type == device.EventOffline && ev.DeviceID == "ee:00:00:00:00:01" && ev.Info.Node == "x" {
				return true
			}
		}
		return false
	}, 5*time.Second, 10*time.Millisecond)
	// x shows the remote boards offline too, and keeps serving its own.
	require.Eventually(t, func() bool {
		ok, _ := fleet{"x": f["x"]}.consistent(map[string]string{"ee:00:00:00:00:01": "x", "ee:00:00:00:00:02": "x"})
		return ok
	}, 4*window, 10*time.Millisecond, "x lists only its own boards while cut off")
	require.NoError(t, status(ctx, f["x"].hub, "ee:00:00:00:00:01"))
	require.NoError(t, status(ctx, f["x"].hub, "ee:00:00:00:00:02"))
	err := status(ctx, f["x"].hub, "aa:00:00:00:00:01")
	require.Equal(t, device.CodeUnknownDevice, device.CodeOf(err), "x no longer lists a's board: %v", err)
	require.NoError(t, status(ctx, f["a"].hub, "bb:00:00:00:00:01"))
	// a's writes to the directory go on meanwhile.
	f["a"].attach(t, "aa:00:00:00:00:02", nil)
	require.Eventually(t, func() bool { return dir.ready("aa:00:00:00:00:02") }, 10*time.Second, 10*time.Millisecond)
	holders := map[string]string{"aa:00:00:00:00:02": "a"}
	for k, v := range partitionBoards {
		holders[k] = v
	}
	writes := map[string]int{}
	for mac := range holders {
		writes[mac] = dir.writesTo(mac)
	}

	p.Restore()
	requireConsistent(t, f, dir, holders)
	require.NoError(t, status(ctx, f["a"].hub, "ee:00:00:00:00:01"))
	require.NoError(t, status(ctx, f["x"].hub, "aa:00:00:00:00:02"))
	// No fight: after a few more heartbeats of every node, each record was
	// written a bounded number of times since NATS returned: x's once to
	// register again, and at most one repair (a delete and a put) for any
	// record, should a loaded machine make a node miss its heartbeats.
	for _, id := range []string{"a", "b", "x"} {
		dir.waitBeats(t, id, 3)
	}
	for mac := range holders {
		n := dir.writesTo(mac) - writes[mac]
		require.LessOrEqual(t, n, 2, "%s rewritten %d times", mac, n)
	}
	requireConsistent(t, f, dir, holders)
}

// TestPartitionDuplicateMAC: while x is cut off, one of its boards
// connects to b (x still holds its old connection). When NATS returns, the
// newest connection wins: x closes its own, and exactly one node holds the
// board, for every node.
func TestPartitionDuplicateMAC(t *testing.T) {
	for _, c := range []struct {
		name   string
		window time.Duration
	}{{"short", 20 * time.Second}, {"long", 1500 * time.Millisecond}} {
		t.Run(c.name, func(t *testing.T) {
			f, p, dir := partitioned(t, c.window)
			old := f["x"].attach(t, "ee:00:00:00:00:09", nil)
			f["a"].attach(t, "aa:00:00:00:00:01", nil)
			requireConsistent(t, f, dir, map[string]string{"ee:00:00:00:00:09": "x", "aa:00:00:00:00:01": "a"})

			p.Cut()
			require.Eventually(t, func() bool { return !f["x"].node.nc.IsConnected() }, 10*time.Second, 10*time.Millisecond)
			if c.name == "long" {
				require.Eventually(t, func() bool { return !dir.has("ee:00:00:00:00:09") }, 4*c.window, 10*time.Millisecond)
			}
			f["b"].attach(t, "ee:00:00:00:00:09", nil)
			require.Eventually(t, func() bool { return readyIDs(f["a"].hub)["ee:00:00:00:00:09"] == "b" }, 10*time.Second, 20*time.Millisecond)
			select {
			case <-old.Done():
				t.Fatal("x closed its connection while cut off; it cannot know")
			default:
			}
			require.NoError(t, status(context.Background(), f["x"].hub, "ee:00:00:00:00:09"), "x still serves it locally")
			writes := dir.writesTo("ee:00:00:00:00:09")

			p.Restore()
			select {
			case <-old.Done():
			case <-time.After(20 * time.Second):
				t.Fatal("x did not close its older connection")
			}
			require.ErrorIs(t, old.Err(), device.ErrReplaced)
			requireConsistent(t, f, dir, map[string]string{"ee:00:00:00:00:09": "b", "aa:00:00:00:00:01": "a"})
			require.NoError(t, status(context.Background(), f["x"].hub, "ee:00:00:00:00:09"))
			for _, id := range []string{"b", "x"} {
				dir.waitBeats(t, id, 2)
			}
			// No fight: after a few heartbeats the record was written once
			// since NATS returned, and at most one repair more (a delete and
			// a put), should a loaded machine make a node miss its
			// heartbeats, as TestPartitionRepairs allows. A fight would keep
			// rewriting it at every heartbeat.
			n := dir.writesTo("ee:00:00:00:00:09") - writes
			require.LessOrEqual(t, n, 3, "the record was rewritten %d times after NATS returned", n)
			requireConsistent(t, f, dir, map[string]string{"ee:00:00:00:00:09": "b", "aa:00:00:00:00:01": "a"})
		})
	}
}
