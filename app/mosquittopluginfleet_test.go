package app_test

import (
	"context"
	"encoding/hex"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/internal/bridgetest"
	"github.com/devicebridge/devicebridge/mqtt"
	"github.com/devicebridge/devicebridge/mqtt/mosquittotest"
)

// startPluginNode starts one node of a fleet on natsURL that shares the
// Mosquitto at brokerURL (mqtt.shared_broker) through the plugin, with
// the fleet's common ota.secret.
func startPluginNode(t *testing.T, natsURL, brokerURL, id string) *sharedNode {
	t.Helper()
	cfg := fleetConfig(natsURL, id)
	cfg.OTA.Secret = fleetOTASecret
	cfg.OTA.RequestsPerSecond, cfg.OTA.RequestBurst = 10000, 10000
	cfg.MQTT.Broker = brokerURL
	cfg.MQTT.SharedBroker = true
	cfg.MQTT.Downlink = mqtt.DownlinkMosquittoPlugin
	cfg.MQTT.UDP.Listen = "127.0.0.1:0"
	cfg.MQTT.MaxReconnectInterval = 200 * time.Millisecond
	cfg.MQTT.KeepAlive = 2 * time.Second
	b := bridgetest.Start(t, func(c *app.Config) { *c = cfg },
		bridgetest.WithLogger(zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))))
	ctx, cancel := context.WithTimeout(context.Background(), pluginWait)
	defer cancel()
	require.NoError(t, b.App.MQTTGateway().WaitReady(ctx))
	return &sharedNode{app: b.App, base: b.Base, stop: func() { require.NoError(t, b.Shutdown()) }}
}

// fleetPluginBroker starts Mosquitto with the plugin reading the fleet's
// ota.secret (as hex, docs/mqtt.md).
func fleetPluginBroker(t *testing.T) *mosquittotest.Broker {
	t.Helper()
	secretFile := filepath.Join(t.TempDir(), "devicebridge-secret")
	require.NoError(t, os.WriteFile(secretFile, []byte(hex.EncodeToString([]byte(fleetOTASecret))+"\n"), 0o600))
	return mosquittotest.Start(t, pluginConf(t, secretFile)...)
}

// TestMosquittoPluginFleet: two nodes on one NATS share one Mosquitto
// with the plugin. Each node's probe comes back to that node (both pass
// /readyz); a current-firmware board booted through one node's OTA is
// claimed by exactly one node, listed ready by both, and a call made
// through the node that does not hold it is routed to the holder, whose
// downlink the plugin delivers.
func TestMosquittoPluginFleet(t *testing.T) {
	noLeaks(t)
	mq := fleetPluginBroker(t)
	url := startNATS(t)
	nodes := []*sharedNode{
		startPluginNode(t, url, mq.URL(), "a"),
		startPluginNode(t, url, mq.URL(), "b"),
	}
	for _, n := range nodes {
		require.Eventually(t, func() bool { code, _ := readyz(t, n.base); return code == http.StatusOK },
			pluginWait, 20*time.Millisecond, "node %s: /readyz once its own probe came back", n.app.Cluster().ID())
	}

	var booted []string
	for i, n := range nodes {
		// One board boots through each node's OTA.
		mac := []string{"0e:00:00:00:02:01", "0e:00:00:00:02:02"}[i]
		_, _, res := bootThroughPlugin(t, n.app.OTAURL(), mac)
		require.Equal(t, "devices/up/"+mqtt.TopicKey(mac), res.MQTT.PublishTopic)
		booted = append(booted, mac)
		holder := oneFleetView(t, nodes, booted, pluginWait)[mac]
		for _, other := range others(nodes, holder) {
			_, local := other.app.Hub.Session(mac)
			require.False(t, local, "node %s holds no session of %s", other.app.Cluster().ID(), mac)
			require.Equal(t, http.StatusOK, callStatus(t, other.base, mac),
				"a call through node %s is routed to %s and answered", other.app.Cluster().ID(), holder.app.Cluster().ID())
		}
		require.Equal(t, http.StatusOK, callStatus(t, holder.base, mac))
	}
	for _, n := range nodes {
		code, body := readyz(t, n.base)
		require.Equal(t, http.StatusOK, code, "node %s: %s", n.app.Cluster().ID(), body)
	}
}

// TestMosquittoPluginUplinksPrivate: a client of the same Mosquitto that
// is neither the bridge nor a board (an anonymous one; Mosquitto admits it,
// the plugin leaves it alone outside devices/) reads nothing of boards'
// uplinks, whatever it subscribes to, and cannot log in as the bridge
// with a wrong password.
func TestMosquittoPluginUplinksPrivate(t *testing.T) {
	noLeaks(t)
	r := startPluginRig(t, true)
	require.Eventually(t, func() bool { code, _ := readyz(t, r.bridge.Base); return code == http.StatusOK },
		pluginWait, 20*time.Millisecond, "/readyz once the plugin answered the probe")

	var mu sync.Mutex
	var got []string
	marker := make(chan struct{}, 1)
	opts := paho.NewClientOptions().AddBroker(r.mq.URL()).SetClientID("spy-1").SetAutoReconnect(false).
		SetConnectTimeout(5 * time.Second)
	spy := paho.NewClient(opts)
	tok := spy.Connect()
	require.True(t, tok.WaitTimeout(pluginWait))
	require.NoError(t, tok.Error(), "an ordinary client of the Mosquitto is admitted")
	t.Cleanup(func() { spy.Disconnect(0) })
	for _, filter := range []string{"devices/up/#", "devices/#", "#"} {
		st := spy.Subscribe(filter, 1, func(_ paho.Client, m paho.Message) {
			if m.Topic() == "spy/marker" {
				select {
				case marker <- struct{}{}:
				default:
				}
				return
			}
			mu.Lock()
			got = append(got, m.Topic())
			mu.Unlock()
		})
		require.True(t, st.WaitTimeout(pluginWait))
		require.NoError(t, st.Error())
	}

	const mac = "0e:00:00:00:03:01"
	_, conn, _ := r.boot(t, mac) // its hello went up devices/up/<mac> and was answered
	r.waitReady(t, mac)
	require.Equal(t, http.StatusOK, callStatus(t, r.bridge.Base, mac), "the board's reply went up too")
	ctx, cancel := context.WithTimeout(context.Background(), pluginWait)
	defer cancel()
	require.NoError(t, conn.OpenAudioChannel(ctx), "one more uplink, answered")

	// Mosquitto delivers to one client in order: the spy's own message,
	// published after the bridge answered the board's last uplink, comes
	// back after anything of the board's it would have been given.
	pt := spy.Publish("spy/marker", 1, false, "m")
	require.True(t, pt.WaitTimeout(pluginWait))
	require.NoError(t, pt.Error())
	select {
	case <-marker:
	case <-time.After(pluginWait):
		t.Fatal("the spy's own marker never came back")
	}
	mu.Lock()
	require.Empty(t, got, "a client other than the bridge read uplinks")
	mu.Unlock()

	// The bridge's username with another password is refused.
	opts = paho.NewClientOptions().AddBroker(r.mq.URL()).SetClientID("spy-2").SetAutoReconnect(false).
		SetConnectTimeout(5 * time.Second).SetUsername(app.DefaultPluginUsername).SetPassword("not-the-bridge")
	impostor := paho.NewClient(opts)
	tok = impostor.Connect()
	require.True(t, tok.WaitTimeout(pluginWait))
	require.Error(t, tok.Error(), "the bridge's username needs the bridge's password")
}
