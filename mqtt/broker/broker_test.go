package broker

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	pahopackets "github.com/eclipse/paho.mqtt.golang/packets"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/devicebridge/devicebridge/mqtt"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const wait = 5 * time.Second

// eventually waits until f returns nil; on timeout the failure shows f's
// last error.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) { assert.NoError(c, f()) }, wait, 5*time.Millisecond, what)
}

func startBroker(t *testing.T, auth AuthConfig) *Broker {
	t.Helper()
	// Info, not debug: mochi's own goroutines log at debug and may do so
	// after the test returned, which zaptest treats as a failure.
	b, err := New(Config{Listen: "127.0.0.1:0", Auth: auth}, zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)))
	require.NoError(t, err)
	require.NoError(t, b.Start())
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// inbox collects what a raw client receives.
type inbox struct {
	mu   sync.Mutex
	msgs []paho.Message
}

func (i *inbox) handler(_ paho.Client, m paho.Message) {
	i.mu.Lock()
	i.msgs = append(i.msgs, m)
	i.mu.Unlock()
}

func (i *inbox) all() []paho.Message {
	i.mu.Lock()
	defer i.mu.Unlock()
	return append([]paho.Message(nil), i.msgs...)
}

// dial connects a raw MQTT 3.1.1 client with clean session, as boards do.
func dial(t *testing.T, url, clientID, user, pass string, in *inbox) (paho.Client, error) {
	t.Helper()
	opts := paho.NewClientOptions().AddBroker(url).SetClientID(clientID).SetUsername(user).SetPassword(pass).
		SetProtocolVersion(4).SetCleanSession(true).SetAutoReconnect(false).SetConnectTimeout(wait)
	if in != nil {
		opts.SetDefaultPublishHandler(in.handler)
	}
	c := paho.NewClient(opts)
	tok := c.Connect()
	if !tok.WaitTimeout(wait) {
		return nil, errors.New("connect timed out")
	}
	if err := tok.Error(); err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Disconnect(0) })
	return c, nil
}

func publish(t *testing.T, c paho.Client, topic, payload string) {
	t.Helper()
	tok := c.Publish(topic, 0, false, payload)
	require.True(t, tok.WaitTimeout(wait))
	require.NoError(t, tok.Error())
}

func gateway(t *testing.T, b *Broker, in *inbox) paho.Client {
	t.Helper()
	cr := b.GatewayCredentials()
	c, err := dial(t, cr.URL, cr.ClientID, cr.Username, cr.Password, in)
	require.NoError(t, err)
	tok := c.Subscribe("devices/up/+", 0, nil)
	require.True(t, tok.WaitTimeout(wait))
	require.NoError(t, tok.Error())
	return c
}

func TestGatewayIdentityOnlyOnLoopbackListener(t *testing.T) {
	b := startBroker(t, AuthConfig{})
	cr := b.GatewayCredentials()
	public := "tcp://" + b.Addr().String()

	_, err := dial(t, public, cr.ClientID, cr.Username, cr.Password, nil)
	assert.ErrorIs(t, err, pahopackets.ErrorRefusedIDRejected, "the gateway identity is refused on the board listener")
	_, err = dial(t, cr.URL, cr.ClientID, cr.Username, "wrong", nil)
	assert.Error(t, err)
	_, err = dial(t, cr.URL, "GID_test@@@aa_bb_cc_dd_ee_ff@@@u", "", "", nil)
	assert.ErrorIs(t, err, pahopackets.ErrorRefusedIDRejected, "boards are not admitted on the bridge listener")
	_, err = dial(t, cr.URL, cr.ClientID, cr.Username, cr.Password, nil)
	assert.NoError(t, err)
}

func TestAnonymousDefaults(t *testing.T) {
	yes, no := true, false
	assert.True(t, AuthConfig{}.anonymous())
	assert.False(t, AuthConfig{HMACSecret: "s"}.anonymous())
	assert.False(t, AuthConfig{Users: []User{{"u", "p"}}}.anonymous())
	assert.True(t, AuthConfig{HMACSecret: "s", AllowAnonymous: &yes}.anonymous())
	assert.Error(t, AuthConfig{AllowAnonymous: &no}.Validate(), "nobody could connect")
	assert.Error(t, AuthConfig{Users: []User{{"u", ""}}}.Validate())
}

// TestDeliveryAttributionPresence: a board that never subscribes receives
// its downlink; a board that subscribes too gets one copy; publishes on the
// shared topic reach the gateway on the sender's uplink topic; presence
// follows connects, MAC takeovers and disconnects.
func TestDeliveryAttributionPresence(t *testing.T) {
	b := startBroker(t, AuthConfig{})
	public := "tcp://" + b.Addr().String()
	var gwIn inbox
	gw := gateway(t, b, &gwIn)

	var curIn, legacyIn inbox
	cur, err := dial(t, public, "GID_test@@@02_00_00_00_00_01@@@uuid-1", "any", "thing", &curIn)
	require.NoError(t, err)
	legacy, err := dial(t, public, "GID_test@@@02_00_00_00_00_02", "", "", &legacyIn)
	require.NoError(t, err)
	tok := legacy.Subscribe("devices/p2p/02_00_00_00_00_02", 2, nil)
	require.True(t, tok.WaitTimeout(wait))

	var boards []mqtt.Board
	eventually(t, "both boards present", func() error {
		if boards = b.Boards(); len(boards) != 2 {
			return fmt.Errorf("%d boards", len(boards))
		}
		return nil
	})
	assert.Equal(t, mqtt.Board{DeviceID: "02:00:00:00:00:01", Key: "02_00_00_00_00_01", UUID: "uuid-1",
		ClientID: "GID_test@@@02_00_00_00_00_01@@@uuid-1", RemoteAddr: boards[0].RemoteAddr, LocalAddr: boards[0].LocalAddr, Gen: boards[0].Gen}, boards[0])
	assert.NotEmpty(t, boards[0].LocalAddr)

	publish(t, gw, "devices/p2p/02_00_00_00_00_01", "to-current")
	publish(t, gw, "devices/p2p/02_00_00_00_00_02", "to-legacy")
	eventually(t, "downlink delivered", func() error {
		if len(curIn.all()) != 1 || len(legacyIn.all()) != 1 {
			return fmt.Errorf("current %d legacy %d", len(curIn.all()), len(legacyIn.all()))
		}
		return nil
	})
	assert.Equal(t, "to-current", string(curIn.all()[0].Payload()))

	publish(t, cur, "device-server", "hello from 01")
	publish(t, legacy, "devices/up/02_00_00_00_00_02", "hello from 02")
	eventually(t, "uplink attributed", func() error {
		if len(gwIn.all()) != 2 {
			return fmt.Errorf("%d messages", len(gwIn.all()))
		}
		return nil
	})
	got := map[string]string{}
	for _, m := range gwIn.all() {
		got[m.Topic()] = string(m.Payload())
		assert.False(t, m.Retained())
	}
	assert.Equal(t, map[string]string{
		"devices/up/02_00_00_00_00_01": "hello from 01",
		"devices/up/02_00_00_00_00_02": "hello from 02",
	}, got)
	assert.EqualValues(t, 1, b.Stats().Attributed)

	// The same MAC under a new client id replaces the older connection.
	gen := boards[0].Gen
	_, err = dial(t, public, "GID_test@@@02_00_00_00_00_01@@@uuid-2", "", "", nil)
	require.NoError(t, err)
	eventually(t, "old connection dropped", func() error {
		if cur.IsConnectionOpen() {
			return errors.New("still open")
		}
		return nil
	})
	var nb mqtt.Board
	eventually(t, "takeover recorded", func() error {
		if nb, _ = b.Board("02:00:00:00:00:01"); nb.UUID != "uuid-2" {
			return fmt.Errorf("uuid %q", nb.UUID)
		}
		return nil
	})
	assert.Greater(t, nb.Gen, gen)

	legacy.Disconnect(0)
	eventually(t, "disconnect reported", func() error {
		if _, ok := b.Board("02:00:00:00:00:02"); ok {
			return errors.New("still listed")
		}
		return nil
	})
	select {
	case <-b.Changed():
	default:
		t.Fatal("Changed was not signalled")
	}
}

func TestAllowAnyClientID(t *testing.T) {
	b := startBroker(t, AuthConfig{AllowAnyClientID: true})
	c, err := dial(t, "tcp://"+b.Addr().String(), "lab-sensor-7", "", "", nil)
	require.NoError(t, err)
	defer c.Disconnect(0)
	var bd mqtt.Board
	eventually(t, "plain client id admitted", func() error {
		var ok bool
		if bd, ok = b.Board("lab-sensor-7"); !ok {
			return errors.New("not listed")
		}
		return nil
	})
	assert.Equal(t, "lab-sensor-7", bd.Key)
	_, err = dial(t, "tcp://"+b.Addr().String(), "bad/id", "", "", nil)
	assert.ErrorIs(t, err, pahopackets.ErrorRefusedIDRejected)
}

// TestSilentSocketsNeitherStayNorBlockClose: a connection that never sends
// CONNECT is dropped after the connect timeout, and one still open does
// not hold up Close (mochi waits for every accepted connection).
func TestSilentSocketsNeitherStayNorBlockClose(t *testing.T) {
	b, err := New(Config{Listen: "127.0.0.1:0", ConnectPacketTimeout: 200 * time.Millisecond}, zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)))
	require.NoError(t, err)
	require.NoError(t, b.Start())

	dropped, err := net.Dial("tcp", b.Addr().String())
	require.NoError(t, err)
	defer dropped.Close()
	_ = dropped.SetReadDeadline(time.Now().Add(wait))
	_, err = dropped.Read(make([]byte, 1))
	require.Error(t, err, "the broker closes a socket that sends no CONNECT")
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "closed by the broker, not by our read deadline")
	require.Eventually(t, func() bool { n, _ := b.conns.open(); return n == 0 }, wait, 5*time.Millisecond)

	require.NoError(t, b.Close())

	b, err = New(Config{Listen: "127.0.0.1:0", ConnectPacketTimeout: time.Hour}, zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)))
	require.NoError(t, err)
	require.NoError(t, b.Start())
	silent, err := net.Dial("tcp", b.Addr().String())
	require.NoError(t, err)
	defer silent.Close()
	// Wait until mochi reads it: only then is it among the connections
	// mochi's Close waits for (mochi adds to its wait group without a
	// lock, so closing earlier is a race inside mochi, not the case tested).
	require.Eventually(t, func() bool { _, reading := b.conns.open(); return reading == 1 }, wait, 5*time.Millisecond)
	closed := make(chan struct{})
	go func() { _ = b.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close is held up by a socket that never sent CONNECT")
	}
}
