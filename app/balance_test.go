package app_test

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/simulator"
)

const fleetOTASecret = "fleet-ota-secret-0123456789"

// startOTANode starts a fleet node whose OTA endpoint requires the
// credentials it issues (derived from one secret shared by the fleet),
// with the embedded broker when mqtt is set.
func startOTANode(t *testing.T, natsURL, id string, mqtt bool, balance string) (*app.App, string) {
	t.Helper()
	cfg := fleetConfig(natsURL, id)
	cfg.OTA.Secret = fleetOTASecret
	cfg.OTA.RequireCredentials = true
	cfg.OTA.Balance = balance
	if mqtt {
		cfg.MQTT.Listen = "127.0.0.1:0"
		cfg.MQTT.UDP.Listen = "127.0.0.1:0"
	}
	return startApp(t, cfg)
}

// connectWithToken connects a simulated board over WebSocket with the
// token the fleet's OTA secret derives for it (the node requires one).
func connectWithToken(t *testing.T, a *app.App, mac string) {
	t.Helper()
	profile, err := simulator.LoadProfile("breadboard")
	require.NoError(t, err)
	b, err := simulator.NewBoard(simulator.Config{MAC: mac, Profile: profile, Token: a.OTA().Credentials().WebSocketToken(mac)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, b.ConnectWebSocket(ctx, a.DeviceURL()))
}

// seesLoad waits until node a's view of the fleet shows these board
// counts, from the heartbeats.
func seesLoad(t *testing.T, a *app.App, want map[string]int) {
	t.Helper()
	require.Eventually(t, func() bool {
		got := map[string]int{}
		for _, hb := range a.Cluster().Nodes() {
			got[hb.Node] = hb.Boards
		}
		return len(got) == len(want) && func() bool {
			for k, v := range want {
				if got[k] != v {
					return false
				}
			}
			return true
		}()
	}, 10*time.Second, 20*time.Millisecond, "heartbeats carry each node's board count")
}

// TestOTASendsBoardsToTheLeastLoadedNode: with ota.balance least_loaded,
// a board that boots through the busy node's OTA URL is told to connect
// to the quiet node, with credentials the quiet node accepts, and becomes
// ready there; over WebSocket and over each node's embedded MQTT broker.
func TestOTASendsBoardsToTheLeastLoadedNode(t *testing.T) {
	for _, transport := range []string{"websocket", "mqtt"} {
		t.Run(transport, func(t *testing.T) {
			noLeaks(t)
			url := startNATS(t)
			mq := transport == "mqtt"
			busy, baseBusy := startOTANode(t, url, "a", mq, "least_loaded")
			quiet, _ := startOTANode(t, url, "b", mq, "least_loaded")
			other, _ := startOTANode(t, url, "c", mq, "least_loaded")
			for _, mac := range []string{"0a:00:00:00:00:01", "0a:00:00:00:00:02", "0a:00:00:00:00:03"} {
				connectWithToken(t, busy, mac)
			}
			connectWithToken(t, other, "0c:00:00:00:00:01")
			seesLoad(t, busy, map[string]int{"a": 3, "b": 0, "c": 1})

			// Every node advertises its own endpoints in its heartbeat.
			for _, hb := range busy.Cluster().Nodes() {
				require.Regexp(t, `^ws://127\.0\.0\.1:\d+/xiaozhi/v1/$`, hb.WebSocketURL, hb.Node)
				if mq {
					require.Regexp(t, `^127\.0\.0\.1:\d+$`, hb.MQTTEndpoint, hb.Node)
				} else {
					require.Empty(t, hb.MQTTEndpoint, "no embedded broker, no MQTT endpoint")
				}
			}

			// The OTA request, as a board sends it at boot, to the busy node.
			board := newSimBoard(t, "0d:00:00:00:00:01")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			res, err := board.CheckOTA(ctx, simulator.OTAConfig{URL: busy.OTAURL()})
			require.NoError(t, err)
			require.Equal(t, transport, res.Transport)
			if mq {
				_, port, _ := net.SplitHostPort(quiet.MQTTAddr().String())
				require.Equal(t, "127.0.0.1:"+port, res.MQTT.Endpoint, "the quiet node's broker")
			} else {
				require.Equal(t, quiet.DeviceURL(), res.WebSocketURL, "the quiet node's device URL")
			}

			// The board boots the same way and lands on the quiet node.
			res, conn, err := board.BootOTA(ctx, simulator.OTAConfig{URL: busy.OTAURL()})
			require.NoError(t, err)
			require.Equal(t, transport, res.Transport, "the boot's answer")
			if conn != nil {
				t.Cleanup(func() { _ = conn.Close() })
			}
			require.Eventually(t, func() bool {
				var d struct {
					State string `json:"state"`
					Node  string `json:"node"`
				}
				return getJSON(t, baseBusy+"/api/devices/0d:00:00:00:00:01", &d) == http.StatusOK && d.State == "ready" && d.Node == "b"
			}, 10*time.Second, 20*time.Millisecond, "ready on node b, as node a sees it")
			require.Equal(t, []string{"0d:00:00:00:00:01"}, localReady(quiet), "node b holds it")
			require.Equal(t, http.StatusOK, callStatus(t, baseBusy, "0d:00:00:00:00:01"))
			seesLoad(t, busy, map[string]int{"a": 3, "b": 1, "c": 1})
		})
	}
}

// TestOTABalanceSkipsDeadAndSilentNodes: a node whose heartbeat lapsed,
// or that offers no endpoint for the transport, is never picked; with no
// better node the board stays where it asked.
func TestOTABalanceSkipsDeadAndSilentNodes(t *testing.T) {
	noLeaks(t)
	url := startNATS(t)
	busy, _ := startOTANode(t, url, "a", false, "least_loaded")
	quiet, _ := startOTANode(t, url, "b", false, "least_loaded")
	connectWithToken(t, busy, "0a:00:00:00:00:01")
	seesLoad(t, busy, map[string]int{"a": 1, "b": 0})
	board := newSimBoard(t, "0d:00:00:00:00:02")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := board.CheckOTA(ctx, simulator.OTAConfig{URL: busy.OTAURL()})
	require.NoError(t, err)
	require.Equal(t, quiet.DeviceURL(), res.WebSocketURL)

	// b dies without a word: once its heartbeat lapses, a keeps its boards.
	quiet.Cluster().Abandon()
	require.Eventually(t, func() bool { return len(busy.Cluster().Nodes()) == 1 }, 2*offlineWindow, 10*time.Millisecond)
	res, err = board.CheckOTA(ctx, simulator.OTAConfig{URL: busy.OTAURL()})
	require.NoError(t, err)
	require.Equal(t, busy.DeviceURL(), res.WebSocketURL, "never a node whose heartbeat lapsed")
}

// TestOTABalanceSkipsNodesWithoutTheTransport: an MQTT board is never
// sent to a quieter node that runs no broker.
func TestOTABalanceSkipsNodesWithoutTheTransport(t *testing.T) {
	noLeaks(t)
	url := startNATS(t)
	busy, _ := startOTANode(t, url, "a", true, "least_loaded")
	startOTANode(t, url, "b", false, "least_loaded")
	connectWithToken(t, busy, "0a:00:00:00:00:01")
	seesLoad(t, busy, map[string]int{"a": 1, "b": 0})
	board := newSimBoard(t, "0d:00:00:00:00:04")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := board.CheckOTA(ctx, simulator.OTAConfig{URL: busy.OTAURL()})
	require.NoError(t, err)
	require.Equal(t, "mqtt", res.Transport)
	_, port, _ := net.SplitHostPort(busy.MQTTAddr().String())
	require.Equal(t, "127.0.0.1:"+port, res.MQTT.Endpoint, "b offers no MQTT endpoint")
}

// TestOTAWithoutBalanceStaysOnItsNode: by default the OTA answer points a
// board at the node it asked, however loaded.
func TestOTAWithoutBalanceStaysOnItsNode(t *testing.T) {
	noLeaks(t)
	url := startNATS(t)
	busy, _ := startOTANode(t, url, "a", false, "")
	startOTANode(t, url, "b", false, "")
	connectWithToken(t, busy, "0a:00:00:00:00:01")
	seesLoad(t, busy, map[string]int{"a": 1, "b": 0})
	board := newSimBoard(t, "0d:00:00:00:00:03")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := board.CheckOTA(ctx, simulator.OTAConfig{URL: busy.OTAURL()})
	require.NoError(t, err)
	require.Equal(t, busy.DeviceURL(), res.WebSocketURL)
}

func TestOTABalanceNeedsAFleet(t *testing.T) {
	cfg := testConfig()
	cfg.OTA.Balance = "least_loaded"
	require.ErrorContains(t, cfg.Validate(), "cluster.nats_url")
	// Insecure: this test is about ota.balance; TestClusterCredentials
	// checks the credentials.
	cfg.Cluster.NATSURL, cfg.Cluster.Insecure = "nats://127.0.0.1:4333", true
	require.NoError(t, cfg.Validate())
	cfg.OTA.Balance = "random"
	require.ErrorContains(t, cfg.Validate(), "least_loaded")
	parsed, err := app.ParseArgs("bridge", []string{"--nats", "nats://127.0.0.1:4333", "--nats-insecure", "--ota-balance", "least_loaded"})
	require.NoError(t, err)
	require.Equal(t, "least_loaded", parsed.OTA.Balance)
}

func newSimBoard(t *testing.T, mac string) *simulator.Board {
	t.Helper()
	profile, err := simulator.LoadProfile("breadboard")
	require.NoError(t, err)
	b, err := simulator.NewBoard(simulator.Config{MAC: mac, Profile: profile})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// localReady lists the ready boards a node holds itself.
func localReady(a *app.App) []string {
	var out []string
	for _, s := range a.Hub.Sessions() {
		if s.Info().State == device.StateReady {
			out = append(out, s.Info().DeviceID)
		}
	}
	return out
}
