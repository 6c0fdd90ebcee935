package api

// This file serves what operators watch: /readyz, /metrics (a handler the
// app hands over) and /api/events, a Server-Sent Events view of the Hub's
// subscription. docs/observability.md documents all three.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/policy"
)

// Defaults for the event stream.
const (
	// DefaultEventsHeartbeat is how often an idle event stream gets a
	// comment line, so that proxies and clients see it is alive.
	DefaultEventsHeartbeat = 15 * time.Second
	// eventsWriteTimeout bounds one write to an event stream: a client
	// that stops reading is dropped instead of holding its handler.
	eventsWriteTimeout = 10 * time.Second
)

// Check is one readiness check in the /readyz body.
type Check struct {
	Name  string `json:"name"`
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

// ReadyBody is the /readyz response: status "ready" (200) or "not_ready"
// (503), each check, and the names of those that fail.
type ReadyBody struct {
	Status  string   `json:"status"`
	Checks  []Check  `json:"checks"`
	Failing []string `json:"failing,omitempty"`
}

// streams tracks the open event streams so that Close can end them.
type streams struct {
	once sync.Once
	done chan struct{}
}

func newStreams() *streams { return &streams{done: make(chan struct{})} }

// Close ends every open /api/events stream and refuses new ones (503), so
// that a shutdown is not held up by clients that never hang up. It is
// idempotent.
func (s *Server) Close() {
	s.streams.once.Do(func() { close(s.streams.done) })
	if s.flow != nil {
		s.flow.Close() // open interactions end; a running call is abandoned
	}
}

func (s *Server) registerObservability(mux *http.ServeMux) {
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.Handle("GET /api/events", s.auth(http.HandlerFunc(s.events)))
	if s.opts.Metrics != nil {
		mux.Handle("GET /metrics", s.auth(s.opts.Metrics))
	}
}

// readyz: 200 when every check passes, else 503 naming the failing ones.
// Like /healthz it needs no token, so probes can reach it.
func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	var checks []Check
	if s.opts.Ready != nil {
		checks = s.opts.Ready()
	}
	body := ReadyBody{Status: "ready", Checks: checks}
	if body.Checks == nil {
		body.Checks = []Check{}
	}
	for _, c := range checks {
		if !c.OK {
			body.Failing = append(body.Failing, c.Name)
		}
	}
	status := http.StatusOK
	if len(body.Failing) > 0 {
		body.Status, status = "not_ready", http.StatusServiceUnavailable
	}
	writeJSON(w, status, body)
}

// BoardEvent is the data of an online, tools_changed or offline event: the
// session snapshot as GET /api/devices shows it (offline events carry
// close_reason and close_cause).
type BoardEvent = DeviceSummary

// CallEvent is the data of a call event: how one tool call ended. It
// carries no arguments and no results.
type CallEvent struct {
	DeviceID  string `json:"device_id"`
	Transport string `json:"transport,omitempty"`
	Tool      string `json:"tool"`
	// Code is "ok" or the device code (device.Code) of the failure.
	Code       string  `json:"code"`
	DurationMS float64 `json:"duration_ms"`
}

// events streams the Hub's events as Server-Sent Events until the client
// goes or the bridge shuts down. The subscription exists before the
// response headers are sent, so a client that reads GET /api/devices
// after the stream opened misses nothing.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	select {
	case <-s.streams.done:
		writeError(w, http.StatusServiceUnavailable, "shutting_down", "the bridge is shutting down")
		return
	default:
	}
	rc := http.NewResponseController(w)
	sub := s.hub.SubscribeWith(device.SubscribeOptions{Calls: true})
	defer sub.Close()
	log := s.log.With(zap.String("remote", r.RemoteAddr))
	log.Debug("event stream opened")
	who := policy.IdentityFrom(r.Context())

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)

	var buf bytes.Buffer
	send := func() error {
		if err := rc.SetWriteDeadline(time.Now().Add(eventsWriteTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return err
		}
		if _, err := w.Write(buf.Bytes()); err != nil {
			return err
		}
		buf.Reset()
		return rc.Flush()
	}
	buf.WriteString(": devicebridge events\n\n")
	if err := send(); err != nil {
		return
	}
	heartbeat := time.NewTicker(s.opts.EventsHeartbeat)
	defer heartbeat.Stop()
	var id uint64
	for {
		select {
		case <-r.Context().Done():
			log.Debug("event stream closed by the client")
			return
		case <-s.streams.done:
			log.Debug("event stream ended: bridge shutting down")
			return
		case <-heartbeat.C:
			buf.WriteString(": heartbeat\n\n")
		case <-sub.C():
			for _, ev := range sub.Next() {
				ev, ok := s.visibleEvent(who, ev)
				if !ok {
					continue
				}
				id++
				writeEvent(&buf, id, ev, s.alias)
			}
		}
		if err := send(); err != nil {
			log.Debug("event stream write failed", zap.Error(err))
			return
		}
	}
}

// writeEvent appends one SSE frame: id, event name, one line of JSON.
func writeEvent(buf *bytes.Buffer, id uint64, ev device.Event, alias func(string) string) {
	var data any
	switch ev.Type {
	case device.EventCall:
		code := string(ev.Call.Code)
		if code == "" {
			code = "ok"
		}
		data = CallEvent{DeviceID: ev.DeviceID, Transport: ev.Call.Transport, Tool: ev.Call.Tool, Code: code,
			DurationMS: float64(ev.Call.Duration.Microseconds()) / 1000}
	case device.EventResync:
		data = struct{}{} // re-read GET /api/devices
	default:
		b := BoardEvent{Info: ev.Info, ToolCount: len(ev.Info.Tools)}
		if alias != nil {
			b.Alias = alias(ev.Info.DeviceID)
		}
		data = b
	}
	b, err := json.Marshal(data) // one line: encoding/json escapes newlines
	if err != nil {
		b = []byte("{}")
	}
	fmt.Fprintf(buf, "id: %d\nevent: %s\ndata: %s\n\n", id, ev.Type, b)
}
