package mqtt_test

// Floods: boards that publish as fast as a socket allows must cost only
// themselves, and must not flood the log either. The flooders are raw
// MQTT connections (floodtest) or simulated boards publishing in a loop.

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/mqtt"
	"github.com/devicebridge/devicebridge/mqtt/broker"
	"github.com/devicebridge/devicebridge/mqtt/floodtest"
	"github.com/devicebridge/devicebridge/mqtt/mosquittotest"
	"github.com/devicebridge/devicebridge/simulator"
)

// floodMessage is a well-formed board message the gateway decodes and
// counts, so every copy that gets through costs it a little work.
var floodMessage = []byte(`{"session_id":"","type":"listen","state":"detect","text":"flood"}`)

// observed is a logger that writes to the test log and records every entry
// at info and above, to be counted.
func observed(t *testing.T) (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zapcore.InfoLevel)
	tl := zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
	return zap.New(zapcore.NewTee(tl.Core(), core)), logs
}

// warnings counts recorded entries at warn level and above.
func warnings(logs *observer.ObservedLogs) int {
	return logs.Filter(func(e observer.LoggedEntry) bool { return e.Level >= zapcore.WarnLevel }).Len()
}

// floodFrom floods topic through a simulated board's own MQTT connection,
// at about 2000 messages a second (a hundred times the default rate), until
// ctx ends or the connection fails; it returns a wait function. The pace
// keeps the flood below what the gateway reads even under the race
// detector: behind an external broker, a flood faster than that delays
// every board on the gateway's one connection, which only the broker's own
// limits can prevent (docs/mqtt.md).
func floodFrom(ctx context.Context, conn *simulator.MQTTConn, topic string) (wait func()) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		pace := time.NewTicker(5 * time.Millisecond)
		defer pace.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-pace.C:
			}
			for range 10 {
				pctx, cancel := context.WithTimeout(ctx, time.Second)
				err := conn.PublishRaw(pctx, topic, floodMessage)
				cancel()
				if err != nil && ctx.Err() == nil && !conn.Connected() {
					return
				}
			}
		}
	}()
	return wg.Wait
}

// TestFloodingBoardsCostOnlyThemselves: four boards publish to
// device-server as fast as their sockets allow while a healthy board is
// called again and again. Every call to the healthy board succeeds, and
// the flood leaves a handful of log lines, not one per dropped message.
func TestFloodingBoardsCostOnlyThemselves(t *testing.T) {
	log, logs := observed(t)
	// Flooders stay connected throughout: what is tested is that their
	// flood, not their disconnection, costs the healthy board nothing.
	br := startEmbedded(t, options{log: log, broker: func(c *broker.Config) { c.BoardLimits.FloodGrace = time.Hour }})
	healthy := newBoard(t, simulator.Config{MAC: "02:00:00:00:0f:01"})
	br.connect(healthy, simulator.MQTTConfig{})
	br.waitReady(healthy.MAC())

	var flooders []*floodtest.Flooder
	for i := range 4 {
		id := mqtt.FormatClientID("GID_test", fmt.Sprintf("02:00:00:00:0e:%02x", i+1), "flood")
		flooders = append(flooders, floodtest.Start(t, br.broker.Addr().String(), id, "device-server", floodMessage))
	}
	sent := func() (n int64) {
		for _, f := range flooders {
			n += f.Sent()
		}
		return n
	}
	// The flood is under way before the first call ...
	require.Eventually(t, func() bool { return sent() >= 20_000 }, wait, tick, "flood under way")

	var failed []string
	const calls = 14
	for i := range calls {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		_, err := br.hub.CallTool(ctx, healthy.MAC(), "self.audio_speaker.set_volume", fmt.Appendf(nil, `{"volume":%d}`, i))
		cancel()
		if err != nil {
			failed = append(failed, err.Error())
		}
	}
	assert.Empty(t, failed, "calls to the healthy board failed during the flood")
	assert.Equal(t, calls-1, healthy.State()["audio_speaker.volume"])
	// ... and still under way after the last.
	before := sent()
	require.Eventually(t, func() bool { return sent() >= before+10_000 }, wait, tick, "flood still under way")

	var dropped int64
	require.Eventually(t, func() bool {
		st := br.broker.Stats()
		dropped = st.RateLimited + st.QueueFull + st.Dropped
		return dropped > 10_000 && st.RateLimited > 0
	}, wait, tick, "the broker dropped the flood")
	// One line per kind of warning and interval, whichever board, however
	// many messages.
	assert.Less(t, warnings(logs), 30, "warnings logged for %d dropped messages", dropped)
}

// TestFloodingBoardIsCutOff: a board that stays over its rate for the
// flood grace is disconnected by the embedded broker; its session closes
// saying why, and the board comes back once the grace has passed again.
func TestFloodingBoardIsCutOff(t *testing.T) {
	const grace = 300 * time.Millisecond
	br := startEmbedded(t, options{broker: func(c *broker.Config) {
		c.BoardLimits = mqtt.BoardLimits{Rate: 20, Burst: 20, FloodGrace: grace}
	}})
	b := newBoard(t, simulator.Config{MAC: "02:00:00:00:0f:11"})
	conn := br.connect(b, simulator.MQTTConfig{ReconnectInterval: 100 * time.Millisecond})
	br.waitReady(b.MAC())
	s, ok := br.hub.Session(b.MAC())
	require.True(t, ok)

	ctx, cancel := context.WithCancel(context.Background())
	stop := floodFrom(ctx, conn, "device-server")
	select {
	case <-s.Done():
	case <-time.After(wait):
		t.Fatal("the flooding board was not cut off")
	}
	cancel()
	stop()
	info := s.Info()
	assert.Equal(t, device.CauseRefused, info.CloseCause)
	assert.Contains(t, info.CloseReason, mqtt.ErrPublishFlood.Error())
	assert.Contains(t, info.CloseReason, "20 messages/s")
	st := br.broker.Stats()
	assert.EqualValues(t, 1, st.CutOff)
	assert.Positive(t, st.RateLimited)

	// The board reconnects on its own; once the grace is over it is back.
	d := br.waitReady(b.MAC())
	assert.NotEqual(t, info.Generation, d.Generation)
	br.mustCall(b.MAC(), "self.get_device_status", nil)
}

// TestMosquittoFloodingBoard: behind an external broker the gateway can
// only drop. A board publishing to its uplink topic as fast as it can has
// its excess dropped, its session closed once the grace is over and its
// messages ignored after that; a healthy board's calls all succeed.
func TestMosquittoFloodingBoard(t *testing.T) {
	mq := mosquittotest.Start(t)
	log, logs := observed(t)
	br := startExternal(t, mq.URL(), options{log: log, gateway: func(c *mqtt.Config) {
		c.BoardLimits = mqtt.BoardLimits{Rate: 20, Burst: 20, FloodGrace: 500 * time.Millisecond}
	}})
	br.waitSubscribed()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	healthy := newBoard(t, simulator.Config{MAC: "02:00:00:00:0f:21"})
	hc := br.connect(healthy, simulator.LegacyMQTTConfig(mq.URL()))
	require.NoError(t, hc.OpenAudioChannel(ctx))
	br.waitReady(healthy.MAC())

	flooder := newBoard(t, simulator.Config{MAC: "02:00:00:00:0f:22"})
	fc := br.connect(flooder, simulator.LegacyMQTTConfig(mq.URL()))
	require.NoError(t, fc.OpenAudioChannel(ctx))
	br.waitReady(flooder.MAC())
	s, _ := br.hub.Session(flooder.MAC())

	fctx, stopFlood := context.WithCancel(context.Background())
	stop := floodFrom(fctx, fc, "devices/up/"+mqtt.TopicKey(flooder.MAC()))
	defer func() { stopFlood(); stop() }()

	for i := range 10 {
		br.mustCall(healthy.MAC(), "self.audio_speaker.set_volume", map[string]any{"volume": i})
	}
	select {
	case <-s.Done():
	case <-time.After(wait):
		t.Fatal("the flooding board's session was not closed")
	}
	info := s.Info()
	assert.Equal(t, device.CauseRefused, info.CloseCause)
	assert.Contains(t, info.CloseReason, mqtt.ErrPublishFlood.Error())
	// Its flood goes on and is ignored for the grace (after which it is
	// heard again, and cut off again if it still floods).
	require.Eventually(t, func() bool { return br.gw.Stats().Muted > 100 }, wait, tick, "flood ignored")
	br.mustCall(healthy.MAC(), "self.audio_speaker.set_volume", map[string]any{"volume": 42})
	assert.Equal(t, 42, healthy.State()["audio_speaker.volume"])

	st := br.gw.Stats()
	assert.Positive(t, st.RateLimited)
	assert.GreaterOrEqual(t, st.CutOff, int64(1))
	assert.Less(t, warnings(logs), 30, "warnings logged for %d dropped messages", st.RateLimited+st.Muted)
}

// TestUDPJunkHoldsNothing: datagrams from anyone, malformed or naming no
// audio session, are counted and dropped: no log line, no state.
func TestUDPJunkHoldsNothing(t *testing.T) {
	log, logs := observed(t)
	br := startEmbedded(t, options{log: log})
	c, err := net.Dial("udp", br.gw.UDPAddr().String())
	require.NoError(t, err)
	defer c.Close()

	valid := make([]byte, 16+4) // a well-formed header for an ssrc nobody has
	valid[0], valid[3], valid[7] = 0x01, 4, 0x42
	const n = 2000
	for i := range n {
		d := valid
		if i%2 == 1 {
			d = []byte(strings.Repeat("x", i%1400))
		}
		_, err := c.Write(d)
		require.NoError(t, err)
	}
	// Loopback may drop datagrams when the reader falls behind; what
	// arrives is counted, nothing is logged.
	require.Eventually(t, func() bool {
		st := br.gw.Stats().UDP
		return st.Malformed > 0 && st.Unknown > 0
	}, wait, tick)
	st := br.gw.Stats().UDP
	assert.Zero(t, st.Packets)
	assert.LessOrEqual(t, st.Malformed+st.Unknown, int64(n))
	assert.Zero(t, warnings(logs))
}

// TestRepliesDoNotCountAgainstTheRate: a board answering calls as fast as
// the bridge makes them is never held to its rate, however low: each
// request lets it answer. Through the embedded broker and behind Mosquitto.
func TestRepliesDoNotCountAgainstTheRate(t *testing.T) {
	tight := mqtt.BoardLimits{Rate: 1, Burst: 2, FloodGrace: 200 * time.Millisecond}
	calls := func(br *bridge, mac string) {
		t.Helper()
		s, ok := br.hub.Session(mac)
		require.True(t, ok)
		for i := range 50 {
			br.mustCall(mac, "self.audio_speaker.set_volume", map[string]any{"volume": i})
		}
		assert.Equal(t, device.StateReady, s.Info().State, "never cut off")
	}

	t.Run("embedded", func(t *testing.T) {
		br := startEmbedded(t, options{broker: func(c *broker.Config) { c.BoardLimits = tight }})
		b := newBoard(t, simulator.Config{MAC: "02:00:00:00:0f:61"})
		br.connect(b, simulator.MQTTConfig{})
		br.waitReady(b.MAC())
		calls(br, b.MAC())
		assert.Zero(t, br.broker.Stats().RateLimited)
	})
	t.Run("mosquitto", func(t *testing.T) {
		mq := mosquittotest.Start(t)
		br := startExternal(t, mq.URL(), options{gateway: func(c *mqtt.Config) { c.BoardLimits = tight }})
		br.waitSubscribed()
		b := newBoard(t, simulator.Config{MAC: "02:00:00:00:0f:62"})
		conn := br.connect(b, simulator.LegacyMQTTConfig(mq.URL()))
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		require.NoError(t, conn.OpenAudioChannel(ctx))
		br.waitReady(b.MAC())
		calls(br, b.MAC())
		assert.Zero(t, br.gw.Stats().RateLimited)
	})
}
