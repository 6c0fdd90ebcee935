// Package frontdoor is the one way into the control listener: the control
// API, /api/events, /metrics, /mcp and the web console are all mounted on
// a Mux, and every route passes the same chain of small steps, in order:
//
//  1. Host: a Host header only DNS rebinding could produce (a page on an
//     attacker's name that now resolves to the bridge) is refused.
//  2. Origin: a browser request from an origin that is neither the
//     bridge's own nor on the allow-list is refused.
//  3. Writes: a state-changing browser request that any page could send
//     without a CORS preflight (a form or text/plain POST) is refused.
//  4. Authentication: the route's own step (see authn.Guard), or none
//     for the few open routes (health, readiness, the console's files, the
//     OAuth metadata).
//
// Requests that carry neither Origin nor Sec-Fetch-Site are not a
// browser's (curl, scripts, SDKs): steps 2 and 3 let them through
// unchanged, so only credentials stand between them and the boards.
//
// The package owns these checks and the table of routes (Routes), so that
// a test can walk every route and a route added later cannot be mounted
// outside the door. What a route does is its owner's business.
package frontdoor

import (
	"net/http"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/internal/logthrottle"
)

// Step is one check of the door: it refuses a request or hands it on.
type Step = func(http.Handler) http.Handler

// Refuser answers a refused request: an HTTP status, a stable code
// ("origin_not_allowed") and a message a person can act on. Each surface
// answers in its own format (the control API in JSON, /mcp in plain text).
type Refuser func(w http.ResponseWriter, r *http.Request, status int, code, msg string)

// PlainText refuses as net/http does: "Forbidden: <msg>".
func PlainText(w http.ResponseWriter, _ *http.Request, status int, _, msg string) {
	http.Error(w, http.StatusText(status)+": "+msg, status)
}

// Chain wraps h in steps, the first step outermost (it runs first).
func Chain(h http.Handler, steps ...Step) http.Handler {
	for i := len(steps) - 1; i >= 0; i-- {
		h = steps[i](h)
	}
	return h
}

// Config configures the door of one listener.
type Config struct {
	// AllowedOrigins are the browser origins admitted besides the
	// listener's own (see ParseOrigins); nil admits none.
	AllowedOrigins []string
	// AllowedHosts are the DNS names a Host header may carry besides
	// localhost (see ParseHosts).
	AllowedHosts []string
	// Auth authenticates the routes mounted with Handle; nil leaves them
	// open.
	Auth Step
	// Refuse answers refusals of routes mounted without a Refuser of
	// their own; nil is PlainText.
	Refuse Refuser
	// Logger receives one throttled line per kind of refusal.
	Logger *zap.Logger
}

// Route is one entry of the route table.
type Route struct {
	// Pattern is the http.ServeMux pattern ("GET /api/devices").
	Pattern string
	// Authenticated is true behind an authentication step.
	Authenticated bool
	// CrossOrigin is true for documents any page may read (the Origin and
	// Writes steps are skipped; the Host step is not).
	CrossOrigin bool
}

// Door is what one route is mounted behind.
type Door struct {
	// Auth authenticates; nil: no credentials are asked.
	Auth Step
	// CrossOrigin skips the Origin and Writes steps: for read-only
	// documents meant for any origin, which say so with CORS headers
	// themselves (RFC 9728 metadata).
	CrossOrigin bool
	// Refuse answers this route's refusals; nil: the Mux's.
	Refuse Refuser
}

// Mux is a listener's routes, each mounted behind the door. It is an
// http.Handler; mount every route before serving.
type Mux struct {
	mux     *http.ServeMux
	cfg     Config
	hosts   Hosts
	origins Origins
	cop     *http.CrossOriginProtection
	log     *zap.Logger
	routes  []Route
	// One throttle per kind of refusal: an outsider can repeat each at
	// will.
	hostLog, originLog, writeLog logthrottle.Throttle
}

// NewMux builds an empty Mux; it fails only on an origin or host entry
// ParseOrigins or ParseHosts refuses.
func NewMux(cfg Config) (*Mux, error) {
	origins, err := ParseOrigins(cfg.AllowedOrigins)
	if err != nil {
		return nil, err
	}
	hosts, err := ParseHosts(cfg.AllowedHosts)
	if err != nil {
		return nil, err
	}
	if cfg.Refuse == nil {
		cfg.Refuse = PlainText
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return &Mux{mux: http.NewServeMux(), cfg: cfg, hosts: hosts, origins: origins,
		cop: http.NewCrossOriginProtection(), log: cfg.Logger}, nil
}

// Handle mounts h behind the whole door, authenticated by Config.Auth.
func (m *Mux) Handle(pattern string, h http.Handler) {
	m.Mount(pattern, Door{Auth: m.cfg.Auth}, h)
}

// HandleOpen mounts h behind the door without authentication: for what
// probes and page loads need, which shows no fleet data and changes
// nothing (health, readiness, the console's files).
func (m *Mux) HandleOpen(pattern string, h http.Handler) {
	m.Mount(pattern, Door{}, h)
}

// Mount mounts h behind d.
func (m *Mux) Mount(pattern string, d Door, h http.Handler) {
	refuse := d.Refuse
	if refuse == nil {
		refuse = m.cfg.Refuse
	}
	steps := []Step{m.hostStep(refuse)}
	if !d.CrossOrigin {
		steps = append(steps, m.originStep(refuse), m.writesStep(refuse))
	}
	if d.Auth != nil {
		steps = append(steps, d.Auth)
	}
	m.mux.Handle(pattern, Chain(h, steps...))
	m.routes = append(m.routes, Route{Pattern: pattern, Authenticated: d.Auth != nil, CrossOrigin: d.CrossOrigin})
}

// Routes returns the route table, in the order the routes were mounted.
func (m *Mux) Routes() []Route { return append([]Route(nil), m.routes...) }

// ServeHTTP serves the route r matches, as http.ServeMux does.
func (m *Mux) ServeHTTP(w http.ResponseWriter, r *http.Request) { m.mux.ServeHTTP(w, r) }

// Handler reports the route r matches, as http.ServeMux.Handler does.
func (m *Mux) Handler(r *http.Request) (http.Handler, string) { return m.mux.Handler(r) }

// refused logs one refusal through its throttle and answers it.
func (m *Mux) refused(th *logthrottle.Throttle, refuse Refuser, w http.ResponseWriter, r *http.Request, status int, code, msg string, fields ...zap.Field) {
	fields = append(fields, zap.String("remote", r.RemoteAddr), clip.Field("method", r.Method), clip.Field("path", r.URL.Path))
	th.Info(m.log, "control request refused: "+code, fields...)
	refuse(w, r, status, code, msg)
}
