package app

// This file wires observability (docs/observability.md): the metrics
// registry of package metrics and what it reads, and the control API's
// /metrics, /readyz and /api/events. debug.go runs the pprof listener.

import (
	"fmt"
	"net"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/api"
	"github.com/devicebridge/devicebridge/metrics"
	"github.com/devicebridge/devicebridge/mqtt"
	"github.com/devicebridge/devicebridge/mqtt/broker"
	"github.com/devicebridge/devicebridge/ws"
)

// observability is the App's observability state.
type observability struct {
	// listening is true from the moment the device and control listeners
	// serve until Shutdown starts.
	listening atomic.Bool
	// debugAddr is the debug listener's bound address, nil when off.
	debugAddr atomic.Pointer[net.Addr]
}

// newMetrics creates the registry; every board transport's series start at
// zero.
func newMetrics(log *zap.Logger) *metrics.Metrics {
	return metrics.New(metrics.Options{
		Transports: []string{ws.TransportName, mqtt.TransportName},
		Logger:     log.Named("observe"),
	})
}

// watchMetrics registers the series read at scrape time.
func (a *App) watchMetrics() {
	a.Metrics.WatchHub(a.Hub)
	a.Metrics.WatchMQTT(a.mqttStats)
	a.Metrics.WatchWebSocket(a.wsStats)
	a.Metrics.WatchListeners(a.listenerStats)
	a.Metrics.WatchVoiceOTA(a.voiceOTAStats)
}

// wsStats reads the device WebSocket listener's counters.
func (a *App) wsStats() metrics.WebSocketStats {
	st := a.WS.Stats()
	return metrics.WebSocketStats{
		Accepted: st.Accepted, Unauthorized: st.Unauthorized, BadRequests: st.BadRequests,
		HelloFailures: st.HelloFailures, Refused: st.Refused, Active: st.Active,
		TextIn: st.TextIn, BinaryIn: st.BinaryIn, TextOut: st.TextOut,
	}
}

// mqttStats reads the MQTT gateway's counters, when one runs.
func (a *App) mqttStats() (metrics.MQTTStats, bool) {
	g := a.MQTTGateway()
	if g == nil {
		return metrics.MQTTStats{}, false
	}
	st := g.Stats()
	var bs broker.Stats
	var refused map[string]int64
	var cutOff *int64
	if b := a.MQTTBroker(); b != nil {
		bs = b.Stats()
		refused = map[string]int64{
			// Sockets closed on arrival: the board listener held
			// mqtt.max_connections, or mqtt.max_pending_connects not yet
			// admitted.
			"socket_limit": bs.RefusedSockets,
			// CONNACKs refusing a board: a client id that names no board,
			// bad or missing credentials, a board still cut off for flooding.
			"client_id":   bs.RefusedClientID,
			"credentials": bs.RefusedAuth,
			"cut_off":     bs.RefusedCutOff,
		}
		cutOff = &bs.CutOff
	}
	return metrics.MQTTStats{
		Refused:   refused,
		CutOff:    cutOff,
		Connected: st.Connected,
		Connects:  st.Connects,
		In:        st.MessagesIn,
		Out:       st.MessagesOut,
		Dropped: map[string]int64{
			"oversized":     st.Oversized,
			"malformed":     st.Malformed,
			"inbox_full":    st.InboxFull,
			"unknown_topic": st.UnknownTopic,
			"unattributed":  st.Unattributed,
			// A board over its rate (where it published, with the embedded
			// broker), over its share of the broker's queue to the gateway,
			// or cut off for flooding.
			"rate_limited": st.RateLimited + bs.RateLimited,
			"queue_share":  bs.QueueFull,
			"cut_off":      st.Muted,
			// Dropped by the embedded broker itself: a client's outbound
			// queue was full (the gateway's, when many boards publish at
			// the same instant).
			"broker_queue_full": bs.Dropped,
		},
	}, true
}

// apiOptions configures the control API, /metrics and /readyz included.
func (a *App) apiOptions() api.Options {
	o := api.Options{Metrics: a.Metrics.Handler(), Ready: a.readiness, Access: a.apiAccess(), MaxBodyBytes: a.cfg.Control.MaxBodyBytes,
		RecentStats: a.Metrics.Recent().Snapshot}
	a.addConsole(&o) // aliases, interactions, the web console (console.go)
	return o
}

// readiness is what /readyz reports: the listeners serve (and the bridge
// is not shutting down) and, when MQTT is configured, the gateway is
// connected to its broker. MQTT nobody asked for (the default embedded
// broker, whose port a system Mosquitto often owns) passes degraded when
// its port was taken: the bridge serves WebSocket boards, and a probe must
// not hold it out of service for ever over a default.
func (a *App) readiness() []api.Check {
	listeners := api.Check{Name: "listeners", OK: a.obs.listening.Load()}
	if !listeners.OK {
		listeners.Error = "the device and control listeners are not serving (starting or shutting down)"
	}
	checks := []api.Check{listeners}
	if a.cfg.MQTT.enabled() {
		c := api.Check{Name: "mqtt", OK: true}
		a.mu.Lock()
		portTaken := a.mqttPortTaken
		a.mu.Unlock()
		switch g := a.MQTTGateway(); {
		case g == nil && portTaken && !a.cfg.mqttRequested():
			c.Degraded = fmt.Sprintf("MQTT is off: the embedded broker's default port (%s) was taken at start, "+
				"and MQTT was not asked for; WebSocket boards are served (set mqtt.listen or mqtt.broker to make this check fail instead)", a.cfg.MQTT.Listen)
		case g == nil && portTaken:
			c.OK, c.Error = false, fmt.Sprintf("MQTT is configured but not running: the embedded broker's port (%s) was taken at start; see the log", a.cfg.MQTT.Listen)
		case g == nil:
			c.OK, c.Error = false, "MQTT is configured but its gateway is not running (see the log)"
		case !g.Connected():
			c.OK, c.Error = false, "the MQTT gateway is not connected to its broker (it keeps retrying)"
		case g.DownlinkProblem() != nil:
			c.OK, c.Error = false, g.DownlinkProblem().Error()
		}
		checks = append(checks, c)
	}
	if c, ok := a.voiceCheck(); ok {
		checks = append(checks, c)
	}
	return checks
}

// startObservability runs once the listeners serve: readiness turns on
// (and off again when Shutdown starts), and the debug listener starts if
// configured.
func (a *App) startObservability() error {
	a.obs.listening.Store(true)
	a.onDrain(func() { a.obs.listening.Store(false) })
	return a.startDebug()
}
