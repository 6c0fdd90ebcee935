// Package bridgetest starts a real bridge on loopback for tests: the
// device listener, the control listener with /mcp and /api, observed
// logs, and simulated boards connected over WebSocket. Every package whose
// tests need a whole bridge uses it instead of a copy of its own.
//
// It is an ordinary package (not a _test file) so that several packages'
// tests can share it; only tests import it.
//
// Lock order: none to keep; each recorder's mutex is a leaf.
package bridgetest

import (
	"context"
	"errors"
	"github.com/devicebridge/devicebridge/internal/syncbuf"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/mcpserver"
	"github.com/devicebridge/devicebridge/simulator"
)

// Protocol versions the tests speak upstream: the newest of each era.
const (
	Legacy = "2025-11-25"
	Modern = "2026-07-28"
)

// Eras lists both protocol eras, for tests that run once per era.
var Eras = []string{Legacy, Modern}

// Bridge is a running bridge. It shuts down when the test ends, or
// earlier when the test calls Shutdown.
type Bridge struct {
	T    testing.TB
	App  *app.App
	Base string // the control listener, http://host:port
	URL  string // the /mcp endpoint
	// Logs holds every line the bridge logged; nil when WithLogger chose
	// the logger.
	Logs *observer.ObservedLogs
	// HTTP is the client Client uses; its idle connections are closed at
	// shutdown. A test may replace it right after Start.
	HTTP *http.Client

	// A copy of the Bridge (another URL, say) shares its one shutdown.
	life *lifetime
}

// lifetime is a bridge's context and its one shutdown.
type lifetime struct {
	cancel context.CancelFunc // ends the context Start gave the App
	stop   sync.Once
	err    error
}

// ShutdownWait is the deadline App.Shutdown is given. A shutdown still
// running at HangAfter is taken for hung: it is left behind, so that one
// hang fails its test rather than holding every later test until the
// binary's timeout.
const (
	ShutdownWait = 20 * time.Second
	HangAfter    = ShutdownWait + 5*time.Second
)

// ErrShutdownHung is what Shutdown returns for a shutdown that did not end.
var ErrShutdownHung = errors.New("bridgetest: the bridge's shutdown did not end")

// Option changes how Start builds the bridge.
type Option func(*options)

type options struct {
	logger *zap.Logger
}

// WithLogger has the bridge log to logger (zap.NewNop() for nothing)
// instead of to Bridge.Logs.
func WithLogger(logger *zap.Logger) Option {
	return func(o *options) { o.logger = logger }
}

// Start starts a bridge on loopback ports chosen by the system, with the
// embedded MQTT broker off (a test that wants it sets mqtt.listen, to
// 127.0.0.1:0) and debug logs observed (printed too when BRIDGE_TEST_LOG
// is set; benchmarks log nothing). mutate changes the config first; it may
// replace it whole.
func Start(t testing.TB, mutate func(*app.Config), opts ...Option) *Bridge {
	t.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	cfg := app.Default()
	cfg.DeviceListen = "127.0.0.1:0"
	cfg.ControlListen = "127.0.0.1:0"
	cfg.MQTT.Listen = ""
	// State in memory: a test never writes into the user's state directory
	// (a test that wants a directory sets one of t.TempDir()).
	cfg.OTA.DataDir = ""
	cfg.Log.Level = "debug"
	if mutate != nil {
		mutate(&cfg)
	}
	logger, logs := o.logger, (*observer.ObservedLogs)(nil)
	if logger == nil {
		var core zapcore.Core
		core, logs = observer.New(zapcore.DebugLevel)
		switch {
		case os.Getenv("BRIDGE_TEST_LOG") != "":
			logger = zap.New(zapcore.NewTee(core, zaptest.NewLogger(t).Core()))
		case IsBenchmark(t):
			logger = zap.NewNop() // keep logging out of the measurement
		default:
			logger = zap.New(core)
		}
	}
	a, err := app.New(cfg, logger)
	require.NoError(t, err)
	// The App hands ctx to long-running parts (the /mcp server stops when
	// it ends): it lives until Shutdown.
	ctx, cancel := context.WithCancel(context.Background())
	if err := a.Start(ctx); err != nil {
		cancel()
		require.NoError(t, err)
	}
	base := "http://" + a.ControlAddr().String()
	b := &Bridge{T: t, App: a, Base: base, URL: base + "/mcp", Logs: logs,
		HTTP: &http.Client{Transport: &http.Transport{}}, life: &lifetime{cancel: cancel}}
	t.Cleanup(func() {
		// Reported here only when the test did not call Shutdown itself.
		b.life.stop.Do(func() {
			b.life.err = b.shutdown()
			assert.NoError(t, b.life.err)
		})
	})
	return b
}

// Shutdown stops the bridge now and returns what App.Shutdown returned,
// or ErrShutdownHung. Only the first call (the test's, or the cleanup's)
// shuts down; later ones return its result.
func (b *Bridge) Shutdown() error {
	b.life.stop.Do(func() { b.life.err = b.shutdown() })
	return b.life.err
}

func (b *Bridge) shutdown() error {
	// Ending the context first closes MCP sessions and streams, as app.Run
	// does on a signal.
	b.life.cancel()
	b.HTTP.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), ShutdownWait)
	defer cancel()
	done := make(chan error, 1)
	// Waited for below while it ends in time; a shutdown that hangs is
	// left behind, and its test fails.
	go func() { done <- b.App.Shutdown(ctx) }()
	select {
	case err := <-done:
		return err
	case <-time.After(HangAfter):
		return ErrShutdownHung
	}
}

// Board connects a simulated board with the named profile and waits until
// the bridge has it ready and publishes it upstream.
func (b *Bridge) Board(mac, profile string, cfg simulator.Config) *simulator.Board {
	t := b.T
	t.Helper()
	p, err := simulator.LoadProfile(profile)
	require.NoError(t, err)
	cfg.MAC, cfg.Profile = mac, p
	board, err := simulator.NewBoard(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, board.ConnectWebSocket(ctx, b.App.DeviceURL()))
	t.Cleanup(func() { _ = board.Close() })
	b.WaitState(mac, device.StateReady)
	b.WaitPublished(mac)
	return board
}

// WaitPublished waits until the upstream MCP server shows the board as
// ready. It follows the Hub on its own goroutine, so a board the Hub calls
// ready may still be missing from tools/list for a moment.
func (b *Bridge) WaitPublished(mac string) {
	b.T.Helper()
	require.Eventually(b.T, func() bool { return b.App.MCP().Published(mac) }, 10*time.Second, 5*time.Millisecond,
		"device %s never published upstream", mac)
}

// WaitState waits until the Hub shows the board in state (StateClosed
// means "gone").
func (b *Bridge) WaitState(mac string, state device.State) {
	b.T.Helper()
	require.Eventually(b.T, func() bool {
		for _, d := range b.App.Hub.Devices() {
			if d.DeviceID == mac {
				return d.State == state
			}
		}
		return state == device.StateClosed
	}, 10*time.Second, 5*time.Millisecond, "device %s never reached state %s", mac, state)
}

// Client connects an MCP client of the given era (Legacy or Modern) over
// the bridge's HTTP client.
func (b *Bridge) Client(era string, opts *mcp.ClientOptions) *mcp.ClientSession {
	return b.ClientWith(era, opts, b.HTTP)
}

// ClientWith is Client over another HTTP client (a token, a proxy).
func (b *Bridge) ClientWith(era string, opts *mcp.ClientOptions, hc *http.Client) *mcp.ClientSession {
	t := b.T
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "1"}, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: b.URL, HTTPClient: hc, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: era})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	if era == Legacy {
		require.NotEmpty(t, cs.ID(), "a legacy client has a session")
	} else {
		require.Empty(t, cs.ID(), "a modern client is stateless")
	}
	return cs
}

// ToolName is the name /mcp gives a board's tool by default: the board's
// default alias, then the tool without "self." and with dots as
// underscores.
func ToolName(mac, tool string) string {
	return mcpserver.DefaultAlias(mac) + "_" + strings.ReplaceAll(strings.TrimPrefix(tool, "self."), ".", "_")
}

// ToolNames lists the name of every tool (all pages).
func ToolNames(t testing.TB, cs *mcp.ClientSession) []string {
	t.Helper()
	var names []string
	for _, tool := range ListTools(t, cs) {
		names = append(names, tool.Name)
	}
	return names
}

// ListTools lists every tool (all pages).
func ListTools(t testing.TB, cs *mcp.ClientSession) []*mcp.Tool {
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

// CallTool calls a tool and fails the test on a protocol error (a tool
// result with IsError is returned, not failed).
func CallTool(t testing.TB, cs *mcp.ClientSession, name string, args any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	require.NoError(t, err)
	return res
}

// Text joins a result's text contents, one per line.
func Text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// Signals counts notifications (from a client handler's goroutine) for a
// test that waits for the next one.
type Signals struct {
	mu sync.Mutex
	n  int
}

// Add counts one.
func (s *Signals) Add() {
	s.mu.Lock()
	s.n++
	s.mu.Unlock()
}

// Count is how many there were.
func (s *Signals) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// Progress collects the progress notifications a client receives; pass
// its Handle as mcp.ClientOptions.ProgressNotificationHandler.
type Progress struct {
	mu     sync.Mutex
	events []*mcp.ProgressNotificationParams
	first  chan struct{}
	once   sync.Once
}

// NewProgress returns an empty recorder.
func NewProgress() *Progress { return &Progress{first: make(chan struct{})} }

// Handle records one notification.
func (p *Progress) Handle(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
	p.mu.Lock()
	p.events = append(p.events, req.Params)
	p.mu.Unlock()
	p.once.Do(func() { close(p.first) })
}

// First is closed when the first notification arrives.
func (p *Progress) First() <-chan struct{} { return p.first }

// All is every notification so far, in order.
func (p *Progress) All() []*mcp.ProgressNotificationParams {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*mcp.ProgressNotificationParams(nil), p.events...)
}

// SyncBuffer is a bytes.Buffer safe to write from one goroutine (a
// command's output, a logger) while the test reads it from another.
type SyncBuffer = syncbuf.Buffer

// Dribble opens a connection to addr, sends head, then one filler byte
// every 20 ms for as long as the server takes them: a slow client, for
// tests of read timeouts. The dribble ends when a write fails or the test
// ends (the connection is closed then).
func Dribble(t testing.TB, addr net.Addr, head string, filler byte) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr.String())
	require.NoError(t, err)
	_, err = io.WriteString(c, head)
	require.NoError(t, err)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if _, err := c.Write([]byte{filler}); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		_ = c.Close()
		wg.Wait()
	})
	return c
}

// IsBenchmark reports whether t is a benchmark's.
func IsBenchmark(t testing.TB) bool {
	_, ok := t.(*testing.B)
	return ok
}
