package mqtt_test

// The gateway's tests run real components end to end: a device Hub, the
// gateway, the embedded mochi broker (or a real Mosquitto), and simulated
// boards speaking the firmware's MQTT protocol. Nothing is mocked.

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/mqtt"
	"github.com/devicebridge/devicebridge/mqtt/broker"
	"github.com/devicebridge/devicebridge/mqtt/mosquittotest"
	"github.com/devicebridge/devicebridge/simulator"
)

// wait bounds every poll in these tests; nothing should come close.
const (
	wait = 15 * time.Second
	tick = 10 * time.Millisecond
)

// bridge is the MQTT half of a bridge: a Hub, a gateway and, unless the
// broker is external, the embedded broker.
type bridge struct {
	t      *testing.T
	hub    *device.Hub
	broker *broker.Broker
	gw     *mqtt.Gateway
}

type options struct {
	gateway        func(*mqtt.Config)
	broker         func(*broker.Config)
	requestTimeout time.Duration
	// log, when set, is the broker's and the gateway's logger.
	log *zap.Logger
}

func newHub(t *testing.T, requestTimeout time.Duration) *device.Hub {
	t.Helper()
	hub := device.NewHub(device.HubConfig{Client: device.ClientOptions{
		ClientName: "devicebridge", ClientVersion: "test", WithUserTools: true,
		RequestTimeout: requestTimeout, CallTimeout: 5 * time.Second, ToolTimeouts: device.DefaultToolTimeouts(),
	}}, zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)).Named("hub"))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		assert.NoError(t, hub.Close(ctx))
	})
	return hub
}

// startEmbedded runs the gateway against the embedded broker, everything
// on loopback port 0, in the order the app wires them.
func startEmbedded(t *testing.T, o options) *bridge {
	t.Helper()
	hub := newHub(t, cmpOr(o.requestTimeout, 3*time.Second))
	log := o.log
	if log == nil {
		log = zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
	}
	bc := broker.Config{Listen: "127.0.0.1:0"}
	if o.broker != nil {
		o.broker(&bc)
	}
	b, err := broker.New(bc, log.Named("broker"))
	require.NoError(t, err)
	require.NoError(t, b.Start())
	t.Cleanup(func() { _ = b.Close() })
	creds := b.GatewayCredentials()
	gc := mqtt.Config{Broker: creds.URL, ClientID: creds.ClientID, Username: creds.Username, Password: creds.Password,
		Topics: bc.Topics, UDP: mqtt.UDPConfig{Listen: "127.0.0.1:0"}}
	if o.gateway != nil {
		o.gateway(&gc)
	}
	br := &bridge{t: t, hub: hub, broker: b, gw: startGateway(t, gc, hub, b, log)}
	return br
}

// startExternal runs the gateway against an external broker, with timings
// short enough for tests.
func startExternal(t *testing.T, url string, o options) *bridge {
	t.Helper()
	hub := newHub(t, cmpOr(o.requestTimeout, time.Second))
	gc := mqtt.Config{Broker: url, UDP: mqtt.UDPConfig{Listen: "127.0.0.1:0"},
		MaxReconnectInterval: 200 * time.Millisecond, KeepAlive: 2 * time.Second}
	if o.gateway != nil {
		o.gateway(&gc)
	}
	log := o.log
	if log == nil {
		log = zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
	}
	return &bridge{t: t, hub: hub, gw: startGateway(t, gc, hub, nil, log)}
}

func startGateway(t *testing.T, gc mqtt.Config, hub *device.Hub, presence mqtt.Presence, log *zap.Logger) *mqtt.Gateway {
	t.Helper()
	g, err := mqtt.NewGateway(gc, hub, presence, log.Named("gateway"))
	require.NoError(t, err)
	require.NoError(t, g.Start())
	t.Cleanup(g.Close) // before the broker and the Hub: boards get their goodbyes
	if presence != nil {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		require.NoError(t, g.WaitReady(ctx))
	}
	return g
}

func cmpOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// waitSubscribed waits until the gateway holds its uplink subscription on
// a plain broker. Before that a board's first publish (its hello) reaches
// nobody, and a board, like the firmware, does not repeat its hello.
func (br *bridge) waitSubscribed() {
	br.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(br.t, br.gw.WaitReady(ctx))
}

func (br *bridge) endpoint() string { return "tcp://" + br.broker.Addr().String() }

func loadProfile(t testing.TB, name string) *simulator.Profile {
	t.Helper()
	p, err := simulator.LoadProfile(name)
	require.NoError(t, err)
	return p
}

func newBoard(t *testing.T, cfg simulator.Config) *simulator.Board {
	t.Helper()
	if cfg.Profile == nil {
		cfg.Profile = loadProfile(t, "breadboard")
	}
	cfg.Logger = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	b, err := simulator.NewBoard(cfg)
	require.NoError(t, err)
	return b
}

// connect connects b to the embedded broker (unless mc names another) and
// closes it at the end of the test.
func (br *bridge) connect(b *simulator.Board, mc simulator.MQTTConfig) *simulator.MQTTConn {
	br.t.Helper()
	if mc.Endpoint == "" {
		mc.Endpoint = br.endpoint()
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	c, err := b.ConnectMQTT(ctx, mc)
	require.NoError(br.t, err)
	br.t.Cleanup(func() { _ = c.Close() })
	return c
}

// waitReady waits until the board's session is ready and returns it.
func (br *bridge) waitReady(id string) device.Info {
	br.t.Helper()
	var info device.Info
	require.Eventually(br.t, func() bool {
		s, ok := br.hub.Session(id)
		if !ok {
			return false
		}
		info = s.Info()
		return info.State == device.StateReady
	}, wait, tick, "device %s ready", id)
	return info
}

func (br *bridge) waitGone(id string) {
	br.t.Helper()
	require.Eventually(br.t, func() bool { _, ok := br.hub.Session(id); return !ok }, wait, tick, "device %s offline", id)
}

func (br *bridge) listed(id string) bool {
	_, ok := br.hub.Session(id)
	return ok
}

// call runs a tool through the Hub, as the control API and /mcp do.
func (br *bridge) call(id, tool string, args map[string]any) (*device.CallResult, error) {
	var raw json.RawMessage
	if args != nil {
		raw, _ = json.Marshal(args)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	return br.hub.CallTool(ctx, id, tool, raw)
}

func (br *bridge) mustCall(id, tool string, args map[string]any) *device.CallResult {
	br.t.Helper()
	res, err := br.call(id, tool, args)
	require.NoError(br.t, err, tool)
	return res
}

func toolNames(info device.Info) []string {
	var n []string
	for _, t := range info.Tools {
		n = append(n, t.Name)
	}
	return n
}

func generation(t *testing.T, hub *device.Hub, id string) uint64 {
	t.Helper()
	s, ok := hub.Session(id)
	require.True(t, ok)
	return s.Info().Generation
}

// TestEmbeddedDiscoveryWithoutHello: a current-firmware board connects,
// never subscribes and never says hello; the gateway still initializes it,
// lists its tools and calls one; leaving the broker takes it offline.
func TestEmbeddedDiscoveryWithoutHello(t *testing.T) {
	br := startEmbedded(t, options{})
	b := newBoard(t, simulator.Config{MAC: "02:00:00:00:01:01"})
	conn := br.connect(b, simulator.MQTTConfig{})

	d := br.waitReady(b.MAC())
	assert.Equal(t, mqtt.TransportName, d.Transport)
	assert.Equal(t, b.ClientID(), d.ClientID)
	assert.Equal(t, b.Profile().Board, d.Board)
	assert.Contains(t, toolNames(d), "self.get_device_status")
	assert.Equal(t, 0, int(conn.Stats().Hellos), "no hello was needed")

	res := br.mustCall(b.MAC(), "self.audio_speaker.set_volume", map[string]any{"volume": 33})
	assert.Contains(t, res.Text(), "true")
	assert.Equal(t, 33, b.State()["audio_speaker.volume"])

	// The board leaving the broker takes it offline at once, as a
	// disconnect rather than anything the bridge decided.
	s, _ := br.hub.Session(b.MAC())
	require.NoError(t, conn.Close())
	br.waitGone(b.MAC())
	<-s.Done()
	assert.Equal(t, device.CauseDisconnected, s.Info().CloseCause)
}

// TestEmbeddedHelloGoodbye: hello gets a server hello the board accepts,
// audio is counted, a new hello replaces the session, and goodbye works
// both ways under the session-id rule. MCP keeps working throughout.
func TestEmbeddedHelloGoodbye(t *testing.T) {
	br := startEmbedded(t, options{})
	gw := br.gw
	b := newBoard(t, simulator.Config{MAC: "02:00:00:00:02:01"})
	conn := br.connect(b, simulator.MQTTConfig{})
	br.waitReady(b.MAC())
	gen := generation(t, br.hub, b.MAC())

	ctx, cancel := context.WithTimeout(context.Background(), wait)
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
	require.Eventually(t, func() bool { as, _ := gw.AudioSession(b.MAC()); return as.Packets == 3 }, wait, tick, "audio counted")

	// A second hello replaces the audio session, not the device session.
	require.NoError(t, conn.OpenAudioChannel(ctx))
	second := b.SessionID()
	require.NotEqual(t, first, second)
	as, _ = gw.AudioSession(b.MAC())
	assert.Equal(t, second, as.ID)
	assert.Equal(t, gen, generation(t, br.hub, b.MAC()), "a hello must not re-create the device session")

	// A board goodbye for another session is ignored; the right one ends it.
	require.NoError(t, conn.PublishRaw(ctx, "device-server", []byte(`{"session_id":"`+first+`","type":"goodbye"}`)))
	br.mustCall(b.MAC(), "self.lamp.get_state", nil) // a round trip orders us after the goodbye
	_, open := gw.AudioSession(b.MAC())
	assert.True(t, open, "a stale goodbye must not close the current session")
	require.NoError(t, conn.CloseAudioChannel())
	require.Eventually(t, func() bool { _, open := gw.AudioSession(b.MAC()); return !open }, wait, tick, "board goodbye honoured")
	assert.EqualValues(t, 1, gw.Stats().GoodbyesIn)

	// The bridge's goodbye carries the board's current session id, so the
	// board closes its channel (and sends no goodbye back).
	require.NoError(t, conn.OpenAudioChannel(ctx))
	third := b.SessionID()
	ended, err := gw.Goodbye(ctx, b.MAC())
	require.NoError(t, err)
	assert.Equal(t, third, ended)
	require.Eventually(t, func() bool { return !conn.AudioChannelOpen() }, wait, tick, "board closed its channel")
	assert.EqualValues(t, 1, conn.Stats().GoodbyesIn)
	assert.EqualValues(t, 1, conn.Stats().GoodbyesSent, "only the board's own goodbye from before")
	_, err = gw.Goodbye(ctx, b.MAC())
	require.ErrorIs(t, err, mqtt.ErrNoAudioSession)

	// MCP is unaffected by all of this.
	br.mustCall(b.MAC(), "self.lamp.turn_off", nil)
	assert.Equal(t, false, b.State()["lamp.power"])
}

// TestEmbeddedMultiPageTools: a board whose catalogue needs several
// tools/list pages is listed completely over MQTT.
func TestEmbeddedMultiPageTools(t *testing.T) {
	br := startEmbedded(t, options{})
	b := newBoard(t, simulator.Config{MAC: "02:00:00:00:03:01", Profile: loadProfile(t, "catalog")})
	br.connect(b, simulator.MQTTConfig{})
	d := br.waitReady(b.MAC())

	var want []string
	for _, tool := range b.Profile().Tools {
		want = append(want, tool.Name)
	}
	assert.Equal(t, want, toolNames(d))
	// initialize + at least three pages
	assert.GreaterOrEqual(t, b.Stats().TextReceived, uint64(4))
	br.mustCall(b.MAC(), "self.get_device_status", nil)
}

// TestEmbeddedAuth: static and HMAC credentials admit boards; wrong or
// missing credentials and foreign client ids get a refused CONNACK.
func TestEmbeddedAuth(t *testing.T) {
	const secret = "hmac-secret"
	br := startEmbedded(t, options{broker: func(c *broker.Config) {
		c.Auth.Users = []broker.User{{Username: "board", Password: "s3cret"}}
		c.Auth.HMACSecret = secret
	}})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	static := newBoard(t, simulator.Config{MAC: "02:00:00:00:04:01"})
	br.connect(static, simulator.MQTTConfig{Username: "board", Password: "s3cret"})
	br.waitReady(static.MAC())

	// The xinnan-style username is opaque to the broker; the HMAC binds it
	// to the client id.
	hm := newBoard(t, simulator.Config{MAC: "02:00:00:00:04:02"})
	br.connect(hm, simulator.MQTTConfig{Username: "eyJpcCI6IjEwLjAuMC41In0=", HMACSecret: secret})
	br.waitReady(hm.MAC())

	for name, mc := range map[string]simulator.MQTTConfig{
		"wrong password":     {Username: "board", Password: "nope"},
		"wrong hmac secret":  {Username: "u", HMACSecret: "other-secret"},
		"hmac of another id": {Username: "u", Password: mqtt.HMACPassword(secret, "GID_test@@@02_00_00_00_04_01", "u")},
		"no credentials":     {},
	} {
		bad := newBoard(t, simulator.Config{MAC: "02:00:00:00:04:09"})
		mc.Endpoint = br.endpoint()
		_, err := bad.ConnectMQTT(ctx, mc)
		require.ErrorIs(t, err, simulator.ErrMQTTRefused, name)
		assert.ErrorContains(t, err, "not Authorized", name)
	}

	odd := newBoard(t, simulator.Config{MAC: "02:00:00:00:04:0a"})
	_, err := odd.ConnectMQTT(ctx, simulator.MQTTConfig{Endpoint: br.endpoint(), ClientID: "some-random-client", Username: "board", Password: "s3cret"})
	require.ErrorIs(t, err, simulator.ErrMQTTRefused)
	assert.ErrorContains(t, err, "identifier rejected")

	st := br.broker.Stats()
	assert.EqualValues(t, 4, st.RefusedAuth)
	assert.EqualValues(t, 1, st.RefusedClientID)
	assert.False(t, br.listed("02:00:00:00:04:09"))
}

// TestEmbeddedIsolation: a board cannot publish as another board nor read
// another board's traffic; publishes on the shared topic are attributed to
// their real sender.
func TestEmbeddedIsolation(t *testing.T) {
	br := startEmbedded(t, options{})
	gw := br.gw
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	victim := newBoard(t, simulator.Config{MAC: "02:00:00:00:05:01"})
	br.connect(victim, simulator.MQTTConfig{})
	attacker := newBoard(t, simulator.Config{MAC: "02:00:00:00:05:02"})
	ac := br.connect(attacker, simulator.MQTTConfig{})
	br.waitReady(victim.MAC())
	br.waitReady(attacker.MAC())

	hello := []byte(`{"type":"hello","version":3,"transport":"udp","features":{"mcp":true},"audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`)
	fakeReply := []byte(`{"session_id":"","type":"mcp","payload":{"jsonrpc":"2.0","id":1,"result":{}}}`)
	require.NoError(t, ac.PublishRaw(ctx, "devices/up/02_00_00_00_05_01", hello))
	require.NoError(t, ac.PublishRaw(ctx, "devices/up/02_00_00_00_05_01", fakeReply))
	require.NoError(t, ac.PublishRaw(ctx, "devices/p2p/02_00_00_00_05_01", fakeReply))
	require.Eventually(t, func() bool { return br.broker.Stats().DeniedPublish == 3 }, wait, tick, "impersonation denied")
	for _, filter := range []string{"devices/p2p/02_00_00_00_05_01", "devices/up/#", "#", "device-server"} {
		granted, err := ac.SubscribeRaw(ctx, filter)
		require.NoError(t, err)
		assert.False(t, granted, filter)
	}

	// The same hello on the shared topic is attributed to its sender.
	require.NoError(t, ac.PublishRaw(ctx, "device-server", hello))
	require.Eventually(t, func() bool {
		_, ok := gw.AudioSession(attacker.MAC())
		return ac.Stats().Hellos == 1 && ok
	}, wait, tick, "the sender got a server hello and an audio session")
	_, victimAudio := gw.AudioSession(victim.MAC())
	assert.False(t, victimAudio, "the victim never said hello")

	// Traffic to the victim does not reach the attacker.
	before := attacker.Stats().TextReceived
	br.mustCall(victim.MAC(), "self.get_device_status", nil)
	br.mustCall(attacker.MAC(), "self.lamp.get_state", nil)
	assert.Equal(t, before+1, attacker.Stats().TextReceived, "attacker got its own call, nothing of the victim's")
	assert.EqualValues(t, 1, gw.Stats().Hellos)
}

// TestEmbeddedGarbage: garbage, payloads without a type and oversized
// payloads on uplink topics are logged and dropped; the board's session is
// untouched.
func TestEmbeddedGarbage(t *testing.T) {
	br := startEmbedded(t, options{})
	gw := br.gw
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	b := newBoard(t, simulator.Config{MAC: "02:00:00:00:06:01"})
	conn := br.connect(b, simulator.MQTTConfig{})
	br.waitReady(b.MAC())
	gen := generation(t, br.hub, b.MAC())

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
	require.Eventually(t, func() bool {
		st := gw.Stats()
		return st.Malformed == 5 && st.Oversized == 1
	}, wait, tick, "garbage dropped and counted")
	br.mustCall(b.MAC(), "self.audio_speaker.set_volume", map[string]any{"volume": 7})
	assert.Equal(t, gen, generation(t, br.hub, b.MAC()))
	assert.Equal(t, device.StateReady, br.waitReady(b.MAC()).State)
}

// TestEmbeddedReboot: self.reboot never replies; the board leaving the
// broker is the outcome, reported as success at once, not after a timeout.
func TestEmbeddedReboot(t *testing.T) {
	br := startEmbedded(t, options{})
	b := newBoard(t, simulator.Config{MAC: "02:00:00:00:0a:01", RebootDelay: 50 * time.Millisecond})
	br.connect(b, simulator.MQTTConfig{})
	br.waitReady(b.MAC())
	// A timeout would be an error; success is the disconnect.
	_, err := br.call(b.MAC(), "self.reboot", nil)
	assert.NoError(t, err)
	br.waitGone(b.MAC())
}

// TestMosquittoLegacyRoundTrip: a real Mosquitto between the bridge and a
// legacy (subscribing) board. The board is found when it first speaks,
// answers hello and MCP, and after the broker is killed and restarted
// mid-call the pending call fails at once, the bridge reconnects and the
// board's tools come back.
func TestMosquittoLegacyRoundTrip(t *testing.T) {
	mq := mosquittotest.Start(t)
	br := startExternal(t, mq.URL(), options{})
	br.waitSubscribed()
	gw := br.gw
	ctx, cancel := context.WithTimeout(context.Background(), 2*wait)
	defer cancel()

	release := make(chan struct{})
	b := newBoard(t, simulator.Config{
		MAC: "02:00:00:00:07:01",
		// In flight when the broker dies, until the test releases it so
		// that the board (whose replies queue behind a running tool, as on
		// the firmware) can answer the bridge's recovery.
		Hold: map[string]<-chan struct{}{"self.lamp.get_state": release},
	})
	conn := br.connect(b, simulator.LegacyMQTTConfig(mq.URL()))

	// Nothing announces the board on a plain broker; its first message does.
	require.False(t, br.listed(b.MAC()))
	require.NoError(t, conn.OpenAudioChannel(ctx))
	d := br.waitReady(b.MAC())
	assert.Equal(t, mqtt.TransportName, d.Transport)
	assert.Contains(t, toolNames(d), "self.lamp.turn_on")
	br.mustCall(b.MAC(), "self.lamp.turn_on", nil)
	assert.Equal(t, true, b.State()["lamp.power"])
	require.NoError(t, conn.SendAudio([]byte("frame")))
	require.Eventually(t, func() bool { return gw.Stats().UDP.Packets == 1 }, wait, tick, "audio counted")

	// A call in flight when the broker dies fails promptly and says why.
	res := make(chan error, 1)
	s, _ := br.hub.Session(b.MAC())
	go func() {
		_, err := br.call(b.MAC(), "self.lamp.get_state", nil)
		res <- err
	}()
	// server hello, initialize, tools/list, turn_on, get_state
	require.Eventually(t, func() bool { return b.Stats().TextReceived >= 5 }, wait, tick, "slow call reached the board")
	mq.Kill()
	err := <-res
	// The board still holds the call, so the answer did not wait for the
	// tool; and it is not the timeout's.
	require.Error(t, err)
	assert.Equal(t, device.CodeOffline, device.CodeOf(err), "the error says the board went offline: %v", err)
	close(release)
	br.waitGone(b.MAC())
	<-s.Done()
	assert.Equal(t, device.CauseBrokerLost, s.Info().CloseCause)

	mq.Restart()
	d = br.waitReady(b.MAC())
	assert.Contains(t, toolNames(d), "self.lamp.turn_on")
	br.mustCall(b.MAC(), "self.lamp.turn_off", nil)
	assert.Equal(t, false, b.State()["lamp.power"])
	assert.GreaterOrEqual(t, gw.Stats().Connects, int64(2))
	require.Eventually(t, func() bool { return gw.Stats().Recovered == 1 }, wait, tick, "recovery recorded")
}

// TestMosquittoLiveness: with an external broker no disconnect event
// exists; an idle board is probed by its Session (its error reply to the
// probe proves it alive), and one that stops answering is marked offline
// after the configured misses, with CauseUnresponsive.
func TestMosquittoLiveness(t *testing.T) {
	mq := mosquittotest.Start(t)
	br := startExternal(t, mq.URL(), options{gateway: func(c *mqtt.Config) {
		// Frequent probes, but a timeout a live board's answer through
		// Mosquitto meets even on a loaded machine: "answers every probe"
		// must not depend on a 300ms round trip.
		c.Liveness = mqtt.LivenessConfig{Interval: 200 * time.Millisecond, Timeout: 2 * time.Second, Misses: 2}
	}})
	br.waitSubscribed()
	gw := br.gw
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	b := newBoard(t, simulator.Config{MAC: "02:00:00:00:08:01"})
	conn := br.connect(b, simulator.LegacyMQTTConfig(mq.URL()))
	require.NoError(t, conn.OpenAudioChannel(ctx))
	br.waitReady(b.MAC())
	s, _ := br.hub.Session(b.MAC())

	require.Eventually(t, func() bool { return gw.Stats().Probes >= 3 }, wait, tick, "idle board probed")
	assert.Zero(t, gw.Stats().ProbeMisses, "a live board answers every probe")
	assert.True(t, br.listed(b.MAC()))

	// The board vanishes; Mosquitto knows, the bridge is not told.
	require.NoError(t, conn.Close())
	br.waitGone(b.MAC())
	st := gw.Stats()
	assert.EqualValues(t, 1, st.Unresponsive)
	assert.GreaterOrEqual(t, st.ProbeMisses, int64(2))
	<-s.Done()
	assert.Equal(t, device.CauseUnresponsive, s.Info().CloseCause)
	assert.Contains(t, s.Info().CloseReason, mqtt.ErrUnresponsive.Error())
}

// TestEmbeddedNoProbes: the embedded broker reports disconnects itself, so
// boards behind it are never probed, however idle.
func TestEmbeddedNoProbes(t *testing.T) {
	br := startEmbedded(t, options{gateway: func(c *mqtt.Config) {
		c.Liveness = mqtt.LivenessConfig{Interval: 20 * time.Millisecond, Timeout: 20 * time.Millisecond, Misses: 1}
	}})
	b := newBoard(t, simulator.Config{MAC: "02:00:00:00:08:02"})
	br.connect(b, simulator.MQTTConfig{})
	br.waitReady(b.MAC())
	assert.Never(t, func() bool { return br.gw.Stats().Probes > 0 }, 300*time.Millisecond, tick)
}

// TestExternalBrokerDown: an unreachable external broker does not stop the
// gateway from starting (it keeps retrying) nor from closing.
func TestExternalBrokerDown(t *testing.T) {
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url := "tcp://" + dead.Addr().String()
	require.NoError(t, dead.Close()) // nothing listens there any more
	br := startExternal(t, url, options{gateway: func(c *mqtt.Config) { c.ConnectTimeout = 300 * time.Millisecond }})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	require.Error(t, br.gw.WaitReady(ctx))
	assert.False(t, br.gw.Connected())
}

// TestEmbeddedBoardRetriedAfterFailedInitialization: a board that stays
// connected but did not answer its first initialize (busy, or a loaded
// bridge) is tried again with back-off, without reconnecting or speaking:
// firmware sends nothing unasked, so it would otherwise wait for its next
// reconnect.
func TestEmbeddedBoardRetriedAfterFailedInitialization(t *testing.T) {
	br := startEmbedded(t, options{requestTimeout: 300 * time.Millisecond,
		gateway: func(c *mqtt.Config) { c.RediscoverInterval = 100 * time.Millisecond }})
	b := newBoard(t, simulator.Config{MAC: "02:00:00:00:0e:51"})
	b.SilenceMCP(true)
	br.connect(b, simulator.MQTTConfig{})
	// The first initialize went unanswered and the session was closed.
	require.Eventually(t, func() bool {
		return b.Stats().Ignored >= 1 && !br.listed("02:00:00:00:0e:51")
	}, wait, tick)
	connects := b.Stats().Connects
	b.SilenceMCP(false)
	br.waitReady("02:00:00:00:0e:51")
	assert.Equal(t, connects, b.Stats().Connects, "served on the same connection")
	br.mustCall("02:00:00:00:0e:51", "self.get_device_status", nil)
}
