package mcpserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/internal/peer"
)

// hopBoards is the number of simulated boards the hop benchmark spreads
// its calls over.
const hopBoards = 64

// BenchmarkHop compares tools/call through the bridge's /mcp (go-sdk
// client → bridge → simulated board over loopback WebSocket → back) with
// the same client loop against a bare go-sdk server answering a local tool
// (internal/peer), in the same run: both protocol eras × 1, 8 and 64
// concurrent callers, the bridge's calls spread over 64 boards. Each
// bridge sub-benchmark reports vs_peer, its throughput divided by the
// peer's in the sub-benchmark just before it (≥ 1 is the target), and the
// p50/p99 call latency.
//
// The bridge runs with its default configuration except the per-session
// rate limit (which would measure the limiter) and logging (off).
//
//	go test -run '^$' -bench BenchmarkHop -benchtime 2000x ./mcpserver/
func BenchmarkHop(b *testing.B) {
	br := startBridge(b, func(cfg *app.Config) {
		cfg.MQTT.Listen, cfg.Log.Level = "", "error"
		cfg.MCP.RateLimit = -1
		cfg.Simulate.Count = hopBoards
	})
	a := br.App
	const tool = "self.audio_speaker.set_volume"
	var names []string
	for i := 1; i <= hopBoards; i++ {
		names = append(names, upstreamName(fmt.Sprintf("02:00:00:00:00:%02x", i), tool))
	}
	published := func() bool {
		for i := 1; i <= hopBoards; i++ {
			if !a.MCP().Published(fmt.Sprintf("02:00:00:00:00:%02x", i)) {
				return false
			}
		}
		return true
	}
	require.Eventually(b, published, 30*time.Second, 10*time.Millisecond, "simulated boards never became ready")
	bridgeURL := br.URL

	peerSrv := httptest.NewServer(peer.Handler())
	b.Cleanup(peerSrv.Close)

	args := json.RawMessage(`{"volume":40}`)
	for _, era := range eras {
		for _, callers := range []int{1, 8, 64} {
			var peerRate float64
			b.Run(fmt.Sprintf("era=%s/callers=%d/server=peer", era, callers), func(b *testing.B) {
				peerRate = hopLoop(b, peerSrv.URL, era, callers, func(int) string { return peer.ToolName }, args)
			})
			b.Run(fmt.Sprintf("era=%s/callers=%d/server=bridge", era, callers), func(b *testing.B) {
				rate := hopLoop(b, bridgeURL, era, callers, func(i int) string { return names[i%hopBoards] }, args)
				if peerRate > 0 {
					b.ReportMetric(rate/peerRate, "vs_peer")
				}
			})
		}
	}
}

// hopLoop runs b.N tools/call over callers concurrent client sessions and
// returns calls per second; it reports calls/s and latency percentiles.
func hopLoop(b *testing.B, url, era string, callers int, name func(int) string, args json.RawMessage) float64 {
	ctx := context.Background()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: callers + 4}}
	defer hc.CloseIdleConnections()
	sessions := make([]*mcp.ClientSession, callers)
	for i := range sessions {
		c := mcp.NewClient(&mcp.Implementation{Name: "hop-bench", Version: "1"}, nil)
		cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1},
			&mcp.ClientSessionOptions{ProtocolVersion: era})
		if err != nil {
			b.Fatal(err)
		}
		defer cs.Close()
		sessions[i] = cs
	}
	lat := make([][]time.Duration, callers)
	var next sync.Mutex
	n := 0
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				next.Lock()
				i := n
				n++
				next.Unlock()
				if i >= b.N {
					return
				}
				t0 := time.Now()
				res, err := sessions[w].CallTool(ctx, &mcp.CallToolParams{Name: name(i), Arguments: args})
				if err != nil || res.IsError {
					b.Errorf("call %d failed: %v %v", i, err, res)
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	rate := float64(b.N) / elapsed.Seconds()
	b.ReportMetric(rate, "calls/s")
	if len(all) > 0 {
		b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50_µs")
		b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99_µs")
	}
	return rate
}
