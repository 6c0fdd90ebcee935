package frontdoor

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/devicebridge/devicebridge/internal/clip"
)

// serve mounts one route per kind on a Mux built from cfg and serves it on
// a real loopback listener.
func serve(t *testing.T, cfg Config) (*Mux, *httptest.Server) {
	t.Helper()
	m, err := NewMux(cfg)
	require.NoError(t, err)
	// One line per kind for the whole test, however slow the machine.
	m.hostLog.Interval, m.originLog.Interval, m.writeLog.Interval = time.Hour, time.Hour, time.Hour
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	m.Handle("/guarded", ok)
	m.HandleOpen("GET /open", ok)
	m.Mount("/public", Door{CrossOrigin: true}, ok)
	srv := httptest.NewServer(m)
	t.Cleanup(srv.Close)
	return m, srv
}

type request struct {
	method, path, host string
	header             map[string]string
}

func do(t *testing.T, srv *httptest.Server, r request) (int, string) {
	t.Helper()
	if r.method == "" {
		r.method = http.MethodGet
	}
	req, err := http.NewRequest(r.method, srv.URL+r.path, strings.NewReader("{}"))
	require.NoError(t, err)
	if r.host != "" {
		req.Host = r.host
	}
	for k, v := range r.header {
		req.Header.Set(k, v)
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func port(srv *httptest.Server) string { return srv.URL[strings.LastIndex(srv.URL, ":"):] }

func TestHostStep(t *testing.T) {
	_, srv := serve(t, Config{AllowedHosts: []string{"bridge.lan"}})
	for host, want := range map[string]int{
		"":                              http.StatusOK, // the URL's 127.0.0.1:port
		"localhost" + port(srv):         http.StatusOK,
		"LocalHost.":                    http.StatusOK,
		"[::1]" + port(srv):             http.StatusOK,
		"127.0.0.2":                     http.StatusOK,
		"bridge.lan" + port(srv):        http.StatusOK,
		"BRIDGE.LAN":                    http.StatusOK,
		"evil.example":                  http.StatusForbidden,
		"evil.example" + port(srv):      http.StatusForbidden,
		"localhost.evil.example":        http.StatusForbidden,
		"sub.bridge.lan":                http.StatusForbidden,
		"10.0.0.5" + port(srv):          http.StatusForbidden, // not loopback, on a loopback listener
		"0.0.0.0" + port(srv):           http.StatusForbidden,
		strings.Repeat("a", 300) + ".x": http.StatusForbidden,
	} {
		for _, path := range []string{"/guarded", "/open", "/public"} {
			status, body := do(t, srv, request{path: path, host: host})
			assert.Equal(t, want, status, "Host %q on %s: %s", host, path, body)
			if want == http.StatusForbidden {
				assert.Contains(t, body, "control.allowed_hosts")
			}
		}
	}

	// "*" turns the check off.
	_, any := serve(t, Config{AllowedHosts: []string{"*"}})
	status, _ := do(t, any, request{path: "/guarded", host: "evil.example"})
	assert.Equal(t, http.StatusOK, status)
}

func TestHostsOffLoopback(t *testing.T) {
	h, err := ParseHosts([]string{"bridge.example"})
	require.NoError(t, err)
	for host, want := range map[string]bool{
		"10.0.0.5:8080":         true, // an address cannot be rebound
		"[2001:db8::1]:8080":    true,
		"bridge.example:443":    true,
		"localhost":             true,
		"":                      true, // no Host: not a browser
		"evil.example":          false,
		"bridge.example.evil.x": false,
		"2130706433":            false, // a number is a name to us; browsers send 127.0.0.1
	} {
		assert.Equal(t, want, h.Allowed(host, false), "Host %q off loopback", host)
	}
	assert.False(t, h.Allowed("10.0.0.5", true), "on loopback an address must be loopback")
}

func TestParseHosts(t *testing.T) {
	for _, bad := range []string{"", "http://bridge.example", "bridge.example:8080", "[::1]:80", "a b", "x/y", "user@host"} {
		_, err := ParseHosts([]string{bad})
		assert.Error(t, err, "%q", bad)
	}
	for _, good := range []string{"bridge.example", "Bridge.Example.", "10.0.0.5", "::1", "[::1]", "*"} {
		_, err := ParseHosts([]string{good})
		assert.NoError(t, err, "%q", good)
	}
}

func TestOriginStep(t *testing.T) {
	_, srv := serve(t, Config{AllowedOrigins: []string{"http://localhost:*", "https://app.example", "null"}})
	self := srv.URL
	tests := []struct {
		name   string
		req    request
		status int
	}{
		{"script GET", request{}, 200},
		{"script POST", request{method: "POST"}, 200},
		{"listed origin", request{method: "POST", header: map[string]string{"Origin": "http://localhost:5173"}}, 200},
		{"listed origin, default port", request{method: "POST", header: map[string]string{"Origin": "https://app.example:443"}}, 200},
		{"listed null", request{method: "POST", header: map[string]string{"Origin": "null"}}, 200},
		{"same origin (Sec-Fetch-Site)", request{method: "POST", header: map[string]string{"Origin": self, "Sec-Fetch-Site": "same-origin"}}, 200},
		{"same origin (old browser: Origin is Host)", request{method: "POST", header: map[string]string{"Origin": self}}, 200},
		{"address bar", request{header: map[string]string{"Sec-Fetch-Site": "none"}}, 200},
		{"link from another site", request{header: map[string]string{"Sec-Fetch-Site": "cross-site"}}, 200},
		{"foreign origin GET", request{header: map[string]string{"Origin": "http://evil.example"}}, 403},
		{"foreign origin GET, same-origin claimed by Origin only", request{header: map[string]string{"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}}, 403},
		{"foreign origin POST", request{method: "POST", header: map[string]string{"Origin": "http://evil.example"}}, 403},
		{"foreign origin DELETE", request{method: "DELETE", header: map[string]string{"Origin": "http://evil.example"}}, 403},
		{"other port of an exact origin", request{method: "POST", header: map[string]string{"Origin": "https://app.example:8443"}}, 403},
		{"same site is not same origin", request{method: "POST", header: map[string]string{"Origin": "http://localhost.evil.example", "Sec-Fetch-Site": "same-site"}}, 403},
		{"cross-site POST without Origin", request{method: "POST", header: map[string]string{"Sec-Fetch-Site": "cross-site"}}, 403},
		{"malformed origin", request{method: "POST", header: map[string]string{"Origin": "::::"}}, 403},
	}
	for _, tc := range tests {
		for _, path := range []string{"/guarded", "/open"} {
			if path == "/open" && tc.req.method != "" && tc.req.method != "GET" {
				continue // GET-only route
			}
			tc.req.path = path
			// JSON, so that the Writes step (tested below) lets it by.
			h := map[string]string{"Content-Type": "application/json"}
			for k, v := range tc.req.header {
				h[k] = v
			}
			tc.req.header = h
			status, body := do(t, srv, tc.req)
			assert.Equal(t, tc.status, status, "%s on %s: %s", tc.name, path, body)
		}
	}
	// Documents for any origin skip the step.
	status, _ := do(t, srv, request{path: "/public", header: map[string]string{"Origin": "http://evil.example"}})
	assert.Equal(t, http.StatusOK, status)

	// An empty list admits only the listener's own pages and scripts.
	_, none := serve(t, Config{})
	status, _ = do(t, none, request{method: "POST", path: "/guarded", header: map[string]string{"Origin": "http://localhost:5173", "Content-Type": "application/json"}})
	assert.Equal(t, http.StatusForbidden, status)
	status, _ = do(t, none, request{method: "POST", path: "/guarded", header: map[string]string{"Origin": none.URL, "Sec-Fetch-Site": "same-origin", "Content-Type": "application/json"}})
	assert.Equal(t, http.StatusOK, status)
}

func TestParseOrigins(t *testing.T) {
	for _, bad := range []string{"localhost", "http://", "http://x/path", "http://x?q", "http://u@x", "http://x:80:*"} {
		_, err := ParseOrigins([]string{bad})
		assert.Error(t, err, "%q", bad)
	}
	o, err := ParseOrigins(DefaultAllowedOrigins)
	require.NoError(t, err)
	assert.True(t, o.Allowed("http://[::1]:6274"))
	assert.False(t, o.Allowed("http://localhost.evil.example"))
	assert.False(t, o.Allowed("null"))
}

func TestWritesStep(t *testing.T) {
	_, srv := serve(t, Config{AllowedOrigins: []string{"http://localhost:*"}})
	browser := func(h map[string]string) map[string]string {
		h["Origin"] = "http://localhost:5173"
		return h
	}
	tests := []struct {
		name   string
		req    request
		status int
	}{
		{"text/plain", request{method: "POST", header: browser(map[string]string{"Content-Type": "text/plain;charset=UTF-8"})}, 415},
		{"form", request{method: "POST", header: browser(map[string]string{"Content-Type": "application/x-www-form-urlencoded"})}, 415},
		{"multipart", request{method: "POST", header: browser(map[string]string{"Content-Type": "multipart/form-data; boundary=x"})}, 415},
		{"no content type", request{method: "POST", header: browser(map[string]string{})}, 415},
		{"unparsable content type", request{method: "POST", header: browser(map[string]string{"Content-Type": "text/plain; application/json"})}, 415},
		{"Basic credentials (a browser adds them itself)", request{method: "POST", header: browser(map[string]string{"Content-Type": "text/plain", "Authorization": "Basic eDp5"})}, 415},
		{"Sec-Fetch-Site only", request{method: "POST", header: map[string]string{"Sec-Fetch-Site": "same-origin", "Content-Type": "text/plain"}}, 415},
		{"JSON", request{method: "POST", header: browser(map[string]string{"Content-Type": "application/json"})}, 200},
		{"JSON with charset", request{method: "POST", header: browser(map[string]string{"Content-Type": "Application/JSON; charset=utf-8"})}, 200},
		{"+json", request{method: "POST", header: browser(map[string]string{"Content-Type": "application/merge-patch+json"})}, 200},
		{"custom header", request{method: "POST", header: browser(map[string]string{"Content-Type": "text/plain", "X-Requested-With": "console"})}, 200},
		{"MCP header", request{method: "POST", header: browser(map[string]string{"Content-Type": "text/plain", "Mcp-Session-Id": "s"})}, 200},
		{"bearer token", request{method: "POST", header: browser(map[string]string{"Content-Type": "text/plain", "Authorization": "Bearer t"})}, 200},
		{"DELETE", request{method: "DELETE", header: browser(map[string]string{})}, 200},
		{"GET", request{header: browser(map[string]string{"Content-Type": "text/plain"})}, 200},
		{"curl -d", request{method: "POST", header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}}, 200},
	}
	for _, tc := range tests {
		tc.req.path = "/guarded"
		status, body := do(t, srv, tc.req)
		assert.Equal(t, tc.status, status, "%s: %s", tc.name, body)
	}
}

// TestMuxMountsEveryRouteBehindTheDoor: the route table says what each
// route is behind, the steps run in order (Host before Origin before
// authentication), and refusals take the route's format and are logged
// once per burst.
func TestMuxMountsEveryRouteBehindTheDoor(t *testing.T) {
	var authed int
	auth := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			authed++
			if r.Header.Get("Authorization") == "" {
				http.Error(w, "no", http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	jsonRefuse := func(w http.ResponseWriter, _ *http.Request, status int, code, msg string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]string{"code": code, "message": msg})
	}
	core, logs := observer.New(zapcore.InfoLevel)
	m, srv := serve(t, Config{Auth: auth, Refuse: jsonRefuse, Logger: zap.New(core)})
	m.Mount("/own", Door{Refuse: PlainText}, http.NotFoundHandler())
	assert.Equal(t, []Route{
		{Pattern: "/guarded", Authenticated: true},
		{Pattern: "GET /open"},
		{Pattern: "/public", CrossOrigin: true},
		{Pattern: "/own"},
	}, m.Routes())

	status, body := do(t, srv, request{path: "/guarded", host: "evil.example"})
	assert.Equal(t, http.StatusForbidden, status)
	assert.Contains(t, body, `"code":"host_not_allowed"`)
	status, body = do(t, srv, request{path: "/guarded", header: map[string]string{"Origin": "http://evil.example"}})
	assert.Equal(t, http.StatusForbidden, status)
	assert.Contains(t, body, `"code":"origin_not_allowed"`)
	assert.Zero(t, authed, "refused before authentication")
	status, _ = do(t, srv, request{path: "/guarded"})
	assert.Equal(t, http.StatusUnauthorized, status)
	status, _ = do(t, srv, request{path: "/guarded", header: map[string]string{"Authorization": "Bearer x"}})
	assert.Equal(t, http.StatusOK, status)
	status, _ = do(t, srv, request{path: "/open"})
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, 2, authed, "open routes are not authenticated")
	status, body = do(t, srv, request{path: "/own", host: "evil.example"})
	assert.Equal(t, http.StatusForbidden, status)
	assert.True(t, strings.HasPrefix(body, "Forbidden: Host"), body)

	for range 50 {
		do(t, srv, request{path: "/guarded", host: "evil.example"})
	}
	assert.Equal(t, 1, logs.FilterMessage("control request refused: host_not_allowed").Len(), "a flood is one line per interval")
	line := logs.FilterMessage("control request refused: host_not_allowed").All()[0].ContextMap()
	assert.Equal(t, "evil.example", line["host"])
	assert.Equal(t, 1, logs.FilterMessage("control request refused: origin_not_allowed").Len())
}

func TestChainOrder(t *testing.T) {
	var seen []string
	step := func(name string) Step {
		return func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen = append(seen, name); next.ServeHTTP(w, r) })
		}
	}
	h := Chain(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { seen = append(seen, "handler") }), step("a"), step("b"))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
	assert.Equal(t, []string{"a", "b", "handler"}, seen)
}

// TestRefusalLinesCutOutsiderText: what a client chose (its method, path,
// Host, Origin, Content-Type) is quoted in a refusal's log line only up to
// clip.Max bytes, however long it sent it.
func TestRefusalLinesCutOutsiderText(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	_, srv := serve(t, Config{AllowedOrigins: []string{"http://localhost:*"}, Logger: zap.New(core)})
	long := strings.Repeat("X", 8000)
	status, _ := do(t, srv, request{method: "POST", path: "/guarded", header: map[string]string{
		"Origin": "http://localhost:5173", "Content-Type": "text/plain; x=" + long}})
	require.Equal(t, http.StatusUnsupportedMediaType, status)
	status, _ = do(t, srv, request{path: "/guarded", host: "h" + long})
	require.Equal(t, http.StatusForbidden, status)
	status, _ = do(t, srv, request{method: "PATCH" + long, path: "/guarded", header: map[string]string{"Origin": "http://evil.example/" + long}})
	require.Equal(t, http.StatusForbidden, status)
	require.Equal(t, 3, logs.Len())
	for _, e := range logs.All() {
		for k, v := range e.ContextMap() {
			if s, ok := v.(string); ok {
				assert.LessOrEqual(t, len(s), clip.Max+40, "%s: %s is not cut", e.Message, k)
			}
		}
	}
	assert.Contains(t, logs.All()[2].ContextMap()["method"], "… (cut from")
}
