package app_test

// Regression tests of the control listener's front door (issue 24,
// defects 2 and 3): every route but the few open ones sits behind the same
// authentication whichever kind is configured, and no web page can drive a
// board through a foreign Origin, a rebound DNS name or a CORS-simple
// request, while curl and the console keep working.

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/frontdoor"
	"github.com/devicebridge/devicebridge/internal/testissuer"
	"github.com/devicebridge/devicebridge/simulator"
)

const frontMAC = "02:00:00:00:0f:01"

// frontReq is one raw request: what a browser, a script or an attacker
// sends.
type frontReq struct {
	method, path, body string
	host               string            // "" keeps the URL's
	header             map[string]string // Origin, Sec-Fetch-Site, Content-Type, Authorization…
}

// send does r against base with a client that adds nothing of its own,
// and returns the status and body.
func send(t *testing.T, base string, r frontReq) (int, string) {
	t.Helper()
	var body io.Reader
	if r.body != "" {
		body = strings.NewReader(r.body)
	}
	req, err := http.NewRequest(r.method, base+r.path, body)
	require.NoError(t, err)
	for k, v := range r.header {
		req.Header.Set(k, v)
	}
	if r.host != "" {
		req.Host = r.host
	}
	ctx, cancel := context.WithTimeout(context.Background(), obsWait)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	require.NoError(t, err)
	defer resp.Body.Close()
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return resp.StatusCode, "" // a stream opened: enough said
	}
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func volumeOf(b *simulator.Board) any { return b.State()["audio_speaker.volume"] }

// TestEvilPageCannotDriveBoards (defect 3): with no control token (the
// default), a page on another origin, a rebound DNS name and a CORS-simple
// POST are refused before anything reaches a board; curl without Origin
// and the console's own same-origin requests still work.
func TestEvilPageCannotDriveBoards(t *testing.T) {
	noLeaks(t)
	a, base := startApp(t, testConfig())
	board := obsBoard(t, a, simulator.Config{MAC: frontMAC})
	waitReady(t, base, 1)
	callPath := "/api/devices/" + frontMAC + "/call"
	loud := `{"name":"self.audio_speaker.set_volume","arguments":{"volume":100}}`
	before, calls := volumeOf(board), board.Stats().CallsRun
	require.NotEqual(t, 100, before)

	refused := []struct {
		name   string
		req    frontReq
		status int
	}{
		{"text/plain POST from a foreign origin (ran set_volume 100)",
			frontReq{method: "POST", path: callPath, body: loud, header: map[string]string{
				"Origin": "http://evil.example", "Content-Type": "text/plain;charset=UTF-8", "Sec-Fetch-Site": "cross-site"}}, 403},
		{"JSON POST from a foreign origin",
			frontReq{method: "POST", path: callPath, body: loud, header: map[string]string{
				"Origin": "http://evil.example", "Content-Type": "application/json"}}, 403},
		{"cross-site POST with no Origin",
			frontReq{method: "POST", path: callPath, body: loud, header: map[string]string{
				"Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"}}, 403},
		{"DNS rebinding: same-origin to the attacker's name",
			frontReq{method: "POST", path: callPath, body: loud, host: "evil.example:" + portOf(base), header: map[string]string{
				"Origin": "http://evil.example:" + portOf(base), "Content-Type": "application/json", "Sec-Fetch-Site": "same-origin"}}, 403},
		{"text/plain POST from an allowed origin (a local dev server)",
			frontReq{method: "POST", path: callPath, body: loud, header: map[string]string{
				"Origin": "http://localhost:5173", "Content-Type": "text/plain"}}, 415},
		{"form POST from the console's own origin",
			frontReq{method: "POST", path: callPath, body: loud, header: map[string]string{
				"Origin": base, "Sec-Fetch-Site": "same-origin", "Content-Type": "application/x-www-form-urlencoded"}}, 415},
	}
	for _, tc := range refused {
		status, body := send(t, base, tc.req)
		assert.Equal(t, tc.status, status, "%s: %s", tc.name, body)
		assert.Contains(t, body, `"error"`, "%s: the control API's JSON error", tc.name)
	}
	assert.Equal(t, before, volumeOf(board), "no refused request reached the board")
	assert.Equal(t, calls, board.Stats().CallsRun)

	// Reads through a rebound name (Host: evil.example) are refused too,
	// on every route that shows fleet data.
	for _, path := range []string{"/api/devices", "/api/devices/" + frontMAC, "/api/events", "/metrics", "/api/ota/devices", "/"} {
		status, body := send(t, base, frontReq{method: "GET", path: path, host: "evil.example"})
		assert.Equal(t, http.StatusForbidden, status, "GET %s with Host evil.example: %s", path, body)
		status, _ = send(t, base, frontReq{method: "GET", path: path, host: "evil.example:" + portOf(base)})
		assert.Equal(t, http.StatusForbidden, status, "GET %s with Host evil.example:port", path)
		status, _ = send(t, base, frontReq{method: "GET", path: path, header: map[string]string{"Origin": "http://evil.example"}})
		assert.Equal(t, http.StatusForbidden, status, "GET %s from a foreign origin", path)
	}

	// What must keep working: curl -d (form content type, no Origin), a
	// script naming the bridge as localhost, and the console (same origin).
	status, body := send(t, base, frontReq{method: "POST", path: callPath,
		body:   `{"name":"self.audio_speaker.set_volume","arguments":{"volume":41}}`,
		header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}})
	require.Equal(t, http.StatusOK, status, body)
	assert.EqualValues(t, 41, volumeOf(board))
	status, body = send(t, base, frontReq{method: "GET", path: "/api/devices", host: "localhost:" + portOf(base)})
	require.Equal(t, http.StatusOK, status, body)

	console := map[string]string{"Origin": base, "Sec-Fetch-Site": "same-origin", "Content-Type": "application/json"}
	status, body = send(t, base, frontReq{method: "POST", path: callPath,
		body: `{"name":"self.audio_speaker.set_volume","arguments":{"volume":42}}`, header: console})
	require.Equal(t, http.StatusOK, status, body)
	assert.EqualValues(t, 42, volumeOf(board))
	for _, path := range []string{"/", "/console/app.js", "/api/devices", "/api/events"} {
		status, body = send(t, base, frontReq{method: "GET", path: path, header: map[string]string{"Sec-Fetch-Site": "same-origin"}})
		assert.Equal(t, http.StatusOK, status, "console GET %s: %s", path, body)
	}
	status, _ = send(t, base, frontReq{method: "GET", path: "/", header: map[string]string{"Sec-Fetch-Site": "none"}})
	assert.Equal(t, http.StatusOK, status, "the console opened from the address bar")
	status, _ = send(t, base, frontReq{method: "GET", path: "/", header: map[string]string{"Sec-Fetch-Site": "cross-site"}})
	assert.Equal(t, http.StatusOK, status, "a link to the console from another site opens it (a navigation changes nothing)")
}

// TestApprovalsNeedCredentialsWithOAuthOnly (defect 2): with an OAuth
// issuer and no control token, the OTA approvals, /metrics and
// /api/events refuse a request without credentials, as the rest of /api
// does; an access token for the bridge opens them.
func TestApprovalsNeedCredentialsWithOAuthOnly(t *testing.T) {
	noLeaks(t)
	is := testissuer.Start(t)
	cfg := testConfig()
	cfg.Auth.OAuth.Issuer = is.URL
	cfg.OTA.Approval = true
	cfg.OTA.DataDir = t.TempDir()
	a, base := startApp(t, cfg)

	// A board boots and waits for approval with a code on its screen.
	status, answer := send(t, "", frontReq{method: "POST", path: a.OTAURL(), body: `{"application":{"version":"2.4.2"},"mac_address":"` + frontMAC + `"}`,
		header: map[string]string{"Device-Id": frontMAC, "Client-Id": "1f0a0b0c-0000-4000-8000-0000000000f1", "Content-Type": "application/json"}})
	require.Equal(t, http.StatusOK, status, answer)
	require.Contains(t, answer, `"activation"`)

	for _, r := range []frontReq{
		{method: "GET", path: "/api/ota/devices"},
		{method: "POST", path: "/api/ota/devices/" + frontMAC + "/approve"},
		{method: "GET", path: "/api/devices"},
		{method: "GET", path: "/api/events"},
		{method: "GET", path: "/metrics"},
	} {
		status, body := send(t, base, r)
		assert.Equal(t, http.StatusUnauthorized, status, "%s %s without credentials: %s", r.method, r.path, body)
		assert.NotContains(t, body, frontMAC, "nothing about the pending board leaks")
	}
	var list struct {
		Devices []struct{ Approved, Pending bool }
	}
	hc := tokenClient(t, is.ES256(t, testissuer.Claims{"sub": "ops@example.com", "aud": base}))
	require.Equal(t, http.StatusOK, getWith(t, hc, base+"/api/ota/devices", &list))
	require.Len(t, list.Devices, 1)
	assert.True(t, list.Devices[0].Pending, "the unauthenticated approval did not go through")
	assert.Equal(t, http.StatusOK, obsPost(t, hc, base+"/api/ota/devices/"+frontMAC+"/approve", ""))
}

func portOf(base string) string { return base[strings.LastIndex(base, ":")+1:] }

// openRoutes are the routes that ask for no credentials, whatever is
// configured: probes, the console's files (a browser cannot send a bearer
// token for a page load) and, with OAuth, the metadata clients read
// before they hold a token. A route added later is authenticated unless
// it is added here, deliberately.
var openRoutes = []string{"GET /healthz", "GET /readyz", "GET /{$}", "GET /console/"}

var metadataRoutes = []string{"/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"}

// TestEveryRouteBehindTheDoor walks the control listener's route table in
// each authentication configuration: every route refuses a rebound Host
// and (but the metadata) a foreign Origin and a CORS-simple write; every
// route but the open ones refuses a request without credentials whenever
// credentials of any kind are configured (defect 2: the OTA approvals did
// not with OAuth alone).
func TestEveryRouteBehindTheDoor(t *testing.T) {
	noLeaks(t)
	is := testissuer.Start(t)
	for _, tc := range []struct {
		name   string
		mutate func(*app.Config)
		auth   bool
	}{
		{"no credentials", func(*app.Config) {}, false},
		{"static tokens", func(c *app.Config) { c.Control.Tokens, c.MCP.Tokens = []string{"ctl"}, []string{"mcp"} }, true},
		{"control token only", func(c *app.Config) { c.Control.Tokens = []string{"ctl"} }, true},
		{"oauth only", func(c *app.Config) { c.Auth.OAuth.Issuer = is.URL }, true},
		{"oauth and tokens", func(c *app.Config) {
			c.Auth.OAuth.Issuer = is.URL
			c.Control.Tokens, c.MCP.Tokens = []string{"ctl"}, []string{"mcp"}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.OTA.Approval = true
			tc.mutate(&cfg)
			a, base := startApp(t, cfg)
			routes := a.ControlRoutes()
			var open, cross []string
			for _, rt := range routes {
				if !rt.Authenticated {
					open = append(open, rt.Pattern)
				}
				if rt.CrossOrigin {
					cross = append(cross, rt.Pattern)
				}
				method, path := splitPattern(rt.Pattern)
				methods := []string{method}
				if method == "" {
					methods = []string{"GET", "POST"}
				}
				for _, m := range methods {
					what := m + " " + path + " (" + rt.Pattern + ")"
					status, body := send(t, base, frontReq{method: m, path: path, host: "evil.example"})
					assert.Equal(t, http.StatusForbidden, status, "%s, Host evil.example: %s", what, body)
					if !rt.CrossOrigin {
						status, body = send(t, base, frontReq{method: m, path: path, header: map[string]string{"Origin": "http://evil.example"}})
						assert.Equal(t, http.StatusForbidden, status, "%s, Origin evil.example: %s", what, body)
						if m == "POST" {
							status, body = send(t, base, frontReq{method: m, path: path, body: "{}",
								header: map[string]string{"Origin": "http://localhost:5173", "Content-Type": "text/plain"}})
							assert.Equal(t, http.StatusUnsupportedMediaType, status, "%s, text/plain from a browser: %s", what, body)
						}
					}
					status, body = send(t, base, frontReq{method: m, path: path})
					if rt.Authenticated && tc.auth {
						assert.Equal(t, http.StatusUnauthorized, status, "%s without credentials: %s", what, body)
						assert.NotEmpty(t, body)
					} else {
						assert.NotContains(t, []int{http.StatusUnauthorized, http.StatusForbidden}, status, "%s is open: %s", what, body)
					}
				}
			}
			require.Greater(t, len(routes), 10, "the walk saw the whole table")
			wantOpen := openRoutes
			if cfg.Auth.OAuth.Issuer != "" {
				wantOpen = append(slices.Clone(openRoutes), metadataRoutes...)
				assert.ElementsMatch(t, metadataRoutes, cross, "only the OAuth metadata is readable from any origin")
			} else {
				assert.Empty(t, cross)
			}
			assert.ElementsMatch(t, wantOpen, open, "the open routes are exactly the documented ones")
		})
	}
}

// splitPattern turns a ServeMux pattern into a method ("" for any) and a
// path that matches it.
func splitPattern(p string) (method, path string) {
	if m, rest, ok := strings.Cut(p, " "); ok {
		method, p = m, rest
	}
	var b strings.Builder
	for _, seg := range strings.Split(p, "/") {
		switch {
		case seg == "{$}":
			seg = ""
		case strings.HasPrefix(seg, "{"):
			seg = "x"
		}
		b.WriteString(seg + "/")
	}
	return method, strings.TrimSuffix(b.String(), "/")
}

// TestFrontDoorConfig: control.allowed_origins (default: pages on this
// machine) and control.allowed_hosts have flags, are checked at start
// naming the key, and apply to every route; mcp.allowed_origins keeps
// working as the old name of the origin list, for the whole listener.
func TestFrontDoorConfig(t *testing.T) {
	cfg, err := app.ParseArgs("bridge", []string{"--allowed-origin", "https://app.example", "--mcp-allowed-origin", "http://lab.local:*",
		"--allowed-host", "bridge.lan"})
	require.NoError(t, err)
	assert.Equal(t, append(slices.Clone(frontdoor.DefaultAllowedOrigins), "https://app.example", "http://lab.local:*"), cfg.Control.AllowedOrigins)
	assert.Equal(t, []string{"bridge.lan"}, cfg.Control.AllowedHosts)

	path := filepath.Join(t.TempDir(), "bridge.yaml")
	for file, wantErr := range map[string]string{
		"mcp:\n  allowed_origins: [\"https://old.example\"]\n":                                                     "",
		"control:\n  allowed_origins: []\n  allowed_hosts: [bridge.lan, \"10.0.0.5\"]\n":                           "",
		"control:\n  allowed_origins: [localhost]\n":                                                               "control.allowed_origins",
		"control:\n  allowed_hosts: [\"http://bridge.lan\"]\n":                                                     "control.allowed_hosts",
		"control:\n  allowed_hosts: [\"bridge.lan:8080\"]\n":                                                       "control.allowed_hosts",
		"mcp:\n  allowed_origins: [\"ftp//x\"]\n":                                                                  "mcp.allowed_origins",
		"control:\n  allowed_origins: [\"https://a.example\"]\nmcp:\n  allowed_origins: [\"https://b.example\"]\n": "old name of control.allowed_origins",
	} {
		require.NoError(t, os.WriteFile(path, []byte(file), 0o600))
		_, err := app.ParseArgs("bridge", []string{"--config", path})
		if wantErr == "" {
			assert.NoError(t, err, file)
		} else {
			assert.ErrorContains(t, err, wantErr, file)
		}
	}

	cfg = testConfig()
	cfg.MCP.AllowedOrigins = []string{"https://app.example"} // the old key, now for every route
	cfg.Control.AllowedHosts = []string{"bridge.lan"}
	cfg.Auth.PublicURL = "https://bridge.example"
	_, base := startApp(t, cfg)
	for _, tc := range []struct {
		host, origin string
		status       int
	}{
		{"", "https://app.example", http.StatusOK},
		{"", "http://localhost:5173", http.StatusForbidden},
		{"bridge.lan:" + portOf(base), "", http.StatusOK},
		{"bridge.example", "", http.StatusOK},
		{"other.lan", "", http.StatusForbidden},
	} {
		h := map[string]string{}
		if tc.origin != "" {
			h["Origin"] = tc.origin
		}
		for _, path := range []string{"/api/devices", "/mcp"} {
			m, body := http.MethodGet, ""
			if path == "/mcp" {
				m, body = http.MethodPost, `{"jsonrpc":"2.0","id":1,"method":"ping"}`
				h["Content-Type"], h["Accept"] = "application/json", "application/json, text/event-stream"
			}
			status, got := send(t, base, frontReq{method: m, path: path, body: body, host: tc.host, header: h})
			if tc.status == http.StatusOK {
				assert.NotEqual(t, http.StatusForbidden, status, "%s Host %q Origin %q: %s", path, tc.host, tc.origin, got)
			} else {
				assert.Equal(t, tc.status, status, "%s Host %q Origin %q: %s", path, tc.host, tc.origin, got)
			}
		}
	}
}
