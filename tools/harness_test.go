package tools_test

import (
	"context"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/simulator"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Protocol versions the tests speak: the newest of each era.
const (
	legacy = "2025-11-25"
	modern = "2026-07-28"
)

var eras = []string{legacy, modern}

// bridge is a real bridge on loopback: device listener, control listener
// with /mcp, and simulated boards connected over WebSocket.
type bridge struct {
	t    testing.TB
	app  *app.App
	url  string
	logs *observer.ObservedLogs
	http *http.Client
}

// startBridge starts a bridge with the given config changes. It shuts down
// at the end of the test.
func startBridge(t testing.TB, mutate func(*app.Config)) *bridge {
	t.Helper()
	cfg := app.Default()
	cfg.DeviceListen = "127.0.0.1:0"
	cfg.ControlListen = "127.0.0.1:0"
	cfg.Log.Level = "debug"
	if mutate != nil {
		mutate(&cfg)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	var logger *zap.Logger
	switch {
	case os.Getenv("BRIDGE_TEST_LOG") != "":
		logger = zap.New(zapcore.NewTee(core, zaptest.NewLogger(t).Core()))
	case isBenchmark(t):
		logger = zap.NewNop() // keep logging out of the measurement
	default:
		logger = zap.New(core)
	}
	a, err := app.New(cfg, logger)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, a.Start(ctx))
	b := &bridge{t: t, app: a, url: "http://" + a.ControlAddr().String() + "/mcp", logs: logs,
		http: &http.Client{Transport: &http.Transport{}}}
	t.Cleanup(func() {
		// Ending the context first closes MCP sessions and streams, as
		// app.Run does on a signal.
		cancel()
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		require.NoError(t, a.Shutdown(sctx))
		b.http.CloseIdleConnections()
	})
	return b
}

// board connects a simulated board and waits until the bridge has it ready
// and publishes it upstream.
func (b *bridge) board(mac, profile string, cfg simulator.Config) *simulator.Board {
	t := b.t
	t.Helper()
	p, err := simulator.LoadProfile(profile)
	require.NoError(t, err)
	cfg.MAC, cfg.Profile = mac, p
	board, err := simulator.NewBoard(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, board.ConnectWebSocket(ctx, b.app.DeviceURL()))
	t.Cleanup(func() { _ = board.Close() })
	b.waitState(mac, device.StateReady)
	b.waitPublished(mac)
	return board
}

// waitPublished waits until the upstream MCP server shows the board as
// ready. It follows the Hub on its own goroutine, so a board the Hub calls
// ready may still be missing from tools/list for a moment.
func (b *bridge) waitPublished(mac string) {
	b.t.Helper()
	require.Eventually(b.t, func() bool { return b.app.MCP().Published(mac) }, 10*time.Second, 5*time.Millisecond,
		"device %s never published upstream", mac)
}

// waitState polls the Hub until the device reaches state (StateClosed
// means "gone").
func (b *bridge) waitState(mac string, state device.State) {
	b.t.Helper()
	require.Eventually(b.t, func() bool {
		for _, d := range b.app.Hub.Devices() {
			if d.DeviceID == mac {
				return d.State == state
			}
		}
		return state == device.StateClosed
	}, 10*time.Second, 5*time.Millisecond, "device %s never reached state %s", mac, state)
}

// client connects an MCP client of the given era (legacy or modern).
func (b *bridge) client(era string, opts *mcp.ClientOptions) *mcp.ClientSession {
	return b.clientWith(era, opts, b.http)
}

func (b *bridge) clientWith(era string, opts *mcp.ClientOptions, hc *http.Client) *mcp.ClientSession {
	t := b.t
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "1"}, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: b.url, HTTPClient: hc, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: era})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	if era == legacy {
		require.NotEmpty(t, cs.ID(), "a legacy client has a session")
	} else {
		require.Empty(t, cs.ID(), "a modern client is stateless")
	}
	return cs
}

// toolNames lists every tool (all pages).
func toolNames(t testing.TB, cs *mcp.ClientSession) []string {
	t.Helper()
	var names []string
	for _, tool := range listTools(t, cs) {
		names = append(names, tool.Name)
	}
	return names
}

func listTools(t testing.TB, cs *mcp.ClientSession) []*mcp.Tool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []*mcp.Tool
	for tool, err := range cs.Tools(ctx, nil) {
		require.NoError(t, err)
		out = append(out, tool)
	}
	return out
}

func callTool(t testing.TB, cs *mcp.ClientSession, name string, args any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	require.NoError(t, err)
	return res
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// signals counts notifications and lets a test wait for the next one.
type signals struct {
	mu sync.Mutex
	n  int
}

func (s *signals) add() {
	s.mu.Lock()
	s.n++
	s.mu.Unlock()
}

func (s *signals) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

func isBenchmark(t testing.TB) bool {
	_, ok := t.(*testing.B)
	return ok
}
