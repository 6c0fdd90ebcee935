package app_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/internal/bridgetest"
	"github.com/devicebridge/devicebridge/mqtt"
	"github.com/devicebridge/devicebridge/mqtt/mosquittotest"
	"github.com/devicebridge/devicebridge/ota"
	"github.com/devicebridge/devicebridge/simulator"
)

// These tests run a real Mosquitto with deploy/mosquitto/devicebridge.so
// loaded, and the bridge beside it in --mqtt-downlink mosquitto-plugin
// mode: boards boot through the bridge's OTA, which sends them to
// Mosquitto with credentials the plugin checks from the same secret.

const pluginWait = 30 * time.Second

type pluginRig struct {
	mq     *mosquittotest.Broker
	bridge *bridgetest.Bridge
	dir    string
}

// startPluginRig starts Mosquitto with the plugin (its own secret file in
// the bridge's data directory) and a bridge using it.
func startPluginRig(t *testing.T, loadPlugin bool) *pluginRig {
	t.Helper()
	dir := t.TempDir()
	_, err := ota.LoadOrCreateSecret(dir)
	require.NoError(t, err)
	var extra []string
	if loadPlugin {
		extra = pluginConf(t, filepath.Join(dir, ota.SecretFile))
	} else if os.Geteuid() == 0 {
		extra = []string{"user root"}
	}
	mq := mosquittotest.Start(t, extra...)
	b := bridgetest.Start(t, func(c *app.Config) {
		c.OTA.DataDir = dir
		c.OTA.RequestsPerSecond, c.OTA.RequestBurst = 10000, 10000 // every board boots from 127.0.0.1
		c.MQTT.Broker = mq.URL()
		c.MQTT.Downlink = mqtt.DownlinkMosquittoPlugin
		c.MQTT.UDP.Listen = "127.0.0.1:0"
		c.MQTT.MaxReconnectInterval = 200 * time.Millisecond
	}, bridgetest.WithLogger(zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))))
	return &pluginRig{mq: mq, bridge: b, dir: dir}
}

// pluginConf is the mosquitto.conf lines that load the plugin with the
// secret in secretFile (hex, as the bridge keeps it).
func pluginConf(t *testing.T, secretFile string) []string {
	t.Helper()
	var lines []string
	if os.Geteuid() == 0 {
		// Mosquitto started as root drops to the mosquitto user, which
		// cannot read the test's private directory (docs/mqtt.md: make
		// the secret readable to that user).
		lines = append(lines, "user root")
	}
	return append(lines,
		"plugin "+mosquittotest.Plugin(t),
		"plugin_opt_secret_file "+secretFile,
		"plugin_opt_bridge_username devicebridge",
	)
}

// boot boots a current-firmware board through the OTA and makes it speak
// once (a hello), as a board does when a conversation starts.
func (r *pluginRig) boot(t *testing.T, mac string) (*simulator.Board, *simulator.MQTTConn, *simulator.OTAResult) {
	t.Helper()
	return bootThroughPlugin(t, r.bridge.App.OTAURL(), mac)
}

// bootThroughPlugin boots a current-firmware board through the OTA at
// otaURL and makes it speak once.
func bootThroughPlugin(t *testing.T, otaURL, mac string) (*simulator.Board, *simulator.MQTTConn, *simulator.OTAResult) {
	t.Helper()
	board := newSimBoard(t, mac)
	ctx, cancel := context.WithTimeout(context.Background(), pluginWait)
	defer cancel()
	res, conn, err := board.BootOTA(ctx, simulator.OTAConfig{URL: otaURL})
	require.NoError(t, err)
	require.Equal(t, "mqtt", res.Transport)
	require.NotNil(t, conn)
	t.Cleanup(func() { _ = conn.Close() })
	require.NoError(t, conn.OpenAudioChannel(ctx), "the server hello came back through the plugin")
	return board, conn, res
}

func (r *pluginRig) waitReady(t *testing.T, mac string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var d struct {
			State string `json:"state"`
		}
		return getJSON(t, r.bridge.Base+"/api/devices/"+mac, &d) == http.StatusOK && d.State == "ready"
	}, pluginWait, 20*time.Millisecond, "%s never ready", mac)
}

func readyz(t *testing.T, base string) (int, string) {
	t.Helper()
	resp, err := http.Get(base + "/readyz")
	require.NoError(t, err)
	defer resp.Body.Close()
	var sb strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, sb.String()
}

// TestMosquittoPluginCurrentFirmware: boards that never subscribe boot
// through OTA, connect to Mosquitto, become ready and answer calls; a
// legacy board too; a board that reconnects is reached again.
func TestMosquittoPluginCurrentFirmware(t *testing.T) {
	noLeaks(t)
	r := startPluginRig(t, true)
	require.Eventually(t, func() bool { code, _ := readyz(t, r.bridge.Base); return code == http.StatusOK },
		pluginWait, 20*time.Millisecond, "/readyz once the plugin answered the probe")

	const mac = "0e:00:00:00:00:01"
	_, conn, res := r.boot(t, mac)
	require.Equal(t, "devices/up/0e_00_00_00_00_01", res.MQTT.PublishTopic)
	require.False(t, res.MQTT.Legacy)
	r.waitReady(t, mac)
	require.Equal(t, http.StatusOK, callStatus(t, r.bridge.Base, mac))

	// A legacy board subscribes (the plugin refuses it) and is reached the
	// same way.
	const legacy = "0e:00:00:00:00:02"
	lb := newSimBoard(t, legacy)
	ctx, cancel := context.WithTimeout(context.Background(), pluginWait)
	defer cancel()
	lres, err := lb.CheckOTA(ctx, simulator.OTAConfig{URL: r.bridge.App.OTAURL()})
	require.NoError(t, err)
	lcfg := lres.MQTT
	lcfg.Legacy = true
	lconn, err := lb.ConnectMQTT(ctx, lcfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lconn.Close() })
	require.NoError(t, lconn.OpenAudioChannel(ctx))
	r.waitReady(t, legacy)
	require.Equal(t, http.StatusOK, callStatus(t, r.bridge.Base, legacy))

	// The first board drops its connection and comes back: reached again.
	require.NoError(t, conn.Close())
	board2 := newSimBoard(t, mac)
	conn2, err := board2.ConnectMQTT(ctx, res.MQTT)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn2.Close() })
	require.NoError(t, conn2.OpenAudioChannel(ctx), "hello answered on the new connection")
	require.Eventually(t, func() bool { return callStatus(t, r.bridge.Base, mac) == http.StatusOK },
		pluginWait, 50*time.Millisecond, "the reconnected board answers calls")
}

// TestMosquittoPluginRefusesImpostors: a board presenting another board's
// credentials is refused; a board publishing on another board's uplink is
// refused, and nothing it sent is attributed to that board.
func TestMosquittoPluginRefusesImpostors(t *testing.T) {
	noLeaks(t)
	r := startPluginRig(t, true)
	const victim, thief = "0e:00:00:00:01:01", "0e:00:00:00:01:02"
	_, _, vres := r.boot(t, victim)
	r.waitReady(t, victim)

	ctx, cancel := context.WithTimeout(context.Background(), pluginWait)
	defer cancel()
	// The thief's client id names itself; the credentials are the victim's.
	tb := newSimBoard(t, thief)
	stolen := vres.MQTT
	stolen.ClientID = mqtt.FormatClientID(ota.MQTTClientGroup, thief, "uuid-thief")
	_, err := tb.ConnectMQTT(ctx, stolen)
	require.ErrorIs(t, err, simulator.ErrMQTTRefused, "another board's password")
	// Claiming the victim's client id with made-up credentials fails too.
	forged := vres.MQTT
	forged.Password = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	_, err = newSimBoard(t, victim).ConnectMQTT(ctx, forged)
	require.ErrorIs(t, err, simulator.ErrMQTTRefused, "a forged password")

	// A board with its own valid login publishes on the victim's uplink.
	_, tconn, _ := r.boot(t, thief)
	r.waitReady(t, thief)
	before := r.bridge.App.MQTTGateway().Stats()
	victimKey := mqtt.TopicKey(victim)
	require.NoError(t, tconn.PublishRaw(ctx, "devices/up/"+victimKey, []byte(`{"type":"goodbye","session_id":"x"}`)))
	// Its next message, on its own uplink, is answered: the broker has
	// handled the one before it (one connection keeps its order).
	require.NoError(t, tconn.OpenAudioChannel(ctx))
	require.Eventually(t, func() bool { return strings.Contains(r.mq.Logs(), "denied board") }, pluginWait, 20*time.Millisecond,
		"the plugin logs the denied publish")
	require.Equal(t, http.StatusOK, callStatus(t, r.bridge.Base, victim))
	require.Equal(t, http.StatusOK, callStatus(t, r.bridge.Base, thief))
	after := r.bridge.App.MQTTGateway().Stats()
	require.Equal(t, before.GoodbyesIn, after.GoodbyesIn, "no goodbye attributed to the victim")
	// Subscribing to other boards' topics is refused too.
	ok, err := tconn.SubscribeRaw(ctx, "devices/p2p/"+victimKey)
	require.NoError(t, err)
	require.False(t, ok, "a board never subscribes")
}

// TestMosquittoPluginMissing: against a Mosquitto without the plugin,
// /readyz fails and says why, and the log says it once.
func TestMosquittoPluginMissing(t *testing.T) {
	noLeaks(t)
	r := startPluginRig(t, false)
	require.Eventually(t, func() bool {
		code, body := readyz(t, r.bridge.Base)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "plugin")
	}, pluginWait, 50*time.Millisecond, "/readyz names the missing plugin")
}

// TestMosquittoPluginManyBoards: many boards through the plugin each get
// a call (DEVICEBRIDGE_PLUGIN_BOARDS, default 1000; 200 under -short).
func TestMosquittoPluginManyBoards(t *testing.T) {
	noLeaks(t)
	n := 1000
	if testing.Short() || os.Getenv(mosquittotest.ValgrindEnv) == "1" {
		n = 20
	}
	if v, err := strconv.Atoi(os.Getenv("DEVICEBRIDGE_PLUGIN_BOARDS")); err == nil && v > 0 {
		n = v
	}
	r := startPluginRig(t, true)
	start := time.Now()
	macs := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 32)
	for i := range n {
		macs[i] = fmt.Sprintf("0f:00:00:00:%02x:%02x", i>>8, i&0xff)
		board := newSimBoard(t, macs[i])
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), 2*pluginWait)
			defer cancel()
			_, conn, err := board.BootOTA(ctx, simulator.OTAConfig{URL: r.bridge.App.OTAURL()})
			if err == nil && conn != nil {
				t.Cleanup(func() { _ = conn.Close() })
				err = conn.OpenAudioChannel(ctx)
			}
			if err != nil {
				errs <- fmt.Errorf("%s: %w", board.MAC(), err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for _, mac := range macs {
		r.waitReady(t, mac)
	}
	t.Logf("%d boards booted, connected and ready through the plugin in %v", n, time.Since(start))
	callStart := time.Now()
	for _, mac := range macs {
		require.Equal(t, http.StatusOK, callStatus(t, r.bridge.Base, mac), mac)
	}
	t.Logf("%d calls in %v", n, time.Since(callStart))
}
