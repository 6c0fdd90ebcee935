package stdioproxy_test

import (
	"context"
	"errors"
	"github.com/devicebridge/devicebridge/internal/bridgetest"
	"go.uber.org/goleak"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/simulator"
	"github.com/devicebridge/devicebridge/stdioproxy"
)

// TestStdioProxy: a host that speaks stdio uses a running bridge through
// the proxy, in both eras toward the bridge: tools are listed, calls run
// (with progress relayed), and list_changed follows the boards.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The shared harness and the boards these tests use.
const (
	macA     = "02:00:00:00:00:01"
	macB     = "02:00:00:00:00:02"
	slowTool = "self.lamp.turn_on"
)

var (
	eras         = bridgetest.Eras
	startBridge  = bridgetest.Start
	toolNames    = bridgetest.ToolNames
	callTool     = bridgetest.CallTool
	text         = bridgetest.Text
	upstreamName = bridgetest.ToolName
)

func TestStdioProxy(t *testing.T) {
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			b := startBridge(t, func(c *app.Config) {
				c.MCP.Tokens = []string{"tok"}
				c.MCP.ProgressInterval = 50 * time.Millisecond
			})
			boardA := b.Board(macA, "breadboard", simulator.Config{ToolDelay: map[string]time.Duration{slowTool: 300 * time.Millisecond}})

			p, err := stdioproxy.New(stdioproxy.Options{URL: b.URL, Token: "tok", HTTPClient: b.HTTP,
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

			var changed bridgetest.Signals
			rec := bridgetest.NewProgress()
			host := mcp.NewClient(&mcp.Implementation{Name: "stdio-host", Version: "1"}, &mcp.ClientOptions{
				ToolListChangedHandler:      func(context.Context, *mcp.ToolListChangedRequest) { changed.Add() },
				ProgressNotificationHandler: rec.Handle,
			})
			cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer ccancel()
			cs, err := host.Connect(cctx, &mcp.IOTransport{Reader: hostIn, Writer: hostOut}, nil)
			require.NoError(t, err)
			defer cs.Close()

			volume := upstreamName(macA, "self.audio_speaker.set_volume")
			require.Eventually(t, func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
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
			require.Eventually(t, func() bool { return len(rec.All()) > 0 }, 5*time.Second, 5*time.Millisecond, "progress is not relayed")
			assert.EqualValues(t, 42, rec.All()[0].ProgressToken, "with the host's own token")

			n := changed.Count()
			b.Board(macB, "robot", simulator.Config{})
			require.Eventually(t, func() bool { return changed.Count() > n }, 10*time.Second, 5*time.Millisecond, "no list_changed through the proxy")
			assert.Contains(t, toolNames(t, cs), upstreamName(macB, "self.otto.walk"))
		})
	}
}

func TestStdioProxyNeedsURL(t *testing.T) {
	_, err := stdioproxy.New(stdioproxy.Options{})
	require.Error(t, err)
}

// proxyRun is a StdioProxy serving a host over two pipes.
type proxyRun struct {
	host *mcp.ClientSession // nil unless asked for
	done chan struct{}      // closed when Run has returned
	err  error              // Run's result, once done is closed
}

// runProxy runs p until the end of the test (or until Run gives up) and,
// if withHost, connects a host to it.
func runProxy(t *testing.T, p *stdioproxy.Proxy, withHost bool) *proxyRun {
	t.Helper()
	hostIn, proxyOut := io.Pipe()
	proxyIn, hostOut := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	r := &proxyRun{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = p.Run(ctx, &mcp.IOTransport{Reader: proxyIn, Writer: proxyOut})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(5 * time.Second):
			t.Error("the proxy did not stop")
		}
		_ = hostIn.Close()
		_ = hostOut.Close()
	})
	if withHost {
		host := mcp.NewClient(&mcp.Implementation{Name: "stdio-host", Version: "1"}, nil)
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		cs, err := host.Connect(cctx, &mcp.IOTransport{Reader: hostIn, Writer: hostOut}, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = cs.Close() })
		r.host = cs
	}
	return r
}

// gateTransport holds every request to the bridge until open is closed,
// as if the bridge were slow to answer.
type gateTransport struct {
	open chan struct{}
	next http.RoundTripper
}

func (g gateTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	select {
	case <-g.open:
		return g.next.RoundTrip(r)
	case <-r.Context().Done():
		return nil, r.Context().Err()
	}
}

type listOutcome struct {
	names []string
	err   error
}

type callOutcome struct {
	res *mcp.CallToolResult
	err error
}

// listAll lists every page without failing the test, for goroutines.
func listAll(cs *mcp.ClientSession) listOutcome {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out listOutcome
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			out.err = err
			return out
		}
		out.names = append(out.names, tool.Name)
	}
	return out
}

func callOnce(cs *mcp.ClientSession, name string, args any) callOutcome {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	return callOutcome{res, err}
}

// TestStdioProxyHoldsRequestsUntilListed: a host that lists or calls
// before the proxy has listed the bridge's tools waits for that listing,
// instead of getting an empty list and an unknown-tool error.
func TestStdioProxyHoldsRequestsUntilListed(t *testing.T) {
	b := startBridge(t, nil)
	board := b.Board(macA, "breadboard", simulator.Config{})
	gate := gateTransport{open: make(chan struct{}), next: b.HTTP.Transport}
	core, logs := observer.New(zapcore.DebugLevel)
	p, err := stdioproxy.New(stdioproxy.Options{URL: b.URL, HTTPClient: &http.Client{Transport: gate},
		RetryInterval: 50 * time.Millisecond, StartupWait: 20 * time.Second, Logger: zap.New(core)})
	require.NoError(t, err)
	r := runProxy(t, p, true)
	var openOnce sync.Once
	open := func() { openOnce.Do(func() { close(gate.open) }) }
	t.Cleanup(open) // runs before the proxy's cleanup, even if the test fails early

	volume := upstreamName(macA, "self.audio_speaker.set_volume")
	listed := make(chan listOutcome, 1)
	called := make(chan callOutcome, 1)
	go func() { listed <- listAll(r.host) }()
	go func() { called <- callOnce(r.host, volume, map[string]any{"volume": 7}) }()

	// Both requests reach the proxy while the bridge cannot answer it.
	held := func() int { return logs.FilterMessage("holding a request until the bridge's tools are known").Len() }
	require.Eventually(t, func() bool { return held() == 2 || len(listed) > 0 || len(called) > 0 },
		10*time.Second, 5*time.Millisecond, "the requests never reached the proxy")
	select {
	case l := <-listed:
		t.Fatalf("tools/list was answered before the bridge was reached: %v, %v", l.names, l.err)
	case c := <-called:
		t.Fatalf("tools/call was answered before the bridge was reached: %v, %v", c.res, c.err)
	default:
	}

	open()
	l := <-listed
	require.NoError(t, l.err)
	assert.Contains(t, l.names, volume, "the first answer holds the bridge's whole list")
	c := <-called
	require.NoError(t, c.err)
	require.False(t, c.res.IsError, text(c.res))
	assert.EqualValues(t, 7, board.State()["audio_speaker.volume"])
}

// TestStdioProxyBridgeNotUpYet: while the bridge is down, held requests
// end with an error that says so; the proxy keeps trying and serves the
// tools once the bridge is up.
func TestStdioProxyBridgeNotUpYet(t *testing.T) {
	// A loopback port with nothing on it, for the bridge to take later.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())

	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	p, err := stdioproxy.New(stdioproxy.Options{URL: "http://" + addr + "/mcp", HTTPClient: hc,
		RetryInterval: 50 * time.Millisecond, StartupWait: 300 * time.Millisecond})
	require.NoError(t, err)
	r := runProxy(t, p, true)

	l0 := listAll(r.host)
	require.Error(t, l0.err, "an empty list is not an answer: got %v", l0.names)
	assert.Contains(t, l0.err.Error(), "not reachable yet")
	volume := upstreamName(macA, "self.audio_speaker.set_volume")
	c := callOnce(r.host, volume, map[string]any{"volume": 7})
	require.NoError(t, c.err)
	require.True(t, c.res.IsError)
	assert.Contains(t, text(c.res), "not reachable yet")

	b := startBridge(t, func(c *app.Config) { c.ControlListen = addr })
	b.Board(macA, "breadboard", simulator.Config{})
	require.Eventually(t, func() bool {
		l := listAll(r.host)
		return l.err == nil && slices.Contains(l.names, volume)
	}, 10*time.Second, 10*time.Millisecond, "the proxy never reached the bridge once it was up")
	res := callTool(t, r.host, volume, map[string]any{"volume": 7})
	require.False(t, res.IsError, text(res))
}

// TestStdioProxyTokenRejected: a bridge that refuses the token is up, so
// the proxy stops with an error naming the status instead of retrying.
func TestStdioProxyTokenRejected(t *testing.T) {
	b := startBridge(t, func(c *app.Config) { c.MCP.Tokens = []string{"tok"} })
	for _, tc := range []struct {
		name, token string
		sent        bool
	}{{"wrong token", "wrong", true}, {"no token", "", false}} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := stdioproxy.New(stdioproxy.Options{URL: b.URL, Token: tc.token, HTTPClient: b.HTTP,
				RetryInterval: 50 * time.Millisecond})
			require.NoError(t, err)
			r := runProxy(t, p, false)
			select {
			case <-r.done:
			case <-time.After(10 * time.Second):
				t.Fatal("the proxy keeps retrying a token the bridge refuses")
			}
			var rej *stdioproxy.TokenRejectedError
			require.True(t, errors.As(r.err, &rej), "Run's error: %v", r.err)
			assert.Equal(t, http.StatusUnauthorized, rej.StatusCode)
			assert.Equal(t, tc.sent, rej.TokenSent)
			assert.Contains(t, rej.Error(), "the bridge rejected the token: 401 Unauthorized")
		})
	}
}

// TestStdioProxyAnswersBeforeEOF: when the host closes its input, the
// session ends only once every request it sent is answered (a request the
// host cancelled excepted), or after DrainWait.
func TestStdioProxyAnswersBeforeEOF(t *testing.T) {
	for _, tc := range []struct {
		name      string
		drainWait time.Duration
	}{{"answered", time.Hour}, {"gives up after DrainWait", 50 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			b := startBridge(t, nil)
			hold := make(chan struct{})
			var release sync.Once
			t.Cleanup(func() { release.Do(func() { close(hold) }) })
			b.Board(macA, "breadboard", simulator.Config{Hold: map[string]<-chan struct{}{slowTool: hold}})
			core, logs := observer.New(zapcore.DebugLevel)
			p, err := stdioproxy.New(stdioproxy.Options{URL: b.URL, HTTPClient: b.HTTP, RetryInterval: 50 * time.Millisecond,
				DrainWait: tc.drainWait, Logger: zap.New(core)})
			require.NoError(t, err)

			call := `{"name":"` + upstreamName(macA, slowTool) + `","arguments":{}}`
			in := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"sh","version":"1"}}}
{"jsonrpc":"2.0","method":"notifications/initialized"}
{"jsonrpc":"2.0","id":2,"method":"tools/call","params":` + call + `}
{"jsonrpc":"2.0","id":3,"method":"tools/call","params":` + call + `}
{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3}}
`
			var out bridgetest.SyncBuffer
			done := make(chan error, 1)
			go func() {
				done <- p.Run(context.Background(), &mcp.IOTransport{Reader: io.NopCloser(strings.NewReader(in)), Writer: nopWriteCloser{&out}})
			}()
			if tc.drainWait == time.Hour {
				require.Eventually(t, func() bool {
					return logs.FilterMessage("the host closed its input; answering what it sent first").Len() > 0
				}, 10*time.Second, 5*time.Millisecond)
				select {
				case err := <-done:
					t.Fatalf("the session ended with a call unanswered: %v\n%s", err, out.String())
				default:
				}
				release.Do(func() { close(hold) })
			}
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("the session did not end after the host closed its input")
			}
			if tc.drainWait == time.Hour {
				assert.Contains(t, out.String(), `"id":2,"result":{"content":[{"type":"text","text":"true"}]`)
			} else {
				assert.Equal(t, 1, logs.FilterMessage("the host closed its input; requests left unanswered").Len())
				assert.NotContains(t, out.String(), `"id":2`)
			}
		})
	}
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// TestStdioProxyContent: every kind of content a board answers reaches a
// stdio host through the proxy as the board sent it.
func TestStdioProxyContent(t *testing.T) {
	want := bridgetest.ContentResults(t)
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			b := startBridge(t, nil)
			b.Board(macA, bridgetest.ContentProfile(t), simulator.Config{})
			p, err := stdioproxy.New(stdioproxy.Options{URL: b.URL, HTTPClient: b.HTTP, ProtocolVersion: era,
				RetryInterval: 50 * time.Millisecond})
			require.NoError(t, err)
			cs := runProxy(t, p, true).host
			require.Eventually(t, func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				n := 0
				for _, err := range cs.Tools(ctx, nil) {
					if err == nil {
						n++
					}
				}
				return n == len(want)
			}, 10*time.Second, 5*time.Millisecond, "the proxy never published the bridge's tools")
			for name, w := range want {
				t.Run(name, func(t *testing.T) {
					bridgetest.AssertSameContent(t, w, callTool(t, cs, upstreamName(macA, name), nil))
				})
			}
		})
	}
}

// TestStdioProxyLegacyShapes: a stdio host speaks a session-based
// protocol version, so its tools/list answer has none of the 2026-07-28
// fields go-sdk would add (ttlMs, cacheScope).
func TestStdioProxyLegacyShapes(t *testing.T) {
	b := startBridge(t, nil)
	p, err := stdioproxy.New(stdioproxy.Options{URL: b.URL, HTTPClient: b.HTTP, RetryInterval: 50 * time.Millisecond, Logger: zap.NewNop()})
	require.NoError(t, err)
	in := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"sh","version":"1"}}}
{"jsonrpc":"2.0","method":"notifications/initialized"}
{"jsonrpc":"2.0","id":2,"method":"tools/list"}
`
	var out bridgetest.SyncBuffer
	done := make(chan error, 1)
	go func() {
		done <- p.Run(context.Background(), &mcp.IOTransport{Reader: io.NopCloser(strings.NewReader(in)), Writer: nopWriteCloser{&out}})
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the session did not end after the host closed its input")
	}
	assert.Contains(t, out.String(), `"id":2,"result":{"tools":[]}`)
	assert.NotContains(t, out.String(), "ttlMs")
}
