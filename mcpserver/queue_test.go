package mcpserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/simulator"
)

// TestQueuedCallTimesOutUnsent: while a board is stuck on one call, a call
// queued behind it ends when its own timeout (counted from when it was
// made) runs out, not when the call ahead ends; upstream says it was never
// sent (MCP) or answers 503 device_queue_timeout (control API), and the
// board never runs it.
func TestQueuedCallTimesOutUnsent(t *testing.T) {
	b := startBridge(t, func(c *app.Config) {
		// The call ahead may take a minute; the queued ones have a short
		// time of their own, so before the fix they would wait the minute.
		c.Devices.ToolTimeouts["self.lamp.turn_on"] = time.Minute
		c.Devices.ToolTimeouts["self.lamp.get_state"] = 200 * time.Millisecond
	})
	hold := make(chan struct{})
	board := b.Board(macA, "breadboard", simulator.Config{
		Hold: map[string]<-chan struct{}{"self.lamp.turn_on": hold}})
	cs := b.Client(legacy, nil)
	before := board.Stats().CallsRun

	type result struct {
		res *mcp.CallToolResult
		err error
	}
	ahead := make(chan result, 1)
	go func() {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: upstreamName(macA, "self.lamp.turn_on")})
		ahead <- result{res, err}
	}()
	s, ok := b.App.Hub.Session(macA)
	require.True(t, ok)
	require.Eventually(t, func() bool { return s.Pending() == 1 }, 10*time.Second, 5*time.Millisecond,
		"turn_on is on the board")

	// The failure deadline for both calls below is far under the minute
	// the call ahead may take.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: upstreamName(macA, "self.lamp.get_state")})
	require.NoError(t, err)
	require.True(t, res.IsError)
	assert.Contains(t, text(res), "never sent: nothing happened")
	assert.NotContains(t, text(res), "outcome is unknown")

	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		strings.TrimSuffix(b.URL, "/mcp")+"/api/devices/"+macA+"/call", strings.NewReader(`{"name":"self.lamp.get_state"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.HTTP.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var body struct {
		Error struct{ Code, Message string }
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, "device_queue_timeout", body.Error.Code)
	assert.Contains(t, body.Error.Message, "not sent")
	assert.NotEmpty(t, resp.Header.Get("Retry-After"))

	close(hold)
	first := <-ahead
	require.NoError(t, first.err)
	require.False(t, first.res.IsError, "the call ahead finishes once the board is free")
	// The board runs its calls in order: once this one has run, anything
	// queued before it would have too.
	require.False(t, callTool(t, cs, upstreamName(macA, "self.get_device_status"), nil).IsError)
	assert.Equal(t, before+2, board.Stats().CallsRun, "turn_on and get_device_status ran; get_state never did")
}
