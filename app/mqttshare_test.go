package app_test

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/bridgetest"
	"github.com/devicebridge/devicebridge/internal/natstest"
	"github.com/devicebridge/devicebridge/mqtt"
	"github.com/devicebridge/devicebridge/mqtt/mosquittotest"
	"github.com/devicebridge/devicebridge/simulator"
)

// These tests run several bridge nodes on one NATS and one real Mosquitto
// that every node uses (mqtt.shared_broker), with simulated boards that
// publish to their own devices/up/{mac} and subscribe to devices/p2p/{mac}
// as a plain broker requires.

const sharedWait = 15 * time.Second

// sharedNode is one node of the fleet; stop shuts it down (once: the
// test's cleanup does too when the test has not).
type sharedNode struct {
	app  *app.App
	base string
	stop func()
}

func startSharedNode(t *testing.T, natsURL, brokerURL, id string, offlineAfter time.Duration) *sharedNode {
	t.Helper()
	cfg := fleetConfig(natsURL, id)
	cfg.Cluster.OfflineAfter = offlineAfter
	cfg.MQTT.Broker = brokerURL
	cfg.MQTT.SharedBroker = true
	cfg.MQTT.UDP.Listen = "127.0.0.1:0"
	cfg.MQTT.MaxReconnectInterval = 200 * time.Millisecond
	cfg.MQTT.KeepAlive = 2 * time.Second
	b := bridgetest.Start(t, func(c *app.Config) { *c = cfg },
		bridgetest.WithLogger(zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))))
	// A board's first message must find every node's uplink subscription.
	ctx, cancel := context.WithTimeout(context.Background(), sharedWait)
	defer cancel()
	require.NoError(t, b.App.MQTTGateway().WaitReady(ctx))
	return &sharedNode{app: b.App, base: b.Base, stop: func() { require.NoError(t, b.Shutdown()) }}
}

// sharedBoard connects a subscribing board to the shared broker and makes
// it speak once (a hello), as a board does when a conversation starts.
func sharedBoard(t *testing.T, brokerURL, mac string) *simulator.MQTTConn {
	t.Helper()
	b := newSimBoard(t, mac)
	ctx, cancel := context.WithTimeout(context.Background(), sharedWait)
	defer cancel()
	c, err := b.ConnectMQTT(ctx, simulator.LegacyMQTTConfig(brokerURL))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	// The board subscribes on connect without waiting for the SUBACK, as
	// old firmware does; subscribing again and waiting makes sure the
	// bridge's first request (sent as soon as the hello is heard) finds it.
	granted, err := c.SubscribeRaw(ctx, "devices/p2p/"+mqtt.TopicKey(mac))
	require.NoError(t, err)
	require.True(t, granted)
	require.NoError(t, c.OpenAudioChannel(ctx))
	return c
}

// holders lists the nodes with a ready local session of the board.
func holders(nodes []*sharedNode, mac string) []*sharedNode {
	var out []*sharedNode
	for _, n := range nodes {
		if s, ok := n.app.Hub.Session(mac); ok && s.Info().State == device.StateReady {
			out = append(out, n)
		}
	}
	return out
}

// oneFleetView waits until every node lists exactly want as ready boards
// (each once) and exactly one node holds each, and returns the holders.
func oneFleetView(t *testing.T, nodes []*sharedNode, want []string, within time.Duration) map[string]*sharedNode {
	t.Helper()
	sort.Strings(want)
	held := map[string]*sharedNode{}
	require.Eventually(t, func() bool {
		for _, n := range nodes {
			if fmt.Sprint(readyBoards(t, n.base)) != fmt.Sprint(want) {
				return false
			}
		}
		for _, mac := range want {
			h := holders(nodes, mac)
			if len(h) != 1 {
				return false
			}
			held[mac] = h[0]
		}
		return true
	}, within, 20*time.Millisecond, "every node lists %v once, each held by one node", want)
	return held
}

func others(nodes []*sharedNode, not *sharedNode) []*sharedNode {
	var out []*sharedNode
	for _, n := range nodes {
		if n != not {
			out = append(out, n)
		}
	}
	return out
}

// directoryWrites counts the writes to one board's record in the fleet
// directory that nodes attempt: every publish on the record's subject, a
// compare-and-set JetStream rejects included (a plain subscriber sees those
// too). That is the traffic a directory fight would make.
type directoryWrites struct {
	nc  *nats.Conn
	sub *nats.Subscription
	n   int
}

func watchDirectory(t *testing.T, natsURL, mac string) *directoryWrites {
	t.Helper()
	nc, err := nats.Connect(natsURL, nats.UserInfo(natstest.Observer, natstest.ObserverPassword))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	digits, ok := device.MACDigits(mac)
	require.True(t, ok)
	sub, err := nc.SubscribeSync("$KV.devicebridge_boards." + digits)
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	return &directoryWrites{nc: nc, sub: sub}
}

// count returns the writes so far: everything NATS routed before a round
// trip made now.
func (d *directoryWrites) count(t *testing.T) int {
	t.Helper()
	require.NoError(t, d.nc.Flush())
	for {
		if _, err := d.sub.NextMsg(0); err != nil {
			return d.n
		}
		d.n++
	}
}

// TestMQTTSharedBrokerConfig: the switch needs an external broker and a
// fleet.
func TestMQTTSharedBrokerConfig(t *testing.T) {
	// --nats-insecure: this test is about the broker; TestClusterCredentials
	// checks the credentials.
	cfg, err := app.ParseArgs("bridge", []string{"--mqtt-shared-broker", "--mqtt-broker", "tcp://10.0.0.5:1883",
		"--nats", "nats://127.0.0.1:4333", "--nats-insecure"})
	require.NoError(t, err)
	require.True(t, cfg.MQTT.SharedBroker)
	require.NoError(t, cfg.Validate())
	noFleet := cfg
	noFleet.Cluster.NATSURL = ""
	require.ErrorContains(t, noFleet.Validate(), "shared_broker needs a fleet")
	embedded := cfg
	embedded.MQTT.Broker, embedded.MQTT.Listen = "", ":1883"
	require.ErrorContains(t, embedded.Validate(), "shared_broker needs mqtt.broker")
}

// TestMQTTSharedBrokerOneHolder: three nodes on one Mosquitto hear every
// board; each board is held by exactly one node, every node lists it once
// and calls it, and the board speaking again, heard by all nodes, writes
// nothing to the directory: no newest-wins fight.
func TestMQTTSharedBrokerOneHolder(t *testing.T) {
	noLeaks(t)
	mq := mosquittotest.Start(t)
	url := startNATS(t)
	nodes := []*sharedNode{
		startSharedNode(t, url, mq.URL(), "a", offlineWindow),
		startSharedNode(t, url, mq.URL(), "b", offlineWindow),
		startSharedNode(t, url, mq.URL(), "c", offlineWindow),
	}
	macs := []string{"0d:00:00:00:00:01", "0d:00:00:00:00:02"}
	writes := map[string]*directoryWrites{}
	conns := map[string]*simulator.MQTTConn{}
	for _, mac := range macs {
		writes[mac] = watchDirectory(t, url, mac)
		conns[mac] = sharedBoard(t, mq.URL(), mac)
	}
	held := oneFleetView(t, nodes, macs, sharedWait)
	for _, n := range nodes {
		for _, mac := range macs {
			require.Equal(t, http.StatusOK, callStatus(t, n.base, mac), "node %s calls %s", n.app.Cluster().ID(), mac)
		}
	}

	before := map[string]int{}
	for _, mac := range macs {
		before[mac] = writes[mac].count(t)
		// At most one claim attempt per node (Create: one wins), then the
		// holder's write as the board comes online.
		require.LessOrEqual(t, before[mac], len(nodes)+2, "directory writes for %s", mac)
		t.Logf("%s: %d directory write attempts until ready on every node", mac, before[mac])
	}
	notOwned := func(n *sharedNode) int64 { return n.app.MQTTGateway().Stats().NotOwned }
	start := map[*sharedNode]int64{}
	for _, n := range nodes {
		start[n] = notOwned(n)
	}
	// Each board speaks five more times; every node hears every message.
	ctx, cancel := context.WithTimeout(context.Background(), sharedWait)
	defer cancel()
	for range 5 {
		for _, mac := range macs {
			require.NoError(t, conns[mac].OpenAudioChannel(ctx))
		}
	}
	// Each node that does not hold a board has turned each of its
	// messages away (a node holding one of the two boards hears five of
	// the other's).
	require.Eventually(t, func() bool {
		for _, n := range nodes {
			want := int64(0)
			for _, mac := range macs {
				if held[mac] != n {
					want += 5
				}
			}
			if notOwned(n)-start[n] < want {
				return false
			}
		}
		return true
	}, sharedWait, 10*time.Millisecond, "every other node dropped the boards' messages")
	for _, mac := range macs {
		require.Equal(t, before[mac], writes[mac].count(t), "the board speaking rewrote its record (%s)", mac)
		require.Len(t, holders(nodes, mac), 1)
		require.Same(t, held[mac], holders(nodes, mac)[0], "the board stayed with its holder")
	}
}

// TestMQTTSharedBrokerHolderDies: the node holding a board dies without a
// word. Within the offline window one survivor adopts the board, which
// neither reconnects nor speaks: the survivor reaches out to it. It is
// ready there and every survivor calls it.
func TestMQTTSharedBrokerHolderDies(t *testing.T) {
	noLeaks(t)
	mq := mosquittotest.Start(t)
	url := startNATS(t)
	nodes := []*sharedNode{
		startSharedNode(t, url, mq.URL(), "a", offlineWindow),
		startSharedNode(t, url, mq.URL(), "b", offlineWindow),
		startSharedNode(t, url, mq.URL(), "c", offlineWindow),
	}
	const mac = "0d:00:00:00:01:01"
	writes := watchDirectory(t, url, mac)
	conn := sharedBoard(t, mq.URL(), mac)
	holder := oneFleetView(t, nodes, []string{mac}, sharedWait)[mac]
	survivors := others(nodes, holder)

	// A crash: the node leaves NATS and the broker without cleaning up.
	holder.app.Cluster().Abandon()
	holder.app.MQTTGateway().Close()
	died := time.Now()
	newHolder := oneFleetView(t, survivors, []string{mac}, 2*offlineWindow+sharedWait)[mac]
	t.Logf("adopted by node %s %v after its holder died (offline window %v)", newHolder.app.Cluster().ID(),
		time.Since(died), offlineWindow)

	for _, n := range survivors {
		require.Equal(t, http.StatusOK, callStatus(t, n.base, mac), "node %s calls the board", n.app.Cluster().ID())
	}
	require.EqualValues(t, 1, conn.Stats().Connects, "the board never reconnected")
	var adopted, discovered int64
	for _, n := range survivors {
		st := n.app.MQTTGateway().Stats()
		adopted += st.Adopted
		discovered += st.Discovered
	}
	require.EqualValues(t, 1, adopted, "exactly one survivor adopted the board")
	require.Zero(t, discovered, "no survivor needed to hear the board")
	n := writes.count(t)
	// Claims by up to three nodes and the first holder's online write, one
	// adoption attempt per survivor (one wins) and the new holder's online
	// write.
	require.LessOrEqual(t, n, 3+1+2+1+1, "a few writes: claim and online at each holder")
	t.Logf("%d directory write attempts for the board in all", n)
}

// TestMQTTSharedBrokerCleanStop: a holder that shuts down hands its boards
// over; a survivor adopts them at once, long before the heartbeat window
// (one minute here) could tell anyone the node is gone.
func TestMQTTSharedBrokerCleanStop(t *testing.T) {
	noLeaks(t)
	mq := mosquittotest.Start(t)
	url := startNATS(t)
	const window = time.Minute
	nodes := []*sharedNode{
		startSharedNode(t, url, mq.URL(), "a", window),
		startSharedNode(t, url, mq.URL(), "b", window),
		startSharedNode(t, url, mq.URL(), "c", window),
	}
	macs := []string{"0d:00:00:00:02:01", "0d:00:00:00:02:02", "0d:00:00:00:02:03"}
	conns := map[string]*simulator.MQTTConn{}
	for _, mac := range macs {
		conns[mac] = sharedBoard(t, mq.URL(), mac)
	}
	held := oneFleetView(t, nodes, macs, sharedWait)

	leaving := held[macs[0]]
	leaving.stop()
	survivors := others(nodes, leaving)
	moved := oneFleetView(t, survivors, macs, sharedWait)
	for _, mac := range macs {
		if held[mac] != leaving {
			require.Same(t, held[mac], moved[mac], "a board of a node that stayed did not move")
		}
		for _, n := range survivors {
			require.Equal(t, http.StatusOK, callStatus(t, n.base, mac))
		}
		require.EqualValues(t, 1, conns[mac].Stats().Connects, "the board never reconnected")
	}
}
