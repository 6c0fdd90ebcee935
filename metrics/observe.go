// Package metrics owns the bridge's metrics: one Prometheus registry of its
// own (never the global default one) holding the Go runtime and process
// collectors and every devicebridge_* series, and the handler that serves
// it on /metrics. docs/observability.md lists each series.
//
// Components never reach it through globals. They get what they record
// through their configs: the device Hub takes a *Metrics as
// device.HubConfig.Observer, the upstream MCP server as
// mcpserver.Options.Observer. Whatever is cheaper to read at scrape time than
// to count as it happens (boards by state, call queue depth, MQTT gateway
// and WebSocket listener counters, MCP sessions) is registered by the
// app's wiring with the Watch methods, so those series are always exact.
package metrics

import (
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device"
)

// Namespace prefixes every series the bridge defines.
const Namespace = "devicebridge"

// Label values used where the real value is missing or successful.
const (
	// NoTransport labels a call that never reached a session (unknown
	// device, bridge shutting down).
	NoTransport = "none"
	// OutcomeOK labels a successful call or request.
	OutcomeOK = "ok"
)

// CallBuckets are the tool call latency histogram's upper bounds, in
// seconds: from 1ms (a refused call) to 60s (a camera capture and upload).
var CallBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// Options configure Metrics.
type Options struct {
	// Transports are the board transports ("websocket", "mqtt") whose
	// series are created at zero up front, so that rates and alerts work
	// before the first board connects.
	Transports []string
	// Logger receives errors from serving /metrics. Nil discards.
	Logger *zap.Logger
}

// Metrics owns the registry. Create it with New; it implements
// device.Observer and the MCP server's observer.
type Metrics struct {
	reg        *prometheus.Registry
	log        *zap.Logger
	transports []string

	connects     *prometheus.CounterVec
	disconnects  *prometheus.CounterVec
	calls        *prometheus.CounterVec
	callDuration *prometheus.HistogramVec
	mcpRequests  *prometheus.CounterVec
	cluster      clusterMetrics
	logs         *logMetrics
	recent       *Recent

	mu      sync.Mutex
	watched map[string]bool // Watch* calls made, each allowed once
}

// New creates the registry with the Go and process collectors and the
// counters the Hub and the MCP server feed.
func New(opts Options) *Metrics {
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	m := &Metrics{
		reg:        prometheus.NewRegistry(),
		log:        opts.Logger,
		transports: slices.Clone(opts.Transports),
		watched:    map[string]bool{},
		cluster:    newClusterMetrics(),
		logs:       newLogMetrics(),
		recent:     NewRecent(0, 0, nil),
		connects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "board_connects_total",
			Help: "Boards that attached to the Hub (handshake done), by transport.",
		}, []string{"transport"}),
		disconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "board_disconnects_total",
			Help: "Board sessions that ended, by transport and close cause.",
		}, []string{"transport", "cause"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "tool_calls_total",
			Help: `Tool calls through the Hub (control API and /mcp), by transport ("none" when no session was found) and outcome ("ok" or a device code).`,
		}, []string{"transport", "outcome"}),
		callDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "tool_call_duration_seconds",
			Help:    "Time from a tool call entering the Hub to its answer, failures included, by transport.",
			Buckets: CallBuckets,
		}, []string{"transport"}),
		mcpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "mcp_requests_total",
			Help: `Requests and notifications the upstream MCP server received, by method and outcome ("ok", "error", or "tool_error" for a tools/call result with isError).`,
		}, []string{"method", "outcome"}),
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.connects, m.disconnects, m.calls, m.callDuration, m.mcpRequests, m.logs.dropped,
	)
	for _, t := range m.transports {
		m.connects.WithLabelValues(t)
		for _, c := range device.CloseCauses {
			m.disconnects.WithLabelValues(t, string(c))
		}
		m.callDuration.WithLabelValues(t)
	}
	for _, t := range append(slices.Clone(m.transports), NoTransport) {
		m.calls.WithLabelValues(t, OutcomeOK)
		for _, c := range device.Codes {
			m.calls.WithLabelValues(t, string(c))
		}
	}
	return m
}

// Registry is the registry the bridge's series live in (for tests and for
// components that bring their own collectors).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus text (or OpenMetrics)
// format. It does no authentication: mount it behind the control tokens.
func (m *Metrics) Handler() http.Handler {
	errLog, _ := zap.NewStdLogAt(m.log, zap.WarnLevel)
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorLog:          errLog,
		ErrorHandling:     promhttp.ContinueOnError,
		Registry:          m.reg, // promhttp_metric_handler_errors_total
		EnableOpenMetrics: true,
	})
}

// SessionOpened implements device.Observer.
func (m *Metrics) SessionOpened(id device.Identity) {
	m.connects.WithLabelValues(transportLabel(id.Transport)).Inc()
}

// SessionClosed implements device.Observer.
func (m *Metrics) SessionClosed(info device.Info) {
	cause := info.CloseCause
	if cause == "" {
		cause = device.CauseClosed
	}
	m.disconnects.WithLabelValues(transportLabel(info.Transport), string(cause)).Inc()
}

// CallDone implements device.Observer.
func (m *Metrics) CallDone(transport string, code device.Code, took time.Duration) {
	t := transportLabel(transport)
	outcome := OutcomeOK
	if code != "" {
		outcome = string(code)
	}
	m.calls.WithLabelValues(t, outcome).Inc()
	m.callDuration.WithLabelValues(t).Observe(took.Seconds())
	m.recent.Record(took, code != "")
}

// Recent is the ring of the last minutes of calls (recent.go), fed by
// CallDone.
func (m *Metrics) Recent() *Recent { return m.recent }

// MCPRequestDone records one request or notification the upstream MCP
// server handled (it implements tools.Observer). The go-sdk only hands
// its middleware methods it knows, so the method label stays bounded.
func (m *Metrics) MCPRequestDone(method, outcome string, _ time.Duration) {
	m.mcpRequests.WithLabelValues(method, outcome).Inc()
}

func transportLabel(t string) string {
	if t == "" {
		return NoTransport
	}
	return t
}

// once reports whether the named Watch call is the first; a second one
// would register a duplicate collector, which is a wiring bug.
func (m *Metrics) once(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.watched[name] {
		m.log.Error("observe: watched twice; keeping the first", zap.String("what", name))
		return false
	}
	m.watched[name] = true
	return true
}

var _ device.Observer = (*Metrics)(nil)
