package metrics

import "github.com/prometheus/client_golang/prometheus"

// ListenerStats is what the metrics read from one HTTP listener's
// connection cap (the app fills it from internal/connlimit).
type ListenerStats struct {
	// Name is the listener: "device", "control" or "debug".
	Name string
	// Max is the cap; Active the connections open now; Refused those
	// refused at the cap so far.
	Max             int
	Active, Refused int64
}

// WatchListeners adds devicebridge_http_connections{listener},
// devicebridge_http_connections_max{listener} and
// devicebridge_http_connections_refused_total{listener}, read at scrape
// time from stats.
func (m *Metrics) WatchListeners(stats func() []ListenerStats) {
	if m.once("listeners") {
		m.reg.MustRegister(&listenerCollector{stats: stats})
	}
}

var (
	listenerActiveDesc = prometheus.NewDesc(Namespace+"_http_connections",
		"Connections open now on an HTTP listener (idle keep-alives, requests, streams and board WebSockets alike).",
		[]string{"listener"}, nil)
	listenerMaxDesc = prometheus.NewDesc(Namespace+"_http_connections_max",
		"The connection cap of an HTTP listener (http.device_max_connections, http.control_max_connections).",
		[]string{"listener"}, nil)
	listenerRefusedDesc = prometheus.NewDesc(Namespace+"_http_connections_refused_total",
		"Connections an HTTP listener closed at once because it held its maximum.",
		[]string{"listener"}, nil)
)

type listenerCollector struct {
	stats func() []ListenerStats
}

func (c *listenerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- listenerActiveDesc
	ch <- listenerMaxDesc
	ch <- listenerRefusedDesc
}

func (c *listenerCollector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.stats() {
		ch <- prometheus.MustNewConstMetric(listenerActiveDesc, prometheus.GaugeValue, float64(st.Active), st.Name)
		ch <- prometheus.MustNewConstMetric(listenerMaxDesc, prometheus.GaugeValue, float64(st.Max), st.Name)
		ch <- prometheus.MustNewConstMetric(listenerRefusedDesc, prometheus.CounterValue, float64(st.Refused), st.Name)
	}
}

// MCPSessionStats is what the metrics read from the upstream MCP server's
// session bounds.
type MCPSessionStats struct {
	// Refused initializations by the cap that refused them.
	RefusedTotal, RefusedPerClient int64
	// IdleClosed counts sessions closed after mcp.session_timeout idle.
	IdleClosed int64
}

// WatchMCPSessionLimits adds devicebridge_mcp_sessions_refused_total{limit}
// and devicebridge_mcp_sessions_idle_closed_total, read at scrape time.
func (m *Metrics) WatchMCPSessionLimits(stats func() MCPSessionStats) {
	if m.once("mcp_session_limits") {
		m.reg.MustRegister(&mcpSessionCollector{stats: stats})
	}
}

var (
	mcpRefusedDesc = prometheus.NewDesc(Namespace+"_mcp_sessions_refused_total",
		`MCP initializations refused at a session cap, by limit ("max_sessions", "max_sessions_per_client").`,
		[]string{"limit"}, nil)
	mcpIdleClosedDesc = prometheus.NewDesc(Namespace+"_mcp_sessions_idle_closed_total",
		"MCP sessions closed after mcp.session_timeout with no request in flight and no stream open.", nil, nil)
)

type mcpSessionCollector struct {
	stats func() MCPSessionStats
}

func (c *mcpSessionCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- mcpRefusedDesc
	ch <- mcpIdleClosedDesc
}

func (c *mcpSessionCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	ch <- prometheus.MustNewConstMetric(mcpRefusedDesc, prometheus.CounterValue, float64(st.RefusedTotal), "max_sessions")
	ch <- prometheus.MustNewConstMetric(mcpRefusedDesc, prometheus.CounterValue, float64(st.RefusedPerClient), "max_sessions_per_client")
	ch <- prometheus.MustNewConstMetric(mcpIdleClosedDesc, prometheus.CounterValue, float64(st.IdleClosed))
}
