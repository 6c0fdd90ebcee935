// Package api is the bridge's control API: a small JSON-over-HTTP view of
// the device Hub (list boards, inspect one, call one of its tools), health
// and readiness checks, /metrics (a handler the app hands over) and
// /api/events, a Server-Sent Events view of the Hub's subscription. It is served on the control listener, loopback by default,
// because it can drive every board.
package api

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/flow"
	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/metrics"
	"github.com/devicebridge/devicebridge/policy"
)

// DefaultMaxBodyBytes bounds a call request body.
const DefaultMaxBodyBytes = 1 << 20

// Options configure the control API.
type Options struct {
	MaxBodyBytes int64
	// Metrics, when set, is served on GET /metrics (authenticated, like
	// /api).
	Metrics http.Handler
	// RecentStats, when set, is served on GET /api/stats/recent
	// (authenticated, like /api): the last minutes of calls, interval by
	// interval, for the console's plots.
	RecentStats func() metrics.RecentSnapshot
	// Ready lists the readiness checks GET /readyz reports (open, like
	// /healthz); nil means always ready.
	Ready func() []Check
	// EventsHeartbeat is how often an idle /api/events stream gets a
	// comment line. Default 15s.
	EventsHeartbeat time.Duration
	// Interactions, when set, serves guided calls (interactions.go).
	Interactions *InteractionOptions
	// Alias, when set, gives each board's alias (shown as "alias" in
	// board listings and events, so that clients can name boards by it).
	Alias func(deviceID string) string
	// Named, when set, returns the board an operator named name (an
	// alias from the configuration): {id} in a route resolves it before
	// any device id.
	Named func(name string) (deviceID string, ok bool)
	// Node, when set, names this bridge's node in a fleet ("" alone).
	// GET /api/devices then says so in "node", beside the boards, so that
	// a client shows every board's holder: the ones with no "node" of
	// their own are held here.
	Node func() string
	// Console, when set, is served on GET / (the web console).
	Console http.Handler
	// Access: policy and audit (access.go).
	Access Access
}

// withDefaults returns o with unset fields set to their defaults.
func (o Options) withDefaults() Options {
	// max(x, 0): a negative value here has always meant the default too.
	o.MaxBodyBytes = cmp.Or(max(o.MaxBodyBytes, 0), DefaultMaxBodyBytes)
	o.EventsHeartbeat = cmp.Or(max(o.EventsHeartbeat, 0), DefaultEventsHeartbeat)
	return o
}

// Server serves the control API.
type Server struct {
	hub     *device.Hub
	opts    Options
	log     *zap.Logger
	streams *streams     // open /api/events streams; see Close
	flow    *flow.Engine // interactions; nil when off
	lines   callerLines  // throttled lines a caller can repeat (logs.go)
}

// New creates the control API over hub.
func New(hub *device.Hub, opts Options, logger *zap.Logger) *Server {
	opts = opts.withDefaults()
	if logger == nil {
		logger = zap.NewNop()
	}
	s := &Server{hub: hub, opts: opts, log: logger, streams: newStreams()}
	if err := s.setupInteractions(); err != nil {
		// Only a missing Lookup fails NewEngine, and setupInteractions
		// always passes one.
		panic(err)
	}
	return s
}

// Routes is where Register mounts the control API: the control
// listener's front door (frontdoor.Mux), which checks Host and Origin on
// every route and credentials on those mounted with Handle.
type Routes interface {
	// Handle mounts a route behind the control API's authentication.
	Handle(pattern string, h http.Handler)
	// HandleOpen mounts a route anyone who reaches the listener may use.
	HandleOpen(pattern string, h http.Handler)
}

// Register mounts the routes. Only probes and the console's files are
// open: they show no fleet data and change nothing.
func (s *Server) Register(r Routes) {
	r.HandleOpen("GET /healthz", http.HandlerFunc(s.healthz))
	r.Handle("GET /api/devices", http.HandlerFunc(s.listDevices))
	r.Handle("GET /api/devices/{id}", http.HandlerFunc(s.getDevice))
	r.Handle("POST /api/devices/{id}/call", http.HandlerFunc(s.callTool))
	s.registerObservability(r) // /readyz, /metrics, /api/events
	s.registerInteractions(r)  // /api/devices/{id}/interactions, /api/interactions/{sid}
	if s.opts.Console != nil {
		// A browser cannot send a bearer token for a page load; everything
		// the page shows comes from /api, behind the credentials.
		r.HandleOpen("GET /{$}", s.opts.Console)
		r.HandleOpen("GET /console/", s.opts.Console)
	}
}

// DeviceSummary is one row of GET /api/devices.
type DeviceSummary struct {
	device.Info
	Alias     string `json:"alias,omitempty"`
	ToolCount int    `json:"tool_count"`
}

// DeviceDetail is GET /api/devices/{id}.
type DeviceDetail struct {
	device.Info
	Alias string            `json:"alias,omitempty"`
	Tools []device.ToolInfo `json:"tools"`
}

// CallRequest is the body of POST /api/devices/{id}/call.
type CallRequest struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

// ErrorBody is every error response: {"error":{"code":..,"message":..}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the error object. Problems and Example come with
// invalid_arguments, Tools with unknown_tool.
type ErrorDetail struct {
	Code     string          `json:"code"`
	Message  string          `json:"message"`
	Problems []string        `json:"problems,omitempty"`
	Example  json.RawMessage `json:"example,omitempty"`
	Tools    []string        `json:"tools,omitempty"`
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "devices": len(s.hub.Devices())})
}

func (s *Server) listDevices(w http.ResponseWriter, r *http.Request) {
	infos := s.hub.Devices()
	id := policy.IdentityFrom(r.Context())
	out := make([]DeviceSummary, 0, len(infos))
	for _, i := range infos {
		if i, ok := s.view(id, i); ok {
			out = append(out, DeviceSummary{Info: i, Alias: s.alias(i.DeviceID), ToolCount: len(i.Tools)})
		}
	}
	resp := map[string]any{"devices": out}
	if s.opts.Node != nil {
		if node := s.opts.Node(); node != "" {
			resp["node"] = node
		}
	}
	writeJSON(w, http.StatusOK, resp)
}

func (s *Server) getDevice(w http.ResponseWriter, r *http.Request) {
	info, ok := s.device(r.PathValue("id"))
	if ok {
		// A board the caller may not see is as absent as an unknown one.
		info, ok = s.view(policy.IdentityFrom(r.Context()), info)
	}
	if !ok {
		writeError(w, http.StatusNotFound, "unknown_device", fmt.Sprintf("no connected device %q (GET /api/devices lists them)", r.PathValue("id")))
		return
	}
	writeJSON(w, http.StatusOK, DeviceDetail{Info: info, Alias: s.alias(info.DeviceID), Tools: info.ToolInfos()})
}

func (s *Server) alias(id string) string {
	if s.opts.Alias == nil {
		return ""
	}
	return s.opts.Alias(id)
}

func (s *Server) callTool(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("request body over %d bytes", s.opts.MaxBodyBytes))
		return
	}
	req, err := parseCall(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	who := policy.IdentityFrom(r.Context())
	id, board := s.resolveBoard(id)
	if s.refused(w, &s.lines.deniedCall, "control call", who, id, board, req.Name, req.Arguments) {
		return
	}
	start := time.Now()
	res, err := s.hub.CallTool(r.Context(), id, req.Name, req.Arguments)
	took := time.Since(start)
	// The id and the tool name are the caller's, up to the whole body.
	log := s.log.With(clip.Field("device_id", id), clip.Field("tool", req.Name), zap.Duration("took", took))
	if err != nil {
		status, code := classify(err)
		s.auditCall(who, id, req.Name, req.Arguments, code, took)
		s.lines.callFailed.Info(log, "control call failed", zap.Int("status", status), zap.String("code", code),
			clip.Error(device.LogSafe(err)))
		detail := ErrorDetail{Code: code, Message: err.Error()}
		var argErr *device.ArgumentsError
		var toolErr *device.UnknownToolError
		switch {
		case errors.As(err, &argErr):
			for _, p := range argErr.Invalid.Problems {
				detail.Problems = append(detail.Problems, p.Msg)
			}
			if json.Valid([]byte(argErr.Invalid.Example)) {
				detail.Example = json.RawMessage(argErr.Invalid.Example)
			}
		case errors.As(err, &toolErr):
			detail.Tools = toolErr.Known
		}
		writeErrorDetail(w, status, detail)
		return
	}
	log.Debug("control call done")
	outcome := "ok"
	if res != nil && res.IsError {
		outcome = "tool_error"
	}
	s.auditCall(who, id, req.Name, req.Arguments, outcome, took)
	writeJSON(w, http.StatusOK, res)
}

func parseCall(body []byte) (CallRequest, error) {
	var req CallRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, fmt.Errorf(`body must be {"name": "<tool>", "arguments": {...}}: %v`, err)
	}
	if dec.More() {
		return req, errors.New("body must hold a single JSON object")
	}
	if req.Name == "" {
		return req, errors.New(`"name" (the device tool to call) is required`)
	}
	if a := strings.TrimSpace(string(req.Arguments)); a != "" && a != "null" && a[0] != '{' {
		return req, errors.New(`"arguments" must be a JSON object`)
	}
	if strings.TrimSpace(string(req.Arguments)) == "null" {
		req.Arguments = nil
	}
	return req, nil
}

// classify maps a call error to an HTTP status and a stable error code,
// from the device layer's one vocabulary (device.Code).
func classify(err error) (int, string) {
	switch device.CodeOf(err) {
	case device.CodeUnknownDevice:
		return http.StatusNotFound, "unknown_device"
	case device.CodeUnknownTool:
		return http.StatusNotFound, "unknown_tool"
	case device.CodeInvalidArguments:
		return http.StatusUnprocessableEntity, "invalid_arguments"
	case device.CodeNotReady:
		return http.StatusConflict, "device_not_ready"
	case device.CodeNoMCP:
		return http.StatusConflict, "device_without_mcp"
	case device.CodeTimeout:
		return http.StatusGatewayTimeout, "device_timeout"
	case device.CodeBusy:
		return http.StatusServiceUnavailable, "device_busy"
	case device.CodeQueueTimeout:
		// Nothing was sent, so, unlike device_timeout, retrying is safe.
		return http.StatusServiceUnavailable, "device_queue_timeout"
	case device.CodeDeviceError:
		return http.StatusBadGateway, "device_error"
	case device.CodeOffline:
		return http.StatusBadGateway, "device_disconnected"
	case device.CodeShuttingDown:
		return http.StatusServiceUnavailable, "shutting_down"
	case device.CodeCanceled:
		return 499, "client_closed_request"
	}
	return http.StatusBadGateway, "device_failure"
}

// device finds the board a route's {id} names (boardID), on this node or
// (in a fleet, see cluster/) on another one.
func (s *Server) device(id string) (device.Info, bool) {
	return s.hub.Device(s.boardID(id))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(encodeJSON(v))
}

// encodeJSON renders a response body the way every route sends it.
func encodeJSON(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	// A JSON API, not HTML: "<tool>" stays "<tool>", not "\u003ctool\u003e".
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return buf.Bytes()
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeErrorDetail(w, status, ErrorDetail{Code: code, Message: msg})
}

// Refuse answers a request the front door refused (a frontdoor.Refuser)
// with the control API's JSON error body.
func Refuse(w http.ResponseWriter, _ *http.Request, status int, code, msg string) {
	writeError(w, status, code, msg)
}

func writeErrorDetail(w http.ResponseWriter, status int, d ErrorDetail) {
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, status, ErrorBody{Error: d})
}

// Mux is what JSONErrors wraps: an http.ServeMux, or the front door's Mux
// over one.
type Mux interface {
	http.Handler
	Handler(r *http.Request) (h http.Handler, pattern string)
}

// JSONErrors wraps the control listener's mux so that requests no route
// matches get the documented JSON error body (404 not_found, or 405
// method_not_allowed with an Allow header) instead of ServeMux's plain
// text. Routes that match are served as they are.
func JSONErrors(mux Mux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		if pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		// Let the mux decide 404 versus 405 (and redirects), keeping only
		// its status and headers.
		rec := &statusRecorder{header: http.Header{}}
		h.ServeHTTP(rec, r)
		switch rec.status {
		case http.StatusNotFound:
			writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no route %s %s (see /api/devices, /mcp, /healthz)", r.Method, r.URL.Path))
		case http.StatusMethodNotAllowed:
			allow := rec.header.Get("Allow")
			w.Header().Set("Allow", allow)
			writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", fmt.Sprintf("%s is not allowed on %s; allowed: %s", r.Method, r.URL.Path, allow))
		default:
			mux.ServeHTTP(w, r)
		}
	})
}

// statusRecorder keeps a handler's status and headers and drops its body.
type statusRecorder struct {
	header http.Header
	status int
}

func (r *statusRecorder) Header() http.Header { return r.header }
func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return len(b), nil
}
func (r *statusRecorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}
