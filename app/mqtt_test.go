package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/mqtt"
	"github.com/devicebridge/devicebridge/mqtt/broker"
	"github.com/devicebridge/devicebridge/mqtt/mosquittotest"
	"github.com/devicebridge/devicebridge/simulator"
)

// mqttWait bounds every poll in these tests; nothing should come close.
const mqttWait = 15 * time.Second

// leakCheck verifies at the end of a test that it left no goroutines
// behind. It is per test (not TestMain) so other files of the package stay
// free to define their own TestMain.
func leakCheck(t *testing.T) {
	t.Helper()
	opts := []goleak.Option{goleak.IgnoreCurrent()}
	t.Cleanup(func() { goleak.VerifyNone(t, opts...) })
}

// eventually polls f until it returns nil, failing with f's last error
// if it never does.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) { assert.NoError(c, f()) }, mqttWait, 10*time.Millisecond, what)
}

// startBridge runs a real bridge on loopback ports: WebSocket, control API,
// embedded MQTT broker and UDP all on port 0.
func startBridge(t testing.TB, mutate func(*Config)) *App {
	t.Helper()
	cfg := Default()
	cfg.DeviceListen = "127.0.0.1:0"
	cfg.ControlListen = "127.0.0.1:0"
	cfg.MQTT.Listen = "127.0.0.1:0"
	cfg.MQTT.UDP.Listen = "127.0.0.1:0"
	cfg.Devices.RequestTimeout = 3 * time.Second
	cfg.Devices.CallTimeout = 5 * time.Second
	if mutate != nil {
		mutate(&cfg)
	}
	logger := zap.NewNop()
	if _, bench := t.(*testing.B); !bench {
		logger = zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
	}
	return runApp(t, cfg, logger)
}

// runApp starts an App and shuts it down at cleanup, each bounded. It is
// internal/bridgetest.Start for this package's internal tests, which cannot
// import bridgetest (bridgetest imports app); startBridge, loggedApp and
// startOTABridge are configs for it. Tests outside the package use
// bridgetest.
func runApp(t testing.TB, cfg Config, logger *zap.Logger) *App {
	t.Helper()
	a, err := New(cfg, logger)
	require.NoError(t, err)
	// Start hands ctx to the long-running parts (the /mcp server closes
	// when it ends): it lives until Shutdown, as in bridgetest.Start.
	life, stop := context.WithCancel(context.Background())
	if err := a.Start(life); err != nil {
		stop()
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		defer stop()
		ctx, cancel := context.WithTimeout(context.Background(), mqttWait)
		defer cancel()
		assert.NoError(t, a.Shutdown(ctx))
	})
	return a
}

func loadProfile(t testing.TB, name string) *simulator.Profile {
	t.Helper()
	p, err := simulator.LoadProfile(name)
	require.NoError(t, err)
	return p
}

func newBoard(t *testing.T, mac, profile string) *simulator.Board {
	t.Helper()
	b, err := simulator.NewBoard(simulator.Config{MAC: mac, Profile: loadProfile(t, profile), Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
	require.NoError(t, err)
	return b
}

// connectMQTT connects b to the bridge's embedded broker and closes it at
// the end of the test.
func connectMQTT(t *testing.T, a *App, b *simulator.Board, mc simulator.MQTTConfig) *simulator.MQTTConn {
	t.Helper()
	if mc.Endpoint == "" {
		mc.Endpoint = "tcp://" + a.MQTTAddr().String()
	}
	ctx, cancel := context.WithTimeout(context.Background(), mqttWait)
	defer cancel()
	c, err := b.ConnectMQTT(ctx, mc)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// controlAPI is a tiny client for the bridge's control API.
type controlAPI struct {
	t    *testing.T
	base string
}

func apiOf(t *testing.T, a *App) controlAPI {
	return controlAPI{t: t, base: "http://" + a.ControlAddr().String()}
}

type apiDevice struct {
	DeviceID    string `json:"device_id"`
	ClientID    string `json:"client_id"`
	Transport   string `json:"transport"`
	State       string `json:"state"`
	Board       string `json:"board"`
	ToolCount   int    `json:"tool_count"`
	CloseReason string `json:"close_reason"`
	Tools       []struct {
		Name     string `json:"name"`
		UserOnly bool   `json:"user_only"`
	} `json:"tools"`
}

func (c controlAPI) get(path string, into any) (int, error) {
	resp, err := http.Get(c.base + path)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if into != nil && resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, into); err != nil {
			return resp.StatusCode, fmt.Errorf("%w: %s", err, body)
		}
	}
	return resp.StatusCode, nil
}

func (c controlAPI) devices() []apiDevice {
	var out struct {
		Devices []apiDevice `json:"devices"`
	}
	_, err := c.get("/api/devices", &out)
	require.NoError(c.t, err)
	return out.Devices
}

func (c controlAPI) device(id string) (apiDevice, bool) {
	var d apiDevice
	code, err := c.get("/api/devices/"+id, &d)
	require.NoError(c.t, err)
	return d, code == http.StatusOK
}

// waitReady polls until the device is listed as ready and returns it.
func (c controlAPI) waitReady(id string) apiDevice {
	c.t.Helper()
	var d apiDevice
	eventually(c.t, "device "+id+" ready", func() error {
		var ok bool
		d, ok = c.device(id)
		if !ok {
			return errors.New("not listed")
		}
		if d.State != "ready" {
			return fmt.Errorf("state %s", d.State)
		}
		return nil
	})
	return d
}

func (c controlAPI) waitGone(id string) {
	c.t.Helper()
	eventually(c.t, "device "+id+" offline", func() error {
		if d, ok := c.device(id); ok {
			return fmt.Errorf("still listed (%s)", d.State)
		}
		return nil
	})
}

// call runs a tool through the control API and returns status and body.
func (c controlAPI) call(id, tool string, args map[string]any) (int, string) {
	body, _ := json.Marshal(map[string]any{"name": tool, "arguments": args})
	resp, err := http.Post(c.base+"/api/devices/"+id+"/call", "application/json", bytes.NewReader(body))
	require.NoError(c.t, err)
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

func toolNames(d apiDevice) []string {
	var n []string
	for _, t := range d.Tools {
		n = append(n, t.Name)
	}
	return n
}

// The MQTT gateway's own behaviour (hello/goodbye, auth, isolation,
// garbage, broker loss, liveness) is tested beside it in mqtt/. These tests
// cover what app adds: flags and config, wiring the broker and gateway into
// a running bridge, and one end-to-end smoke through the control API.

// TestMQTTEmbeddedDiscoveryWithoutHello (the end-to-end smoke): a
// current-firmware board connects, never subscribes and never says hello;
// the bridge still initializes it, lists its tools and calls one, and the
// control API shows it exactly like a WebSocket board.
func TestMQTTEmbeddedDiscoveryWithoutHello(t *testing.T) {
	leakCheck(t)
	a := startBridge(t, nil)
	api := apiOf(t, a)

	b := newBoard(t, "02:00:00:00:01:01", "breadboard")
	conn := connectMQTT(t, a, b, simulator.MQTTConfig{})

	d := api.waitReady(b.MAC())
	assert.Equal(t, "mqtt", d.Transport)
	assert.Equal(t, b.ClientID(), d.ClientID)
	assert.Equal(t, b.Profile().Board, d.Board)
	assert.Contains(t, toolNames(d), "self.get_device_status")
	assert.Equal(t, 0, int(conn.Stats().Hellos), "no hello was needed")

	code, body := api.call(b.MAC(), "self.audio_speaker.set_volume", map[string]any{"volume": 33})
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "true")
	assert.Equal(t, 33, b.State()["audio_speaker.volume"])

	// And the same board over WebSocket looks the same in the list.
	ws := newBoard(t, "02:00:00:00:01:02", "breadboard")
	ctx, cancel := context.WithTimeout(context.Background(), mqttWait)
	defer cancel()
	require.NoError(t, ws.ConnectWebSocket(ctx, a.DeviceURL()))
	t.Cleanup(func() { _ = ws.Close() })
	wd := api.waitReady(ws.MAC())
	assert.Equal(t, "websocket", wd.Transport)
	assert.Equal(t, len(wd.Tools), len(d.Tools))

	list := api.devices()
	require.Len(t, list, 2)
	assert.Equal(t, list[0].ToolCount, list[1].ToolCount)

	// The board leaving the broker takes it offline at once.
	require.NoError(t, conn.Close())
	api.waitGone(b.MAC())
}

// externalBridge runs a bridge against an external broker, with timings
// short enough for tests.
func externalBridge(t testing.TB, brokerURL string, mutate func(*Config)) *App {
	return startBridge(t, func(c *Config) {
		c.MQTT.Listen = ""
		c.MQTT.Broker = brokerURL
		c.MQTT.MaxReconnectInterval = 200 * time.Millisecond
		c.MQTT.KeepAlive = 2 * time.Second
		c.Devices.RequestTimeout = time.Second
		if mutate != nil {
			mutate(c)
		}
	})
}

// BenchmarkCallRoundTrip measures one tool call, bridge → board → bridge,
// through the device Hub, for the same simulated board over WebSocket, over
// MQTT through the embedded broker, and (when installed) over MQTT through
// Mosquitto with a legacy board. Run the sub-benchmarks together and
// compare: go test -run '^$' -bench CallRoundTrip ./app/
func BenchmarkCallRoundTrip(b *testing.B) {
	run := func(b *testing.B, a *App, mac string) {
		ctx := context.Background()
		s, ok := a.Hub.Session(mac)
		require.True(b, ok)
		require.NoError(b, s.WaitReady(ctx))
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			if _, err := a.Hub.CallTool(ctx, mac, "self.get_device_status", nil); err != nil {
				b.Fatal(err)
			}
		}
	}
	board := func(b *testing.B, mac string) *simulator.Board {
		sb, err := simulator.NewBoard(simulator.Config{MAC: mac, Profile: loadProfile(b, "breadboard")})
		require.NoError(b, err)
		return sb
	}
	ready := func(b *testing.B, a *App, mac string) {
		require.Eventually(b, func() bool {
			s, ok := a.Hub.Session(mac)
			return ok && s.Info().State == device.StateReady
		}, mqttWait, 5*time.Millisecond, "%s not ready", mac)
	}

	b.Run("websocket", func(b *testing.B) {
		a := startBridge(b, nil)
		sb := board(b, "02:00:00:00:b0:01")
		require.NoError(b, sb.ConnectWebSocket(context.Background(), a.DeviceURL()))
		defer sb.Close()
		ready(b, a, sb.MAC())
		run(b, a, sb.MAC())
	})
	b.Run("mqtt-embedded", func(b *testing.B) {
		a := startBridge(b, nil)
		sb := board(b, "02:00:00:00:b0:02")
		c, err := sb.ConnectMQTT(context.Background(), simulator.MQTTConfig{Endpoint: "tcp://" + a.MQTTAddr().String()})
		require.NoError(b, err)
		defer c.Close()
		ready(b, a, sb.MAC())
		run(b, a, sb.MAC())
	})
	b.Run("mqtt-mosquitto", func(b *testing.B) {
		mq := mosquittotest.Start(b)
		a := externalBridge(b, mq.URL(), nil)
		// The board's hello must find the gateway's uplink subscription.
		wctx, wcancel := context.WithTimeout(context.Background(), mqttWait)
		require.NoError(b, a.MQTTGateway().WaitReady(wctx))
		wcancel()
		sb := board(b, "02:00:00:00:b0:03")
		c, err := sb.ConnectMQTT(context.Background(), simulator.LegacyMQTTConfig(mq.URL()))
		require.NoError(b, err)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), mqttWait)
		defer cancel()
		require.NoError(b, c.OpenAudioChannel(ctx))
		ready(b, a, sb.MAC())
		run(b, a, sb.MAC())
	})
}

// TestMQTTPortInUse: when the broker port is taken the bridge starts
// anyway, without MQTT, and WebSocket boards still work.
func TestMQTTPortInUse(t *testing.T) {
	leakCheck(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	a := startBridge(t, func(c *Config) { c.MQTT.Listen = taken.Addr().String() })
	assert.Nil(t, a.MQTTBroker())
	assert.Nil(t, a.MQTTGateway())

	ws := newBoard(t, "02:00:00:00:09:01", "breadboard")
	ctx, cancel := context.WithTimeout(context.Background(), mqttWait)
	defer cancel()
	require.NoError(t, ws.ConnectWebSocket(ctx, a.DeviceURL()))
	t.Cleanup(func() { _ = ws.Close() })
	apiOf(t, a).waitReady(ws.MAC())
	assert.Contains(t, portInUseMessage(taken.Addr().String(), true), "--mqtt-broker tcp://127.0.0.1:")
}

// TestMQTTExternalBrokerDown: an unreachable external broker does not stop
// the bridge from starting (it keeps retrying) nor from shutting down.
func TestMQTTExternalBrokerDown(t *testing.T) {
	leakCheck(t)
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url := "tcp://" + dead.Addr().String()
	require.NoError(t, dead.Close()) // nothing listens there any more
	a := externalBridge(t, url, func(c *Config) { c.MQTT.ConnectTimeout = 300 * time.Millisecond })
	require.NotNil(t, a.MQTTGateway())
	assert.False(t, a.MQTTGateway().Connected())
}

func TestMQTTConfig(t *testing.T) {
	base := Default()
	require.NoError(t, base.Validate())
	assert.Equal(t, ":1883", base.MQTT.Listen)

	for name, mutate := range map[string]func(*MQTTConfig){
		"bad broker scheme": func(c *MQTTConfig) { c.Broker = "http://x:1883" },
		"bad listen":        func(c *MQTTConfig) { c.Listen = "1883" },
		"bad topic":         func(c *MQTTConfig) { c.GatewayConfig.Topics.Uplink = "devices/up" },
		"nobody admitted":   func(c *MQTTConfig) { f := false; c.Auth.AllowAnonymous = &f },
		"bad advertise":     func(c *MQTTConfig) { c.UDP.Advertise = "host:notaport" },
		"missing ca file":   func(c *MQTTConfig) { c.TLS.CAFile = "/nonexistent/ca.pem" },
		"negative rate":     func(c *MQTTConfig) { c.GatewayConfig.BoardLimits.Rate = -1 },
		"negative burst":    func(c *MQTTConfig) { c.GatewayConfig.BoardLimits.Burst = -1 },
		"negative grace":    func(c *MQTTConfig) { c.GatewayConfig.BoardLimits.FloodGrace = -time.Second },
		"negative inbox":    func(c *MQTTConfig) { c.InboxSize = -1 },
		"negative max conn": func(c *MQTTConfig) { c.MaxConnections = -1 },
		"negative pending":  func(c *MQTTConfig) { c.MaxPendingConnects = -1 },
	} {
		c := Default()
		mutate(&c.MQTT)
		assert.Error(t, c.Validate(), name)
	}
	ok := Default()
	ok.MQTT.UDP.Advertise = "192.168.1.10:8884"
	ok.MQTT.Listen = ""
	assert.NoError(t, ok.Validate(), "MQTT off")

	cfg, err := ParseArgs("bridge", []string{"--mqtt-listen", ":1884", "--mqtt-user", "a:b", "--mqtt-hmac-secret", "s",
		"--mqtt-allow-anonymous", "true", "--mqtt-udp-advertise", "10.0.0.2"})
	require.NoError(t, err)
	assert.Equal(t, ":1884", cfg.MQTT.Listen)
	assert.Equal(t, []broker.User{{Username: "a", Password: "b"}}, cfg.MQTT.Auth.Users)
	assert.Equal(t, "s", cfg.MQTT.Auth.HMACSecret)
	require.NotNil(t, cfg.MQTT.Auth.AllowAnonymous)
	assert.True(t, *cfg.MQTT.Auth.AllowAnonymous)
	assert.Equal(t, "10.0.0.2", cfg.MQTT.UDP.Advertise)
	_, err = ParseArgs("bridge", []string{"--mqtt-user", "nopassword"})
	assert.Error(t, err)
	cfg, err = ParseArgs("bridge", []string{"--mqtt-board-rate", "2.5", "--mqtt-board-burst", "7"})
	require.NoError(t, err)
	assert.Equal(t, mqtt.BoardLimits{Rate: 2.5, Burst: 7, FloodGrace: mqtt.DefaultFloodGrace}, cfg.MQTT.embeddedBroker().BoardLimits)
	_, err = ParseArgs("bridge", []string{"--mqtt-board-rate", "-1"})
	assert.ErrorContains(t, err, "mqtt.board_limits.rate -1")

	path := t.TempDir() + "/bridge.yaml"
	require.NoError(t, os.WriteFile(path, []byte("mqtt:\n  broker: tcp://10.0.0.5:1883\n  liveness: {interval: 30s, misses: 5}\n  topics: {shared: []}\n"), 0o600))
	cfg, err = ParseArgs("bridge", []string{"--config", path})
	require.NoError(t, err)
	assert.Equal(t, "tcp://10.0.0.5:1883", cfg.MQTT.Broker)
	assert.Equal(t, 30*time.Second, cfg.MQTT.Liveness.Interval)
	assert.Equal(t, 5, cfg.MQTT.Liveness.Misses)
	assert.NotNil(t, cfg.MQTT.GatewayConfig.Topics.Shared, "an explicit empty list is kept, not defaulted")
	assert.Empty(t, cfg.MQTT.GatewayConfig.Topics.Shared)
}

// TestMQTTConfigKeys: every key under mqtt: lands in the gateway's or the
// embedded broker's own config (they are embedded, not copied), and the
// broker is handed the gateway's topics.
func TestMQTTConfigKeys(t *testing.T) {
	path := t.TempDir() + "/bridge.yaml"
	require.NoError(t, os.WriteFile(path, []byte(`mqtt:
  listen: ":1884"
  broker: ""
  username: bridge
  password: pw
  client_id: bridge-1
  tls: {ca_file: "", server_name: broker.lan}
  topics: {uplink: "up/{mac}", downlink: "down/{mac}", shared: ["hub"]}
  downlink: subscribe
  auth: {users: [{username: u, password: p}], hmac_secret: s, allow_any_client_id: true}
  udp: {listen: ":9884", advertise: "10.0.0.9"}
  liveness: {interval: 1m30s, timeout: 7s, misses: 4}
  max_message_size: 1000
  max_packet_size: 2000
  client_writes_pending: 64
  connect_packet_timeout: 5s
  max_connections: 100
  max_pending_connects: 10
  inbox_size: 8
  board_limits: {rate: 5, burst: 10, flood_grace: 3s}
  keepalive: 20s
  max_reconnect_interval: 3s
  connect_timeout: 4s
  write_timeout: 6s
  recover_window: 2m
  rediscover_interval: 9s
`), 0o600))
	cfg, err := ParseArgs("bridge", []string{"--config", path})
	require.NoError(t, err)
	gw, br := cfg.MQTT.gateway(), cfg.MQTT.embeddedBroker()
	assert.Equal(t, mqtt.Config{
		Username: "bridge", Password: "pw", ClientID: "bridge-1",
		TLS:                  mqtt.TLSConfig{ServerName: "broker.lan"},
		Topics:               mqtt.Topics{Uplink: "up/{mac}", Downlink: "down/{mac}", Shared: []string{"hub"}},
		Downlink:             mqtt.DownlinkSubscribe,
		UDP:                  mqtt.UDPConfig{Listen: ":9884", Advertise: "10.0.0.9"},
		Liveness:             mqtt.LivenessConfig{Interval: 90 * time.Second, Timeout: 7 * time.Second, Misses: 4},
		MaxMessageSize:       1000,
		InboxSize:            8,
		BoardLimits:          mqtt.BoardLimits{Rate: 5, Burst: 10, FloodGrace: 3 * time.Second},
		KeepAlive:            20 * time.Second,
		MaxReconnectInterval: 3 * time.Second,
		ConnectTimeout:       4 * time.Second,
		WriteTimeout:         6 * time.Second,
		RecoverWindow:        2 * time.Minute,
		RediscoverInterval:   9 * time.Second,
		// mqtt.auth.allow_any_client_id decides for the gateway too.
		AllowAnyDeviceID: true,
	}, gw)
	assert.Equal(t, broker.Config{
		Listen: ":1884", Topics: gw.Topics,
		Auth:          broker.AuthConfig{Users: []broker.User{{Username: "u", Password: "p"}}, HMACSecret: "s", AllowAnyClientID: true},
		MaxPacketSize: 2000, ClientWritesPending: 64, ConnectPacketTimeout: 5 * time.Second,
		MaxConnections: 100, MaxPendingConnects: 10,
		BoardLimits: gw.BoardLimits, BoardQueue: 8,
	}, br)

	// The shipped file spells out the defaults.
	shipped, err := ParseArgs("bridge", []string{"--config", "../configs/bridge.yaml"})
	require.NoError(t, err)
	def := Default().MQTT
	assert.Equal(t, def.gateway().Topics, shipped.MQTT.gateway().Topics)
	assert.Equal(t, def.Liveness, shipped.MQTT.Liveness)
	assert.Equal(t, def.UDP, shipped.MQTT.UDP)
	assert.Equal(t, def.Listen, shipped.MQTT.Listen)
	assert.Equal(t, def.MaxMessageSize, shipped.MQTT.MaxMessageSize)
	assert.Equal(t, def.MaxPacketSize, shipped.MQTT.MaxPacketSize)
	assert.Equal(t, def.KeepAlive, shipped.MQTT.KeepAlive)
	assert.Equal(t, def.RecoverWindow, shipped.MQTT.RecoverWindow)
	assert.Equal(t, def.GatewayConfig.BoardLimits, shipped.MQTT.GatewayConfig.BoardLimits)
	assert.Equal(t, def.InboxSize, shipped.MQTT.InboxSize)
	assert.Equal(t, def.MaxConnections, shipped.MQTT.MaxConnections)
	assert.Equal(t, def.MaxPendingConnects, shipped.MQTT.MaxPendingConnects)
}
