package app_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/devicebridge/devicebridge/api"
	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/simulator"
)

// obsWait bounds every poll in these tests; nothing should come close.
const obsWait = 15 * time.Second

// bearerClient adds a bearer token to every request.
type bearerClient struct {
	token string
	next  http.RoundTripper
}

func (b bearerClient) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

func tokenClient(t *testing.T, token string) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: bearerClient{token: token, next: tr}}
}

// scrapeMetrics reads /metrics and returns every sample by its series, written as
// the text format writes it: name{label="value",...} with labels sorted.
func scrapeMetrics(t *testing.T, hc *http.Client, base string) map[string]float64 {
	t.Helper()
	resp, err := hc.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		require.Positive(t, i, line)
		v, err := strconv.ParseFloat(line[i+1:], 64)
		require.NoError(t, err, line)
		out[canonicalSeries(line[:i])] = v
	}
	return out
}

// canonicalSeries sorts a series' labels (the text format puts le and quantile
// last).
func canonicalSeries(s string) string {
	open := strings.IndexByte(s, '{')
	if open < 0 || !strings.HasSuffix(s, "}") {
		return s
	}
	pairs := strings.Split(s[open+1:len(s)-1], `",`)
	for i := range pairs[:len(pairs)-1] {
		pairs[i] += `"`
	}
	sort.Strings(pairs)
	return s[:open] + "{" + strings.Join(pairs, ",") + "}"
}

// metricSeries writes a series name with its labels sorted by name.
func metricSeries(name string, labels ...string) string {
	var pairs []string
	for i := 0; i+1 < len(labels); i += 2 {
		pairs = append(pairs, fmt.Sprintf("%s=%q", labels[i], labels[i+1]))
	}
	sort.Strings(pairs)
	if len(pairs) == 0 {
		return name
	}
	return name + "{" + strings.Join(pairs, ",") + "}"
}

func obsBoard(t *testing.T, a *app.App, c simulator.Config) *simulator.Board {
	t.Helper()
	profile, err := simulator.LoadProfile("breadboard")
	require.NoError(t, err)
	c.Profile = profile
	b, err := simulator.NewBoard(c)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), obsWait)
	defer cancel()
	require.NoError(t, b.ConnectWebSocket(ctx, a.DeviceURL()))
	return b
}

func obsPost(t *testing.T, hc *http.Client, url, body string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	return statusOf(t, hc, req)
}

// statusOf sends req with hc and returns the status, the body read and
// dropped.
func statusOf(t *testing.T, hc *http.Client, req *http.Request) int {
	t.Helper()
	resp, err := hc.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// TestMetrics: /metrics follows a board through connect, calls (ok,
// refused, queued) and disconnect, and counts the upstream MCP server's
// sessions and requests; it honours the control tokens.
func TestMetrics(t *testing.T) {
	noLeaks(t)
	cfg := testConfig()
	cfg.Control.Tokens = []string{"ctl"}
	a, base := startApp(t, cfg)
	hc := tokenClient(t, "ctl")

	assert.Equal(t, http.StatusUnauthorized, getJSON(t, base+"/metrics", nil), "metrics need the control token")
	m := scrapeMetrics(t, hc, base)
	ws := "websocket"
	for _, tr := range []string{ws, "mqtt"} {
		assert.Contains(t, m, metricSeries("devicebridge_boards", "state", "ready", "transport", tr), "declared before any board")
		assert.Contains(t, m, metricSeries("devicebridge_board_disconnects_total", "transport", tr, "cause", "broker_lost"))
		assert.Contains(t, m, metricSeries("devicebridge_tool_calls_total", "transport", tr, "outcome", "timeout"))
	}
	assert.Contains(t, m, "go_goroutines")
	assert.Contains(t, m, "process_cpu_seconds_total")
	assert.NotContains(t, m, metricSeries("devicebridge_mqtt_broker_connected"), "no MQTT series while MQTT is off")

	board := obsBoard(t, a, simulator.Config{MAC: "aa:00:00:00:0b:01",
		ToolDelay: map[string]time.Duration{"self.lamp.turn_on": time.Minute}})
	require.Eventually(t, func() bool {
		return scrapeMetrics(t, hc, base)[metricSeries("devicebridge_boards", "state", "ready", "transport", ws)] == 1
	}, obsWait, 10*time.Millisecond)

	dev := base + "/api/devices/aa:00:00:00:0b:01/call"
	require.Equal(t, http.StatusOK, obsPost(t, hc, dev, `{"name":"self.get_device_status"}`))
	require.Equal(t, http.StatusNotFound, obsPost(t, hc, dev, `{"name":"self.nope"}`))
	require.Equal(t, http.StatusNotFound, obsPost(t, hc, base+"/api/devices/ff:ff:ff:ff:ff:ff/call", `{"name":"x"}`))

	// Two slow calls: one on the board, one queued behind it.
	done := make(chan int, 2)
	for range 2 {
		go func() {
			resp, err := hc.Post(dev, "application/json", strings.NewReader(`{"name":"self.lamp.turn_on"}`))
			if err != nil {
				done <- 0
				return
			}
			resp.Body.Close()
			done <- resp.StatusCode
		}()
	}
	require.Eventually(t, func() bool {
		m := scrapeMetrics(t, hc, base)
		return m[metricSeries("devicebridge_call_queue_depth", "transport", ws)] == 2 &&
			m[metricSeries("devicebridge_call_queue_depth_max", "transport", ws)] == 2
	}, obsWait, 10*time.Millisecond)

	// The board drops off: both calls fail, the disconnect is counted.
	require.NoError(t, board.Close())
	for range 2 {
		assert.Equal(t, http.StatusBadGateway, <-done)
	}
	require.Eventually(t, func() bool {
		m := scrapeMetrics(t, hc, base)
		return m[metricSeries("devicebridge_boards", "state", "ready", "transport", ws)] == 0 &&
			m[metricSeries("devicebridge_board_disconnects_total", "transport", ws, "cause", "disconnected")] == 1
	}, obsWait, 10*time.Millisecond)

	m = scrapeMetrics(t, hc, base)
	assert.Equal(t, 1.0, m[metricSeries("devicebridge_board_connects_total", "transport", ws)])
	assert.Equal(t, 1.0, m[metricSeries("devicebridge_tool_calls_total", "transport", ws, "outcome", "ok")])
	assert.Equal(t, 1.0, m[metricSeries("devicebridge_tool_calls_total", "transport", ws, "outcome", "unknown_tool")])
	assert.Equal(t, 2.0, m[metricSeries("devicebridge_tool_calls_total", "transport", ws, "outcome", "offline")])
	assert.Equal(t, 1.0, m[metricSeries("devicebridge_tool_calls_total", "transport", "none", "outcome", "unknown_device")])
	assert.Equal(t, 4.0, m[metricSeries("devicebridge_tool_call_duration_seconds_count", "transport", ws)])
	assert.Equal(t, 4.0, m[metricSeries("devicebridge_tool_call_duration_seconds_bucket", "transport", ws, "le", "+Inf")])
	assert.Equal(t, 0.0, m[metricSeries("devicebridge_call_queue_depth", "transport", ws)])

	// Upstream MCP: one session-based client, its requests by method.
	c := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), obsWait)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: hc, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	require.NoError(t, err)
	_, err = cs.ListTools(ctx, nil)
	require.NoError(t, err)
	_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "nope"})
	require.Error(t, err, "an unknown tool is a protocol error")
	require.Eventually(t, func() bool {
		m := scrapeMetrics(t, hc, base)
		return m[metricSeries("devicebridge_mcp_sessions")] == 1 &&
			m[metricSeries("devicebridge_mcp_requests_total", "method", "tools/list", "outcome", "ok")] == 1 &&
			m[metricSeries("devicebridge_mcp_requests_total", "method", "tools/call", "outcome", "error")] == 1 &&
			m[metricSeries("devicebridge_mcp_requests_total", "method", "initialize", "outcome", "ok")] == 1
	}, obsWait, 10*time.Millisecond)
	require.NoError(t, cs.Close())
	require.Eventually(t, func() bool { return scrapeMetrics(t, hc, base)[metricSeries("devicebridge_mcp_sessions")] == 0 },
		obsWait, 10*time.Millisecond)
}

// TestMetricsAndReadinessWithMQTT: with the embedded broker the MQTT series
// appear and move with an MQTT board, and /readyz includes the MQTT check.
func TestMetricsAndReadinessWithMQTT(t *testing.T) {
	noLeaks(t)
	cfg := testConfig()
	cfg.MQTT.Listen = "127.0.0.1:0"
	cfg.MQTT.UDP.Listen = "127.0.0.1:0"
	a, base := startApp(t, cfg)

	var ready api.ReadyBody
	require.Equal(t, http.StatusOK, getJSON(t, base+"/readyz", &ready))
	assert.Equal(t, "ready", ready.Status)
	assert.Equal(t, []api.Check{{Name: "listeners", OK: true}, {Name: "mqtt", OK: true}}, ready.Checks)

	profile, err := simulator.LoadProfile("breadboard")
	require.NoError(t, err)
	b, err := simulator.NewBoard(simulator.Config{MAC: "aa:00:00:00:0b:02", Profile: profile})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), obsWait)
	defer cancel()
	conn, err := b.ConnectMQTT(ctx, simulator.MQTTConfig{Endpoint: "tcp://" + a.MQTTAddr().String()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })

	hc := http.DefaultClient
	require.Eventually(t, func() bool {
		return scrapeMetrics(t, hc, base)[metricSeries("devicebridge_boards", "state", "ready", "transport", "mqtt")] == 1
	}, obsWait, 10*time.Millisecond)
	require.Equal(t, http.StatusOK, obsPost(t, hc, base+"/api/devices/aa:00:00:00:0b:02/call", `{"name":"self.get_device_status"}`))
	m := scrapeMetrics(t, hc, base)
	assert.Equal(t, 1.0, m[metricSeries("devicebridge_mqtt_broker_connected")])
	assert.Equal(t, 1.0, m[metricSeries("devicebridge_mqtt_broker_connects_total")])
	assert.GreaterOrEqual(t, m[metricSeries("devicebridge_mqtt_messages_total", "direction", "in")], 3.0, "initialize, tools/list, call replies")
	assert.GreaterOrEqual(t, m[metricSeries("devicebridge_mqtt_messages_total", "direction", "out")], 3.0)
	for _, reason := range []string{"oversized", "malformed", "inbox_full", "unknown_topic", "unattributed", "rate_limited", "queue_share", "cut_off"} {
		assert.Contains(t, m, metricSeries("devicebridge_mqtt_messages_dropped_total", "reason", reason))
	}
	assert.Equal(t, 1.0, m[metricSeries("devicebridge_tool_calls_total", "transport", "mqtt", "outcome", "ok")])
}

// TestReadyzNamesTheFailingCheck: an external broker nobody answers keeps
// the bridge alive (/healthz 200) but not ready (/readyz 503 naming mqtt).
func TestReadyzNamesTheFailingCheck(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		// paho's failed connect attempt ends only after its retry sleep
		// (1s), longer than goleak waits by itself: wait for it first.
		// VerifyNone then names the goroutines if it never did.
		assert.Eventually(t, func() bool { return goleak.Find(opt) == nil }, obsWait, 50*time.Millisecond)
		goleak.VerifyNone(t, opt)
	})
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url := "tcp://" + dead.Addr().String()
	require.NoError(t, dead.Close())
	cfg := testConfig()
	cfg.MQTT.Broker = url
	cfg.MQTT.UDP.Listen = "127.0.0.1:0"
	cfg.MQTT.ConnectTimeout = 200 * time.Millisecond
	_, base := startApp(t, cfg)

	assert.Equal(t, http.StatusOK, getJSON(t, base+"/healthz", nil), "alive")
	var ready api.ReadyBody
	require.Equal(t, http.StatusServiceUnavailable, getJSON(t, base+"/readyz", &ready))
	assert.Equal(t, "not_ready", ready.Status)
	assert.Equal(t, []string{"mqtt"}, ready.Failing)
	require.Len(t, ready.Checks, 2)
	assert.True(t, ready.Checks[0].OK)
	assert.Contains(t, ready.Checks[1].Error, "not connected to its broker")
}

// sseEvent is one parsed Server-Sent Event.
type sseEvent struct {
	// ID is the event's id, "<epoch>-<seq>"; Epoch and Seq are its parts.
	ID    string
	Epoch string
	Seq   int
	Event string
	Data  map[string]any
}

// readSSE parses an event stream until it ends, passing comments on.
func readSSE(body io.Reader, events chan<- sseEvent, comments chan<- string) {
	defer close(events)
	sc := bufio.NewScanner(body)
	var ev sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if ev.Event != "" {
				events <- ev
			}
			ev = sseEvent{}
		case strings.HasPrefix(line, ":"):
			if comments == nil {
				continue
			}
			select {
			case comments <- line:
			default:
			}
		case strings.HasPrefix(line, "id: "):
			ev.ID = strings.TrimPrefix(line, "id: ")
			epoch, seq, _ := strings.Cut(ev.ID, "-")
			ev.Epoch, ev.Seq = epoch, atoi(seq)
		case strings.HasPrefix(line, "event: "):
			ev.Event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			_ = json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev.Data)
		}
	}
}

// atoi is strconv.Atoi, -1 for anything but a number.
func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

func nextSSE(t *testing.T, events <-chan sseEvent) sseEvent {
	t.Helper()
	select {
	case ev, ok := <-events:
		require.True(t, ok, "the stream ended early")
		return ev
	case <-time.After(obsWait):
		t.Fatal("no event")
		return sseEvent{}
	}
}

// TestEventStream: a real HTTP client reads /api/events while a simulated
// board connects, is called and disconnects; the stream ends when the
// bridge shuts down, without holding the shutdown up.
func TestEventStream(t *testing.T) {
	noLeaks(t)
	cfg := testConfig()
	cfg.Control.Tokens = []string{"ctl"}
	a, err := app.New(cfg, nil)
	require.NoError(t, err)
	require.NoError(t, a.Start(context.Background()))
	base := "http://" + a.ControlAddr().String()
	hc := tokenClient(t, "ctl")

	assert.Equal(t, http.StatusUnauthorized, getJSON(t, base+"/api/events", nil), "same auth as /api")
	resp, err := hc.Get(base + "/api/events")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	events, comments := make(chan sseEvent, 16), make(chan string, 16)
	go readSSE(resp.Body, events, comments)

	board := obsBoard(t, a, simulator.Config{MAC: "aa:00:00:00:0b:03"})
	ev := nextSSE(t, events)
	assert.Equal(t, "online", ev.Event)
	assert.Equal(t, 1, ev.Seq)
	assert.Regexp(t, "^[0-9a-f]{8}-1$", ev.ID, "<epoch>-<seq>")
	assert.Equal(t, "aa:00:00:00:0b:03", ev.Data["device_id"])
	assert.Equal(t, "websocket", ev.Data["transport"])
	assert.Equal(t, "ready", ev.Data["state"])
	assert.EqualValues(t, 13, ev.Data["tool_count"])

	require.Equal(t, http.StatusOK, obsPost(t, hc, base+"/api/devices/aa:00:00:00:0b:03/call",
		`{"name":"self.audio_speaker.set_volume","arguments":{"volume":35}}`))
	require.Equal(t, http.StatusUnprocessableEntity, obsPost(t, hc, base+"/api/devices/aa:00:00:00:0b:03/call",
		`{"name":"self.audio_speaker.set_volume","arguments":{"volume":300}}`))
	ev = nextSSE(t, events)
	assert.Equal(t, "call", ev.Event)
	assert.Equal(t, 2, ev.Seq)
	assert.Equal(t, map[string]any{"device_id": "aa:00:00:00:0b:03", "transport": "websocket",
		"tool": "self.audio_speaker.set_volume", "code": "ok", "duration_ms": ev.Data["duration_ms"], "at": ev.Data["at"]}, ev.Data,
		"no arguments, no results")
	assert.Positive(t, ev.Data["duration_ms"])
	at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(ev.Data["at"]))
	require.NoError(t, err, "a call event says when it ended")
	assert.WithinDuration(t, time.Now(), at, time.Minute)
	ev = nextSSE(t, events)
	assert.Equal(t, "call", ev.Event)
	assert.Equal(t, 3, ev.Seq)
	assert.Equal(t, "invalid_arguments", ev.Data["code"])

	require.NoError(t, board.Close())
	ev = nextSSE(t, events)
	assert.Equal(t, "offline", ev.Event)
	assert.Equal(t, 4, ev.Seq)
	assert.Equal(t, "closed", ev.Data["state"])
	assert.Equal(t, "disconnected", ev.Data["close_cause"])
	assert.NotEmpty(t, ev.Data["close_reason"])

	// Shutdown ends the open stream instead of waiting for the client.
	ctx, cancel := context.WithTimeout(context.Background(), obsWait)
	defer cancel()
	require.NoError(t, a.Shutdown(ctx))
	select {
	case _, open := <-events:
		assert.False(t, open, "no event after shutdown, only the end of the stream")
	case <-time.After(obsWait):
		t.Fatal("the stream did not end at shutdown")
	}
	assert.Equal(t, ": devicebridge events", <-comments, "the stream opens with a comment")
}

// wsHandshake sends a WebSocket handshake's headers as a plain GET, which
// the device endpoint checks (token, then Device-Id) before upgrading.
func wsHandshake(t *testing.T, a *app.App, header http.Header) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http"+strings.TrimPrefix(a.DeviceURL(), "ws"), nil)
	require.NoError(t, err)
	req.Header = header
	tr := http.DefaultTransport.(*http.Transport).Clone()
	defer tr.CloseIdleConnections()
	return statusOf(t, &http.Client{Transport: tr}, req)
}

// TestWebSocketMetrics: the device WebSocket listener's counters are on
// /metrics: handshakes by result, open connections, and messages, which
// count while the connection is still open and do not drop when it closes.
func TestWebSocketMetrics(t *testing.T) {
	noLeaks(t)
	cfg := testConfig()
	cfg.Control.Tokens = []string{"ctl"}
	cfg.WebSocket.Tokens = []string{"dev"}
	a, base := startApp(t, cfg)
	hc := tokenClient(t, "ctl")

	m := scrapeMetrics(t, hc, base)
	for _, r := range []string{"accepted", "unauthorized", "bad_request", "hello_failed", "refused"} {
		assert.Equal(t, 0.0, m[metricSeries("devicebridge_ws_connections_total", "result", r)], r)
		assert.Contains(t, m, metricSeries("devicebridge_ws_connections_total", "result", r), "every result from the start")
	}
	assert.Contains(t, m, metricSeries("devicebridge_ws_connections_active"))
	assert.Contains(t, m, metricSeries("devicebridge_ws_messages_total", "direction", "in", "kind", "binary"))

	assert.Equal(t, http.StatusUnauthorized, wsHandshake(t, a, http.Header{"Device-Id": {"aa:00:00:00:0c:01"}}))
	assert.Equal(t, http.StatusBadRequest, wsHandshake(t, a, http.Header{"Authorization": {"Bearer dev"}}), "no Device-Id")

	board := obsBoard(t, a, simulator.Config{MAC: "aa:00:00:00:0c:01", Token: "dev"})
	require.Eventually(t, func() bool {
		return scrapeMetrics(t, hc, base)[metricSeries("devicebridge_boards", "state", "ready", "transport", "websocket")] == 1
	}, obsWait, 10*time.Millisecond)
	require.Equal(t, http.StatusOK, obsPost(t, hc, base+"/api/devices/aa:00:00:00:0c:01/call", `{"name":"self.get_device_status"}`))

	m = scrapeMetrics(t, hc, base)
	assert.Equal(t, 1.0, m[metricSeries("devicebridge_ws_connections_total", "result", "accepted")])
	assert.Equal(t, 1.0, m[metricSeries("devicebridge_ws_connections_total", "result", "unauthorized")])
	assert.Equal(t, 1.0, m[metricSeries("devicebridge_ws_connections_total", "result", "bad_request")])
	assert.Equal(t, 0.0, m[metricSeries("devicebridge_ws_connections_total", "result", "hello_failed")])
	assert.Equal(t, 1.0, m[metricSeries("devicebridge_ws_connections_active")])
	// hello, initialize, tools/list and the call's reply in; the same out.
	// The writer counts a message once its write returns, which may be a
	// moment after the board has already answered it: poll.
	var textIn, textOut float64
	require.Eventually(t, func() bool {
		m := scrapeMetrics(t, hc, base)
		textIn = m[metricSeries("devicebridge_ws_messages_total", "direction", "in", "kind", "text")]
		textOut = m[metricSeries("devicebridge_ws_messages_total", "direction", "out", "kind", "text")]
		return textIn >= 4 && textOut >= 4
	}, obsWait, 10*time.Millisecond, "a live connection's messages count")

	require.NoError(t, board.Close())
	require.Eventually(t, func() bool {
		return scrapeMetrics(t, hc, base)[metricSeries("devicebridge_ws_connections_active")] == 0
	}, obsWait, 10*time.Millisecond)
	m = scrapeMetrics(t, hc, base)
	assert.GreaterOrEqual(t, m[metricSeries("devicebridge_ws_messages_total", "direction", "in", "kind", "text")], textIn, "closing keeps the count")
	assert.GreaterOrEqual(t, m[metricSeries("devicebridge_ws_messages_total", "direction", "out", "kind", "text")], textOut, "closing keeps the count")
}

// openSSE opens /api/events, resuming after lastID unless it is "" (sent
// as Last-Event-ID, as EventSource does), and parses it until the test
// ends.
func openSSE(t *testing.T, hc *http.Client, url, lastID string) <-chan sseEvent {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := hc.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { _ = resp.Body.Close() })
	require.Equal(t, http.StatusOK, resp.StatusCode)
	events := make(chan sseEvent, 64)
	go readSSE(resp.Body, events, nil)
	return events
}

// TestEventStreamResume: a client that reconnects with the id of the last
// event it saw gets exactly the events it missed, in order, then live ones;
// an id the bridge cannot resume from (foreign, malformed, older than
// control.events_replay) starts the stream with a resync saying why.
func TestEventStreamResume(t *testing.T) {
	noLeaks(t)
	cfg := testConfig()
	cfg.Control.Tokens = []string{"ctl"}
	cfg.Control.EventsReplay = 4 // the four events missed below, and no more
	a, base := startApp(t, cfg)
	hc := tokenClient(t, "ctl")
	call := func(mac string, volume int) {
		t.Helper()
		obsPost(t, hc, base+"/api/devices/"+mac+"/call",
			fmt.Sprintf(`{"name":"self.audio_speaker.set_volume","arguments":{"volume":%d}}`, volume))
	}
	listed := func(mac string) string { // the board's state in /api/devices
		var list deviceList
		getWith(t, hc, base+"/api/devices", &list)
		for _, d := range list.Devices {
			if d.DeviceID == mac {
				return d.State
			}
		}
		return ""
	}

	// The first stream sees board A come online, then the client goes.
	req, err := http.NewRequest(http.MethodGet, base+"/api/events", nil)
	require.NoError(t, err)
	resp, err := hc.Do(req)
	require.NoError(t, err)
	first := make(chan sseEvent, 64)
	go readSSE(resp.Body, first, nil)
	boardA := obsBoard(t, a, simulator.Config{MAC: "aa:00:00:00:0c:01"})
	seen := nextSSE(t, first)
	require.Equal(t, "online", seen.Event)
	require.NoError(t, resp.Body.Close())
	for range first { // the stream ended
	}

	// While it is away: two calls, A goes, B comes.
	call("aa:00:00:00:0c:01", 35)
	call("aa:00:00:00:0c:01", 300)
	require.NoError(t, boardA.Close())
	require.Eventually(t, func() bool { return listed("aa:00:00:00:0c:01") != "ready" }, obsWait, time.Millisecond)
	obsBoard(t, a, simulator.Config{MAC: "aa:00:00:00:0c:02"})
	require.Eventually(t, func() bool { return listed("aa:00:00:00:0c:02") == "ready" }, obsWait, time.Millisecond)

	// Resumed: exactly the missed events, in order, then live ones.
	resumed := openSSE(t, hc, base+"/api/events", seen.ID)
	var got []string
	for i := range 4 {
		ev := nextSSE(t, resumed)
		assert.Equal(t, seen.Epoch, ev.Epoch)
		assert.Equal(t, seen.Seq+1+i, ev.Seq, "no gap, no duplicate")
		got = append(got, fmt.Sprintf("%s %v %v", ev.Event, ev.Data["device_id"], ev.Data["code"]))
	}
	assert.Equal(t, []string{
		"call aa:00:00:00:0c:01 ok", "call aa:00:00:00:0c:01 invalid_arguments",
		"offline aa:00:00:00:0c:01 <nil>", "online aa:00:00:00:0c:02 <nil>"}, got)
	call("aa:00:00:00:0c:02", 40)
	live := nextSSE(t, resumed)
	assert.Equal(t, "call", live.Event)
	assert.Equal(t, seen.Seq+5, live.Seq)
	assert.Equal(t, "aa:00:00:00:0c:02", live.Data["device_id"])

	// ?last_event_id= works as the header does; the history holds exactly
	// control.events_replay events: the oldest one it can resume after is
	// four back.
	q := openSSE(t, hc, fmt.Sprintf("%s/api/events?last_event_id=%s-%d", base, live.Epoch, live.Seq-4), "")
	ev := nextSSE(t, q)
	assert.Equal(t, live.Seq-3, ev.Seq)
	assert.Equal(t, "call", ev.Event)

	for _, c := range []struct{ id, reason string }{
		{seen.ID, "too_old"}, // five events ago: beyond the bound
		{"0badcafe-1", "foreign"},
		{"not-an-id", "malformed"},
		{"12345", "malformed"},
	} {
		if c.id == "0badcafe-1" && live.Epoch == "0badcafe" {
			continue
		}
		s := openSSE(t, hc, base+"/api/events", c.id)
		ev := nextSSE(t, s)
		assert.Equal(t, "resync", ev.Event, c.id)
		assert.Equal(t, map[string]any{"reason": c.reason}, ev.Data, c.id)
		assert.Equal(t, fmt.Sprintf("%s-%d", live.Epoch, live.Seq), ev.ID, "resync names the last event: resuming from it misses nothing")
		call("aa:00:00:00:0c:02", 41)
		next := nextSSE(t, s)
		assert.Equal(t, "call", next.Event, "then live events")
		live = next
	}
}

// TestBrokerRefusalsAreExported: the embedded broker's refusals (a client
// id that names no board; a socket past mqtt.max_connections) and its
// cut-offs are on /metrics, by reason, with no label per board.
func TestBrokerRefusalsAreExported(t *testing.T) {
	noLeaks(t)
	cfg := testConfig()
	cfg.MQTT.Listen = "127.0.0.1:0"
	cfg.MQTT.UDP.Listen = "127.0.0.1:0"
	cfg.MQTT.MaxConnections = 2
	a, base := startApp(t, cfg)
	addr := a.MQTTAddr().String()
	hc := http.DefaultClient
	refused := func(reason string) float64 {
		return scrapeMetrics(t, hc, base)[metricSeries("devicebridge_mqtt_broker_refused_total", "reason", reason)]
	}
	m := scrapeMetrics(t, hc, base)
	for _, reason := range []string{"socket_limit", "client_id", "credentials", "cut_off"} {
		assert.Contains(t, m, metricSeries("devicebridge_mqtt_broker_refused_total", "reason", reason), "present at zero")
	}
	assert.Contains(t, m, metricSeries("devicebridge_mqtt_broker_cut_offs_total"))

	// CONNECT (MQTT 3.1.1, clean session, keepalive 60 s) as client "nope".
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	_, err = conn.Write([]byte{0x10, 16, 0, 4, 'M', 'Q', 'T', 'T', 4, 2, 0, 60, 0, 4, 'n', 'o', 'p', 'e'})
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(obsWait)))
	connack := make([]byte, 4)
	_, err = io.ReadFull(conn, connack)
	require.NoError(t, err)
	assert.Equal(t, []byte{0x20, 2, 0, 2}, connack, "identifier rejected")
	require.NoError(t, conn.Close())
	require.Eventually(t, func() bool { return refused("client_id") == 1 }, obsWait, 10*time.Millisecond)

	// Sockets that never send CONNECT hold the listener's places until
	// they are refused on arrival.
	for range 4 {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
	}
	require.Eventually(t, func() bool { return refused("socket_limit") >= 2 }, obsWait, 10*time.Millisecond)
}
