package mcpserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/simulator"
)

// BenchmarkFanout measures the bridge with many boards (1,000 by default;
// DEVICEBRIDGE_FANOUT_BOARDS changes it): a burst of boards connecting at
// once, then
//
//   - tools_list: a full tools/list through the go-sdk client, every page
//     (13 tools per board), reported as ms per full list;
//   - calls: one tools/call per board, all concurrently, all of which must
//     succeed, reported as ms per round.
//
// The burst reports list_changed, the notifications a session open during
// it received (coalesced: far fewer than one per board). The per-session
// rate limit is off: it is a policy per client, not a capacity; boards
// list and the bridge publishes all 13 tools (user-only ones included).
//
//	go test -run '^$' -bench BenchmarkFanout -benchtime 5x ./mcpserver/
func BenchmarkFanout(b *testing.B) {
	boards := 1000
	if v, err := strconv.Atoi(os.Getenv("DEVICEBRIDGE_FANOUT_BOARDS")); err == nil && v > 0 {
		boards = v
	}
	br := startBridge(b, func(cfg *app.Config) {
		cfg.MQTT.Listen, cfg.Log.Level = "", "error"
		cfg.MCP.RateLimit = -1
		// All 13 tools of every board, user-only ones included: 13,000 tools.
		cfg.Devices.WithUserTools, cfg.MCP.ShowUserOnlyTools = true, true
	})
	a := br.App
	url := br.URL
	ctx := context.Background()

	var changed atomic.Int64
	watcher := mcp.NewClient(&mcp.Implementation{Name: "fanout-watch", Version: "1"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed.Add(1) },
	})
	ws, err := watcher.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: legacy})
	if err != nil {
		b.Fatal(err)
	}
	defer ws.Close()

	profile, err := simulator.LoadProfile("breadboard")
	if err != nil {
		b.Fatal(err)
	}
	fleet, err := simulator.NewFleet(simulator.FleetConfig{URL: a.DeviceURL(), Profile: profile, Count: boards, Reconnect: true})
	if err != nil {
		b.Fatal(err)
	}
	fctx, stopFleet := context.WithCancel(ctx)
	fleetDone := make(chan struct{})
	go func() { defer close(fleetDone); _ = fleet.Run(fctx) }()
	b.Cleanup(func() { stopFleet(); <-fleetDone })

	const tool = "self.audio_speaker.set_volume"
	names := make([]string, boards)
	macs := make([]string, boards)
	for i, bd := range fleet.Boards() {
		macs[i] = bd.MAC()
		names[i] = upstreamName(macs[i], tool)
	}
	start := time.Now()
	require.EventuallyWithT(b, func(c *assert.CollectT) {
		n := 0
		for _, mac := range macs {
			if a.MCP().Published(mac) {
				n++
			}
		}
		assert.Equal(c, boards, n, "boards published")
	}, 60*time.Second, 20*time.Millisecond)
	ready := time.Since(start)
	time.Sleep(200 * time.Millisecond) // the last notification is debounced
	burstChanged := changed.Load()

	cs, err := mcp.NewClient(&mcp.Implementation{Name: "fanout", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1}, &mcp.ClientSessionOptions{ProtocolVersion: legacy})
	if err != nil {
		b.Fatal(err)
	}
	defer cs.Close()

	b.Run(fmt.Sprintf("boards=%d/tools_list", boards), func(b *testing.B) {
		var tools int
		for b.Loop() {
			tools = 0
			for _, err := range cs.Tools(ctx, nil) {
				if err != nil {
					b.Fatal(err)
				}
				tools++
			}
		}
		if tools < boards*10 {
			b.Fatalf("listed %d tools for %d boards", tools, boards)
		}
		b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/list")
		b.ReportMetric(float64(tools), "tools")
		b.ReportMetric(float64(burstChanged), "list_changed")
		b.ReportMetric(ready.Seconds(), "ready_s")
	})
	b.Run(fmt.Sprintf("boards=%d/calls", boards), func(b *testing.B) {
		args := json.RawMessage(`{"volume":40}`)
		for b.Loop() {
			var wg sync.WaitGroup
			var failed atomic.Int64
			for _, name := range names {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
					if err != nil || res.IsError {
						failed.Add(1)
					}
				}()
			}
			wg.Wait()
			if n := failed.Load(); n > 0 {
				b.Fatalf("%d of %d concurrent calls failed", n, boards)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/round")
	})
}
