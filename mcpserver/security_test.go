package mcpserver_test

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/mcpserver"
	"github.com/devicebridge/devicebridge/simulator"
)

const initBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`

func TestOrigin(t *testing.T) {
	b := startBridge(t, nil)
	for origin, want := range map[string]int{
		"":                         http.StatusOK,
		"http://localhost:5173":    http.StatusOK,
		"http://127.0.0.1:3000":    http.StatusOK,
		"https://localhost":        http.StatusOK,
		"http://[::1]:8080":        http.StatusOK,
		"http://evil.example":      http.StatusForbidden,
		"http://localhost.evil.io": http.StatusForbidden,
		"null":                     http.StatusForbidden,
	} {
		hdr := map[string]string{}
		if origin != "" {
			hdr["Origin"] = origin
		}
		status, _, body := rawStatus(b, "POST", initBody, hdr)
		assert.Equal(t, want, status, "Origin %q: %s", origin, body)
	}

	// A configured list replaces the defaults.
	b2 := startBridge(t, func(c *app.Config) { c.MCP.AllowedOrigins = []string{"https://app.example", "http://lab.local:*"} })
	for origin, want := range map[string]int{
		"https://app.example":      http.StatusOK,
		"https://app.example:443":  http.StatusOK,
		"https://app.example:8443": http.StatusForbidden,
		"http://lab.local:9000":    http.StatusOK,
		"http://localhost:5173":    http.StatusForbidden,
	} {
		status, _, _ := rawStatus(b2, "POST", initBody, map[string]string{"Origin": origin})
		assert.Equal(t, want, status, "Origin %q", origin)
	}

	// The front door's DNS-rebinding check covers /mcp (go-sdk's own is off).
	req := rawRequest(b, "POST", initBody, nil)
	req.Host = "evil.example"
	resp := do(b, req)
	resp.Body.Close()
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
}

// bearer adds a token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

func TestBearerToken(t *testing.T) {
	b := startBridge(t, func(c *app.Config) { c.MCP.Tokens = []string{"s3cret", "other"} })
	b.Board(macA, "breadboard", simulator.Config{})

	status, hdr, body := rawStatus(b, "POST", initBody, nil)
	assert.Equal(t, http.StatusUnauthorized, status)
	assert.Contains(t, hdr.Get("WWW-Authenticate"), "Bearer")
	assert.Contains(t, body, "Authorization: Bearer")
	status, _, _ = rawStatus(b, "POST", initBody, map[string]string{"Authorization": "Bearer wrong"})
	assert.Equal(t, http.StatusUnauthorized, status)
	status, _, _ = rawStatus(b, "POST", initBody, map[string]string{"Authorization": "Basic s3cret"})
	assert.Equal(t, http.StatusUnauthorized, status)
	status, _, _ = rawStatus(b, "POST", initBody, map[string]string{"Authorization": "Bearer s3cret"})
	assert.Equal(t, http.StatusOK, status)

	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			hc := &http.Client{Transport: bearer{"s3cret", b.HTTP.Transport}}
			cs := b.ClientWith(era, nil, hc)
			res := callTool(t, cs, upstreamName(macA, "self.audio_speaker.set_volume"), map[string]any{"volume": 5})
			require.False(t, res.IsError)

			// A session opened with one token cannot be used with another.
			if era == legacy {
				status, _, _ := rawStatus(b, "POST", `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
					map[string]string{"Authorization": "Bearer other", "Mcp-Session-Id": cs.ID(), "MCP-Protocol-Version": legacy})
				assert.Equal(t, http.StatusForbidden, status)
			}
		})
	}

	// Without MCP tokens of its own, /mcp takes the control API's.
	b2 := startBridge(t, func(c *app.Config) { c.Control.Tokens = []string{"ctl"} })
	status, _, _ = rawStatus(b2, "POST", initBody, nil)
	assert.Equal(t, http.StatusUnauthorized, status)
	status, _, _ = rawStatus(b2, "POST", initBody, map[string]string{"Authorization": "Bearer ctl"})
	assert.Equal(t, http.StatusOK, status)
}

func TestRequestSizeLimit(t *testing.T) {
	b := startBridge(t, func(c *app.Config) { c.MCP.MaxBodyBytes = 4096 })
	b.Board(macA, "breadboard", simulator.Config{})
	big := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},` +
		`"clientInfo":{"name":"` + strings.Repeat("x", 5000) + `","version":"1"}}}`
	status, _, body := rawStatus(b, "POST", big, nil)
	assert.Equal(t, http.StatusRequestEntityTooLarge, status)
	assert.JSONEq(t, `{"jsonrpc":"2.0","id":1,"error":{"code":-32600,"message":"request body exceeds 4096 bytes (see mcp.max_body_bytes); send less data"}}`, body)
	status, _, body = rawStatus(b, "POST", `{"jsonrpc":"2.0","method":"x","params":{"pad":"`+strings.Repeat("x", 5000)+`"},"id":9}`, nil)
	assert.Equal(t, http.StatusRequestEntityTooLarge, status)
	assert.Contains(t, body, "exceeds 4096 bytes", "no id before the cut: a plain error")

	// Through a client: an oversized call fails, the session survives.
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			cs := b.Client(era, nil)
			ctx, cancel := withTimeout(5e9)
			defer cancel()
			_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: upstreamName(macA, "self.screen.set_theme"),
				Arguments: map[string]any{"theme": strings.Repeat("d", 5000)}})
			require.ErrorContains(t, err, "exceeds 4096 bytes")
			res := callTool(t, cs, upstreamName(macA, "self.screen.set_theme"), map[string]any{"theme": "dark"})
			require.False(t, res.IsError)
		})
	}

	// The default limit is 4 MiB.
	b2 := startBridge(t, nil)
	huge := `{"jsonrpc":"2.0","id":1,"method":"ping","params":{"_meta":{"pad":"` + strings.Repeat("x", 4<<20) + `"}}}`
	status, _, _ = rawStatus(b2, "POST", huge, nil)
	assert.Equal(t, http.StatusRequestEntityTooLarge, status)
}

// TestRateLimit: outside a session requests are counted per client
// address, inside one per session; a refusal is 429 with Retry-After and a
// JSON-RPC error for the request's id that names mcp.rate_limit.
func TestRateLimit(t *testing.T) {
	b := startBridge(t, func(c *app.Config) {
		c.MCP.RateLimit = 0.5 // one token every two seconds: nothing refills during the test
		c.MCP.RateBurst = 3
	})
	var codes []int
	for range 5 {
		status, hdr, body := rawStatus(b, "POST", initBody, nil)
		codes = append(codes, status)
		if status == http.StatusTooManyRequests {
			refusal(t, hdr.Get("Retry-After"), body, "mcp.rate_limit")
		}
	}
	assert.Equal(t, []int{200, 200, 200, 429, 429}, codes)

	// Inside a session each session has its own budget.
	b2 := startBridge(t, func(c *app.Config) {
		c.MCP.RateLimit = 0.5
		c.MCP.RateBurst = 4
	})
	// initialize counts for the address, notifications/initialized for
	// the session.
	sid := rawSession(b2, legacy)
	hdr := map[string]string{"Mcp-Session-Id": sid, "MCP-Protocol-Version": legacy}
	codes = nil
	for range 5 {
		status, _, _ := rawStatus(b2, "POST", `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`, hdr)
		codes = append(codes, status)
	}
	assert.Equal(t, []int{200, 200, 200, 429, 429}, codes)
	sid2 := rawSession(b2, legacy)
	status, _, _ := rawStatus(b2, "POST", `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`,
		map[string]string{"Mcp-Session-Id": sid2, "MCP-Protocol-Version": legacy})
	assert.Equal(t, http.StatusOK, status, "another session has its own budget")
}

// modernList is a stateless (2026-07-28) tools/list with id 1.
const modernList = `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{` +
	`"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`

// TestRateLimitStateless: a stateless client has no session; behind
// tokens its budget is its verified identity's, so two callers on one
// address (a NAT, one machine) do not share one, and one caller does not
// get more by changing address or token.
func TestRateLimitStateless(t *testing.T) {
	b := startBridge(t, func(c *app.Config) {
		c.MCP.Tokens = []string{"kitchen=k-one", "kitchen=k-two", "hall=h-one"}
		c.MCP.RateLimit = 0.01 // nothing refills during the test
		c.MCP.RateBurst = 3
	})
	as := func(token string) map[string]string {
		return map[string]string{"MCP-Protocol-Version": modern, "Mcp-Method": "tools/list", "Authorization": "Bearer " + token}
	}
	var codes []int
	for _, token := range []string{"k-one", "k-two", "k-one", "k-two"} {
		status, hdr, body := rawStatus(b, "POST", modernList, as(token))
		codes = append(codes, status)
		if status == http.StatusTooManyRequests {
			refusal(t, hdr.Get("Retry-After"), body, "mcp.rate_limit")
		}
	}
	assert.Equal(t, []int{200, 200, 200, 429}, codes, "one identity, one budget, whichever of its tokens")
	status, _, body := rawStatus(b, "POST", modernList, as("h-one"))
	assert.Equal(t, http.StatusOK, status, "another identity on the same address has its own budget: %s", body)
}

// TestRateLimitDefaults: at the default mcp.rate_limit a stateless
// client may send as many requests at once as a whole run of the official
// conformance suite sends from its one address (suiteRequests) without a
// refusal, and so may a session. The bucket starts full and its burst
// covers the whole run, so this holds whatever the timing.
func TestRateLimitDefaults(t *testing.T) {
	b := startBridge(t, nil)
	require.GreaterOrEqual(t, mcpserver.DefaultRateBurst, 3*suiteRequests, "the default burst leaves room over the suite's")
	hdr := map[string]string{"MCP-Protocol-Version": modern, "Mcp-Method": "tools/list"}
	for i := range suiteRequests {
		status, _, body := rawStatus(b, "POST", modernList, hdr)
		require.Equal(t, http.StatusOK, status, "stateless request %d: %s", i+1, body)
	}
	sid := rawSession(b, legacy)
	hdr = map[string]string{"Mcp-Session-Id": sid, "MCP-Protocol-Version": legacy}
	for i := range suiteRequests {
		status, _, body := rawStatus(b, "POST", `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`, hdr)
		require.Equal(t, http.StatusOK, status, "session request %d: %s", i+1, body)
	}
}

// suiteRequests rounds up what one run of the conformance suite sends
// outside a session, all from one address (measured against this bridge:
// 124 for 0.2.0-alpha.12 --suite all, 31 for 0.1.16; docs/mcp.md).
const suiteRequests = 128

func TestSessionIDs(t *testing.T) {
	b := startBridge(t, nil)
	a := b.Client(legacy, nil).ID()
	c := b.Client(legacy, nil).ID()
	assert.NotEqual(t, a, c)
	// crypto/rand.Text: 26 characters of base32, 128 bits.
	assert.Regexp(t, regexp.MustCompile(`^[A-Z2-7]{26}$`), a)
}

// TestArgumentsNotLoggedAtInfo: a call refused for its arguments is
// logged at info (it is the caller's mistake, not the bridge's), and the
// refusal quotes the caller's values back to the caller, but the log line
// names the arguments at fault without their values: tool arguments are
// payload, kept out of logs above debug.
func TestArgumentsNotLoggedAtInfo(t *testing.T) {
	b := startBridge(t, nil)
	b.Board("aa:00:00:00:a1:01", "breadboard", simulator.Config{})
	cs := b.Client("legacy", nil)
	require.Eventually(t, func() bool { return len(toolNames(t, cs)) > 0 }, 10*time.Second, 10*time.Millisecond, "tools listed")
	const canary = "payload-canary-8e1f"
	res := callTool(t, cs, "dev_00a101_audio_speaker_set_volume", map[string]any{"volume": canary})
	require.True(t, res.IsError)
	assert.Contains(t, text(res), canary, "the caller sees what it sent")
	var seen bool
	for _, e := range b.Logs.FilterMessage("tool call").All() {
		if e.Level < zapcore.InfoLevel {
			continue
		}
		seen = true
		for k, v := range e.ContextMap() {
			assert.NotContains(t, fmt.Sprint(v), canary, "field %s of an info line", k)
		}
	}
	assert.True(t, seen, "the refused call is logged at info")
}

// TestMethodsWithoutParams: every method the bridge serves answers a
// request that has no params, or null params, with a JSON-RPC message, in
// both eras; none takes the bridge down. (tasks/list without params, as
// the TypeScript SDK v1 sends it, once reached go-sdk's ClientCapabilities
// with a nil *taskParams, whose promoted isNil dereferences it: a panic
// that ended the process.)
func TestMethodsWithoutParams(t *testing.T) {
	b := startBridge(t, func(c *app.Config) { c.MCP.RateLimit = -1 })
	methods := []string{
		"tools/list", "tools/call", "resources/list", "resources/templates/list", "resources/read",
		"resources/subscribe", "resources/unsubscribe", "prompts/list", "prompts/get", "completion/complete",
		"logging/setLevel", "ping", "subscriptions/listen",
		"tasks/get", "tasks/result", "tasks/list", "tasks/cancel", "tasks/update",
		"capabilities", "interaction.start", "interaction.respond", "interaction.getState", "interaction.cancel",
	}
	sid := rawSession(b, legacy)
	for _, era := range eras {
		for _, params := range []string{``, `,"params":null`} {
			for i, method := range methods {
				body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":%q%s}`, i+2, method, params)
				hdr := map[string]string{"MCP-Protocol-Version": era}
				if era == legacy {
					hdr["Mcp-Session-Id"] = sid
				} else {
					hdr["Mcp-Method"] = method
				}
				resp := do(b, rawRequest(b, "POST", body, hdr))
				msg := map[string]any{}
				if resp.StatusCode == http.StatusOK {
					msg = rawMessage(t, resp)
				} else {
					resp.Body.Close()
				}
				_, answered := msg["result"]
				if _, failed := msg["error"]; failed {
					answered = true
				}
				assert.True(t, answered || resp.StatusCode == http.StatusBadRequest,
					"%s %s%s: status %d, %v", era, method, params, resp.StatusCode, msg)
			}
		}
	}
	// tasks/list without params is the first page.
	resp := do(b, rawRequest(b, "POST", `{"jsonrpc":"2.0","id":100,"method":"tasks/list"}`,
		map[string]string{"MCP-Protocol-Version": legacy, "Mcp-Session-Id": sid}))
	msg := rawMessage(t, resp)
	res, _ := msg["result"].(map[string]any)
	require.NotNil(t, res, "%v", msg)
	assert.Equal(t, []any{}, res["tasks"])
	// Still serving.
	cs := b.Client(legacy, nil)
	require.NoError(t, cs.Ping(t.Context(), nil))
}
