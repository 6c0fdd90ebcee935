package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/natstest"
	"github.com/devicebridge/devicebridge/internal/testlink"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startNATS runs an in-process NATS server with JetStream on a random
// port, stored in a temp dir, configured as docs/scaling.md says to run
// the fleet's NATS (configs/nats-fleet.conf): nodes need fleetAuth.
func startNATS(t testing.TB) string {
	t.Helper()
	return natstest.Start(t).ClientURL()
}

// fleetAuth are the nodes' credentials on a server from startNATS.
var fleetAuth = Auth{User: natstest.User, Password: natstest.Password}

// connectAsFleet is a connection of the test's own with the fleet's
// credentials (to look at the buckets as a node would).
func connectAsFleet(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserInfo(natstest.User, natstest.Password))
	require.NoError(t, err)
	return nc
}

const tools = `[{"name":"self.get_device_status","description":"d","inputSchema":{"type":"object","properties":{}}},` +
	`{"name":"self.fail","description":"f","inputSchema":{"type":"object","properties":{}}},` +
	`{"name":"self.hold","description":"h","inputSchema":{"type":"object","properties":{}}}]`

// node is one Hub joined to the fleet.
type node struct {
	hub  *device.Hub
	node *Node
}

func startNode(t testing.TB, url, id string) *node {
	t.Helper()
	return startNodeWith(t, url, id, 1500*time.Millisecond)
}

// attach connects a scripted board to a node. hold, when set, makes
// self.hold wait until it is closed or the link ends.
func (n *node) attach(t testing.TB, mac string, hold chan struct{}) *testlink.Link {
	t.Helper()
	link, _ := n.attachBoard(t, mac, hold)
	return link
}

// attachBoard is attach that also returns the scripted board (to count
// what reached it).
func (n *node) attachBoard(t testing.TB, mac string, hold chan struct{}) (*testlink.Link, *testlink.Board) {
	t.Helper()
	bridge, end := testlink.Pair(64)
	b := testlink.NewBoard(end, func(r testlink.Request) string {
		switch r.Method {
		case "initialize":
			return testlink.Result(r, `{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"test-board","version":"2.4.2"}}`)
		case "tools/list":
			return testlink.Result(r, `{"tools":`+tools+`}`)
		case "tools/call":
			var p struct{ Name string }
			_ = json.Unmarshal(r.Params, &p)
			switch p.Name {
			case "self.fail":
				return testlink.ErrorReply(r, "lamp broken")
			case "self.hold":
				select {
				case <-hold:
				case <-end.Done():
				}
			}
			return testlink.Result(r, `{"content":[{"type":"text","text":"`+mac+`"}],"isError":false}`)
		}
		return testlink.ErrorReply(r, "Method not implemented: "+r.Method)
	})
	t.Cleanup(b.Close)
	_, err := n.hub.Attach(bridge, device.Identity{DeviceID: mac, Transport: "websocket", HasMCP: true})
	require.NoError(t, err)
	return bridge, b
}

// readyIDs lists the ready boards a node sees, with their holders.
func readyIDs(h *device.Hub) map[string]string {
	out := map[string]string{}
	for _, i := range h.Devices() {
		if i.State == device.StateReady && len(i.Tools) == 3 {
			out[i.DeviceID] = i.Node
		}
	}
	return out
}

func TestTwoNodesShareOneFleet(t *testing.T) {
	url := startNATS(t)
	a, b := startNode(t, url, "a"), startNode(t, url, "b")
	hold := make(chan struct{})
	a.attach(t, "aa:00:00:00:00:01", nil)
	b.attach(t, "bb:00:00:00:00:01", hold)
	b.attach(t, "bb:00:00:00:00:02", nil)

	want := func(self string) map[string]string {
		m := map[string]string{"aa:00:00:00:00:01": "a", "bb:00:00:00:00:01": "b", "bb:00:00:00:00:02": "b"}
		for k, v := range m {
			if v == self {
				m[k] = ""
			}
		}
		return m
	}
	require.Eventually(t, func() bool { return fmt.Sprint(readyIDs(a.hub)) == fmt.Sprint(want("a")) }, 10*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return fmt.Sprint(readyIDs(b.hub)) == fmt.Sprint(want("b")) }, 10*time.Second, 20*time.Millisecond)

	ctx := context.Background()
	// Routed both ways, through the Hub's one face.
	res, err := a.hub.CallTool(ctx, "bb:00:00:00:00:02", "self.get_device_status", nil)
	require.NoError(t, err)
	require.Equal(t, "bb:00:00:00:00:02", res.Text())
	res, err = b.hub.CallTool(ctx, "aa:00:00:00:00:01", "self.get_device_status", nil)
	require.NoError(t, err)
	require.Equal(t, "aa:00:00:00:00:01", res.Text())

	// Errors keep their codes and details across nodes.
	_, err = a.hub.CallTool(ctx, "bb:00:00:00:00:01", "self.nope", nil)
	require.Equal(t, device.CodeUnknownTool, device.CodeOf(err))
	var toolErr *device.UnknownToolError
	require.ErrorAs(t, err, &toolErr)
	require.Contains(t, toolErr.Known, "self.get_device_status")
	_, err = a.hub.CallTool(ctx, "bb:00:00:00:00:01", "self.fail", nil)
	require.Equal(t, device.CodeDeviceError, device.CodeOf(err))
	require.Contains(t, err.Error(), "lamp broken")
	_, err = a.hub.CallTool(ctx, "bb:00:00:00:00:01", "self.get_device_status", json.RawMessage(`{"x":`))
	require.NotNil(t, err)
	_, err = a.hub.CallTool(ctx, "ff:00:00:00:00:01", "self.get_device_status", nil)
	require.Equal(t, device.CodeUnknownDevice, device.CodeOf(err))

	// The caller's deadline travels: a held call ends at the caller's
	// deadline, and the holder's board is released by the cancellation.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err = a.hub.CallTool(short, "bb:00:00:00:00:01", "self.hold", nil)
	require.Equal(t, device.CodeCanceled, device.CodeOf(err))
	require.Eventually(t, func() bool {
		s, ok := b.hub.Session("bb:00:00:00:00:01")
		return ok && s.Pending() == 0
	}, 5*time.Second, 10*time.Millisecond)
	close(hold) // the board itself finishes the abandoned tool

	// 100 concurrent calls across the nodes, both ways.
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			from, id := a.hub, fmt.Sprintf("bb:00:00:00:00:0%d", 1+i%2)
			if i%3 == 0 {
				from, id = b.hub, "aa:00:00:00:00:01"
			}
			res, err := from.CallTool(ctx, id, "self.get_device_status", nil)
			if err == nil && res.Text() != id {
				err = fmt.Errorf("%s answered %q", id, res.Text())
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		// Busy is an honest answer of a board's bounded queue; anything
		// else is a routing failure.
		if device.CodeOf(err) != device.CodeBusy {
			require.NoError(t, err)
		}
	}

	// A board going offline disappears from the other node.
	s, _ := b.hub.Session("bb:00:00:00:00:02")
	s.Close(errors.New("bye"))
	require.Eventually(t, func() bool { _, ok := a.hub.Device("bb:00:00:00:00:02"); return !ok }, 5*time.Second, 10*time.Millisecond)
}

func TestDeadNodeBoardsGoOfflineAndReconnectElsewhere(t *testing.T) {
	url := startNATS(t)
	a, b := startNode(t, url, "a"), startNode(t, url, "b")
	sub := a.hub.Subscribe()
	defer sub.Close()
	a.attach(t, "aa:00:00:00:00:01", nil)
	b.attach(t, "bb:00:00:00:00:01", nil)
	require.Eventually(t, func() bool { return len(readyIDs(a.hub)) == 2 }, 10*time.Second, 20*time.Millisecond)

	// b dies without a word: its heartbeat lapses. How soon is the
	// configured window's business (deadAfter), not the clock of a loaded
	// test machine: the poll's deadline only bounds the test.
	require.Equal(t, time.Second, a.node.deadAfter(), "a node is dead two thirds into cluster.offline_after (1.5 s here)")
	b.node.Abandon()
	require.Eventually(t, func() bool { _, ok := a.hub.Device("bb:00:00:00:00:01"); return !ok }, 10*time.Second, 10*time.Millisecond)
	// Subscribers (the /mcp catalog, /api/events) were told.
	require.Eventually(t, func() bool {
		for _, ev := range sub.Next() {
			if ev.Type == device.EventOffline && ev.DeviceID == "bb:00:00:00:00:01" && ev.Info.Node == "b" {
				return true
			}
		}
		return false
	}, 5*time.Second, 10*time.Millisecond)
	// Calls to a's own board never failed meanwhile.
	_, err := a.hub.CallTool(context.Background(), "aa:00:00:00:00:01", "self.get_device_status", nil)
	require.NoError(t, err)

	// The board reconnects to a survivor and is ready there, for every node.
	c := startNode(t, url, "c")
	c.attach(t, "bb:00:00:00:00:01", nil)
	require.Eventually(t, func() bool { return readyIDs(a.hub)["bb:00:00:00:00:01"] == "c" }, 10*time.Second, 20*time.Millisecond)
	res, err := a.hub.CallTool(context.Background(), "bb:00:00:00:00:01", "self.get_device_status", nil)
	require.NoError(t, err)
	require.Equal(t, "bb:00:00:00:00:01", res.Text())
}

// TestLaggingViewKillsNoLiveNode: a node whose view of a peer lags (its
// watch is behind, or it was paused: starved of CPU, a stopped VM) finds
// the peer's heartbeat overdue by its own clock; it asks the directory
// before declaring the peer dead, and a heartbeat it had not seen yet keeps
// the peer alive. Before, it showed the peer's boards offline, ended the
// calls routed there and deleted their records: under load, a routed
// call answered 502 (and the next ones 404) while every node was alive.
func TestLaggingViewKillsNoLiveNode(t *testing.T) {
	url := startNATS(t)
	a, b := startNode(t, url, "a"), startNode(t, url, "b")
	b.attach(t, "bb:00:00:00:00:07", nil)
	require.Eventually(t, func() bool { return readyIDs(a.hub)["bb:00:00:00:00:07"] == "b" }, 10*time.Second, 20*time.Millisecond)
	sub := a.hub.Subscribe()
	defer sub.Close()

	// a's view of b as it is after a pause: the last heartbeat it applied
	// is long past, and b has written newer ones since.
	d := a.node.dir
	d.mu.Lock()
	d.alive["b"] = time.Now().Add(-time.Minute)
	d.beatRev["b"] = 0
	d.mu.Unlock()
	a.node.reap()

	alive, lapsed := d.liveness("b")
	require.True(t, alive, "b lives")
	require.False(t, lapsed)
	_, ok := a.hub.Device("bb:00:00:00:00:07")
	require.True(t, ok, "b's board is still listed")
	for _, ev := range sub.Next() {
		require.NotEqual(t, device.EventOffline, ev.Type, "no offline event: %+v", ev)
	}
	res, err := a.hub.CallTool(context.Background(), "bb:00:00:00:00:07", "self.get_device_status", nil)
	require.NoError(t, err)
	require.Equal(t, "bb:00:00:00:00:07", res.Text())

	// A heartbeat a has already seen is no sign of life: once b is gone,
	// a declares it dead as before.
	b.node.Abandon()
	require.Eventually(t, func() bool { _, ok := a.hub.Device("bb:00:00:00:00:07"); return !ok }, 10*time.Second, 10*time.Millisecond)
	alive, lapsed = d.liveness("b")
	require.False(t, alive)
	require.True(t, lapsed)
}

func TestDuplicateMACNewestConnectionWins(t *testing.T) {
	url := startNATS(t)
	a, b := startNode(t, url, "a"), startNode(t, url, "b")
	old := a.attach(t, "cc:00:00:00:00:01", nil)
	require.Eventually(t, func() bool { return readyIDs(b.hub)["cc:00:00:00:00:01"] == "a" }, 10*time.Second, 20*time.Millisecond)

	b.attach(t, "cc:00:00:00:00:01", nil)
	select {
	case <-old.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the older connection on node a was not closed")
	}
	require.ErrorIs(t, old.Err(), device.ErrReplaced)
	require.Contains(t, old.Err().Error(), "node b")
	require.Eventually(t, func() bool { return readyIDs(a.hub)["cc:00:00:00:00:01"] == "b" }, 10*time.Second, 20*time.Millisecond)
	res, err := a.hub.CallTool(context.Background(), "cc:00:00:00:00:01", "self.get_device_status", nil)
	require.NoError(t, err)
	require.Equal(t, "cc:00:00:00:00:01", res.Text())
}

func TestCleanStopShowsBoardsOfflineAtOnce(t *testing.T) {
	url := startNATS(t)
	a, b := startNode(t, url, "a"), startNode(t, url, "b")
	b.attach(t, "bb:00:00:00:00:09", nil)
	require.Eventually(t, func() bool { return len(readyIDs(a.hub)) == 1 }, 10*time.Second, 20*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b.node.Stop(ctx)
	require.Eventually(t, func() bool { return len(a.hub.Devices()) == 0 }, 5*time.Second, 10*time.Millisecond)
}

func TestDefaultNodeID(t *testing.T) {
	a, b := DefaultNodeID(), DefaultNodeID()
	require.NotEqual(t, a, b)
	require.Equal(t, sanitize(a), a)
	require.Equal(t, "aabbccddeeff", keyFor("AA:BB:CC:DD:EE:FF"))
}

// TestHolderLostMidCall: a routed call whose holder drops off NATS before
// answering (crashed, or cut off) ends as offline once the holder is
// declared dead, within the window, not at the call's deadline (here none,
// so the 5-minute limit).
func TestHolderLostMidCall(t *testing.T) {
	url := startNATS(t)
	p := startProxy(t, strings.TrimPrefix(url, "nats://"))
	a, b := startNode(t, url, "a"), startNode(t, p.URL(), "b")
	hold := make(chan struct{})
	defer close(hold)
	b.attach(t, "bb:00:00:00:00:03", hold)
	callThroughCut(t, a, b, "bb:00:00:00:00:03", p, "node b")
}

// TestCutOffMidCall: a routed call in flight when its caller loses NATS
// ends as offline at once (the answer can no longer arrive), long before
// any window or deadline.
func TestCutOffMidCall(t *testing.T) {
	url := startNATS(t)
	p := startProxy(t, strings.TrimPrefix(url, "nats://"))
	a, x := startNodeWith(t, url, "a", time.Minute), startNodeWith(t, p.URL(), "x", time.Minute)
	hold := make(chan struct{})
	defer close(hold)
	a.attach(t, "aa:00:00:00:00:03", hold)
	callThroughCut(t, x, a, "aa:00:00:00:00:03", p, "lost NATS")
}

// callThroughCut calls a held tool of holder's board mac from caller, cuts
// p once the board has the call, and requires the call to end as offline
// with a message containing want, long before any deadline (it has none).
func callThroughCut(t *testing.T, caller, holder *node, mac string, p *proxy, want string) {
	t.Helper()
	require.Eventually(t, func() bool { return readyIDs(caller.hub)[mac] == holder.node.ID() }, 10*time.Second, 20*time.Millisecond)
	done := make(chan error, 1)
	go func() {
		_, err := caller.hub.CallTool(context.Background(), mac, "self.hold", nil)
		done <- err
	}()
	require.Eventually(t, func() bool {
		s, ok := holder.hub.Session(mac)
		return ok && s.Pending() == 1
	}, 10*time.Second, 10*time.Millisecond, "the call reached the board")
	p.Cut()
	select {
	case err := <-done:
		require.Equal(t, device.CodeOffline, device.CodeOf(err), "%v", err)
		require.ErrorContains(t, err, want)
	case <-time.After(30 * time.Second):
		t.Fatal("the call waited for an answer that cannot arrive")
	}
}

// TestNodesCarryLoadAndEndpoints: every node's heartbeat says how many
// boards it holds and where boards reach it; Placed counts a board sent
// to a node until that node's next heartbeat; a node that stops is gone.
func TestNodesCarryLoadAndEndpoints(t *testing.T) {
	url := startNATS(t)
	start := func(id string) *node {
		hub := device.NewHub(device.HubConfig{ReadyWait: 2 * time.Second}, nil)
		n, err := Start(context.Background(), Config{URL: url, NodeID: id, OfflineAfter: 1500 * time.Millisecond, Auth: fleetAuth,
			Advertise: func() Endpoints { return Endpoints{WebSocketURL: "ws://" + id + "/"} }}, hub, nil)
		require.NoError(t, err)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			n.Stop(ctx)
			require.NoError(t, hub.Close(ctx))
		})
		return &node{hub: hub, node: n}
	}
	a, b := start("a"), start("b")
	b.attach(t, "bb:00:00:00:00:01", nil)
	b.attach(t, "bb:00:00:00:00:02", nil)
	view := func() string { return fmt.Sprint(a.node.Nodes()) }
	load := func() map[string]int {
		m := map[string]int{}
		for _, hb := range a.node.Nodes() {
			m[hb.Node] = hb.Boards
			require.Equal(t, "ws://"+hb.Node+"/", hb.WebSocketURL)
		}
		return m
	}
	require.Eventually(t, func() bool { return fmt.Sprint(load()) == "map[a:0 b:2]" }, 10*time.Second, 20*time.Millisecond, view)
	a.node.Placed("b")
	a.node.Placed("a") // this node counts its own boards live
	require.Equal(t, map[string]int{"a": 0, "b": 3}, load(), "a board sent to b counts until b's next beat")
	require.Eventually(t, func() bool { return fmt.Sprint(load()) == "map[a:0 b:2]" }, 10*time.Second, 20*time.Millisecond,
		"b's next heartbeat replaces the estimate")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b.node.Stop(ctx)
	require.Eventually(t, func() bool { return fmt.Sprint(load()) == "map[a:0]" }, 10*time.Second, 20*time.Millisecond)
}
