package app_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/audit"
	"github.com/devicebridge/devicebridge/internal/testissuer"
	"github.com/devicebridge/devicebridge/simulator"
)

const (
	kitchenMAC = "02:00:00:00:0a:01"
	officeMAC  = "02:00:00:00:0b:01"
	// The static token of the kitchen agent, and of an identity the
	// policy does not name.
	kitchenSecret  = "kitchen-secret-0123456789"
	strangerSecret = "stranger-secret-0123456789"
)

const accessPolicy = `identities:
  kitchen:
    boards: ["` + kitchenMAC + `"]
    confirm: ["self.screen.*"]  # asked of whoever calls
  office:                       # a group of the OAuth user
    boards: ["office"]          # by alias
    tools: ["self.get_device_status", "self.audio_speaker.*"]
    confirm: ["self.reboot"]
`

// accessBridge is a bridge that takes OAuth tokens from a test issuer and
// named static tokens, with a policy and an audit log.
type accessBridge struct {
	app             *app.App
	base            string
	issuer          *testissuer.Issuer
	policy, auditTo string
}

func startAccessBridge(t *testing.T, mutate ...func(*app.Config)) *accessBridge {
	is := testissuer.Start(t)
	dir := t.TempDir()
	ab := &accessBridge{issuer: is, policy: filepath.Join(dir, "policy.yaml"), auditTo: filepath.Join(dir, "audit.log")}
	require.NoError(t, os.WriteFile(ab.policy, []byte(accessPolicy), 0o600))
	cfg := testConfig()
	cfg.MCP.Tokens = []string{"kitchen=" + kitchenSecret, "stranger=" + strangerSecret}
	cfg.Control.Tokens = cfg.MCP.Tokens
	cfg.MCP.Aliases = map[string]string{kitchenMAC: "kitchen", officeMAC: "office"}
	cfg.Auth.OAuth.Issuer = is.URL
	cfg.Auth.OAuth.GroupsClaim = "groups"
	cfg.Auth.PolicyFile = ab.policy
	cfg.Auth.PolicyCheckInterval = 10 * time.Millisecond
	cfg.Auth.AuditLog = ab.auditTo
	for _, m := range mutate {
		m(&cfg)
	}
	ab.app, ab.base = startApp(t, cfg)
	for _, mac := range []string{kitchenMAC, officeMAC} {
		obsBoard(t, ab.app, simulator.Config{MAC: mac})
	}
	require.Eventually(t, func() bool {
		return ab.app.MCP().Published(kitchenMAC) && ab.app.MCP().Published(officeMAC)
	}, obsWait, 5*time.Millisecond)
	return ab
}

// officeToken is an OAuth access token of a user in the office group.
func (ab *accessBridge) officeToken(t *testing.T) string {
	return ab.issuer.ES256(t, testissuer.Claims{"sub": "bob@example.com", "aud": ab.base + "/mcp", "groups": []string{"office"}})
}

func mcpSession(t *testing.T, base string, hc *http.Client, era string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "access-test", Version: "1"}, nil)
	require.NoError(t, mcp.AddSendingCustomMethod[*flowStartParams, *flowStepResult](c, "interaction.start"))
	ctx, cancel := context.WithTimeout(context.Background(), obsWait)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: hc, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: era})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func mcpTools(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	var names []string
	for tool, err := range cs.Tools(context.Background(), nil) {
		require.NoError(t, err)
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	return names
}

func mcpCall(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) (string, bool) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	require.NoError(t, err)
	var text []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text = append(text, tc.Text)
		}
	}
	return strings.Join(text, "\n"), res.IsError
}

// TestOAuthDiscoveryAsAClientDoesIt: an unauthenticated request gets a
// 401 naming the protected-resource metadata; the metadata names the
// issuer; the issuer's metadata is found where RFC 8414 puts it.
func TestOAuthDiscoveryAsAClientDoesIt(t *testing.T) {
	noLeaks(t)
	ab := startAccessBridge(t)
	ctx := context.Background()
	for _, c := range []struct{ path, resource string }{{"/mcp", ab.base + "/mcp"}, {"/api/devices", ab.base}} {
		var resp *http.Response
		var err error
		if c.path == "/mcp" {
			resp, err = http.Post(ab.base+c.path, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
		} else {
			resp, err = http.Get(ab.base + c.path)
		}
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, c.path)
		challenges, err := oauthex.ParseWWWAuthenticate(resp.Header.Values("WWW-Authenticate"))
		require.NoError(t, err)
		require.Len(t, challenges, 1)
		require.Equal(t, "bearer", challenges[0].Scheme)
		metaURL := challenges[0].Params["resource_metadata"]
		require.NotEmpty(t, metaURL, c.path)

		prm, err := oauthex.GetProtectedResourceMetadata(ctx, metaURL, c.resource, http.DefaultClient)
		require.NoError(t, err, c.path)
		require.Equal(t, []string{ab.issuer.URL}, prm.AuthorizationServers)
		asm, err := oauthex.GetAuthServerMeta(ctx, ab.issuer.URL+"/.well-known/oauth-authorization-server", prm.AuthorizationServers[0], http.DefaultClient)
		require.NoError(t, err)
		require.NotNil(t, asm)
		require.Equal(t, ab.issuer.URL+"/token", asm.TokenEndpoint)
	}
	// Browsers (the Inspector) may read the metadata cross-origin.
	req, _ := http.NewRequest(http.MethodGet, ab.base+"/.well-known/oauth-protected-resource/mcp", nil)
	req.Header.Set("Origin", "http://localhost:6274")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "*", resp.Header.Get("Access-Control-Allow-Origin"))

	// Tokens the bridge must refuse on /mcp itself.
	bad := map[string]string{
		"wrong audience": ab.issuer.RS256(t, testissuer.Claims{"sub": "bob", "aud": "http://elsewhere/mcp"}),
		"alg none":       ab.issuer.AlgNone(testissuer.Claims{"sub": "bob", "aud": ab.base + "/mcp"}),
		"HS256 pubkey":   ab.issuer.HS256WithPublicKey(testissuer.Claims{"sub": "bob", "aud": ab.base + "/mcp"}),
	}
	for name, tok := range bad {
		status := obsPost(t, tokenClient(t, tok), ab.base+"/mcp", `{"jsonrpc":"2.0","id":1,"method":"ping"}`)
		require.Equal(t, http.StatusUnauthorized, status, name)
	}
}

// TestPolicySeparatesIdentities: the kitchen agent (a named static token)
// and an office user (an OAuth token, through its group) see different
// tools and cannot call each other's boards through /mcp or the control
// API; an identity the policy does not name sees nothing; every call is
// audited without secrets; a bad policy file keeps the old policy.
func TestPolicySeparatesIdentities(t *testing.T) {
	noLeaks(t)
	ab := startAccessBridge(t)
	officeTok := ab.officeToken(t)
	kitchenHC, officeHC, strangerHC := tokenClient(t, kitchenSecret), tokenClient(t, officeTok), tokenClient(t, strangerSecret)

	kitchen := mcpSession(t, ab.base, kitchenHC, "2025-11-25")
	office := mcpSession(t, ab.base, officeHC, "2026-07-28")
	stranger := mcpSession(t, ab.base, strangerHC, "2025-11-25")

	kitchenTools := mcpTools(t, kitchen)
	require.NotEmpty(t, kitchenTools)
	for _, n := range kitchenTools {
		require.True(t, strings.HasPrefix(n, "kitchen_"), "kitchen sees only its board: %s", n)
	}
	require.Contains(t, kitchenTools, "kitchen_screen_set_theme", "no tools: list means every tool of the board")
	require.Equal(t, []string{"office_audio_speaker_set_volume", "office_get_device_status"}, mcpTools(t, office))
	require.Empty(t, mcpTools(t, stranger), "an identity not in the policy sees nothing")

	text, isErr := mcpCall(t, kitchen, "kitchen_get_device_status", nil)
	require.False(t, isErr, text)
	text, isErr = mcpCall(t, kitchen, "kitchen_screen_set_theme", map[string]any{"theme": "dark"})
	require.True(t, isErr, "the policy's confirm list needs the user's yes")
	require.Contains(t, text, "needs the user's confirmation")
	text, isErr = mcpCall(t, kitchen, "office_get_device_status", nil)
	require.True(t, isErr)
	require.Contains(t, text, "not allowed for kitchen")
	text, isErr = mcpCall(t, office, "office_lamp_turn_on", nil)
	require.True(t, isErr)
	require.Contains(t, text, "not allowed for bob@example.com (policy): self.lamp.turn_on on board", "the tool name as the board spells it")
	text, isErr = mcpCall(t, office, "kitchen_get_device_status", nil)
	require.True(t, isErr)
	require.Contains(t, text, "not allowed for bob@example.com")
	_, isErr = mcpCall(t, office, "office_audio_speaker_set_volume", map[string]any{"volume": 30})
	require.False(t, isErr)

	// Interactions: a denied tool cannot be started either.
	_, err := mcp.CallCustomMethod[*flowStartParams, *flowStepResult](context.Background(), kitchen, "interaction.start",
		&flowStartParams{ToolName: "office_get_device_status"})
	require.ErrorContains(t, err, "not allowed for kitchen")

	// The control API asks the same policy.
	var list deviceList
	require.Equal(t, http.StatusOK, getWith(t, kitchenHC, ab.base+"/api/devices", &list))
	require.Len(t, list.Devices, 1)
	require.Equal(t, kitchenMAC, list.Devices[0].DeviceID)
	list = deviceList{}
	require.Equal(t, http.StatusOK, getWith(t, officeHC, ab.base+"/api/devices", &list))
	require.Len(t, list.Devices, 1)
	require.Equal(t, officeMAC, list.Devices[0].DeviceID)
	require.Equal(t, 2, list.Devices[0].ToolCount, "only the tools the policy allows")
	list = deviceList{}
	require.Equal(t, http.StatusOK, getWith(t, strangerHC, ab.base+"/api/devices", &list))
	require.Empty(t, list.Devices)
	require.Equal(t, http.StatusNotFound, getWith(t, kitchenHC, ab.base+"/api/devices/"+officeMAC, nil))

	require.Equal(t, http.StatusForbidden, obsPost(t, kitchenHC, ab.base+"/api/devices/"+officeMAC+"/call", `{"name":"self.get_device_status"}`))
	require.Equal(t, http.StatusForbidden, obsPost(t, officeHC, ab.base+"/api/devices/"+officeMAC+"/call", `{"name":"self.reboot"}`))
	require.Equal(t, http.StatusOK, obsPost(t, officeHC, ab.base+"/api/devices/"+officeMAC+"/call", `{"name":"self.get_device_status"}`))

	// Refusals are counted by policy identity (a bounded label).
	metrics := scrapeMetrics(t, kitchenHC, ab.base)
	require.Equal(t, 3.0, metrics[metricSeries("devicebridge_policy_denials_total", "identity", "kitchen")])
	require.Equal(t, 3.0, metrics[metricSeries("devicebridge_policy_denials_total", "identity", "office")])

	// The audit log has every call, with identities and outcomes, and no
	// credential.
	records := readAudit(t, ab.auditTo)
	var seen []string
	for _, r := range records {
		if r.Kind == audit.KindToolCall {
			seen = append(seen, r.Via+" "+r.Identity+" "+r.Board+" "+r.Tool+" "+r.Outcome)
		}
	}
	for _, want := range []string{
		"mcp kitchen " + kitchenMAC + " self.get_device_status ok",
		"mcp kitchen " + officeMAC + " self.get_device_status denied",
		"mcp bob@example.com " + officeMAC + " self.lamp.turn_on denied",
		"mcp bob@example.com " + officeMAC + " self.audio_speaker.set_volume ok",
		"api kitchen " + officeMAC + " self.get_device_status denied",
		"api bob@example.com " + officeMAC + " self.get_device_status ok",
	} {
		require.Contains(t, seen, want)
	}
	raw, err := os.ReadFile(ab.auditTo)
	require.NoError(t, err)
	for _, secret := range []string{kitchenSecret, strangerSecret, officeTok, strings.Split(officeTok, ".")[2]} {
		require.NotContains(t, string(raw), secret, "the audit log holds no credential")
	}

	// The control API's guided calls (console, CLI) ask the same policy.
	require.Equal(t, http.StatusForbidden, obsPost(t, kitchenHC, ab.base+"/api/devices/"+officeMAC+"/interactions", `{"name":"self.get_device_status"}`))
	require.Equal(t, http.StatusForbidden, obsPost(t, officeHC, ab.base+"/api/devices/"+officeMAC+"/interactions", `{"name":"self.reboot"}`))
	require.Equal(t, http.StatusOK, obsPost(t, officeHC, ab.base+"/api/devices/"+officeMAC+"/interactions", `{"name":"self.audio_speaker.set_volume"}`))

	// A bad policy file is refused, naming the line; the old one stays.
	require.NoError(t, os.WriteFile(ab.policy, []byte(accessPolicy+"  broken:\n    boards: *\n"), 0o600))
	err = ab.app.ReloadPolicy()
	require.ErrorContains(t, err, "line ")
	require.Len(t, mcpTools(t, kitchen), len(kitchenTools), "the old policy stays in force")
	_, isErr = mcpCall(t, kitchen, "kitchen_get_device_status", nil)
	require.False(t, isErr)

	// A good file is picked up on change.
	require.NoError(t, os.WriteFile(ab.policy, []byte(strings.Replace(accessPolicy, `boards: ["`+kitchenMAC+`"]`, `boards: ["*"]`, 1)), 0o600))
	require.Eventually(t, func() bool { return slices.Contains(mcpTools(t, kitchen), "office_lamp_turn_on") }, obsWait, 10*time.Millisecond)
}

type flowStartParams struct {
	mcp.ParamsBase
	ToolName string `json:"toolName"`
}

type flowStepResult struct {
	mcp.ResultBase
	SessionID string `json:"sessionId"`
}

// TestEventsFollowThePolicy: an identity's /api/events stream carries
// only the boards and tools it may see.
func TestEventsFollowThePolicy(t *testing.T) {
	noLeaks(t)
	ab := startAccessBridge(t)
	kitchenHC, officeHC := tokenClient(t, kitchenSecret), tokenClient(t, ab.officeToken(t))
	resp, err := kitchenHC.Get(ab.base + "/api/events")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	events, comments := make(chan sseEvent, 16), make(chan string, 16)
	go readSSE(resp.Body, events, comments)
	<-comments // the stream is subscribed

	// A call on the office board first: the kitchen stream must skip it.
	require.Equal(t, http.StatusOK, obsPost(t, officeHC, ab.base+"/api/devices/"+officeMAC+"/call", `{"name":"self.get_device_status"}`))
	require.Equal(t, http.StatusOK, obsPost(t, kitchenHC, ab.base+"/api/devices/"+kitchenMAC+"/call", `{"name":"self.get_device_status"}`))
	ev := nextSSE(t, events)
	require.Equal(t, "call", ev.Event)
	require.Equal(t, kitchenMAC, ev.Data["device_id"], "the office call is not in the kitchen's stream")
	require.Greater(t, ev.Seq, 1, "ids count the bridge's events, not the stream's")

	// A replay follows the policy exactly as the live stream does: resumed
	// from before both calls, the kitchen gets its own call again and not
	// the office's, which the office's stream does replay.
	before := fmt.Sprintf("%s-%d", ev.Epoch, ev.Seq-2)
	kitchen := openSSE(t, kitchenHC, ab.base+"/api/events", before)
	replayed := nextSSE(t, kitchen)
	require.Equal(t, ev.ID, replayed.ID, "the office call is not replayed to the kitchen")
	require.Equal(t, kitchenMAC, replayed.Data["device_id"])
	office := openSSE(t, officeHC, ab.base+"/api/events", before)
	replayed = nextSSE(t, office)
	require.Equal(t, "call", replayed.Event)
	require.Equal(t, ev.Seq-1, replayed.Seq)
	require.Equal(t, officeMAC, replayed.Data["device_id"])
}

// TestRequiredScope: with auth.oauth.scopes, a token without them gets
// 403 insufficient_scope, named in WWW-Authenticate; static tokens are not
// scoped.
func TestRequiredScope(t *testing.T) {
	noLeaks(t)
	ab := startAccessBridge(t, func(c *app.Config) { c.Auth.OAuth.Scopes = []string{"devices"} })
	ping := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	claims := testissuer.Claims{"sub": "bob", "aud": ab.base + "/mcp", "groups": []string{"office"}}
	req, _ := http.NewRequest(http.MethodPost, ab.base+"/mcp", strings.NewReader(ping))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+ab.issuer.RS256(t, claims))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Contains(t, resp.Header.Get("WWW-Authenticate"), `error="insufficient_scope"`)
	require.Contains(t, resp.Header.Get("WWW-Authenticate"), `scope="devices"`)

	claims["scope"] = "openid devices"
	office := mcpSession(t, ab.base, tokenClient(t, ab.issuer.RS256(t, claims)), "2025-11-25")
	require.NotEmpty(t, mcpTools(t, office))
	kitchen := mcpSession(t, ab.base, tokenClient(t, kitchenSecret), "2025-11-25")
	require.NotEmpty(t, mcpTools(t, kitchen))
}

// TestPolicyInCompactMode: the three fixed tools show and run only what
// the caller's policy allows.
func TestPolicyInCompactMode(t *testing.T) {
	noLeaks(t)
	ab := startAccessBridge(t, func(c *app.Config) { c.MCP.Compact = true })
	kitchen := mcpSession(t, ab.base, tokenClient(t, kitchenSecret), "2025-11-25")
	require.Equal(t, []string{"call_device_tool", "describe_device", "list_devices"}, mcpTools(t, kitchen))

	text, isErr := mcpCall(t, kitchen, "list_devices", nil)
	require.False(t, isErr, text)
	require.Contains(t, text, kitchenMAC)
	require.NotContains(t, text, officeMAC)
	_, isErr = mcpCall(t, kitchen, "describe_device", map[string]any{"device": officeMAC})
	require.True(t, isErr, "a board the caller may not see is not described")
	text, isErr = mcpCall(t, kitchen, "call_device_tool", map[string]any{"device": officeMAC, "tool": "self.get_device_status"})
	require.True(t, isErr)
	require.Contains(t, text, "not allowed for kitchen")
	text, isErr = mcpCall(t, kitchen, "call_device_tool", map[string]any{"device": kitchenMAC, "tool": "self.get_device_status"})
	require.False(t, isErr, text)
}

func getWith(t *testing.T, hc *http.Client, url string, out any) int {
	t.Helper()
	resp, err := hc.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	if out != nil && resp.StatusCode == http.StatusOK {
		require.NoError(t, json.NewDecoder(resp.Body).Decode(out))
	}
	return resp.StatusCode
}

func readAudit(t *testing.T, path string) []audit.Record {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var out []audit.Record
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r audit.Record
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r), sc.Text())
		out = append(out, r)
	}
	return out
}
