package authn_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/devicebridge/devicebridge/audit"
	"github.com/devicebridge/devicebridge/authn"
	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/internal/testissuer"
	"github.com/devicebridge/devicebridge/policy"
)

// whoAmI answers with what the guard put in the request's context.
var whoAmI = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	ti := authn.TokenInfoFrom(r.Context())
	_ = json.NewEncoder(w).Encode(map[string]any{"identity": policy.IdentityFrom(r.Context()).Name, "verified": ti != nil})
})

func guarded(t *testing.T, g *authn.Guard, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(g.Middleware()(h))
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, srv *httptest.Server, authz string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestGuardOpenWithoutVerifier(t *testing.T) {
	srv := guarded(t, &authn.Guard{}, whoAmI)
	resp, body := get(t, srv, "Bearer anything")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.JSONEq(t, `{"identity":"`+policy.Anonymous+`","verified":false}`, body)
}

func TestGuardStaticTokens(t *testing.T) {
	dir := t.TempDir()
	al, err := audit.Open(filepath.Join(dir, "audit.log"), 0, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = al.Close() })
	core, logs := observer.New(zapcore.InfoLevel)
	var codes []string
	g := &authn.Guard{Verifier: authn.NewVerifier([]string{"kitchen=k-secret"}, nil), Via: "api", Keys: "control.tokens",
		Audit: al, Log: zap.New(core),
		Refuse: func(w http.ResponseWriter, _ *http.Request, status int, code, msg string) {
			codes = append(codes, code)
			http.Error(w, msg, status)
		}}
	srv := guarded(t, g, whoAmI)

	for _, authz := range []string{"", "Bearer", "Bearer wrong", "Basic k-secret", "k-secret"} {
		resp, body := get(t, srv, authz)
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%q", authz)
		assert.Equal(t, `Bearer realm="devicebridge"`, resp.Header.Get("WWW-Authenticate"))
		assert.Contains(t, body, "Authorization: Bearer <token> (see control.tokens)")
	}
	assert.Equal(t, []string{"unauthorized", "unauthorized", "unauthorized", "unauthorized", "unauthorized"}, codes)
	resp, body := get(t, srv, "bearer k-secret")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.JSONEq(t, `{"identity":"kitchen","verified":true}`, body)

	// One line at once, then at most one per 10 s: fewer than the refusals.
	lines := logs.FilterMessage("api request refused: missing or invalid bearer token").Len()
	assert.Less(t, lines, 5, "refusals are throttled in the log")
	assert.Positive(t, lines)
	f, err := os.Open(filepath.Join(dir, "audit.log"))
	require.NoError(t, err)
	defer f.Close()
	var n int
	for sc := bufio.NewScanner(f); sc.Scan(); n++ {
		var r audit.Record
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r))
		assert.Equal(t, audit.KindAdmission, r.Kind)
		assert.Equal(t, "api", r.Via)
		assert.Equal(t, "unauthenticated", r.Outcome)
		assert.NotContains(t, sc.Text(), "wrong", "the audit log never holds a token")
	}
	assert.Equal(t, 5, n, "every refusal is audited")
}

func TestGuardScopes(t *testing.T) {
	is, v := setup(t)
	g := &authn.Guard{Verifier: v, Via: "mcp", Keys: "mcp.tokens", Scopes: []string{"devices"},
		ResourceMetadataURL: "http://127.0.0.1:8080/.well-known/oauth-protected-resource/mcp"}
	srv := guarded(t, g, whoAmI)

	resp, body := get(t, srv, "")
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	assert.Equal(t, `Bearer realm="devicebridge", resource_metadata="http://127.0.0.1:8080/.well-known/oauth-protected-resource/mcp", scope="devices"`,
		resp.Header.Get("WWW-Authenticate"))
	assert.Contains(t, body, "or the OAuth metadata named in WWW-Authenticate")

	resp, body = get(t, srv, "Bearer "+is.RS256(t, testissuer.Claims{"sub": "bob", "aud": aud, "scope": "openid"}))
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.Contains(t, resp.Header.Get("WWW-Authenticate"), `error="insufficient_scope"`)
	assert.Contains(t, body, `"devices"`)

	resp, body = get(t, srv, "Bearer "+is.RS256(t, testissuer.Claims{"sub": "bob", "aud": aud, "scope": "openid devices"}))
	assert.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.JSONEq(t, `{"identity":"bob","verified":true}`, body)
	resp, _ = get(t, srv, "Bearer k-secret")
	assert.Equal(t, http.StatusOK, resp.StatusCode, "static tokens carry no scopes and are not checked")
}

// TestRequireVerified: behind Middleware, go-sdk's RequireBearerToken gets
// the verified TokenInfo (it binds MCP sessions to it); without Middleware
// it fails closed.
func TestRequireVerified(t *testing.T) {
	sdk := authn.RequireVerified()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, auth.TokenInfoFromContext(r.Context()).UserID)
	}))
	srv := guarded(t, &authn.Guard{Verifier: authn.NewVerifier([]string{"kitchen=k-secret"}, nil)}, sdk)
	resp, body := get(t, srv, "Bearer k-secret")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "kitchen", body)

	bare := httptest.NewServer(sdk)
	t.Cleanup(bare.Close)
	resp, _ = get(t, bare, "Bearer k-secret")
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "not verified by Middleware: refused")
}

// TestRefusalReasonIsCut: why a token was refused may quote what the token
// claims (an audience, an issuer), which the caller chose; the refusal's
// line quotes it cut.
func TestRefusalReasonIsCut(t *testing.T) {
	is, v := setup(t)
	core, logs := observer.New(zapcore.InfoLevel)
	srv := guarded(t, &authn.Guard{Verifier: v, Via: "api", Log: zap.New(core)}, whoAmI)
	long := strings.Repeat("a", 20_000)
	tok := is.RS256(t, testissuer.Claims{"sub": "alice", "aud": long, "iss": long})
	resp, _ := get(t, srv, "Bearer "+tok)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	lines := logs.FilterMessageSnippet("request refused").All()
	require.Len(t, lines, 1)
	assert.LessOrEqual(t, len(lines[0].ContextMap()["why"].(string)), clip.Max+40, "%.300s", lines[0].ContextMap()["why"])
}
