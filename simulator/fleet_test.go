package simulator

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
