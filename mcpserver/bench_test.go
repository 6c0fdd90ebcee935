package mcpserver_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/simulator"
)

// BenchmarkToolsCall measures one tools/call through the upstream MCP
// server (go-sdk client over loopback HTTP → bridge → simulated board over
// loopback WebSocket), in both eras, against the direct device call
// (hub.CallTool) measured in the same run as the baseline. Calls are
// sequential: a board runs one tool at a time, so latency is what bounds
// throughput per board; calls/s is reported alongside.
//
//	go test -run '^$' -bench BenchmarkToolsCall -benchtime 2000x ./mcpserver/
func BenchmarkToolsCall(b *testing.B) {
	// The default per-session rate limit (20/s) would measure the limiter.
	br := startBridge(b, func(c *app.Config) { c.MCP.RateLimit = -1 })
	br.Board(macA, "breadboard", simulator.Config{})
	const tool = "self.audio_speaker.set_volume"
	args := json.RawMessage(`{"volume":40}`)

	report := func(b *testing.B) {
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
	}

	b.Run("baseline=hub.CallTool", func(b *testing.B) {
		ctx := context.Background()
		for b.Loop() {
			res, err := br.App.Hub.CallTool(ctx, macA, tool, args)
			if err != nil || res.IsError {
				b.Fatalf("call failed: %v", err)
			}
		}
		report(b)
	})
	for _, era := range eras {
		b.Run("mcp="+era, func(b *testing.B) {
			cs := br.Client(era, nil)
			ctx := context.Background()
			params := &mcp.CallToolParams{Name: upstreamName(macA, tool), Arguments: args}
			for b.Loop() {
				res, err := cs.CallTool(ctx, params)
				if err != nil || res.IsError {
					b.Fatalf("call failed: %v %v", err, res)
				}
			}
			report(b)
		})
	}
}
