package broker

import (
	"bytes"
	"errors"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/devicebridge/devicebridge/mqtt"
	"github.com/devicebridge/devicebridge/mqtt/floodtest"
)

func startBrokerWith(t *testing.T, cfg Config, log *zap.Logger) *Broker {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	if log == nil {
		log = zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
	}
	b, err := New(cfg, log)
	require.NoError(t, err)
	require.NoError(t, b.Start())
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// TestGatewayQueueKeepsRoomForQuietBoards: boards flooding with large
// messages while the gateway reads nothing fill their shares of the queue
// towards it, and no more: a quiet board's message still finds a place
// and reaches the gateway once it reads again.
func TestGatewayQueueKeepsRoomForQuietBoards(t *testing.T) {
	// No rate limit here: the queue shares alone must do it.
	b := startBrokerWith(t, Config{BoardLimits: mqtt.BoardLimits{Rate: 1e9, Burst: 1e9, FloodGrace: time.Hour}}, nil)

	// A gateway that stops reading: paho hands messages to the handler
	// one at a time, so a blocked handler stalls its whole connection.
	release := make(chan struct{})
	var (
		mu     sync.Mutex
		topics = map[string]int{}
	)
	cr := b.GatewayCredentials()
	gw, err := dial(t, cr.URL, cr.ClientID, cr.Username, cr.Password, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	tok := gw.Subscribe("devices/up/+", 0, func(_ paho.Client, m paho.Message) {
		<-release
		mu.Lock()
		topics[m.Topic()]++
		mu.Unlock()
	})
	require.True(t, tok.WaitTimeout(wait))
	require.NoError(t, tok.Error())

	big := bytes.Repeat([]byte("x"), 32<<10)
	for _, mac := range []string{"02_00_00_00_0e_01", "02_00_00_00_0e_02", "02_00_00_00_0e_03", "02_00_00_00_0e_04"} {
		floodtest.Start(t, b.Addr().String(), "GID_test@@@"+mac+"@@@flood", "devices/up/"+mac, big)
	}
	// The flooders have filled what they may of the stalled queue.
	eventually(t, "flooders held to their shares", func() error {
		if b.Stats().QueueFull == 0 {
			return errors.New("no publish refused yet")
		}
		return nil
	})

	quiet, code := floodtest.Connect(t, b.Addr().String(), "GID_test@@@02_00_00_00_0f_01@@@quiet")
	require.Zero(t, code)
	t.Cleanup(func() { _ = quiet.Close() })
	require.NoError(t, floodtest.Publish(quiet, "device-server", []byte(`{"type":"mcp","payload":{}}`)))
	require.NoError(t, floodtest.Ping(quiet)) // the broker has routed the publish
	assert.Zero(t, b.Stats().Dropped, "nothing was dropped from the gateway's queue")

	close(release)
	eventually(t, "the quiet board's message reached the gateway", func() error {
		mu.Lock()
		defer mu.Unlock()
		if topics["devices/up/02_00_00_00_0f_01"] != 1 {
			return errors.New("not yet")
		}
		return nil
	})
}

// TestCutOffBoardRefusedWhileCutOff: a board cut off for flooding is
// refused reconnecting (CONNACK server unavailable) until its time is
// over, and only that board.
func TestCutOffBoardRefusedWhileCutOff(t *testing.T) {
	b := startBroker(t, AuthConfig{})
	const id = "02:00:00:00:0f:31"
	reason := errors.New("flooded")
	b.recordCutOff(nil, id, reason, time.Now().Add(time.Hour))

	_, code := floodtest.Connect(t, b.Addr().String(), "GID_test@@@02_00_00_00_0f_31@@@x")
	assert.EqualValues(t, 3, code, "server unavailable")
	other, code := floodtest.Connect(t, b.Addr().String(), "GID_test@@@02_00_00_00_0f_32@@@x")
	assert.Zero(t, code)
	_ = other.Close()
	assert.EqualValues(t, 1, b.Stats().RefusedCutOff)

	b.recordCutOff(nil, id, reason, time.Now().Add(-time.Second))
	back, code := floodtest.Connect(t, b.Addr().String(), "GID_test@@@02_00_00_00_0f_31@@@x")
	assert.Zero(t, code, "admitted once the cut-off is over")
	_ = back.Close()
}

// TestFloodWarningsAreThrottled: boards flooding past their rate make the
// broker log one line per interval, not one per message, and the lines
// account for every message left out.
func TestFloodWarningsAreThrottled(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	log := zap.New(zapcore.NewTee(zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)).Core(), core))
	// One message per connection, then nothing: every later one is over
	// the rate.
	b := startBrokerWith(t, Config{BoardLimits: mqtt.BoardLimits{Rate: 0.001, Burst: 1, FloodGrace: time.Hour}}, log)
	b.warns.rateLimited.Interval = 200 * time.Millisecond
	gateway(t, b, &inbox{})

	const each = 100 * 256
	for _, mac := range []string{"02_00_00_00_0e_01", "02_00_00_00_0e_02"} {
		floodtest.StartN(t, b.Addr().String(), "GID_test@@@"+mac+"@@@flood", "device-server", []byte("{}"), each)
	}
	// All but the first message of each flooder are over the rate.
	require.Eventually(t, func() bool { return b.Stats().RateLimited == 2*(each-1) }, 60*time.Second, 5*time.Millisecond,
		"the whole flood processed")

	lines := func() []observer.LoggedEntry {
		return logs.FilterMessage("board is publishing over its rate; dropping its excess").AllUntimed()
	}
	// One more message over the rate once the interval is over writes the
	// line that counts what the last interval left out.
	c, code := floodtest.Connect(t, b.Addr().String(), "GID_test@@@02_00_00_00_0e_03@@@flood")
	require.Zero(t, code)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, floodtest.Publish(c, "device-server", []byte("{}"))) // within the burst
	n := len(lines())
	eventually(t, "a line after the flood", func() error {
		if err := floodtest.Publish(c, "device-server", []byte("{}")); err != nil {
			return err
		}
		if err := floodtest.Ping(c); err != nil {
			return err
		}
		if len(lines()) == n {
			return errors.New("no new line yet")
		}
		return nil
	})

	all := lines()
	var suppressed int64
	for _, e := range all {
		if v, ok := e.ContextMap()["suppressed"]; ok {
			suppressed += v.(int64)
		}
	}
	limited := b.Stats().RateLimited
	assert.Equal(t, limited, int64(len(all))+suppressed, "every dropped message is a line or counted in one")
	assert.Less(t, len(all)*100, int(limited), "%d lines for %d dropped messages", len(all), limited)
	assert.Positive(t, suppressed)
}

// TestFloodOfDeniedPublishesIsCutOff: a board flooding topics it may not
// publish to counts against its rate like any other and is disconnected
// once the grace is over; the departure says why.
func TestFloodOfDeniedPublishesIsCutOff(t *testing.T) {
	b := startBrokerWith(t, Config{BoardLimits: mqtt.BoardLimits{Rate: 10, Burst: 10, FloodGrace: 200 * time.Millisecond}}, nil)
	f := floodtest.Start(t, b.Addr().String(), "GID_test@@@02_00_00_00_0e_09@@@flood", "devices/up/02_00_00_00_0e_01", []byte("{}"))
	// Listed soon after the CONNACK, until the cut-off at least a grace later.
	var board mqtt.Board
	eventually(t, "presence lists the board", func() error {
		var ok bool
		if board, ok = b.Board("02:00:00:00:0e:09"); !ok {
			return errors.New("not listed")
		}
		return nil
	})
	select {
	case <-f.Done():
	case <-time.After(wait):
		t.Fatal("the flooder was not disconnected")
	}
	st := b.Stats()
	assert.EqualValues(t, 1, st.CutOff)
	assert.Positive(t, st.DeniedPublish)
	eventually(t, "the board left", func() error {
		if _, ok := b.Board("02:00:00:00:0e:09"); ok {
			return errors.New("still listed")
		}
		return nil
	})
	assert.ErrorIs(t, b.Departure(board.DeviceID, board.Gen), mqtt.ErrPublishFlood)
	assert.NoError(t, b.Departure(board.DeviceID, board.Gen+1), "another connection of the board")
}

// TestBoardListenerBounds: the board listener holds at most
// max_pending_connects sockets that have not been admitted and
// max_connections in all; a socket past either is closed at once and
// counted, and admitted boards free their pending place.
func TestBoardListenerBounds(t *testing.T) {
	b := startBrokerWith(t, Config{MaxConnections: 3, MaxPendingConnects: 2}, nil)
	addr := b.Addr().String()
	silent := func() net.Conn {
		c, err := net.DialTimeout("tcp", addr, wait)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	closedByBroker := func(c net.Conn) bool {
		_ = c.SetReadDeadline(time.Now().Add(wait))
		_, err := c.Read(make([]byte, 1))
		return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
	}
	open := func(n int) {
		t.Helper()
		require.Eventually(t, func() bool { o, _ := b.conns.open(); return o == n }, wait, 5*time.Millisecond)
	}

	s1 := silent()
	silent()
	open(2)
	assert.True(t, closedByBroker(silent()), "a third socket not admitted is refused")
	assert.EqualValues(t, 1, b.Stats().RefusedSockets)

	_ = s1.Close()
	open(1)
	for _, id := range []string{"GID_test@@@02_00_00_00_0f_41@@@a", "GID_test@@@02_00_00_00_0f_42@@@b"} {
		c, code := floodtest.Connect(t, addr, id)
		require.Zero(t, code)
		t.Cleanup(func() { _ = c.Close() })
	}
	open(3)
	assert.True(t, closedByBroker(silent()), "a fourth socket is refused")
	assert.EqualValues(t, 2, b.Stats().RefusedSockets)
}
