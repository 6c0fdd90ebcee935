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

// eventually polls f until it returns nil or the deadline passes.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(mqttWait)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s: still failing after %v: %v", what, mqttWait, err)
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
	a, err := New(cfg, logger)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), mqttWait)
	defer cancel()
	require.NoError(t, a.Start(ctx))
	t.Cleanup(func() {
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

// TestMQTTEmbeddedDiscoveryWithoutHello: a current-firmware board connects,
// never subscribes and never says hello; the bridge still initializes it,
// lists its tools and calls one, and the control API shows it exactly like
// a WebSocket board.
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

// TestMQTTEmbeddedHelloGoodbye: hello gets a server hello the board
// accepts, audio is counted, a new hello replaces the session, and goodbye
// works both ways under the session-id rule. MCP keeps working throughout.
func TestMQTTEmbeddedHelloGoodbye(t *testing.T) {
	leakCheck(t)
	a := startBridge(t, nil)
	api := apiOf(t, a)
	gw := a.MQTTGateway()

	b := newBoard(t, "02:00:00:00:02:01", "breadboard")
	conn := connectMQTT(t, a, b, simulator.MQTTConfig{})
	api.waitReady(b.MAC())
	s, ok := a.Hub.Session(b.MAC())
	require.True(t, ok)
	gen := s.Info().Generation

	ctx, cancel := context.WithTimeout(context.Background(), mqttWait)
	defer cancel()
	require.NoError(t, conn.OpenAudioChannel(ctx))
	first := b.SessionID()
	require.NotEmpty(t, first)
	as, ok := gw.AudioSession(b.MAC())
	require.True(t, ok)
	assert.Equal(t, first, as.ID)

	// Audio is accepted and counted, not played.
	for range 3 {
		require.NoError(t, conn.SendAudio([]byte("opus-frame")))
	}
	eventually(t, "audio counted", func() error {
		if as, _ := gw.AudioSession(b.MAC()); as.Packets != 3 {
			return fmt.Errorf("%d packets", as.Packets)
		}
		return nil
	})

	// A second hello replaces the audio session, not the device session.
	require.NoError(t, conn.OpenAudioChannel(ctx))
	second := b.SessionID()
	require.NotEqual(t, first, second)
	as, _ = gw.AudioSession(b.MAC())
	assert.Equal(t, second, as.ID)
	s2, _ := a.Hub.Session(b.MAC())
	assert.Equal(t, gen, s2.Info().Generation, "a hello must not re-create the device session")

	// A board goodbye for another session is ignored; the right one ends it.
	require.NoError(t, conn.PublishRaw(ctx, "device-server", []byte(`{"session_id":"`+first+`","type":"goodbye"}`)))
	code, body := api.call(b.MAC(), "self.lamp.get_state", nil) // a round trip orders us after the goodbye
	require.Equal(t, http.StatusOK, code, body)
	_, open := gw.AudioSession(b.MAC())
	assert.True(t, open, "a stale goodbye must not close the current session")
	require.NoError(t, conn.CloseAudioChannel())
	eventually(t, "board goodbye honoured", func() error {
		if _, open := gw.AudioSession(b.MAC()); open {
			return errors.New("still open")
		}
		return nil
	})
	assert.EqualValues(t, 1, gw.Stats().GoodbyesIn)

	// The bridge's goodbye carries the board's current session id, so the
	// board closes its channel (and sends no goodbye back).
	require.NoError(t, conn.OpenAudioChannel(ctx))
	third := b.SessionID()
	ended, err := gw.Goodbye(ctx, b.MAC())
	require.NoError(t, err)
	assert.Equal(t, third, ended)
	eventually(t, "board closed its channel", func() error {
		if conn.AudioChannelOpen() {
			return errors.New("still open")
		}
		return nil
	})
	assert.EqualValues(t, 1, conn.Stats().GoodbyesIn)
	assert.EqualValues(t, 1, conn.Stats().GoodbyesSent, "only the board's own goodbye from before")

	// MCP is unaffected by all of this.
	code, body = api.call(b.MAC(), "self.lamp.turn_off", nil)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, false, b.State()["lamp.power"])
}

// TestMQTTEmbeddedMultiPageTools: a board whose catalogue needs several
// tools/list pages is listed completely over MQTT.
func TestMQTTEmbeddedMultiPageTools(t *testing.T) {
	leakCheck(t)
	a := startBridge(t, nil)
	api := apiOf(t, a)
	b := newBoard(t, "02:00:00:00:03:01", "catalog")
	connectMQTT(t, a, b, simulator.MQTTConfig{})
	d := api.waitReady(b.MAC())

	var want []string
	for _, tool := range b.Profile().Tools {
		want = append(want, tool.Name)
	}
	assert.Equal(t, want, toolNames(d))
	// initialize + at least three pages
	assert.GreaterOrEqual(t, b.Stats().TextReceived, uint64(4))
	code, body := api.call(b.MAC(), "self.get_device_status", nil)
	require.Equal(t, http.StatusOK, code, body)
}

// TestMQTTEmbeddedAuth: static and HMAC credentials admit boards; wrong or
// missing credentials and foreign client ids get a refused CONNACK.
func TestMQTTEmbeddedAuth(t *testing.T) {
	leakCheck(t)
	const secret = "hmac-secret"
	a := startBridge(t, func(c *Config) {
		c.MQTT.Auth.Users = []broker.User{{Username: "board", Password: "s3cret"}}
		c.MQTT.Auth.HMACSecret = secret
	})
	api := apiOf(t, a)
	ctx, cancel := context.WithTimeout(context.Background(), mqttWait)
	defer cancel()
	endpoint := "tcp://" + a.MQTTAddr().String()

	static := newBoard(t, "02:00:00:00:04:01", "breadboard")
	connectMQTT(t, a, static, simulator.MQTTConfig{Username: "board", Password: "s3cret"})
	api.waitReady(static.MAC())

	// The xinnan-style username is opaque to the broker; the HMAC binds it
	// to the client id.
	hm := newBoard(t, "02:00:00:00:04:02", "breadboard")
	connectMQTT(t, a, hm, simulator.MQTTConfig{Username: "eyJpcCI6IjEwLjAuMC41In0=", HMACSecret: secret})
	api.waitReady(hm.MAC())

	for name, mc := range map[string]simulator.MQTTConfig{
		"wrong password":     {Username: "board", Password: "nope"},
		"wrong hmac secret":  {Username: "u", HMACSecret: "other-secret"},
		"hmac of another id": {Username: "u", Password: mqtt.HMACPassword(secret, "GID_test@@@02_00_00_00_04_01", "u")},
		"no credentials":     {},
	} {
		bad := newBoard(t, "02:00:00:00:04:09", "breadboard")
		mc.Endpoint = endpoint
		_, err := bad.ConnectMQTT(ctx, mc)
		require.ErrorIs(t, err, simulator.ErrMQTTRefused, name)
		assert.ErrorContains(t, err, "not Authorized", name)
	}

	odd := newBoard(t, "02:00:00:00:04:0a", "breadboard")
	_, err := odd.ConnectMQTT(ctx, simulator.MQTTConfig{Endpoint: endpoint, ClientID: "some-random-client", Username: "board", Password: "s3cret"})
	require.ErrorIs(t, err, simulator.ErrMQTTRefused)
	assert.ErrorContains(t, err, "identifier rejected")

	st := a.MQTTBroker().Stats()
	assert.EqualValues(t, 4, st.RefusedAuth)
	assert.EqualValues(t, 1, st.RefusedClientID)
	_, listed := api.device("02:00:00:00:04:09")
	assert.False(t, listed)
}

// TestMQTTEmbeddedIsolation: a board cannot publish as another board nor
// read another board's traffic; publishes on the shared topic are
// attributed to their real sender.
func TestMQTTEmbeddedIsolation(t *testing.T) {
	leakCheck(t)
	a := startBridge(t, nil)
	api := apiOf(t, a)
	gw := a.MQTTGateway()
	ctx, cancel := context.WithTimeout(context.Background(), mqttWait)
	defer cancel()

	victim := newBoard(t, "02:00:00:00:05:01", "breadboard")
	connectMQTT(t, a, victim, simulator.MQTTConfig{})
	attacker := newBoard(t, "02:00:00:00:05:02", "breadboard")
	ac := connectMQTT(t, a, attacker, simulator.MQTTConfig{})
	api.waitReady(victim.MAC())
	api.waitReady(attacker.MAC())

	hello := []byte(`{"type":"hello","version":3,"transport":"udp","features":{"mcp":true},"audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`)
	fakeReply := []byte(`{"session_id":"","type":"mcp","payload":{"jsonrpc":"2.0","id":1,"result":{}}}`)
	require.NoError(t, ac.PublishRaw(ctx, "devices/up/02_00_00_00_05_01", hello))
	require.NoError(t, ac.PublishRaw(ctx, "devices/up/02_00_00_00_05_01", fakeReply))
	require.NoError(t, ac.PublishRaw(ctx, "devices/p2p/02_00_00_00_05_01", fakeReply))
	eventually(t, "impersonation denied", func() error {
		if n := a.MQTTBroker().Stats().DeniedPublish; n != 3 {
			return fmt.Errorf("%d denied", n)
		}
		return nil
	})
	for _, filter := range []string{"devices/p2p/02_00_00_00_05_01", "devices/up/#", "#", "device-server"} {
		granted, err := ac.SubscribeRaw(ctx, filter)
		require.NoError(t, err)
		assert.False(t, granted, filter)
	}

	// The same hello on the shared topic is attributed to its sender.
	require.NoError(t, ac.PublishRaw(ctx, "device-server", hello))
	eventually(t, "attributed hello", func() error {
		if ac.Stats().Hellos != 1 {
			return errors.New("the sender got no server hello")
		}
		if _, ok := gw.AudioSession(attacker.MAC()); !ok {
			return errors.New("no audio session for the sender")
		}
		return nil
	})
	_, victimAudio := gw.AudioSession(victim.MAC())
	assert.False(t, victimAudio, "the victim never said hello")

	// Traffic to the victim does not reach the attacker.
	before := attacker.Stats().TextReceived
	code, body := api.call(victim.MAC(), "self.get_device_status", nil)
	require.Equal(t, http.StatusOK, code, body)
	code, body = api.call(attacker.MAC(), "self.lamp.get_state", nil)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, before+1, attacker.Stats().TextReceived, "attacker got its own call, nothing of the victim's")
	assert.EqualValues(t, 1, gw.Stats().Hellos)
}

// TestMQTTEmbeddedGarbage: garbage, payloads without a type and oversized
// payloads on uplink topics are logged and dropped; the board's session is
// untouched.
func TestMQTTEmbeddedGarbage(t *testing.T) {
	leakCheck(t)
	a := startBridge(t, nil)
	api := apiOf(t, a)
	gw := a.MQTTGateway()
	ctx, cancel := context.WithTimeout(context.Background(), mqttWait)
	defer cancel()

	b := newBoard(t, "02:00:00:00:06:01", "breadboard")
	conn := connectMQTT(t, a, b, simulator.MQTTConfig{})
	api.waitReady(b.MAC())
	s, _ := a.Hub.Session(b.MAC())
	gen := s.Info().Generation

	big := append([]byte(`{"type":"mcp","payload":{"x":"`), bytes.Repeat([]byte("a"), 100<<10)...)
	big = append(big, []byte(`"}}`)...)
	for _, p := range [][]byte{
		[]byte("\x00\xffnot json at all"),
		[]byte(`{"no":"type"}`),
		[]byte(`[1,2,3]`),
		[]byte(`{"type":"mcp","payload":"a string"}`),
		big,
	} {
		require.NoError(t, conn.PublishRaw(ctx, "device-server", p))
	}
	require.NoError(t, conn.PublishRaw(ctx, "devices/up/02_00_00_00_06_01", []byte("{{{")))
	eventually(t, "garbage dropped", func() error {
		st := gw.Stats()
		if st.Malformed != 5 || st.Oversized != 1 {
			return fmt.Errorf("malformed %d oversized %d", st.Malformed, st.Oversized)
		}
		return nil
	})
	code, body := api.call(b.MAC(), "self.audio_speaker.set_volume", map[string]any{"volume": 7})
	require.Equal(t, http.StatusOK, code, body)
	s2, _ := a.Hub.Session(b.MAC())
	assert.Equal(t, gen, s2.Info().Generation)
	assert.Equal(t, "ready", s2.Info().State.String())
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

// legacyConfig is an old, subscribing board pointed at a plain broker: it
// publishes to its own uplink topic and subscribes to its downlink topic.
func legacyConfig(brokerURL, mac string) simulator.MQTTConfig {
	key := mqtt.TopicKey(mac)
	return simulator.MQTTConfig{
		Endpoint:          brokerURL,
		Legacy:            true,
		PublishTopic:      "devices/up/" + key,
		SubscribeTopic:    "devices/p2p/" + key,
		ReconnectInterval: 200 * time.Millisecond,
	}
}

// TestMQTTMosquittoLegacyRoundTrip: a real Mosquitto between the bridge
// and a legacy (subscribing) board. The board is found when it first
// speaks, answers hello and MCP, and after the broker is killed and
// restarted mid-call the pending call fails at once, the bridge reconnects
// and the board's tools come back.
func TestMQTTMosquittoLegacyRoundTrip(t *testing.T) {
	leakCheck(t)
	mq := mosquittotest.Start(t)
	a := externalBridge(t, mq.URL(), nil)
	api := apiOf(t, a)
	gw := a.MQTTGateway()
	ctx, cancel := context.WithTimeout(context.Background(), 2*mqttWait)
	defer cancel()

	b, err := simulator.NewBoard(simulator.Config{
		MAC: "02:00:00:00:07:01", Profile: loadProfile(t, "breadboard"),
		// Long enough to be in flight when the broker dies, short enough
		// that the board (whose replies queue behind a running tool, as on
		// the firmware) can answer the bridge's recovery soon after.
		ToolDelay: map[string]time.Duration{"self.lamp.get_state": 3 * time.Second},
		Logger:    zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
	})
	require.NoError(t, err)
	conn, err := b.ConnectMQTT(ctx, legacyConfig(mq.URL(), b.MAC()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })

	// Nothing announces the board on a plain broker; its first message does.
	_, listed := api.device(b.MAC())
	require.False(t, listed)
	require.NoError(t, conn.OpenAudioChannel(ctx))
	d := api.waitReady(b.MAC())
	assert.Equal(t, "mqtt", d.Transport)
	assert.Contains(t, toolNames(d), "self.lamp.turn_on")
	code, body := api.call(b.MAC(), "self.lamp.turn_on", nil)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, true, b.State()["lamp.power"])
	require.NoError(t, conn.SendAudio([]byte("frame")))
	eventually(t, "audio counted", func() error {
		if n := gw.Stats().UDP.Packets; n != 1 {
			return fmt.Errorf("%d packets", n)
		}
		return nil
	})

	// A call in flight when the broker dies fails promptly and says why.
	type result struct {
		code int
		body string
		took time.Duration
	}
	res := make(chan result, 1)
	go func() {
		start := time.Now()
		body, _ := json.Marshal(map[string]any{"name": "self.lamp.get_state"})
		resp, err := http.Post(api.base+"/api/devices/"+b.MAC()+"/call", "application/json", bytes.NewReader(body))
		if err != nil {
			res <- result{body: err.Error()}
			return
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		res <- result{resp.StatusCode, string(out), time.Since(start)}
	}()
	eventually(t, "slow call reached the board", func() error {
		if b.Stats().TextReceived < 5 { // server hello, initialize, tools/list, turn_on, get_state
			return errors.New("not yet")
		}
		return nil
	})
	mq.Kill()
	r := <-res
	assert.NotEqual(t, http.StatusOK, r.code, r.body)
	assert.Contains(t, r.body, "offline", "the error says the board went offline")
	assert.Less(t, r.took, 2*time.Second, "the call must not wait for the tool or its timeout")
	api.waitGone(b.MAC())

	mq.Restart()
	d = api.waitReady(b.MAC())
	assert.Contains(t, toolNames(d), "self.lamp.turn_on")
	code, body = api.call(b.MAC(), "self.lamp.turn_off", nil)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, false, b.State()["lamp.power"])
	assert.GreaterOrEqual(t, gw.Stats().Connects, int64(2))
	eventually(t, "recovery recorded", func() error {
		if n := gw.Stats().Recovered; n != 1 {
			return fmt.Errorf("recovered %d", n)
		}
		return nil
	})
}

// TestMQTTMosquittoLiveness: with an external broker no disconnect event
// exists; an idle board is probed (its error reply to the probe proves it
// alive), and one that stops answering is marked offline after the
// configured misses.
func TestMQTTMosquittoLiveness(t *testing.T) {
	leakCheck(t)
	mq := mosquittotest.Start(t)
	a := externalBridge(t, mq.URL(), func(c *Config) {
		c.MQTT.Liveness = mqtt.LivenessConfig{Interval: 200 * time.Millisecond, Timeout: 300 * time.Millisecond, Misses: 2}
	})
	api := apiOf(t, a)
	gw := a.MQTTGateway()
	ctx, cancel := context.WithTimeout(context.Background(), mqttWait)
	defer cancel()

	b := newBoard(t, "02:00:00:00:08:01", "breadboard")
	conn, err := b.ConnectMQTT(ctx, legacyConfig(mq.URL(), b.MAC()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	require.NoError(t, conn.OpenAudioChannel(ctx))
	api.waitReady(b.MAC())

	eventually(t, "idle board probed", func() error {
		if st := gw.Stats(); st.Probes < 3 {
			return fmt.Errorf("%d probes", st.Probes)
		}
		return nil
	})
	assert.Zero(t, gw.Stats().ProbeMisses, "a live board answers every probe")
	_, listed := api.device(b.MAC())
	assert.True(t, listed)

	// The board vanishes; Mosquitto knows, the bridge is not told.
	require.NoError(t, conn.Close())
	api.waitGone(b.MAC())
	st := gw.Stats()
	assert.EqualValues(t, 1, st.Unresponsive)
	assert.GreaterOrEqual(t, st.ProbeMisses, int64(2))
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
		deadline := time.Now().Add(mqttWait)
		for {
			if s, ok := a.Hub.Session(mac); ok && s.Info().State.String() == "ready" {
				return
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s not ready", mac)
			}
			time.Sleep(5 * time.Millisecond)
		}
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
		sb := board(b, "02:00:00:00:b0:03")
		c, err := sb.ConnectMQTT(context.Background(), legacyConfig(mq.URL(), sb.MAC()))
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
	assert.Contains(t, portInUseMessage(taken.Addr().String()), "--mqtt-broker tcp://127.0.0.1:")
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

// TestMQTTEmbeddedReboot: self.reboot never replies; the board leaving the
// broker is the outcome, reported as success at once, not after a timeout.
func TestMQTTEmbeddedReboot(t *testing.T) {
	leakCheck(t)
	a := startBridge(t, nil)
	api := apiOf(t, a)
	b, err := simulator.NewBoard(simulator.Config{MAC: "02:00:00:00:0a:01", Profile: loadProfile(t, "breadboard"),
		RebootDelay: 50 * time.Millisecond, Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
	require.NoError(t, err)
	connectMQTT(t, a, b, simulator.MQTTConfig{})
	api.waitReady(b.MAC())
	start := time.Now()
	code, body := api.call(b.MAC(), "self.reboot", nil)
	assert.Equal(t, http.StatusOK, code, body)
	assert.Less(t, time.Since(start), 3*time.Second)
	api.waitGone(b.MAC())
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
  auth: {users: [{username: u, password: p}], hmac_secret: s, allow_any_client_id: true}
  udp: {listen: ":9884", advertise: "10.0.0.9"}
  liveness: {interval: 1m30s, timeout: 7s, misses: 4}
  max_message_size: 1000
  max_packet_size: 2000
  client_writes_pending: 64
  inbox_size: 8
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
		UDP:                  mqtt.UDPConfig{Listen: ":9884", Advertise: "10.0.0.9"},
		Liveness:             mqtt.LivenessConfig{Interval: 90 * time.Second, Timeout: 7 * time.Second, Misses: 4},
		MaxMessageSize:       1000,
		InboxSize:            8,
		KeepAlive:            20 * time.Second,
		MaxReconnectInterval: 3 * time.Second,
		ConnectTimeout:       4 * time.Second,
		WriteTimeout:         6 * time.Second,
		RecoverWindow:        2 * time.Minute,
		RediscoverInterval:   9 * time.Second,
	}, gw)
	assert.Equal(t, broker.Config{
		Listen: ":1884", Topics: gw.Topics,
		Auth:          broker.AuthConfig{Users: []broker.User{{Username: "u", Password: "p"}}, HMACSecret: "s", AllowAnyClientID: true},
		MaxPacketSize: 2000, ClientWritesPending: 64,
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
}
