package tools_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/simulator"
	"github.com/devicebridge/devicebridge/tools"
)

// TestStdioProxy: a host that speaks stdio uses a running bridge through
// the proxy, in both eras toward the bridge: tools are listed, calls run
// (with progress relayed), and list_changed follows the boards.
func TestStdioProxy(t *testing.T) {
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			b := startBridge(t, func(c *app.Config) {
				c.MCP.Tokens = []string{"tok"}
				c.MCP.ProgressInterval = 50 * time.Millisecond
			})
			boardA := b.board(macA, "breadboard", simulator.Config{ToolDelay: map[string]time.Duration{slowTool: 300 * time.Millisecond}})

			p, err := tools.NewStdioProxy(tools.StdioProxyOptions{URL: b.url, Token: "tok", HTTPClient: b.http,
				ProtocolVersion: era, RetryInterval: 50 * time.Millisecond})
			require.NoError(t, err)

			// The host's stdio, as two pipes.
			hostIn, proxyOut := io.Pipe()
			proxyIn, hostOut := io.Pipe()
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- p.Run(ctx, &mcp.IOTransport{Reader: proxyIn, Writer: proxyOut}) }()
			defer func() {
				cancel()
				select {
				case err := <-done:
					require.NoError(t, err)
				case <-time.After(5 * time.Second):
					t.Fatal("the proxy did not stop")
				}
			}()

			var changed signals
			rec := newProgressRecorder()
			host := mcp.NewClient(&mcp.Implementation{Name: "stdio-host", Version: "1"}, &mcp.ClientOptions{
				ToolListChangedHandler:      func(context.Context, *mcp.ToolListChangedRequest) { changed.add() },
				ProgressNotificationHandler: rec.handle,
			})
			cctx, ccancel := withTimeout(10 * time.Second)
			defer ccancel()
			cs, err := host.Connect(cctx, &mcp.IOTransport{Reader: hostIn, Writer: hostOut}, nil)
			require.NoError(t, err)
			defer cs.Close()

			volume := upstreamName(macA, "self.audio_speaker.set_volume")
			require.Eventually(t, func() bool {
				ctx, cancel := withTimeout(10 * time.Second)
				defer cancel()
				for tool, err := range cs.Tools(ctx, nil) {
					if err == nil && tool.Name == volume {
						return true
					}
				}
				return false
			}, 10*time.Second, 5*time.Millisecond, "the proxy never published the bridge's tools")
			res := callTool(t, cs, volume, map[string]any{"volume": 12})
			require.False(t, res.IsError, text(res))
			assert.EqualValues(t, 12, boardA.State()["audio_speaker.volume"])

			res = callTool(t, cs, volume, map[string]any{"volume": "12"})
			require.True(t, res.IsError)
			assert.Contains(t, text(res), `must be an integer from 0 to 100`)

			params := &mcp.CallToolParams{Name: upstreamName(macA, slowTool)}
			params.SetProgressToken(42)
			res, err = cs.CallTool(cctx, params)
			require.NoError(t, err)
			require.False(t, res.IsError, text(res))
			require.Eventually(t, func() bool { return len(rec.all()) > 0 }, 5*time.Second, 5*time.Millisecond, "progress is not relayed")
			assert.EqualValues(t, 42, rec.all()[0].ProgressToken, "with the host's own token")

			n := changed.count()
			b.board(macB, "robot", simulator.Config{})
			require.Eventually(t, func() bool { return changed.count() > n }, 10*time.Second, 5*time.Millisecond, "no list_changed through the proxy")
			assert.Contains(t, toolNames(t, cs), upstreamName(macB, "self.otto.walk"))
		})
	}
}

func TestStdioProxyNeedsURL(t *testing.T) {
	_, err := tools.NewStdioProxy(tools.StdioProxyOptions{})
	require.Error(t, err)
}
