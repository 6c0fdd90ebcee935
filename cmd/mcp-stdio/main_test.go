package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/devicebridge/devicebridge/internal/bridgetest"
	"github.com/devicebridge/devicebridge/simulator"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// command is one run of mcp-stdio with a host that never says anything.
type command struct {
	stderr bridgetest.SyncBuffer
	done   chan int // the exit status
	cancel context.CancelFunc
}

func start(t *testing.T, env map[string]string, args ...string) *command {
	t.Helper()
	stdin, hostOut := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	c := &command{done: make(chan int, 1), cancel: cancel}
	go func() {
		c.done <- run(ctx, args, stdin, nopCloser{io.Discard}, &c.stderr, func(k string) string { return env[k] })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-c.done:
		case <-time.After(5 * time.Second):
			t.Error("mcp-stdio did not stop")
		}
		_ = hostOut.Close()
	})
	return c
}

func (c *command) exitStatus(t *testing.T) int {
	t.Helper()
	select {
	case code := <-c.done:
		c.done <- code // for the cleanup
		return code
	case <-time.After(10 * time.Second):
		t.Fatalf("mcp-stdio is still running; stderr:\n%s", c.stderr.String())
		return 0
	}
}

// guardedServer is a real go-sdk MCP server on loopback behind the SDK's
// bearer-token middleware: "good" passes, "unscoped" is a valid token
// without the required scope (403), anything else is unknown (401).
func guardedServer(t *testing.T) string {
	t.Helper()
	srv := mcp.NewServer(&mcp.Implementation{Name: "bridge", Version: "1"}, nil)
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		exp := time.Now().Add(time.Hour)
		switch token {
		case "good":
			return &auth.TokenInfo{Scopes: []string{"devices"}, Expiration: exp}, nil
		case "unscoped":
			return &auth.TokenInfo{Expiration: exp}, nil
		}
		return nil, auth.ErrInvalidToken
	}
	ts := httptest.NewServer(auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{Scopes: []string{"devices"}})(h))
	t.Cleanup(ts.Close)
	return ts.URL + "/mcp"
}

// TestRefusedTokenExits: a bridge that answers 401 or 403 makes mcp-stdio
// say so on stderr, naming the flag and the variable that set the token,
// and exit with status 1 instead of retrying forever.
func TestRefusedTokenExits(t *testing.T) {
	url := guardedServer(t)
	for _, tc := range []struct {
		name   string
		args   []string
		env    map[string]string
		status string
	}{
		{"wrong token by flag", []string{"--token", "wrong"}, nil, "401 Unauthorized"},
		{"wrong token by env", nil, map[string]string{tokenEnv: "wrong"}, "401 Unauthorized"},
		{"no token", nil, nil, "401 Unauthorized"},
		{"token without the scope", []string{"--token", "unscoped"}, nil, "403 Forbidden"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := start(t, tc.env, append([]string{"--url", url}, tc.args...)...)
			require.Equal(t, 1, c.exitStatus(t))
			out := c.stderr.String()
			assert.Contains(t, out, "the bridge rejected the token: "+tc.status)
			assert.Contains(t, out, "--token")
			assert.Contains(t, out, tokenEnv)
		})
	}
}

// TestGoodTokenKeepsRunning: the same server with the right token is
// served until the host goes away.
func TestGoodTokenKeepsRunning(t *testing.T) {
	c := start(t, map[string]string{tokenEnv: "good"}, "--url", guardedServer(t), "--log-level", "debug")
	require.Eventually(t, func() bool { return strings.Contains(c.stderr.String(), "connected to the bridge") },
		10*time.Second, 5*time.Millisecond)
	c.cancel()
	require.Equal(t, 0, c.exitStatus(t), c.stderr.String())
	assert.NotContains(t, c.stderr.String(), "rejected")
}

// TestUnreachableBridgeIsRetried: connection errors are not a refusal;
// mcp-stdio keeps trying until the host goes away.
func TestUnreachableBridgeIsRetried(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())

	c := start(t, nil, "--url", "http://"+addr+"/mcp")
	retries := func() int { return strings.Count(c.stderr.String(), "cannot reach the bridge; retrying") }
	require.Eventually(t, func() bool { return retries() >= 2 }, 20*time.Second, 10*time.Millisecond,
		"no retries; stderr:\n%s", c.stderr.String())
	select {
	case code := <-c.done:
		c.done <- code
		t.Fatalf("mcp-stdio gave up (status %d) on a bridge that is merely down", code)
	default:
	}
	c.cancel()
	require.Equal(t, 0, c.exitStatus(t))
}

// TestPipedRequestsAnsweredBeforeExit: a host that writes its requests and
// closes stdin at once (printf '…' | mcp-stdio) gets an answer to every
// request it sent before mcp-stdio exits, and the proxy's own shutdown is
// not reported as an unreachable bridge.
func TestPipedRequestsAnsweredBeforeExit(t *testing.T) {
	b := bridgetest.Start(t, nil)
	const mac = "02:00:00:00:00:01"
	b.Board(mac, "breadboard", simulator.Config{})
	in := strings.Join([]string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"sh","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"` + bridgetest.ToolName(mac, "self.get_device_status") + `","arguments":{}}}`,
	}, "\n") + "\n"
	var stdout, stderr bridgetest.SyncBuffer
	code := run(context.Background(), []string{"--url", b.URL, "--log-level", "debug"}, io.NopCloser(strings.NewReader(in)),
		nopCloser{&stdout}, &stderr, func(string) string { return "" })
	require.Equal(t, 0, code, stderr.String())

	answers := map[float64]map[string]any{}
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		var msg map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &msg), line)
		if id, ok := msg["id"].(float64); ok {
			answers[id] = msg
		}
	}
	require.Len(t, answers, 3, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	assert.Contains(t, answers[2]["result"], "tools")
	result, _ := answers[3]["result"].(map[string]any)
	require.NotNil(t, result, "tools/call answered with an error: %v", answers[3])
	assert.NotEqual(t, true, result["isError"], "%v", result)
	assert.Contains(t, fmt.Sprint(result["content"]), "audio_speaker")
	assert.NotContains(t, stderr.String(), "cannot reach the bridge")
	assert.NotContains(t, stderr.String(), "context canceled")
}
