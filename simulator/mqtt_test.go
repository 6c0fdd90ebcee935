package simulator

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
)

// mqttServer is a bare mochi broker playing the xiaozhi server: it records
// what boards send at the MQTT level, hands every uplink publish to the
// test, and — like the official gateway — delivers downlink to a board's
// connection without the board subscribing (here by subscribing it on its
// behalf to every topic under "down/").
type mqttServer struct {
	mochi.HookBase
	t   *testing.T
	srv *mochi.Server

	mu         sync.Mutex
	connects   []packets.Packet
	subscribes []packets.Packet
	publishes  []packets.Packet // uplink, as received
	// established counts sessions subscribed to "down/#". mochi sends the
	// CONNACK before that hook runs, so a board can be connected before
	// the broker would deliver to it.
	established int
}

func (s *mqttServer) ID() string { return "recorder" }

func (s *mqttServer) Provides(b byte) bool {
	switch b {
	case mochi.OnConnectAuthenticate, mochi.OnACLCheck, mochi.OnConnect, mochi.OnSubscribe,
		mochi.OnPublish, mochi.OnSessionEstablished:
		return true
	}
	return false
}

func (s *mqttServer) OnConnectAuthenticate(*mochi.Client, packets.Packet) bool { return true }
func (s *mqttServer) OnACLCheck(*mochi.Client, string, bool) bool              { return true }

func (s *mqttServer) OnConnect(_ *mochi.Client, pk packets.Packet) error {
	s.mu.Lock()
	s.connects = append(s.connects, pk)
	s.mu.Unlock()
	return nil
}

func (s *mqttServer) OnSubscribe(_ *mochi.Client, pk packets.Packet) packets.Packet {
	s.mu.Lock()
	s.subscribes = append(s.subscribes, pk)
	s.mu.Unlock()
	return pk
}

func (s *mqttServer) OnPublish(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if cl.Net.Inline {
		return pk, nil // the test's own downlink
	}
	s.mu.Lock()
	s.publishes = append(s.publishes, pk.Copy(false))
	s.mu.Unlock()
	return pk, nil
}

func (s *mqttServer) OnSessionEstablished(cl *mochi.Client, _ packets.Packet) {
	sub := packets.Subscription{Filter: "down/#"}
	s.srv.Topics.Subscribe(cl.ID, sub)
	cl.State.Subscriptions.Add(sub.Filter, sub)
	s.mu.Lock()
	s.established++
	s.mu.Unlock()
}

func startMQTTServer(t *testing.T) (*mqttServer, string) {
	t.Helper()
	s := &mqttServer{t: t}
	s.srv = mochi.New(&mochi.Options{InlineClient: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, s.srv.AddHook(s, nil))
	return s, serveMochi(t, s.srv)
}

// serveMochi serves srv on a loopback port and returns its URL. The broker
// stops when the test ends, after the test's own cleanups (which close the
// boards) have run.
//
// mochi's Close disconnects the clients that completed CONNECT and then
// waits for the goroutine of every connection it accepted. A connection
// still in its CONNECT exchange (a board connecting or reconnecting just
// then) is not disconnected, so Close would wait for as long as the peer
// keeps its socket open: minutes. So the broker stops in order: stop
// accepting, close every accepted connection, and only then Close, which
// has nothing left to wait for; and that wait is bounded.
func serveMochi(t *testing.T, srv *mochi.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	tl := &trackingListener{Listener: ln}
	require.NoError(t, srv.AddListener(listeners.NewNet("t", tl)))
	require.NoError(t, srv.Serve())
	t.Cleanup(func() {
		tl.closeAll()
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			_ = srv.Close()
		}()
		select {
		case <-stopped:
		case <-time.After(waitTimeout):
			t.Errorf("the mochi broker did not stop within %v", waitTimeout)
		}
	})
	return "tcp://" + ln.Addr().String()
}

// trackingListener remembers the connections it accepts so that they can
// all be closed at shutdown.
type trackingListener struct {
	net.Listener
	mu     sync.Mutex
	closed bool
	conns  []net.Conn
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		_ = c.Close()
		return nil, net.ErrClosed
	}
	l.conns = append(l.conns, c)
	return c, nil
}

// closeAll stops accepting and closes every connection accepted so far.
func (l *trackingListener) closeAll() {
	l.mu.Lock()
	l.closed = true
	conns := l.conns
	l.conns = nil
	l.mu.Unlock()
	_ = l.Listener.Close()
	for _, c := range conns {
		_ = c.Close()
	}
}

// uplink returns the payloads boards published, in order.
func (s *mqttServer) uplink() []packets.Packet {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]packets.Packet(nil), s.publishes...)
}

// waitUplink waits for the n-th uplink publish (1-based) and returns it.
func (s *mqttServer) waitUplink(n int) packets.Packet {
	s.t.Helper()
	require.Eventually(s.t, func() bool { return len(s.uplink()) >= n }, waitTimeout, 5*time.Millisecond,
		"no uplink message #%d", n)
	return s.uplink()[n-1]
}

// down publishes a server message that reaches every board.
func (s *mqttServer) down(payload string) {
	s.t.Helper()
	require.Eventually(s.t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.established >= len(s.connects)
	}, waitTimeout, 5*time.Millisecond, "every connected board to be subscribed to the downlink")
	require.NoError(s.t, s.srv.Publish("down/any/topic", []byte(payload), false, 0))
}

func mqttBoard(t *testing.T, cfg Config) *Board {
	t.Helper()
	if cfg.Profile == nil {
		p, err := LoadProfile("breadboard")
		require.NoError(t, err)
		cfg.Profile = p
	}
	cfg.Logger = zaptest.NewLogger(t)
	b, err := NewBoard(cfg)
	require.NoError(t, err)
	return b
}

func connectTestMQTT(t *testing.T, b *Board, mc MQTTConfig) *MQTTConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	c, err := b.ConnectMQTT(ctx, mc)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestMQTTLikeCurrentFirmware checks the MQTT-level behaviour of current
// firmware: 3.1.1, clean session, the backends' client id form, keepalive
// 240, no SUBSCRIBE, QoS 0 publishes to the publish topic, MCP answered
// with no hello, and downlink handled whatever its topic.
func TestMQTTLikeCurrentFirmware(t *testing.T) {
	srv, url := startMQTTServer(t)
	b := mqttBoard(t, Config{MAC: "02:00:00:00:aa:01", ClientID: "11111111-2222-4333-8444-555555555555"})
	connectTestMQTT(t, b, MQTTConfig{Endpoint: url, Username: "u", Password: "p"})

	srv.mu.Lock()
	require.Len(t, srv.connects, 1)
	c := srv.connects[0]
	srv.mu.Unlock()
	assert.EqualValues(t, 4, c.ProtocolVersion, "MQTT 3.1.1")
	assert.True(t, c.Connect.Clean)
	assert.False(t, c.Connect.WillFlag)
	assert.EqualValues(t, 240, c.Connect.Keepalive)
	assert.Equal(t, "GID_test@@@02_00_00_00_aa_01@@@11111111-2222-4333-8444-555555555555", c.Connect.ClientIdentifier)
	assert.Equal(t, "u", string(c.Connect.Username))
	assert.Equal(t, "p", string(c.Connect.Password))

	srv.down(`{"type":"mcp","payload":{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}}`)
	p := srv.waitUplink(1)
	assert.Equal(t, "device-server", p.TopicName)
	assert.EqualValues(t, 0, p.FixedHeader.Qos)
	assert.False(t, p.FixedHeader.Retain)
	assert.True(t, strings.HasPrefix(string(p.Payload), `{"session_id":"","type":"mcp","payload":{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2024-11-05"`), string(p.Payload))

	srv.mu.Lock()
	assert.Empty(t, srv.subscribes, "current firmware never subscribes")
	srv.mu.Unlock()
}

// TestMQTTLegacySubscribes: firmware before v1.0 subscribes to its
// subscribe_topic with QoS 2.
func TestMQTTLegacySubscribes(t *testing.T) {
	srv, url := startMQTTServer(t)
	b := mqttBoard(t, Config{MAC: "02:00:00:00:aa:02"})
	connectTestMQTT(t, b, MQTTConfig{Endpoint: url, Legacy: true})
	require.Eventually(t, func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.subscribes) == 1
	}, waitTimeout, 5*time.Millisecond, "legacy subscribe")
	srv.mu.Lock()
	sub := srv.subscribes[0].Filters[0]
	srv.mu.Unlock()
	assert.Equal(t, "devices/p2p/02_00_00_00_aa_02", sub.Filter)
	assert.EqualValues(t, 2, sub.Qos)
}

// udpHello renders an MQTT server hello.
func udpHello(sessionID, server string, port int, key, nonce string) string {
	return fmt.Sprintf(`{"type":"hello","version":3,"transport":"udp","session_id":%q,"audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60},"udp":{"server":%q,"port":%d,"encryption":"aes-128-ctr","key":%q,"nonce":%q}}`,
		sessionID, server, port, key, nonce)
}

// TestMQTTHelloValidation: the board sends the exact §5.4 hello, ignores
// server hellos that fail the firmware's checks (while still taking their
// session id, as v2.4 does), and accepts a complete one; its audio follows
// the nonce layout and is AES-128-CTR encrypted with the header as IV.
func TestMQTTHelloValidation(t *testing.T) {
	srv, url := startMQTTServer(t)
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer udp.Close()
	port := udp.LocalAddr().(*net.UDPAddr).Port

	b := mqttBoard(t, Config{MAC: "02:00:00:00:aa:03"})
	conn := connectTestMQTT(t, b, MQTTConfig{Endpoint: url})
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()

	const key, nonce = "000102030405060708090a0b0c0d0e0f", "01000000deadbeef0000000000000000"
	bad := []string{
		`{"type":"hello","transport":"websocket","session_id":"s-ws"}`,
		`{"type":"hello","transport":"udp","session_id":"s-noudp"}`,
		udpHello("s-shortkey", "127.0.0.1", port, "0001", nonce),
		udpHello("s-badnonce", "127.0.0.1", port, key, "zz000000deadbeef0000000000000000"),
		udpHello("s-port0", "127.0.0.1", 0, key, nonce),
		strings.Replace(udpHello("s-portstr", "127.0.0.1", port, key, nonce), fmt.Sprintf(`"port":%d`, port), `"port":"8884"`, 1),
	}
	for i, reply := range bad {
		// The board ignores the reply and would wait out its hello timeout;
		// once it has counted the reply as ignored, the attempt is given up.
		actx, acancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() { errc <- conn.OpenAudioChannel(actx) }()
		hello := srv.waitUplink(i + 1)
		assert.Equal(t, `{"type":"hello","version":3,"transport":"udp","features":{"mcp":true,"glyph_push":true},"text_font":{"bundle":"noto-v1","charset":"basic","size":14,"bpp":1},"audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`,
			string(hello.Payload))
		srv.down(reply)
		require.Eventually(t, func() bool { return conn.Stats().HellosIgnored == uint64(i+1) }, waitTimeout, 5*time.Millisecond,
			"hello not ignored: %s", reply)
		assert.False(t, conn.AudioChannelOpen())
		acancel()
		assert.ErrorIs(t, <-errc, context.Canceled, reply)
		assert.False(t, conn.AudioChannelOpen())
	}
	assert.EqualValues(t, len(bad), conn.Stats().HellosIgnored)
	// The last rejected hello passed the transport check, so its id stuck.
	assert.Equal(t, "s-portstr", b.SessionID())

	errc := make(chan error, 1)
	go func() { errc <- conn.OpenAudioChannel(ctx) }()
	srv.waitUplink(len(bad) + 1)
	srv.down(udpHello("s-good", "127.0.0.1", port, key, nonce))
	require.NoError(t, <-errc)
	assert.True(t, conn.AudioChannelOpen())
	assert.Equal(t, "s-good", b.SessionID())

	require.NoError(t, conn.SendAudio([]byte("opus!")))
	buf := make([]byte, 1500)
	require.NoError(t, udp.SetReadDeadline(time.Now().Add(waitTimeout)))
	n, _, err := udp.ReadFromUDP(buf)
	require.NoError(t, err)
	pkt := buf[:n]
	require.Len(t, pkt, 16+5)
	wantHeader, _ := hex.DecodeString(nonce)
	binary.BigEndian.PutUint16(wantHeader[2:4], 5)
	binary.BigEndian.PutUint32(wantHeader[12:16], 1) // sequence starts at 1
	assert.Equal(t, wantHeader, pkt[:16])
	k, _ := hex.DecodeString(key)
	block, _ := aes.NewCipher(k)
	plain := make([]byte, 5)
	cipher.NewCTR(block, pkt[:16]).XORKeyStream(plain, pkt[16:])
	assert.Equal(t, "opus!", string(plain))
}

// TestMQTTHelloTimesOut: with no usable server hello the attempt ends at
// the hello timeout and the channel stays closed.
func TestMQTTHelloTimesOut(t *testing.T) {
	_, url := startMQTTServer(t)
	b := mqttBoard(t, Config{MAC: "02:00:00:00:aa:06", HelloTimeout: 100 * time.Millisecond})
	conn := connectTestMQTT(t, b, MQTTConfig{Endpoint: url})
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	require.ErrorIs(t, conn.OpenAudioChannel(ctx), ErrHelloTimeout)
	assert.False(t, conn.AudioChannelOpen())
}

// TestMQTTGoodbye: the board honours a server goodbye only with its
// current session id and does not answer it; its own goodbye is the exact
// firmware string; MQTT stays connected throughout.
func TestMQTTGoodbye(t *testing.T) {
	srv, url := startMQTTServer(t)
	b := mqttBoard(t, Config{MAC: "02:00:00:00:aa:04"})
	conn := connectTestMQTT(t, b, MQTTConfig{Endpoint: url})
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	open := func(n int, sid string) {
		t.Helper()
		errc := make(chan error, 1)
		go func() { errc <- conn.OpenAudioChannel(ctx) }()
		srv.waitUplink(n)
		srv.down(udpHello(sid, "127.0.0.1", 9, "000102030405060708090a0b0c0d0e0f", "01000000000000010000000000000000"))
		require.NoError(t, <-errc)
	}

	open(1, "s1")
	srv.down(`{"type":"goodbye","session_id":"other"}`)
	srv.down(`{"type":"goodbye"}`)
	srv.down(`{"type":"goodbye","session_id":1}`)
	require.Eventually(t, func() bool { return conn.Stats().GoodbyesStale == 3 }, waitTimeout, 5*time.Millisecond, "stale goodbyes ignored")
	assert.True(t, conn.AudioChannelOpen())

	srv.down(`{"type":"goodbye","session_id":"s1"}`)
	require.Eventually(t, func() bool { return !conn.AudioChannelOpen() }, waitTimeout, 5*time.Millisecond, "channel closed")
	assert.EqualValues(t, 1, conn.Stats().GoodbyesIn)

	open(2, "s2")
	require.NoError(t, conn.CloseAudioChannel())
	p := srv.waitUplink(3)
	assert.Equal(t, `{"session_id":"s2","type":"goodbye"}`, string(p.Payload))
	assert.ErrorIs(t, conn.CloseAudioChannel(), ErrNoAudioChannel)
	assert.Equal(t, 3, len(srv.uplink()), "no goodbye in answer to the server's")
	assert.True(t, conn.Connected())
}

// TestMQTTRefused: a refused CONNECT surfaces as ErrMQTTRefused.
func TestMQTTRefused(t *testing.T) {
	s := &refuser{}
	srv := mochi.New(&mochi.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, srv.AddHook(s, nil))
	url := serveMochi(t, srv)

	b := mqttBoard(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	_, err := b.ConnectMQTT(ctx, MQTTConfig{Endpoint: url, Username: "x", Password: "y"})
	require.ErrorIs(t, err, ErrMQTTRefused)
	_, err = b.ConnectMQTT(ctx, MQTTConfig{Endpoint: "127.0.0.1:1"})
	require.Error(t, err)
	assert.False(t, errors.Is(err, ErrMQTTRefused))
}

type refuser struct{ mochi.HookBase }

func (r *refuser) ID() string                                               { return "refuser" }
func (r *refuser) Provides(b byte) bool                                     { return b == mochi.OnConnectAuthenticate }
func (r *refuser) OnConnectAuthenticate(*mochi.Client, packets.Packet) bool { return false }

func TestMQTTBrokerURL(t *testing.T) {
	for in, want := range map[string]string{
		"mqtt.example.com":      "ssl://mqtt.example.com:8883",
		"mqtt.example.com:1883": "tcp://mqtt.example.com:1883",
		"10.0.0.2:8883":         "ssl://10.0.0.2:8883",
		"tcp://127.0.0.1:1883":  "tcp://127.0.0.1:1883",
	} {
		got, err := mqttBrokerURL(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "host:port"} {
		_, err := mqttBrokerURL(bad)
		assert.Error(t, err, bad)
	}
}

// TestMQTTReboot: self.reboot never replies, and the board drops off the
// broker, which is how a server learns the call did its job.
func TestMQTTReboot(t *testing.T) {
	srv, url := startMQTTServer(t)
	b := mqttBoard(t, Config{MAC: "02:00:00:00:aa:05", RebootDelay: 10 * time.Millisecond})
	conn := connectTestMQTT(t, b, MQTTConfig{Endpoint: url})
	srv.down(`{"type":"mcp","payload":{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"self.reboot"}}}`)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	err := conn.Serve(ctx)
	assert.ErrorIs(t, err, ErrRebooted)
	assert.Empty(t, srv.uplink(), "no reply to self.reboot")
	assert.False(t, conn.Connected())
}
