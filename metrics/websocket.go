package metrics

import "github.com/prometheus/client_golang/prometheus"

// WebSocketStats is what the metrics read from the device WebSocket
// listener. The app's wiring fills it from ws.Server.Stats, so this
// package does not depend on the ws package's layout.
type WebSocketStats struct {
	// Connection attempts by outcome: Accepted finished the hello,
	// Unauthorized had no valid token, BadRequests a missing or invalid
	// Device-Id (or a failed upgrade), HelloFailures no valid hello in
	// time, Refused hit max_connections or max_pending_hellos.
	Accepted, Unauthorized, BadRequests, HelloFailures, Refused int64
	// Active counts the sockets open now.
	Active int64
	// Messages of every connection, open or closed.
	TextIn, BinaryIn, TextOut int64
}

// WatchWebSocket adds the device WebSocket listener's series, read at
// scrape time from stats.
func (m *Metrics) WatchWebSocket(stats func() WebSocketStats) {
	if m.once("websocket") {
		m.reg.MustRegister(&wsCollector{stats: stats})
	}
}

type wsCollector struct {
	stats func() WebSocketStats
}

var (
	wsConnectionsDesc = prometheus.NewDesc(Namespace+"_ws_connections_total",
		`WebSocket connection attempts of boards, by result: "accepted" (hello done), "unauthorized" (no valid token), "bad_request" (missing or invalid Device-Id, failed upgrade), "hello_failed" (no valid hello in time), "refused" (max_connections or max_pending_hellos).`,
		[]string{"result"}, nil)
	wsActiveDesc = prometheus.NewDesc(Namespace+"_ws_connections_active",
		"Board WebSocket connections open now, hello pending included.", nil, nil)
	wsMessagesDesc = prometheus.NewDesc(Namespace+"_ws_messages_total",
		`WebSocket messages of boards, open and closed connections alike, by direction ("in", "out") and kind ("text"; "binary" is board audio, received and not played).`,
		[]string{"direction", "kind"}, nil)
)

func (c *wsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- wsConnectionsDesc
	ch <- wsActiveDesc
	ch <- wsMessagesDesc
}

func (c *wsCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	for _, r := range []struct {
		result string
		n      int64
	}{
		{"accepted", st.Accepted},
		{"unauthorized", st.Unauthorized},
		{"bad_request", st.BadRequests},
		{"hello_failed", st.HelloFailures},
		{"refused", st.Refused},
	} {
		ch <- prometheus.MustNewConstMetric(wsConnectionsDesc, prometheus.CounterValue, float64(r.n), r.result)
	}
	ch <- prometheus.MustNewConstMetric(wsActiveDesc, prometheus.GaugeValue, float64(st.Active))
	ch <- prometheus.MustNewConstMetric(wsMessagesDesc, prometheus.CounterValue, float64(st.TextIn), "in", "text")
	ch <- prometheus.MustNewConstMetric(wsMessagesDesc, prometheus.CounterValue, float64(st.BinaryIn), "in", "binary")
	ch <- prometheus.MustNewConstMetric(wsMessagesDesc, prometheus.CounterValue, float64(st.TextOut), "out", "text")
}
