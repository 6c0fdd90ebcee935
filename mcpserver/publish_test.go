package mcpserver

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/device"
)

// TestPublishRefusesWhatTheSDKWouldPanicOn: the last line of defence
// behind the intake bounds. go-sdk's AddTool panics on a schema it does
// not accept (here an x-mcp-header that is not a string, which intake
// refuses); publish turns that into an error for that one tool.
func TestPublishRefusesWhatTheSDKWouldPanicOn(t *testing.T) {
	hub := device.NewHub(device.HubConfig{}, nil)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, hub.Close(ctx))
	})
	s, err := New(hub, Options{})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	bad := json.RawMessage(`{"type":"object","properties":{"h":{"type":"string","x-mcp-header":5}}}`)
	e := &entry{name: "dev_000001_bad", deviceID: "02:00:00:00:00:01", tool: device.Tool{Name: "self.bad", InputSchema: bad},
		mcpTool: &mcp.Tool{Name: "dev_000001_bad", InputSchema: bad}}
	require.ErrorContains(t, s.publish(e), "x-mcp-header")
	e.mcpTool = &mcp.Tool{Name: "dev_000001_bad", InputSchema: json.RawMessage(`{"type":"object","properties":{}}`)}
	require.NoError(t, s.publish(e))
}
