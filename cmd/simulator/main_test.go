package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/bridgetest"
	"github.com/devicebridge/devicebridge/simulator"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseToolDelay(t *testing.T) {
	name, d, err := parseToolDelay("self.lamp.turn_on=1.5s")
	require.NoError(t, err)
	assert.Equal(t, "self.lamp.turn_on", name)
	assert.Equal(t, 1500*time.Millisecond, d)
	for _, bad := range []string{"self.x", "=1s", "self.x=soon", "self.x=-1s"} {
		_, _, err := parseToolDelay(bad)
		assert.Error(t, err, bad)
	}
}

func TestParseFlags(t *testing.T) {
	m := &Main{}
	require.NoError(t, m.ParseFlags([]string{"--count", "3", "--tool-delay", "a=1s", "--tool-delay", "b=2s", "--disconnect-on", "c", "--log-level", "warn"}, io.Discard))
	assert.Equal(t, 3, m.count)
	assert.Equal(t, map[string]time.Duration{"a": time.Second, "b": 2 * time.Second}, m.toolDelay)
	assert.Equal(t, map[string]bool{"c": true}, m.disconnectOn)
	assert.Equal(t, "ws://127.0.0.1:8000/xiaozhi/v1/", m.url)
	assert.Equal(t, "breadboard", m.profile)

	for _, bad := range [][]string{{"--log-format", "xml"}, {"--log-level", "loud"}, {"extra"}, {"--tool-delay", "x"}} {
		assert.Error(t, (&Main{}).ParseFlags(bad, io.Discard), "%q", bad)
	}
}

func TestParseConverseFlags(t *testing.T) {
	m := &Main{}
	require.NoError(t, m.ParseFlags(nil, io.Discard))
	assert.Nil(t, m.converseOptions(), "no conversations by default")

	m = &Main{}
	require.NoError(t, m.ParseFlags([]string{"--converse", "5", "--converse-every", "2s", "--converse-mode", "manual",
		"--wake-word", "hi", "--converse-pace", "0", "--converse-goodbye"}, io.Discard))
	o := m.converseOptions()
	require.NotNil(t, o)
	assert.Equal(t, 5, o.Frames)
	assert.Equal(t, "manual", o.Mode)
	assert.Equal(t, "hi", o.WakeWord)
	assert.Zero(t, o.Pace)
	assert.True(t, o.Goodbye)
	assert.Equal(t, simulator.DefaultReplyTimeout, o.ReplyTimeout)
	assert.Equal(t, 2*time.Second, m.converseEvery)
	assert.Error(t, (&Main{}).ParseFlags([]string{"--converse", "-1"}, io.Discard))
}

// TestRunConverse: with --converse a board talks after connecting and
// the conversation is summed up in one info line.
func TestRunConverse(t *testing.T) {
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		audio int
	)
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		wg.Add(1)
		defer wg.Done()
		defer c.Close()
		if _, _, err := c.ReadMessage(); err != nil {
			return
		}
		_ = c.WriteMessage(websocket.TextMessage, []byte(`{"type":"hello","transport":"websocket","session_id":"s"}`))
		for {
			typ, _, err := c.ReadMessage()
			if err != nil {
				return
			}
			if typ != websocket.BinaryMessage {
				continue
			}
			mu.Lock()
			audio++
			last := audio == 3
			mu.Unlock()
			if last {
				for _, m := range []string{`{"type":"stt","text":"what is the weather"}`, `{"type":"tts","state":"start"}`,
					`{"type":"tts","state":"sentence_start","text":"Sunny."}`} {
					_ = c.WriteMessage(websocket.TextMessage, []byte(m))
				}
				_ = c.WriteMessage(websocket.BinaryMessage, []byte{1, 2, 3})
				_ = c.WriteMessage(websocket.TextMessage, []byte(`{"type":"tts","state":"stop"}`))
			}
		}
	}))
	defer srv.Close()

	var out bridgetest.SyncBuffer
	m := &Main{}
	url := "ws" + strings.TrimPrefix(srv.URL, "http") + "/xiaozhi/v1/"
	require.NoError(t, m.ParseFlags([]string{"--url", url, "--converse", "3", "--converse-pace", "1ms", "--log-format", "json",
		"--stats-interval", "0", "--mac-prefix", "02:ac"}, &out))
	runUntil(t, m, &mu, &wg, func() bool { return strings.Contains(out.String(), `"msg":"conversation"`) })
	var line map[string]any
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.Contains(l, `"msg":"conversation"`) {
			require.NoError(t, json.Unmarshal([]byte(l), &line))
		}
	}
	assert.Equal(t, "what is the weather", line["stt"])
	assert.Equal(t, "Sunny.", line["tts"])
	assert.EqualValues(t, 3, line["uplink_frames"])
	assert.EqualValues(t, 1, line["downlink_frames"])
}

// TestRun starts two boards against a minimal server and stops them.
func TestRun(t *testing.T) {
	var (
		mu  sync.Mutex
		ids []string
		wg  sync.WaitGroup
	)
	srv := httptest.NewServer(helloServer(&mu, &wg, func(r *http.Request) {
		ids = append(ids, r.Header.Get("Device-Id"))
	}))
	defer srv.Close()

	m := &Main{}
	url := "ws" + strings.TrimPrefix(srv.URL, "http") + "/xiaozhi/v1/"
	require.NoError(t, m.ParseFlags([]string{"--url", url, "--count", "2", "--profile", "robot", "--log-level", "error", "--mac-prefix", "02:aa"}, io.Discard))
	runUntil(t, m, &mu, &wg, func() bool { return len(ids) == 2 })
	assert.ElementsMatch(t, []string{"02:aa:00:00:00:01", "02:aa:00:00:00:02"}, ids)
}

// TestStatsIgnoreLogLevel: --stats-interval asks for the fleet counters,
// so --log-level warn (the usual setting for load runs) must not hide
// them, while it still hides other info lines.
func TestStatsIgnoreLogLevel(t *testing.T) {
	for _, format := range []string{"console", "json"} {
		t.Run(format, func(t *testing.T) {
			var out bridgetest.SyncBuffer
			m := &Main{}
			require.NoError(t, m.ParseFlags([]string{"--log-level", "warn", "--log-format", format,
				"--stats-interval", "10ms"}, &out))
			profile, err := simulator.LoadProfile("breadboard")
			require.NoError(t, err)
			fleet, err := simulator.NewFleet(simulator.FleetConfig{URL: "ws://127.0.0.1:1/", Profile: profile, Count: 1})
			require.NoError(t, err)

			m.log.Info("per-board chatter")
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); m.logStats(ctx, fleet) }()
			require.Eventually(t, func() bool { return strings.Contains(out.String(), "fleet") },
				5*time.Second, 5*time.Millisecond, "no stats line at --log-level warn")
			cancel()
			<-done
			assert.Contains(t, out.String(), "boards")
			assert.NotContains(t, out.String(), "per-board chatter", "--log-level warn still applies elsewhere")
		})
	}
}

// TestRunOTA: with --ota the boards POST the firmware's headers and body,
// then connect where the answer says, with the token it gave.
func TestRunOTA(t *testing.T) {
	var (
		mu      sync.Mutex
		headers http.Header
		body    string
		auth    []string
		wg      sync.WaitGroup
	)
	mux := http.NewServeMux()
	var srv *httptest.Server
	mux.HandleFunc("/xiaozhi/ota/", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		headers, body = r.Header.Clone(), string(b)
		if r.Close {
			headers.Set("X-Connection-Close", "true")
		}
		mu.Unlock()
		ws := "ws" + strings.TrimPrefix(srv.URL, "http") + "/xiaozhi/v1/"
		_, _ = io.WriteString(w, `{"server_time":{"timestamp":1},"firmware":{"version":"2.4.2","url":""},"websocket":{"url":"`+ws+`","token":"issued-token","version":1}}`)
	})
	mux.Handle("/xiaozhi/v1/", helloServer(&mu, &wg, func(r *http.Request) {
		auth = append(auth, r.Header.Get("Authorization"))
	}))
	srv = httptest.NewServer(mux)
	defer srv.Close()

	m := &Main{}
	require.NoError(t, m.ParseFlags([]string{"--ota", srv.URL + "/xiaozhi/ota/", "--log-level", "error", "--mac-prefix", "02:ab"}, io.Discard))
	runUntil(t, m, &mu, &wg, func() bool { return len(auth) == 1 })
	assert.Equal(t, []string{"Bearer issued-token"}, auth)
	assert.Equal(t, "1", headers.Get("Activation-Version"))
	assert.Equal(t, "02:ab:00:00:00:01", headers.Get("Device-Id"))
	assert.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, headers.Get("Client-Id"))
	assert.Equal(t, "bread-compact-wifi/2.4.2", headers.Get("User-Agent"))
	assert.Equal(t, "application/json", headers.Get("Content-Type"))
	assert.NotEmpty(t, headers.Get("Accept-Language"))
	assert.Empty(t, headers.Get("Accept-Encoding"), "the firmware asks for no compression")
	assert.Equal(t, "true", headers.Get("X-Connection-Close"))
	assert.Contains(t, body, `"minimum_free_heap_size":"`, "the number sent as a string")
	assert.Contains(t, body, `"partition_table": [`)
	assert.Contains(t, body, `"mac_address":"02:ab:00:00:00:01"`)
}

// helloServer is a minimal WebSocket server for boards: it answers the
// hello and reads until the board leaves. seen is called under mu with
// each upgraded request; wg counts open connections.
func helloServer(mu *sync.Mutex, wg *sync.WaitGroup, seen func(*http.Request)) http.Handler {
	up := websocket.Upgrader{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		wg.Add(1)
		defer wg.Done()
		defer c.Close()
		mu.Lock()
		seen(r)
		mu.Unlock()
		if _, _, err := c.ReadMessage(); err != nil {
			return
		}
		_ = c.WriteMessage(websocket.TextMessage, []byte(`{"type":"hello","transport":"websocket","session_id":"s"}`))
		for {
			if _, _, err := c.ReadMessage(); err != nil {
				return
			}
		}
	})
}

// runUntil runs m until ready (checked under mu) holds, then stops it and
// waits for the server's connections to end.
func runUntil(t *testing.T, m *Main, mu *sync.Mutex, wg *sync.WaitGroup, ready func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return ready()
	}, 5*time.Second, time.Millisecond)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not stop")
	}
	wg.Wait()
}

// TestFleetCountersAgainstBridge: the fleet line's "connected" is the
// boards connected now, over either transport, and never more than
// "connects" (finding: MQTT boards read "connected": 0 while connected,
// and WebSocket boards counted as connected before their hello).
func TestFleetCountersAgainstBridge(t *testing.T) {
	for _, transport := range []string{"websocket", "mqtt"} {
		t.Run(transport, func(t *testing.T) {
			b := bridgetest.Start(t, func(c *app.Config) {
				if transport == "mqtt" {
					c.MQTT.Listen = "127.0.0.1:0"
				}
			}, bridgetest.WithLogger(zap.NewNop()))
			args := []string{"--count", "3", "--mac-prefix", "02:00:05", "--log-format", "json", "--log-level", "warn",
				"--stats-interval", "5ms", "--reconnect-min", "10ms", "--reconnect-max", "50ms"}
			if transport == "mqtt" {
				args = append(args, "--mqtt", "tcp://"+b.App.MQTTAddr().String())
			} else {
				args = append(args, "--url", b.App.DeviceURL())
			}
			var out bridgetest.SyncBuffer
			m := &Main{}
			require.NoError(t, m.ParseFlags(args, &out))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- m.Run(ctx) }()

			ready := func() bool {
				n := 0
				for _, info := range b.App.Hub.Devices() {
					if info.State == device.StateReady {
						n++
					}
				}
				return n == 3
			}
			require.Eventually(t, ready, 10*time.Second, 5*time.Millisecond)
			// A line written after every board was ready says so.
			mark := len(fleetLines(t, out.String()))
			require.Eventually(t, func() bool {
				lines := fleetLines(t, out.String())
				for _, l := range lines[mark:] {
					if l.Connected == 3 && l.Connects == 3 {
						return true
					}
				}
				return false
			}, 10*time.Second, 5*time.Millisecond, "no fleet line with 3 connected boards:\n%s", out.String())
			for _, l := range fleetLines(t, out.String()) {
				assert.LessOrEqual(t, l.Connected, l.Connects, "more boards connected than connects so far")
			}

			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not stop")
			}
		})
	}
}

type fleetLine struct {
	Connected int `json:"connected"`
	Connects  int `json:"connects"`
}

// fleetLines parses the JSON "fleet" lines of the simulator's log.
func fleetLines(t *testing.T, log string) []fleetLine {
	var out []fleetLine
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, `"msg":"fleet"`) {
			continue
		}
		var l fleetLine
		require.NoError(t, json.Unmarshal([]byte(line), &l), line)
		out = append(out, l)
	}
	return out
}

// TestQuietAtWarnWhileBridgeRefusesAndStops: at --log-level warn, boards
// refused during a burst (503, too many waiting for their hello) and then
// dropped by the bridge stopping write no line each; one summary warning
// counts them.
func TestQuietAtWarnWhileBridgeRefusesAndStops(t *testing.T) {
	b := bridgetest.Start(t, func(c *app.Config) { c.WebSocket.MaxPendingHellos = 1 })
	const boards = 20
	var out bridgetest.SyncBuffer
	m := &Main{}
	require.NoError(t, m.ParseFlags([]string{"--url", b.App.DeviceURL(), "--count", "20", "--mac-prefix", "02:00:06",
		"--log-format", "json", "--log-level", "warn", "--stats-interval", "0", "--reconnect-summary", "20ms",
		"--reconnect-min", "5ms", "--reconnect-max", "20ms"}, &out))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	require.Eventually(t, func() bool { return len(b.App.Hub.Devices()) == boards }, 20*time.Second, 5*time.Millisecond)
	require.NoError(t, b.Shutdown())
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "boards reconnecting") },
		10*time.Second, 5*time.Millisecond, "no summary after the bridge stopped:\n%s", out.String())
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop")
	}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		assert.Contains(t, line, "boards reconnecting", "only the summary at warn")
	}
	// The bridge's side of the same: its refusals are throttled (ws), and a
	// shutdown closes boards without a warning each.
	assert.Zero(t, b.Logs.FilterLevelExact(zapcore.WarnLevel).FilterField(zap.String("transport", "websocket")).
		FilterMessageSnippet("clos").Len(), "no warning per board closed at shutdown")
}
