package app

import (
	"context"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// TestInternalBridgeServesMCP: the bridge this package's tests start
// (runApp) keeps /mcp open until Shutdown. runApp used to cancel the
// context it handed Start as soon as Start returned, which closed the MCP
// server at once (Start hands ctx to the long-running parts): initialize
// then raced the closed server and failed about one time in three.
func TestInternalBridgeServesMCP(t *testing.T) {
	a := startBridge(t, func(c *Config) { c.MCP.Enabled = true })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 50 {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "1"}, nil).Connect(ctx,
			&mcp.StreamableClientTransport{Endpoint: "http://" + a.ControlAddr().String() + "/mcp", MaxRetries: -1},
			&mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
		require.NoError(t, err, "connect %d", i)
		_, err = cs.ListTools(ctx, nil)
		require.NoError(t, err, "connect %d", i)
		require.NoError(t, cs.Close())
	}
}
