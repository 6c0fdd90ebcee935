package api

// This file serves what operators watch: /readyz, /metrics (a handler the
// app hands over) and /api/events, a Server-Sent Events view of the Hub's
// subscription. docs/observability.md documents all three.

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/clip"
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
	// Degraded says why a passing check runs without part of what it
	// covers (MQTT off because its default port was taken).
	Degraded string `json:"degraded,omitempty"`
}

// ReadyBody is the /readyz response: status "ready" (200) or "not_ready"
// (503), each check, the names of those that fail and of those that pass
// degraded.
type ReadyBody struct {
	Status   string   `json:"status"`
	Checks   []Check  `json:"checks"`
	Failing  []string `json:"failing,omitempty"`
	Degraded []string `json:"degraded,omitempty"`
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

func (s *Server) registerObservability(r Routes) {
	r.HandleOpen("GET /readyz", http.HandlerFunc(s.readyz))
	r.Handle("GET /api/events", http.HandlerFunc(s.events))
	if s.opts.RecentStats != nil {
		r.Handle("GET /api/stats/recent", http.HandlerFunc(s.recentStats))
	}
	if s.opts.Metrics != nil {
		r.Handle("GET /metrics", s.opts.Metrics)
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
		switch {
		case !c.OK:
			body.Failing = append(body.Failing, c.Name)
		case c.Degraded != "":
			body.Degraded = append(body.Degraded, c.Name)
		}
	}
	status := http.StatusOK
	if len(body.Failing) > 0 {
		body.Status, status = "not_ready", http.StatusServiceUnavailable
	}
	writeJSON(w, status, body)
}

// recentStats serves the last minutes of calls, interval by interval
// (metrics.Recent): what the console plots when it opens.
func (s *Server) recentStats(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.opts.RecentStats())
}

// BoardEvent is the data of an online, tools_changed or offline event: the
// session snapshot as GET /api/devices shows it (offline events carry
// close_reason and close_cause), and when the bridge published it.
type BoardEvent struct {
	DeviceSummary
	At time.Time `json:"at,omitzero"`
}

// CallEvent is the data of a call event: how one tool call ended. It
// carries no arguments and no results.
type CallEvent struct {
	DeviceID  string `json:"device_id"`
	Transport string `json:"transport,omitempty"`
	Tool      string `json:"tool"`
	// Code is "ok" or the device code (device.Code) of the failure.
	Code       string  `json:"code"`
	DurationMS float64 `json:"duration_ms"`
	// At is when the call ended.
	At time.Time `json:"at,omitzero"`
}

// VoiceEvent is the data of a voice event: a board's relayed conversation
// "opened", "closed", or "failed" to reach the voice upstream.
type VoiceEvent struct {
	DeviceID  string    `json:"device_id"`
	Kind      string    `json:"kind"`
	Transport string    `json:"transport,omitempty"`
	SessionID string    `json:"session_id,omitempty"`
	Upstream  string    `json:"upstream,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	At        time.Time `json:"at,omitzero"`
}

// ResyncEvent is the data of a resync event: re-read GET /api/devices.
// Reason says why: "behind" (the client fell too far behind and its
// backlog was dropped), or, first on a stream that asked to resume
// (Last-Event-ID), "malformed" (not an id of this API), "foreign" (an id
// from another bridge process or fleet node) or "too_old" (the events after
// it are no longer held: control.events_replay).
type ResyncEvent struct {
	Reason string `json:"reason"`
}

// Resync reasons.
const (
	ResyncBehind    = "behind"
	ResyncMalformed = "malformed"
	ResyncForeign   = "foreign"
	ResyncTooOld    = "too_old"
)

// lastEventID is where a client asks to resume: the Last-Event-ID header
// (EventSource sends it when it reconnects), or ?last_event_id= for
// clients that cannot set headers. "" means a fresh stream.
func lastEventID(r *http.Request) string {
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		return id
	}
	return r.URL.Query().Get("last_event_id")
}

// parseEventID splits an event id, "<epoch>-<seq>".
func parseEventID(id string) (epoch string, seq uint64, ok bool) {
	epoch, n, found := strings.Cut(id, "-")
	if !found || epoch == "" {
		return "", 0, false
	}
	seq, err := strconv.ParseUint(n, 10, 64)
	return epoch, seq, err == nil
}

// historyParam is ?history=N: a fresh stream (no Last-Event-ID) that
// starts with the newest N events the bridge still holds. 0 when absent.
func historyParam(r *http.Request) (int, error) {
	v := r.URL.Query().Get("history")
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("history must be a number of events, like history=200; got %q", v)
	}
	return n, nil
}

// HistoryHeader, on a stream opened with ?history=N, is the id of the last
// event of the history it starts with: events up to it happened before the
// stream opened, later ones are live.
const HistoryHeader = "Devicebridge-History-Until"

// subscribe opens the stream's subscription. With a last event id it also
// returns the events to replay first, or a resync event (with its reason)
// when the id cannot be resumed from; without one, the newest history
// events held. seq is the last event published before the subscription.
func (s *Server) subscribe(lastID string, history int) (sub *device.Subscription, replay []device.Event, reason string, seq uint64) {
	opts := device.SubscribeOptions{Calls: true}
	if lastID == "" {
		sub, hist := s.hub.SubscribeRecent(opts, history)
		return sub, hist.Replay, "", hist.Seq
	}
	epoch, after, ok := parseEventID(lastID)
	switch {
	case !ok:
		reason, after = ResyncMalformed, math.MaxUint64
	case epoch != s.hub.Epoch():
		reason, after = ResyncForeign, math.MaxUint64
	}
	sub, hist := s.hub.SubscribeAfter(opts, after)
	if !hist.Complete {
		return sub, []device.Event{{Type: device.EventResync, Seq: hist.Seq}}, cmp.Or(reason, ResyncTooOld), hist.Seq
	}
	return sub, hist.Replay, "", hist.Seq
}

// events streams the Hub's events as Server-Sent Events until the client
// goes or the bridge shuts down. The subscription exists before the
// response headers are sent, so a client that reads GET /api/devices
// after the stream opened misses nothing. A client that resumes
// (Last-Event-ID) first gets the events it missed, from the Hub's history,
// or a resync when they are not all there; a new one that asks for
// ?history=N first gets the newest N events held (the console's recent
// past).
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	select {
	case <-s.streams.done:
		writeError(w, http.StatusServiceUnavailable, "shutting_down", "the bridge is shutting down")
		return
	default:
	}
	history, err := historyParam(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	rc := http.NewResponseController(w)
	lastID := lastEventID(r)
	sub, replay, reason, seq := s.subscribe(lastID, history)
	defer sub.Close()
	log := s.log.With(zap.String("remote", r.RemoteAddr))
	log.Debug("event stream opened", clip.Field("last_event_id", lastID), zap.Int("replay", len(replay)),
		zap.String("resync", reason))
	who := policy.IdentityFrom(r.Context())
	epoch := s.hub.Epoch()

	h := w.Header()
	if lastID == "" && history > 0 {
		h.Set(HistoryHeader, fmt.Sprintf("%s-%d", epoch, seq))
	}
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
	// sent is the seq of the last event written: the replay and the
	// subscription never overlap, but a stream never repeats an event.
	var sent uint64
	write := func(evs []device.Event, reason string) {
		for _, ev := range evs {
			if ev.Seq != 0 && ev.Seq <= sent {
				continue
			}
			ev, ok := s.visibleEvent(who, ev)
			if !ok {
				continue
			}
			sent = max(sent, ev.Seq)
			writeEvent(&buf, epoch, ev, cmp.Or(reason, ResyncBehind), s.alias)
		}
	}
	buf.WriteString(": devicebridge events\n\n")
	write(replay, reason)
	replay = nil
	if err := send(); err != nil {
		return
	}
	heartbeat := time.NewTicker(s.opts.EventsHeartbeat)
	defer heartbeat.Stop()
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
			write(sub.Next(), "")
		}
		if err := send(); err != nil {
			log.Debug("event stream write failed", zap.Error(err))
			return
		}
	}
}

// writeEvent appends one SSE frame: id ("<epoch>-<seq>"), event name, one
// line of JSON. reason is a resync's.
func writeEvent(buf *bytes.Buffer, epoch string, ev device.Event, reason string, alias func(string) string) {
	var data any
	switch ev.Type {
	case device.EventCall:
		code := string(ev.Call.Code)
		if code == "" {
			code = "ok"
		}
		data = CallEvent{DeviceID: ev.DeviceID, Transport: ev.Call.Transport, Tool: ev.Call.Tool, Code: code,
			DurationMS: float64(ev.Call.Duration.Microseconds()) / 1000, At: ev.At.UTC()}
	case device.EventResync:
		data = ResyncEvent{Reason: reason} // re-read GET /api/devices
	case device.EventVoice:
		data = VoiceEvent{DeviceID: ev.DeviceID, Kind: ev.Voice.Kind, Transport: ev.Voice.Transport,
			SessionID: ev.Voice.SessionID, Upstream: ev.Voice.Upstream, Reason: ev.Voice.Reason, At: ev.At.UTC()}
	default:
		b := BoardEvent{DeviceSummary: DeviceSummary{Info: ev.Info, ToolCount: len(ev.Info.Tools)}, At: ev.At.UTC()}
		if alias != nil {
			b.Alias = alias(ev.Info.DeviceID)
		}
		data = b
	}
	// One line (encoding/json escapes newlines), and no HTML escaping, as
	// in every /api answer.
	var line bytes.Buffer
	enc := json.NewEncoder(&line)
	enc.SetEscapeHTML(false)
	b := []byte("{}")
	if enc.Encode(data) == nil {
		b = bytes.TrimSuffix(line.Bytes(), []byte("\n"))
	}
	fmt.Fprintf(buf, "id: %s-%d\nevent: %s\ndata: %s\n\n", epoch, ev.Seq, ev.Type, b)
}
