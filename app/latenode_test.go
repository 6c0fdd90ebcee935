package app_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mcpHost connects the go-sdk client to a node's /mcp.
func mcpHost(t *testing.T, base string) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: base + "/mcp", MaxRetries: -1}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// mcpToolNames lists a host's tools (all pages).
func mcpToolNames(cs *mcp.ClientSession) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var names []string
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return nil, err
		}
		names = append(names, tool.Name)
	}
	return names, nil
}

// TestLateNodeListsRemoteTools: a node that joins a fleet whose boards
// are already connected elsewhere publishes their tools on /mcp. (Its
// Hub used to list the other nodes' boards only after the watches had
// announced them, so the /mcp catalogue, which re-reads the Hub on each
// event, could miss them until some later event.)
func TestLateNodeListsRemoteTools(t *testing.T) {
	noLeaks(t)
	url := startNATS(t)
	a, baseA := startNode(t, url, "a")
	connectBoard(t, a, "0a:00:00:00:00:01")
	connectBoard(t, a, "0a:00:00:00:00:02")
	require.Eventually(t, func() bool { return len(readyBoards(t, baseA)) == 2 }, 15*time.Second, 20*time.Millisecond)

	b, baseB := startNode(t, url, "b")
	require.Eventually(t, func() bool { return len(readyBoards(t, baseB)) == 2 }, 15*time.Second, 20*time.Millisecond)
	host := mcpHost(t, baseB)
	assert.Eventually(t, func() bool {
		return b.MCP().Published("0a:00:00:00:00:01") && b.MCP().Published("0a:00:00:00:00:02")
	}, 10*time.Second, 20*time.Millisecond, "node b publishes the boards node a holds")
	names, err := mcpToolNames(host)
	require.NoError(t, err)
	count := map[string]int{}
	for _, n := range names {
		if alias, _, ok := strings.Cut(n, "_lamp_"); ok {
			count[alias]++
		}
	}
	assert.Equal(t, 2, len(count), names)
	assert.Equal(t, count["dev_000001"], count["dev_000002"], names)
	assert.Positive(t, count["dev_000001"])
}
