package simulator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestFleetConnectsAndReconnects(t *testing.T) {
	ts := newTestServer(t, func(ts *testServer) { ts.auto = true })
	f, err := NewFleet(FleetConfig{
		URL:          ts.url,
		Profile:      mustProfile(t, "breadboard"),
		Count:        3,
		Token:        "t",
		Reconnect:    true,
		ReconnectMin: 10 * time.Millisecond,
		ReconnectMax: 20 * time.Millisecond,
	})
	require.NoError(t, err)
	boards := f.Boards()
	require.Len(t, boards, 3)
	assert.Equal(t, "02:00:00:00:00:01", boards[0].MAC())
	assert.Equal(t, "02:00:00:00:00:03", boards[2].MAC())
	assert.Equal(t, uuidFromMAC("02:00:00:00:00:01"), boards[0].ClientID(), "client ids are stable per MAC")
	assert.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, boards[0].ClientID())

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()

	// Wait for three finished hello exchanges, not just three sockets: a
	// socket dropped mid-hello would reconnect without adding a connect.
	require.Eventually(t, func() bool {
		s := f.Stats()
		return s.Connects == 3 && s.Connected == 3
	}, waitTimeout, time.Millisecond)
	ids := ts.seenIDs()
	slices.Sort(ids)
	assert.Equal(t, []string{"02:00:00:00:00:01", "02:00:00:00:00:02", "02:00:00:00:00:03"}, ids)

	// Drop one board from the server side; it comes back by itself.
	ts.mu.Lock()
	victim := ts.all[0]
	ts.mu.Unlock()
	require.NoError(t, victim.c.Close())
	require.Eventually(t, func() bool {
		s := f.Stats()
		return s.Connects == 4 && s.Connected == 3
	}, waitTimeout, time.Millisecond)
	assert.Equal(t, victim.header.Get("Device-Id"), ts.seenIDs()[3])

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(waitTimeout):
		t.Fatal("fleet did not stop")
	}
	assert.Zero(t, f.Stats().Connected)
}

func TestFleetWithoutReconnectReportsErrors(t *testing.T) {
	ts := newTestServer(t, func(ts *testServer) { ts.reject = http.StatusUnauthorized })
	err := RunFleet(context.Background(), FleetConfig{URL: ts.url, Profile: mustProfile(t, "robot"), Count: 2, MACPrefix: "0A:BB:CC:DD"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "board 0a:bb:cc:dd:00:01")
	assert.Contains(t, err.Error(), "board 0a:bb:cc:dd:00:02")
	assert.Contains(t, err.Error(), "401")
}

func TestFleetConfigValidation(t *testing.T) {
	p := mustProfile(t, "breadboard")
	for name, cfg := range map[string]FleetConfig{
		"no profile":      {URL: "ws://x/", Count: 1},
		"no url":          {Profile: p, Count: 1},
		"zero count":      {URL: "ws://x/", Profile: p},
		"bad prefix":      {URL: "ws://x/", Profile: p, Count: 1, MACPrefix: "zz:00"},
		"long prefix":     {URL: "ws://x/", Profile: p, Count: 1, MACPrefix: "02:00:00:00:00:00"},
		"prefix too full": {URL: "ws://x/", Profile: p, Count: 256, MACPrefix: "02:00:00:00:00"},
	} {
		_, err := NewFleet(cfg)
		assert.Error(t, err, name)
	}
	f, err := NewFleet(FleetConfig{URL: "ws://x/", Profile: p, Count: 255, MACPrefix: "02:00:00:00:00"})
	require.NoError(t, err)
	assert.Equal(t, "02:00:00:00:00:ff", f.Boards()[254].MAC())
}

func TestFleetBackoff(t *testing.T) {
	f := &Fleet{cfg: FleetConfig{ReconnectMin: 100 * time.Millisecond, ReconnectMax: time.Second}}
	for attempt, base := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		d := f.backoff(attempt)
		base *= time.Millisecond
		assert.InDelta(t, float64(base), float64(d), float64(base)*reconnectJitterRatio+1, "attempt %d", attempt)
	}
}

// TestConnectedOnlyAfterHello: a WebSocket board waiting for the server
// hello is not yet connected (nor counted in Connects), so the fleet line
// never shows more boards connected than connects.
func TestConnectedOnlyAfterHello(t *testing.T) {
	ts := newTestServer(t, nil)
	b := newTestBoard(t, Config{})
	errc := make(chan error, 1)
	go func() { errc <- b.ConnectWebSocket(context.Background(), ts.url) }()
	sc := ts.accept()
	sc.readText(t) // the device hello: the socket is up, the exchange is not done
	assert.False(t, b.Connected(), "connected before the server hello")
	assert.Zero(t, b.Stats().Connects)
	sc.write(t, serverHello)
	require.NoError(t, <-errc)
	assert.True(t, b.Connected())
	assert.EqualValues(t, 1, b.Stats().Connects)
}

// TestFleetReconnectLogs: reconnects a busy server explains (503) are one
// summary warning per interval, each board's line at info; a real failure
// (401) is a warning, throttled across the fleet with a count of what it
// left out.
func TestFleetReconnectLogs(t *testing.T) {
	run := func(t *testing.T, status int, summary time.Duration) *observer.ObservedLogs {
		ts := newTestServer(t, func(ts *testServer) { ts.reject = status })
		core, logs := observer.New(zapcore.InfoLevel)
		f, err := NewFleet(FleetConfig{URL: ts.url, Profile: mustProfile(t, "breadboard"), Count: 3, Reconnect: true,
			ReconnectMin: time.Millisecond, ReconnectMax: 5 * time.Millisecond, SummaryInterval: summary, Logger: zap.New(core)})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- f.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			require.NoError(t, <-done)
		})
		if status == http.StatusServiceUnavailable {
			require.Eventually(t, func() bool { return logs.FilterMessageSnippet("boards reconnecting").Len() > 0 },
				waitTimeout, time.Millisecond)
		} else {
			require.Eventually(t, func() bool { return f.failures.Suppressed() >= 6 }, waitTimeout, time.Millisecond)
		}
		return logs
	}

	t.Run("server busy", func(t *testing.T) {
		logs := run(t, http.StatusServiceUnavailable, 20*time.Millisecond)
		summary := logs.FilterMessageSnippet("boards reconnecting").All()[0]
		assert.Equal(t, zapcore.WarnLevel, summary.Level)
		fields := summary.ContextMap()
		assert.Positive(t, fields["server_busy"])
		assert.Equal(t, fields["reconnects"], fields["server_busy"])
		perBoard := logs.FilterMessage("connection ended; reconnecting").All()
		require.NotEmpty(t, perBoard)
		for _, e := range perBoard {
			assert.Equal(t, zapcore.InfoLevel, e.Level, "a busy server is not a warning per board")
			assert.Equal(t, "server_busy", e.ContextMap()["reason"])
		}
	})
	t.Run("refused token", func(t *testing.T) {
		logs := run(t, http.StatusUnauthorized, time.Hour)
		warns := logs.FilterLevelExact(zapcore.WarnLevel).All()
		require.Len(t, warns, 1, "one warning for the fleet within the interval")
		assert.Equal(t, "connection failed; reconnecting", warns[0].Message)
		assert.Contains(t, warns[0].ContextMap()["error"], "401")
		assert.Zero(t, logs.FilterMessageSnippet("boards reconnecting").Len(), "a refusal is not counted as a busy server")
		assert.Positive(t, logs.FilterMessage("connection failed; reconnecting").FilterLevelExact(zapcore.InfoLevel).Len())
	})
}

func TestReconnectReason(t *testing.T) {
	for _, c := range []struct {
		err      error
		reason   string
		expected bool
	}{
		{&HandshakeError{StatusCode: 503}, reasonServerBusy, false},
		{&HandshakeError{StatusCode: 429}, reasonServerBusy, false},
		{&HandshakeError{StatusCode: 401}, "", false},
		{&otaStatusError{status: 503}, reasonServerBusy, false},
		{&otaStatusError{status: 403}, "", false},
		{fmt.Errorf("simulator: websocket hello: %w", fmt.Errorf("%w (code 1001)", ErrServerClosed)), reasonConnectionLost, false},
		{fmt.Errorf("%w: EOF", ErrConnectionLost), reasonConnectionLost, false},
		{fmt.Errorf("simulator: dial: %w", &net.OpError{Op: "dial", Err: errors.New("connection refused")}), reasonUnreachable, false},
		{fmt.Errorf("x: %w: %w", errMQTTUnreachable, errors.New("paho")), reasonUnreachable, false},
		{ErrRebooted, "", true},
		{ErrInjectedDisconnect, "", true},
		{fmt.Errorf("simulator: websocket hello: %w", ErrHelloTimeout), "", false},
		{fmt.Errorf("%w: bad user", ErrMQTTRefused), "", false},
	} {
		reason, expected := reconnectReason(c.err)
		assert.Equal(t, c.reason, reason, "%v", c.err)
		assert.Equal(t, c.expected, expected, "%v", c.err)
	}
	assert.ErrorIs(t, &otaStatusError{status: 503}, ErrOTAStatus)
}

// TestFleetConverses: with Converse set, every board holds a conversation
// after connecting and again every ConverseEvery, and each one is summed
// up in an info line.
func TestFleetConverses(t *testing.T) {
	ts := newTestServer(t, func(ts *testServer) { ts.auto, ts.voice = true, true })
	core, logs := observer.New(zapcore.InfoLevel)
	f, err := NewFleet(FleetConfig{
		URL:           ts.url,
		Profile:       mustProfile(t, "breadboard"),
		Count:         2,
		Converse:      &ConverseOptions{Frames: 2},
		ConverseEvery: 5 * time.Millisecond,
		Logger:        zap.New(core),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	require.Eventually(t, func() bool {
		for _, b := range f.Boards() {
			if b.Stats().Conversations < 2 {
				return false
			}
		}
		return true
	}, waitTimeout, time.Millisecond)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(waitTimeout):
		t.Fatal("fleet did not stop")
	}
	lines := logs.FilterMessage("conversation").All()
	require.NotEmpty(t, lines)
	fields := lines[0].ContextMap()
	assert.Equal(t, "hello", fields["stt"])
	assert.Equal(t, "hi there", fields["tts"])
	assert.EqualValues(t, 1, fields["downlink_frames"])
	// The answer comes after the first frame; the second may be out by then.
	assert.Contains(t, []int64{1, 2}, fields["uplink_frames"])
	assert.Zero(t, logs.FilterMessage("conversation failed").Len())

	_, err = NewFleet(FleetConfig{URL: ts.url, Profile: mustProfile(t, "breadboard"), Count: 1, Converse: &ConverseOptions{Mode: "shout"}})
	assert.Error(t, err)
}
