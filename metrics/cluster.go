package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/devicebridge/devicebridge/device"
)

// Routed call directions, as the cluster reports them.
var routedDirections = []string{"out", "in"}

// Fleet buckets a directory write can fail on.
var directoryBuckets = []string{"boards", "catalogs", "nodes"}

// clusterMetrics are the series of a bridge that is a node of a fleet
// (docs/scaling.md). They are registered by WatchCluster only, so a bridge
// running alone shows none of them.
type clusterMetrics struct {
	routedCalls    *prometheus.CounterVec
	routedDuration *prometheus.HistogramVec
	noResponders   prometheus.Counter
	writeFailures  *prometheus.CounterVec
}

func newClusterMetrics() clusterMetrics {
	return clusterMetrics{
		routedCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "routed_calls_total",
			Help: `Tool calls routed through NATS between nodes, by direction ("out": this node called a board another node holds; "in": this node answered for one of its boards) and outcome ("ok" or a device code).`,
		}, []string{"direction", "outcome"}),
		routedDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "routed_call_duration_seconds",
			Help:    `Time of a routed call, failures included: "out" from the request to the answer (routing included), "in" the holder's own call to the board.`,
			Buckets: CallBuckets,
		}, []string{"direction"}),
		noResponders: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Name: "routed_call_no_responders_total",
			Help: "Outgoing routed calls no node answered (the holder died or is cut off from NATS); each also counts as offline in devicebridge_routed_calls_total.",
		}),
		writeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "cluster_directory_write_failures_total",
			Help: `Writes to the fleet's key-value buckets that failed, by bucket ("boards", "catalogs", "nodes"); failed board writes are retried with the next heartbeat.`,
		}, []string{"bucket"}),
	}
}

// WatchCluster registers the fleet series: routed calls, no-responder
// calls, directory write failures and the NATS connection gauge, read
// from connected at scrape time. Every direction, outcome and bucket
// starts at zero.
func (m *Metrics) WatchCluster(connected func() bool) {
	if !m.once("cluster") {
		return
	}
	c := m.cluster
	for _, d := range routedDirections {
		c.routedCalls.WithLabelValues(d, OutcomeOK)
		for _, code := range device.Codes {
			c.routedCalls.WithLabelValues(d, string(code))
		}
		c.routedDuration.WithLabelValues(d)
	}
	for _, b := range directoryBuckets {
		c.writeFailures.WithLabelValues(b)
	}
	m.reg.MustRegister(c.routedCalls, c.routedDuration, c.noResponders, c.writeFailures,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "cluster_nats_connected",
			Help: "1 while this node is connected to NATS, else 0 (read at scrape time).",
		}, func() float64 {
			if connected() {
				return 1
			}
			return 0
		}))
}

// RoutedCallDone records a routed call (it implements cluster.Observer).
func (m *Metrics) RoutedCallDone(direction string, code device.Code, took time.Duration) {
	outcome := OutcomeOK
	if code != "" {
		outcome = string(code)
	}
	m.cluster.routedCalls.WithLabelValues(direction, outcome).Inc()
	m.cluster.routedDuration.WithLabelValues(direction).Observe(took.Seconds())
}

// RoutedCallNoResponder records an outgoing routed call nobody answered
// (cluster.Observer).
func (m *Metrics) RoutedCallNoResponder() { m.cluster.noResponders.Inc() }

// DirectoryWriteFailed records a failed write to a fleet bucket
// (cluster.Observer).
func (m *Metrics) DirectoryWriteFailed(bucket string) {
	m.cluster.writeFailures.WithLabelValues(bucket).Inc()
}
