package mcpserver_test

import (
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest/observer"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/mcpserver"
	"github.com/devicebridge/devicebridge/simulator"
)

// floodIsOneLine checks one kind of line a caller can repeat: n
// occurrences (each a call of do) within its interval are one line; once
// the interval is over, the next occurrence's line counts the n-1 left
// out. match picks the kind's lines from the log.
func floodIsOneLine(t *testing.T, b *bridge, kind string, n int, match func(observer.LoggedEntry) bool, do func()) {
	t.Helper()
	th := mcpserver.Throttles(b.App.MCP())[kind]
	require.NotNil(t, th, kind)
	th.SetInterval(time.Hour)
	lines := func() []observer.LoggedEntry { return b.Logs.Filter(match).AllUntimed() }
	require.Empty(t, lines(), kind)
	for range n {
		do()
	}
	require.Len(t, lines(), 1, "%s: one line for a flood of %d", kind, n)
	require.EqualValues(t, n-1, th.Suppressed(), kind)
	th.SetInterval(time.Nanosecond)
	do()
	all := lines()
	require.Len(t, all, 2, kind)
	assert.EqualValues(t, n-1, all[1].ContextMap()["suppressed"], "%s: the next line counts the flood", kind)
}

func message(msg string) func(observer.LoggedEntry) bool {
	return func(e observer.LoggedEntry) bool { return e.Message == msg }
}

// TestCallerRefusalsAreThrottled: every refusal a caller of /mcp can
// repeat per request (rate, size, policy, confirmation, an unknown board
// or tool, a forged requestState) is one line per interval, with the
// count of what it left out.
func TestCallerRefusalsAreThrottled(t *testing.T) {
	const n = 20
	t.Run("rate limit", func(t *testing.T) {
		b := startBridge(t, func(c *app.Config) { c.MCP.RateLimit, c.MCP.RateBurst = 0.001, 1 })
		status, _, _ := rawStatus(b, "POST", initBody, nil)
		require.Equal(t, http.StatusOK, status)
		floodIsOneLine(t, b, "rate_limited", n, message("mcp request refused: rate limit"), func() {
			status, _, _ := rawStatus(b, "POST", initBody, nil)
			require.Equal(t, http.StatusTooManyRequests, status)
		})
	})
	t.Run("body too large", func(t *testing.T) {
		b := startBridge(t, func(c *app.Config) { c.MCP.MaxBodyBytes, c.MCP.RateLimit = 4096, -1 })
		big := `{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":"` + strings.Repeat("x", 5000) + `"}}`
		floodIsOneLine(t, b, "too_big", n, message("mcp request refused: body too large"), func() {
			status, _, _ := rawStatus(b, "POST", big, nil)
			require.Equal(t, http.StatusRequestEntityTooLarge, status)
		})
	})
	t.Run("policy, confirmation", func(t *testing.T) {
		b := startBridge(t, func(c *app.Config) {
			c.MCP.ShowUserOnlyTools = true
			c.MCP.RateLimit = -1 // the flood is of other refusals
			c.MCP.Tokens = []string{"kitchen=s3cret"}
			c.Auth.PolicyFile = t.TempDir() + "/policy.yaml"
			require.NoError(t, os.WriteFile(c.Auth.PolicyFile, []byte("identities:\n  kitchen:\n    boards: [\"*\"]\n    tools: [\"self.reboot\"]\n"), 0o600))
		})
		b.Board(macC, "robot", simulator.Config{})
		cs := b.ClientWith(legacy, nil, &http.Client{Transport: bearer{token: "s3cret", next: &http.Transport{}}})
		floodIsOneLine(t, b, "denied", n, message("tool call refused by policy"), func() {
			res := callTool(t, cs, upstreamName(macC, "self.audio_speaker.set_volume"), map[string]any{"volume": 5})
			require.True(t, res.IsError)
		})
		floodIsOneLine(t, b, "unconfirmed", n, message("tool call refused: needs confirmation"), func() {
			res := callTool(t, cs, upstreamName(macC, "self.reboot"), map[string]any{})
			require.True(t, res.IsError)
		})
	})
	t.Run("compact: unknown board or tool", func(t *testing.T) {
		b := startBridge(t, func(c *app.Config) { c.MCP.Compact, c.MCP.RateLimit = true, -1 })
		b.Board(macC, "robot", simulator.Config{})
		cs := b.Client(legacy, nil)
		long := strings.Repeat("x", 10_000)
		floodIsOneLine(t, b, "unknown_device", n, func(e observer.LoggedEntry) bool {
			return e.Message == "tool call rejected" && e.ContextMap()["outcome"] == "unknown_device"
		}, func() {
			res := callTool(t, cs, "call_device_tool", map[string]any{"device": long, "tool": long})
			require.True(t, res.IsError)
		})
		floodIsOneLine(t, b, "unknown_tool", n, func(e observer.LoggedEntry) bool {
			return e.Message == "tool call rejected" && e.ContextMap()["outcome"] == "unknown_tool"
		}, func() {
			res := callTool(t, cs, "call_device_tool", map[string]any{"device": macC, "tool": long})
			require.True(t, res.IsError)
		})
		for _, e := range b.Logs.FilterMessage("tool call rejected").AllUntimed() {
			for _, k := range []string{"device", "tool"} {
				if v, ok := e.ContextMap()[k]; ok {
					assert.Equal(t, clip.String(long), v, "the caller's %s is cut", k)
				}
			}
		}
	})
	t.Run("forged requestState", func(t *testing.T) {
		b := startBridge(t, func(c *app.Config) { c.MCP.RateLimit = -1 })
		b.Board(macC, "robot", simulator.Config{})
		tool := upstreamName(macC, "self.audio_speaker.set_volume")
		cs := b.Client(modern, &mcp.ClientOptions{
			ElicitationHandler: (&elicitor{}).handle,
			MultiRoundTrip:     &mcp.MultiRoundTripOptions{Disabled: true},
		})
		call := func(p *mcp.CallToolParams) (*mcp.CallToolResult, error) {
			ctx, cancel := withTimeout(20 * time.Second)
			defer cancel()
			return cs.CallTool(ctx, p)
		}
		first, err := call(&mcp.CallToolParams{Name: tool, Arguments: map[string]any{}})
		require.NoError(t, err)
		require.NotEmpty(t, first.RequestState)
		forged := first.RequestState[:len(first.RequestState)-2] + "AA"
		floodIsOneLine(t, b, "bad_state", n, message("requestState refused"), func() {
			_, err := call(&mcp.CallToolParams{Name: tool, Arguments: map[string]any{}, RequestState: forged,
				InputResponses: mcp.InputResponseMap{"flow": &mcp.ElicitResult{Action: "accept", Content: map[string]any{"volume": 7}}}})
			require.ErrorContains(t, err, "requestState rejected")
		})
	})
}
