package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/devicebridge/devicebridge/device"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestObserverLabels: missing transports and causes get their documented
// label values, and every series of a declared transport exists at zero.
func TestObserverLabels(t *testing.T) {
	m := New(Options{Transports: []string{"websocket"}})
	m.CallDone("", device.CodeUnknownDevice, time.Millisecond)
	m.CallDone("websocket", "", 2*time.Second)
	m.SessionOpened(device.Identity{DeviceID: "a", Transport: "websocket"})
	m.SessionClosed(device.Info{Identity: device.Identity{DeviceID: "a", Transport: "websocket"}})
	m.MCPRequestDone("tools/call", "tool_error", time.Millisecond)

	assert.Equal(t, 1.0, testutil.ToFloat64(m.calls.WithLabelValues(NoTransport, "unknown_device")))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.calls.WithLabelValues("websocket", OutcomeOK)))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.connects.WithLabelValues("websocket")))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.disconnects.WithLabelValues("websocket", "closed")), "no cause reads as closed")
	assert.Equal(t, 1.0, testutil.ToFloat64(m.mcpRequests.WithLabelValues("tools/call", "tool_error")))
	assert.Equal(t, len(device.CloseCauses), testutil.CollectAndCount(m.disconnects))
	assert.Equal(t, 2*(len(device.Codes)+1), testutil.CollectAndCount(m.calls), "websocket and none, ok and every code")
	problems, err := testutil.GatherAndLint(m.Registry())
	require.NoError(t, err)
	assert.Empty(t, problems, "series follow the Prometheus naming rules")
}

// TestWatchOnceAndInteractions: each Watch registers once (a second call is
// logged, not a panic), and the interactions gauge reads its source.
func TestWatchOnceAndInteractions(t *testing.T) {
	core, logs := observer.New(zap.ErrorLevel)
	m := New(Options{Logger: zap.New(core)})
	m.WatchInteractions(func() map[string]int { return map[string]int{"prompting": 2, "confirming": 1} })
	m.WatchInteractions(func() map[string]int { return nil })
	assert.Equal(t, 1, logs.Len())
	m.WatchMCPSessions(func() int { return 3 })
	m.WatchMQTT(func() (MQTTStats, bool) { return MQTTStats{}, false })

	n, err := testutil.GatherAndCount(m.Registry(), "devicebridge_interactions", "devicebridge_mcp_sessions",
		"devicebridge_mqtt_broker_connected")
	require.NoError(t, err)
	assert.Equal(t, 3, n, "two interaction states and the session gauge; no MQTT series while it is off")
}

// TestClusterSeries: the fleet series appear only with WatchCluster, every
// direction, outcome and bucket at zero, and follow the naming rules.
func TestClusterSeries(t *testing.T) {
	m := New(Options{})
	n, err := testutil.GatherAndCount(m.Registry(), "devicebridge_routed_calls_total", "devicebridge_cluster_nats_connected")
	require.NoError(t, err)
	assert.Zero(t, n, "a bridge running alone has no fleet series")

	connected := true
	m.WatchCluster(func() bool { return connected })
	m.RoutedCallDone("out", "", time.Millisecond)
	m.RoutedCallDone("in", device.CodeBusy, time.Millisecond)
	m.RoutedCallNoResponder()
	m.DirectoryWriteFailed("boards")

	assert.Equal(t, 1.0, testutil.ToFloat64(m.cluster.routedCalls.WithLabelValues("out", OutcomeOK)))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.cluster.routedCalls.WithLabelValues("in", "busy")))
	assert.Equal(t, 2*(len(device.Codes)+1), testutil.CollectAndCount(m.cluster.routedCalls))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.cluster.noResponders))
	assert.Equal(t, 3, testutil.CollectAndCount(m.cluster.writeFailures))
	n, err = testutil.GatherAndCount(m.Registry(), "devicebridge_cluster_nats_connected")
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	problems, err := testutil.GatherAndLint(m.Registry())
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// TestWebSocketSeries: the WebSocket listener's series read their source
// at scrape time, every result at its value, and follow the naming rules.
func TestWebSocketSeries(t *testing.T) {
	m := New(Options{})
	st := WebSocketStats{Accepted: 3, Unauthorized: 1, BadRequests: 2, HelloFailures: 4, Refused: 5, Active: 2,
		TextIn: 10, BinaryIn: 7, TextOut: 9}
	m.WatchWebSocket(func() WebSocketStats { return st })
	m.WatchWebSocket(func() WebSocketStats { return WebSocketStats{} })
	st.Accepted = 6 // read at scrape time, not at registration
	expected := `
# HELP devicebridge_ws_connections_active Board WebSocket connections open now, hello pending included.
# TYPE devicebridge_ws_connections_active gauge
devicebridge_ws_connections_active 2
`
	require.NoError(t, testutil.GatherAndCompare(m.Registry(), strings.NewReader(expected), "devicebridge_ws_connections_active"))
	n, err := testutil.GatherAndCount(m.Registry(), "devicebridge_ws_connections_total", "devicebridge_ws_messages_total")
	require.NoError(t, err)
	assert.Equal(t, 5+3, n, "five results, three direction and kind pairs")
	fams, err := m.Registry().Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range fams {
		for _, mt := range f.GetMetric() {
			key := f.GetName()
			for _, l := range mt.GetLabel() {
				key += "," + l.GetValue()
			}
			if mt.GetCounter() != nil {
				got[key] = mt.GetCounter().GetValue()
			}
		}
	}
	assert.Equal(t, 6.0, got["devicebridge_ws_connections_total,accepted"])
	assert.Equal(t, 1.0, got["devicebridge_ws_connections_total,unauthorized"])
	assert.Equal(t, 2.0, got["devicebridge_ws_connections_total,bad_request"])
	assert.Equal(t, 4.0, got["devicebridge_ws_connections_total,hello_failed"])
	assert.Equal(t, 5.0, got["devicebridge_ws_connections_total,refused"])
	assert.Equal(t, 10.0, got["devicebridge_ws_messages_total,in,text"])
	assert.Equal(t, 7.0, got["devicebridge_ws_messages_total,in,binary"])
	assert.Equal(t, 9.0, got["devicebridge_ws_messages_total,out,text"])
	problems, err := testutil.GatherAndLint(m.Registry())
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// TestLogSampledCountsDrops: as zap's sampler hook, LogSampled counts the
// lines the sampler drops, by level, and nothing else; every level's
// series exists at zero from the start.
func TestLogSampledCountsDrops(t *testing.T) {
	m := New(Options{})
	assert.Equal(t, 7, testutil.CollectAndCount(m.logs.dropped))
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(zapcore.NewSamplerWithOptions(core, time.Hour, 3, 0, zapcore.SamplerHook(m.LogSampled)))
	for range 10 {
		log.Info("again")
		log.Warn("again")
	}
	log.Error("once")
	assert.Equal(t, 7, logs.Len())
	assert.Equal(t, 7.0, testutil.ToFloat64(m.logs.dropped.WithLabelValues("info")))
	assert.Equal(t, 7.0, testutil.ToFloat64(m.logs.dropped.WithLabelValues("warn")))
	assert.Zero(t, testutil.ToFloat64(m.logs.dropped.WithLabelValues("error")))
}
