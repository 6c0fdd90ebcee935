package metrics

import (
	"slices"
	"sort"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/devicebridge/devicebridge/device"
)

// boardStates are the device states the boards gauge always reports.
var boardStates = []device.State{device.StateConnected, device.StateInitializing, device.StateReady, device.StateClosed}

// WatchHub adds the series read from the Hub at scrape time: boards by
// state and transport, and the call queue depth (total and deepest board)
// by transport.
func (m *Metrics) WatchHub(hub *device.Hub) {
	if m.once("hub") {
		m.reg.MustRegister(&hubCollector{hub: hub, transports: m.transports})
	}
}

type hubCollector struct {
	hub        *device.Hub
	transports []string
}

var (
	boardsDesc = prometheus.NewDesc(Namespace+"_boards",
		"Boards the Hub holds now, by session state and transport (read from the Hub at scrape time).",
		[]string{"state", "transport"}, nil)
	queueDesc = prometheus.NewDesc(Namespace+"_call_queue_depth",
		"Board requests held by the bridge now (the one outstanding on each board plus those queued behind it), summed by transport.",
		[]string{"transport"}, nil)
	queueMaxDesc = prometheus.NewDesc(Namespace+"_call_queue_depth_max",
		"The deepest single board's call queue now (outstanding plus queued), by transport.",
		[]string{"transport"}, nil)
)

func (c *hubCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- boardsDesc
	ch <- queueDesc
	ch <- queueMaxDesc
}

func (c *hubCollector) Collect(ch chan<- prometheus.Metric) {
	type key struct {
		state     device.State
		transport string
	}
	boards := map[key]int{}
	depth, deepest := map[string]int{}, map[string]int{}
	transports := slices.Clone(c.transports)
	for _, s := range c.hub.Sessions() {
		info := s.Info()
		t := transportLabel(info.Transport)
		if !slices.Contains(transports, t) {
			transports = append(transports, t)
		}
		boards[key{info.State, t}]++
		n := s.Pending()
		depth[t] += n
		deepest[t] = max(deepest[t], n)
	}
	sort.Strings(transports)
	for _, t := range transports {
		for _, st := range boardStates {
			ch <- prometheus.MustNewConstMetric(boardsDesc, prometheus.GaugeValue, float64(boards[key{st, t}]), st.String(), t)
		}
		ch <- prometheus.MustNewConstMetric(queueDesc, prometheus.GaugeValue, float64(depth[t]), t)
		ch <- prometheus.MustNewConstMetric(queueMaxDesc, prometheus.GaugeValue, float64(deepest[t]), t)
	}
}

// MQTTStats is what the metrics read from the MQTT gateway. The app's
// wiring fills it from the gateway's own Stats, so this package does not
// depend on the mqtt package's layout.
type MQTTStats struct {
	// Connected: the gateway's connection to its broker is up.
	Connected bool
	// Connects counts successful broker connections (1 + reconnects).
	Connects int64
	// In counts uplink messages accepted, Out downlink publishes done.
	In, Out int64
	// Dropped counts uplink messages dropped, by reason. Keep the set of
	// reasons fixed: each is a label value.
	Dropped map[string]int64
	// Refused counts board connections the embedded broker turned away,
	// by reason, and CutOff the boards it disconnected for flooding; both
	// nil/zero and absent from the series behind an external broker.
	// Keep the set of reasons fixed: each is a label value.
	Refused map[string]int64
	CutOff  *int64
}

// WatchMQTT adds the MQTT gateway series, read at scrape time from stats.
// stats reports false while no gateway runs (MQTT off, or its broker port
// was taken); the series are then absent.
func (m *Metrics) WatchMQTT(stats func() (MQTTStats, bool)) {
	if m.once("mqtt") {
		m.reg.MustRegister(&mqttCollector{stats: stats})
	}
}

type mqttCollector struct {
	stats func() (MQTTStats, bool)
}

var (
	mqttConnectedDesc = prometheus.NewDesc(Namespace+"_mqtt_broker_connected",
		"1 while the MQTT gateway is connected to its broker, else 0.", nil, nil)
	mqttConnectsDesc = prometheus.NewDesc(Namespace+"_mqtt_broker_connects_total",
		"Successful connections of the MQTT gateway to its broker (1 + reconnects).", nil, nil)
	mqttMessagesDesc = prometheus.NewDesc(Namespace+"_mqtt_messages_total",
		`MQTT messages of boards: direction "in" counts uplink messages accepted, "out" downlink publishes completed.`,
		[]string{"direction"}, nil)
	mqttDroppedDesc = prometheus.NewDesc(Namespace+"_mqtt_messages_dropped_total",
		"Uplink MQTT messages the gateway dropped, by reason.", []string{"reason"}, nil)
	mqttRefusedDesc = prometheus.NewDesc(Namespace+"_mqtt_broker_refused_total",
		"Board connections the embedded MQTT broker refused, by reason.", []string{"reason"}, nil)
	mqttCutOffDesc = prometheus.NewDesc(Namespace+"_mqtt_broker_cut_offs_total",
		"Boards the embedded MQTT broker disconnected for publishing over their rate past the grace.", nil, nil)
)

func (c *mqttCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- mqttConnectedDesc
	ch <- mqttConnectsDesc
	ch <- mqttMessagesDesc
	ch <- mqttDroppedDesc
	ch <- mqttRefusedDesc
	ch <- mqttCutOffDesc
}

func (c *mqttCollector) Collect(ch chan<- prometheus.Metric) {
	st, ok := c.stats()
	if !ok {
		return
	}
	connected := 0.0
	if st.Connected {
		connected = 1
	}
	ch <- prometheus.MustNewConstMetric(mqttConnectedDesc, prometheus.GaugeValue, connected)
	ch <- prometheus.MustNewConstMetric(mqttConnectsDesc, prometheus.CounterValue, float64(st.Connects))
	ch <- prometheus.MustNewConstMetric(mqttMessagesDesc, prometheus.CounterValue, float64(st.In), "in")
	ch <- prometheus.MustNewConstMetric(mqttMessagesDesc, prometheus.CounterValue, float64(st.Out), "out")
	byReason(ch, mqttDroppedDesc, st.Dropped)
	byReason(ch, mqttRefusedDesc, st.Refused)
	if st.CutOff != nil {
		ch <- prometheus.MustNewConstMetric(mqttCutOffDesc, prometheus.CounterValue, float64(*st.CutOff))
	}
}

// byReason sends one counter of desc per reason, in a stable order.
func byReason(ch chan<- prometheus.Metric, desc *prometheus.Desc, counts map[string]int64) {
	reasons := make([]string, 0, len(counts))
	for r := range counts {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	for _, r := range reasons {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(counts[r]), r)
	}
}

// WatchMCPSessions adds devicebridge_mcp_sessions, read at scrape time
// from count (the upstream MCP server's open sessions).
func (m *Metrics) WatchMCPSessions(count func() int) {
	if m.once("mcp_sessions") {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "mcp_sessions",
			Help: "Upstream MCP sessions open now (session-based protocol eras; stateless requests open none).",
		}, func() float64 { return float64(count()) }))
	}
}

// WatchInteractions adds devicebridge_interactions{state}, read at scrape
// time from states (interactions by state: the flow package's
// waiting_user, processing, completed, cancelled, error). States must be a
// small fixed set. The app calls it when interactions are on.
func (m *Metrics) WatchInteractions(states func() map[string]int) {
	if m.once("interactions") {
		m.reg.MustRegister(&interactionsCollector{states: states})
	}
}

type interactionsCollector struct {
	states func() map[string]int
}

var interactionsDesc = prometheus.NewDesc(Namespace+"_interactions",
	"Interactions (flow/) open now, by state.", []string{"state"}, nil)

func (c *interactionsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- interactionsDesc }

func (c *interactionsCollector) Collect(ch chan<- prometheus.Metric) {
	for state, n := range c.states() {
		ch <- prometheus.MustNewConstMetric(interactionsDesc, prometheus.GaugeValue, float64(n), state)
	}
}
