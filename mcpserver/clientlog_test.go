//lint:file-ignore SA1019 logging is deprecated in 2026-07-28 (SEP-2577) but still defined there, per request, and served in both eras

package mcpserver_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/bridgetest"
	"github.com/devicebridge/devicebridge/simulator"
)

// logRecorder collects the log messages a client receives; pass its
// Handle as mcp.ClientOptions.LoggingMessageHandler.
type logRecorder struct {
	mu   sync.Mutex
	msgs []*mcp.LoggingMessageParams
}

func (r *logRecorder) Handle(_ context.Context, req *mcp.LoggingMessageRequest) {
	r.mu.Lock()
	r.msgs = append(r.msgs, req.Params)
	r.mu.Unlock()
}

func (r *logRecorder) all() []*mcp.LoggingMessageParams {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*mcp.LoggingMessageParams(nil), r.msgs...)
}

// waitFor waits until there are n messages, and returns them.
func (r *logRecorder) waitFor(t *testing.T, n int) []*mcp.LoggingMessageParams {
	t.Helper()
	require.Eventually(t, func() bool { return len(r.all()) >= n }, 10*time.Second, 5*time.Millisecond,
		"expected %d log messages", n)
	return r.all()
}

// field is one field of a message's data.
func field(p *mcp.LoggingMessageParams, key string) any {
	m, _ := p.Data.(map[string]any)
	return m[key]
}

// callLogged calls a tool asking for log messages at level: in the legacy
// era the session's level is set first (and stays), in the modern era
// the request carries it ("" asks for none).
func callLogged(t *testing.T, cs *mcp.ClientSession, era, level, name string, args any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := withTimeout(10 * time.Second)
	defer cancel()
	params := &mcp.CallToolParams{Name: name, Arguments: args}
	if level != "" {
		if era == legacy {
			require.NoError(t, cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: mcp.LoggingLevel(level)}))
		} else {
			params.Meta = mcp.Meta{"io.modelcontextprotocol/logLevel": level}
		}
	}
	res, err := cs.CallTool(ctx, params)
	require.NoError(t, err)
	return res
}

// TestCallLogMessages: a caller that asked for log messages hears its
// call's steps at debug (received, sent, answered), and at warning only
// what went wrong (the board left during the call); one that asked for
// none hears nothing. No message carries the call's arguments. In the
// modern era the level comes with each request; in the legacy era from
// logging/setLevel.
func TestCallLogMessages(t *testing.T) {
	const payload = "payload-7f3e" // an argument no message may quote
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			b := startBridge(t, func(c *app.Config) { c.MCP.ProgressInterval = -1 })
			b.Board(macA, "breadboard", simulator.Config{DisconnectOn: map[string]bool{"self.lamp.turn_off": true}})
			rec := &logRecorder{}
			cs := b.Client(era, &mcp.ClientOptions{LoggingMessageHandler: rec.Handle})

			// Nothing asked, nothing sent (shown by the next messages
			// being all about the next call).
			require.False(t, callLogged(t, cs, era, "", upstreamName(macA, "self.audio_speaker.set_volume"),
				map[string]any{"volume": 20}).IsError)

			res := callLogged(t, cs, era, "debug", upstreamName(macA, "self.screen.set_theme"), map[string]any{"theme": payload})
			require.False(t, res.IsError, text(res))
			msgs := rec.waitFor(t, 3)
			require.Len(t, msgs, 3, "received, sent, answered")
			for i, want := range []string{"received", "sent", "answered"} {
				m := msgs[i]
				assert.Equal(t, want, field(m, "event"))
				assert.Equal(t, mcp.LoggingLevel("debug"), m.Level)
				assert.Equal(t, "devicebridge", m.Logger)
				assert.Equal(t, "self.screen.set_theme", field(m, "tool"))
				assert.Equal(t, "dev_000001", field(m, "board"))
				data, err := json.Marshal(m)
				require.NoError(t, err)
				assert.NotContains(t, string(data), payload)
			}
			assert.Equal(t, "ok", field(msgs[2], "outcome"))
			assert.Regexp(t, `^board "dev_000001" \(bread-compact-wifi, 02:00:00:00:00:01\) answered self.screen.set_theme in [0-9.]+(µs|ms|s)$`,
				field(msgs[2], "message"))

			// At warning: a call that went well says nothing; a board that
			// drops the connection during the call does.
			require.False(t, callLogged(t, cs, era, "warning", upstreamName(macA, "self.audio_speaker.set_volume"),
				map[string]any{"volume": 30}).IsError)
			res = callLogged(t, cs, era, "warning", upstreamName(macA, "self.lamp.turn_off"), nil)
			require.True(t, res.IsError)
			msgs = rec.waitFor(t, 4)
			require.Len(t, msgs, 4)
			last := msgs[3]
			assert.Equal(t, mcp.LoggingLevel("warning"), last.Level)
			assert.Equal(t, "answered", field(last, "event"))
			assert.Equal(t, string(device.CodeOffline), field(last, "outcome"))
			assert.Equal(t, `board "dev_000001" (bread-compact-wifi, 02:00:00:00:00:01) disconnected during self.lamp.turn_off, `+
				`before it answered; the outcome is unknown`, field(last, "message"))
		})
	}
}

// TestSetLevelRefusesUnknownLevels: logging/setLevel with a level MCP
// does not define is invalid params (not taken for "debug").
func TestSetLevelRefusesUnknownLevels(t *testing.T) {
	b := startBridge(t, nil)
	cs := b.Client(legacy, nil)
	ctx, cancel := withTimeout(10 * time.Second)
	defer cancel()
	err := cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "verbose"})
	requireRPCCode(t, err, jsonrpc.CodeInvalidParams)
	require.NoError(t, cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "notice"}))
}

// TestProgressStages: a fast call with a progress token gets its steps as
// progress notifications with increasing values (three at least, as
// clients expect of a call that reports progress), and one that waits
// behind another call to the same board is told how many are ahead.
func TestProgressStages(t *testing.T) {
	release := make(chan struct{})
	b := startBridge(t, func(c *app.Config) { c.MCP.ProgressInterval = -1 })
	b.Board(macA, "breadboard", simulator.Config{Hold: map[string]<-chan struct{}{slowTool: release}})
	board := `board "dev_000001" (bread-compact-wifi, 02:00:00:00:00:01)`
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			rec := bridgetest.NewProgress()
			cs := b.Client(era, &mcp.ClientOptions{ProgressNotificationHandler: rec.Handle})
			ctx, cancel := withTimeout(10 * time.Second)
			defer cancel()

			params := &mcp.CallToolParams{Name: upstreamName(macA, "self.lamp.get_state")}
			params.SetProgressToken("fast")
			res, err := cs.CallTool(ctx, params)
			require.NoError(t, err)
			require.False(t, res.IsError, text(res))
			require.Eventually(t, func() bool { return len(rec.All()) >= 3 }, 10*time.Second, 5*time.Millisecond)
			events := rec.All()
			require.Len(t, events, 3)
			assert.Equal(t, "received call of self.lamp.get_state for "+board, events[0].Message)
			assert.Equal(t, "sent self.lamp.get_state to "+board, events[1].Message)
			assert.Contains(t, events[2].Message, board+" answered self.lamp.get_state in ")
			for i, ev := range events {
				assert.Equal(t, "fast", ev.ProgressToken)
				if i > 0 {
					assert.Greater(t, ev.Progress, events[i-1].Progress)
				}
			}

			// The lamp holds the board; a call behind it hears so.
			first := make(chan error, 1)
			go func() {
				_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: upstreamName(macA, slowTool)})
				first <- err
			}()
			require.Eventually(t, func() bool { return pending(b, macA) == 1 }, 10*time.Second, 5*time.Millisecond)
			behind := make(chan error, 1)
			params = &mcp.CallToolParams{Name: upstreamName(macA, "self.lamp.get_state")}
			params.SetProgressToken("behind")
			go func() {
				_, err := cs.CallTool(ctx, params)
				behind <- err
			}()
			queued := "call queued behind 1 call for " + board
			require.Eventually(t, func() bool {
				for _, ev := range rec.All() {
					if ev.ProgressToken == "behind" && ev.Message == queued {
						return true
					}
				}
				return false
			}, 10*time.Second, 5*time.Millisecond, "the waiting call was not told it is queued")
			release <- struct{}{}
			require.NoError(t, <-first)
			require.NoError(t, <-behind)
			var steps []string
			require.Eventually(t, func() bool {
				steps = steps[:0]
				for _, ev := range rec.All() {
					if ev.ProgressToken == "behind" {
						steps = append(steps, strings.Fields(ev.Message)[0])
					}
				}
				return len(steps) == 4
			}, 10*time.Second, 5*time.Millisecond)
			assert.Equal(t, []string{"received", "call", "sent", "board"}, steps)
		})
	}
}

// pending is the board's call queue depth (device.Session.Pending).
func pending(b *bridge, mac string) int {
	s, ok := b.App.Hub.Session(mac)
	if !ok {
		return 0
	}
	return s.Pending()
}

// TestBoardNews: a legacy session that set its level to info or below
// hears when boards it may see become ready or go offline (and only
// those: the policy applies); sessions that asked for nothing, or only
// for warnings, hear nothing.
func TestBoardNews(t *testing.T) {
	const (
		kitchenMAC = "02:00:00:00:0a:01"
		officeMAC  = "02:00:00:00:0b:01"
	)
	policyFile := filepath.Join(t.TempDir(), "policy.yaml")
	require.NoError(t, os.WriteFile(policyFile, []byte("identities:\n  all:\n    boards: [\"*\"]\n  cook:\n    boards: [kitchen]\n"), 0o600))
	b := startBridge(t, func(c *app.Config) {
		c.MCP.Tokens = []string{"all=all-secret-0123456789", "cook=cook-secret-0123456789"}
		c.MCP.Aliases = map[string]string{kitchenMAC: "kitchen", officeMAC: "office"}
		c.Auth.PolicyFile = policyFile
	})
	session := func(token, level string) *logRecorder {
		rec := &logRecorder{}
		cs := b.ClientWith(legacy, &mcp.ClientOptions{LoggingMessageHandler: rec.Handle}, tokenHTTP(t, token))
		if level != "" {
			ctx, cancel := withTimeout(10 * time.Second)
			defer cancel()
			require.NoError(t, cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: mcp.LoggingLevel(level)}))
		}
		return rec
	}
	everything := session("all-secret-0123456789", "info")
	cook := session("cook-secret-0123456789", "debug")
	silent := session("all-secret-0123456789", "")
	warnings := session("all-secret-0123456789", "warning")

	kitchen := b.Board(kitchenMAC, "breadboard", simulator.Config{})
	office := b.Board(officeMAC, "robot", simulator.Config{})
	about := func(msgs []*mcp.LoggingMessageParams) []string {
		var out []string
		for _, m := range msgs {
			assert.Equal(t, mcp.LoggingLevel("info"), m.Level)
			out = append(out, field(m, "event").(string)+" "+field(m, "board").(string))
		}
		return out
	}
	assert.ElementsMatch(t, []string{"board_ready kitchen", "board_ready office"}, about(everything.waitFor(t, 2)))
	msgs := everything.all()
	assert.Equal(t, `board "kitchen" (bread-compact-wifi, 02:00:00:00:0a:01) is ready (13 tools)`, field(msgs[0], "message"))

	require.NoError(t, office.Close())
	b.WaitState(officeMAC, device.StateClosed)
	msgs = everything.waitFor(t, 3)
	assert.Equal(t, "board_offline office", about(msgs[2:])[0])
	assert.Equal(t, "disconnected", field(msgs[2], "cause"))

	require.NoError(t, kitchen.Close())
	b.WaitState(kitchenMAC, device.StateClosed)
	everything.waitFor(t, 4)
	// The cook sees the kitchen only: had the office's news reached it,
	// it would have come before the kitchen's going.
	assert.Equal(t, []string{"board_ready kitchen", "board_offline kitchen"}, about(cook.waitFor(t, 2)))
	assert.Empty(t, silent.all())
	assert.Empty(t, warnings.all())
}

// TestHeartbeatLogMessages: a caller that asked for debug messages but
// gave no progress token hears the heartbeats as log messages while its
// board works.
func TestHeartbeatLogMessages(t *testing.T) {
	release := make(chan struct{})
	b, _ := slowBridge(t, 0, release)
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			rec := &logRecorder{}
			cs := b.Client(era, &mcp.ClientOptions{LoggingMessageHandler: rec.Handle})
			ctx, cancel := withTimeout(10 * time.Second)
			defer cancel()
			params := &mcp.CallToolParams{Name: upstreamName(macA, slowTool)}
			if era == legacy {
				require.NoError(t, cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "debug"}))
			} else {
				params.Meta = mcp.Meta{"io.modelcontextprotocol/logLevel": "debug"}
			}
			type outcome struct {
				res *mcp.CallToolResult
				err error
			}
			done := make(chan outcome, 1)
			go func() {
				res, err := cs.CallTool(ctx, params)
				done <- outcome{res, err}
			}()
			require.Eventually(t, func() bool {
				for _, m := range rec.all() {
					if field(m, "event") == "waiting" {
						return true
					}
				}
				return false
			}, 10*time.Second, 5*time.Millisecond, "no heartbeat while the board works")
			var out outcome
			select {
			case release <- struct{}{}: // taken once the board reaches the hold
				out = <-done
			case out = <-done:
				t.Fatalf("the call ended before the board finished it: %v", out.err)
			}
			require.NoError(t, out.err)
			require.False(t, out.res.IsError, text(out.res))
			msgs := rec.all()
			for _, m := range msgs {
				if field(m, "event") == "waiting" {
					assert.Equal(t, mcp.LoggingLevel("debug"), m.Level)
					assert.Contains(t, field(m, "message"), `still waiting for board "dev_000001" to finish self.lamp.turn_on (`)
				}
			}
			assert.Equal(t, "received", field(msgs[0], "event"))
		})
	}
}
