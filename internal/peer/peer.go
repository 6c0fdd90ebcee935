// Package peer is a bare go-sdk MCP server answering a local tool: the
// baseline the upstream hop of the bridge is measured against
// (docs/performance.md). It is what a go-sdk user writes in a few lines, and
// serves both protocol eras the way the bridge does: a stateful handler for
// session-based requests, a stateless one for the modern era.
package peer

import (
	"context"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ToolName is the local tool: it sets a volume, as the board tool the
// bridge benchmarks call does.
const ToolName = "set_volume"

// VolumeArgs are the tool's arguments.
type VolumeArgs struct {
	Volume int `json:"volume" jsonschema:"volume from 0 to 100"`
}

// NewServer returns the bare go-sdk server with its one typed tool.
func NewServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "peer", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: ToolName, Description: "Set the speaker volume."},
		func(_ context.Context, _ *mcp.CallToolRequest, in VolumeArgs) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "true"}}}, nil, nil
		})
	return s
}

// Handler serves NewServer over Streamable HTTP in both eras: requests
// that carry MCP-Protocol-Version ≥ 2026-07-28 go to a stateless handler,
// the rest to a stateful one.
func Handler() http.Handler {
	s := NewServer()
	get := func(*http.Request) *mcp.Server { return s }
	stateful := mcp.NewStreamableHTTPHandler(get, nil)
	stateless := mcp.NewStreamableHTTPHandler(get, &mcp.StreamableHTTPOptions{Stateless: true})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.Header.Get("Mcp-Protocol-Version"); v >= "2026-07-28" {
			stateless.ServeHTTP(w, r)
			return
		}
		stateful.ServeHTTP(w, r)
	})
}
