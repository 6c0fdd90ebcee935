package mcpserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/devicebridge/devicebridge/internal/bridgetest"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/devicebridge/devicebridge/device"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/simulator"
)

const slowTool = "self.lamp.turn_on"

// slowBridge has one breadboard whose lamp takes delay to switch on and
// then waits for a value on (or the close of) release, and sends progress
// heartbeats every 50ms.
func slowBridge(t *testing.T, delay time.Duration, release <-chan struct{}) (*bridge, *simulator.Board) {
	b := startBridge(t, func(c *app.Config) { c.MCP.ProgressInterval = 50 * time.Millisecond })
	board := b.Board(macA, "breadboard", simulator.Config{
		ToolDelay: map[string]time.Duration{slowTool: delay},
		Hold:      map[string]<-chan struct{}{slowTool: release},
	})
	return b, board
}

// cancelledOutcome reports whether the bridge logged the slow call as
// cancelled.
func cancelledOutcome(b *bridge) bool {
	for _, e := range b.Logs.FilterMessage("tool call").All() {
		f := e.ContextMap()
		if f["tool"] == slowTool && f["outcome"] == string(device.CodeCanceled) && f["device_id"] == macA {
			return true
		}
	}
	return false
}

// TestProgressHeartbeats: a call that waits for its board sends progress
// notifications when the client gave a progress token, and none without:
// its steps (received, sent, answered) and, while the board works,
// heartbeats every progress interval, all with increasing progress.
func TestProgressHeartbeats(t *testing.T) {
	release := make(chan struct{})
	b, _ := slowBridge(t, 400*time.Millisecond, release)
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			rec := bridgetest.NewProgress()
			cs := b.Client(era, &mcp.ClientOptions{ProgressNotificationHandler: rec.Handle})

			// Without a token: a 400ms call, eight heartbeat intervals.
			ctx, cancel := withTimeout(10 * time.Second)
			defer cancel()
			errc := make(chan error, 1)
			call := func(params *mcp.CallToolParams) {
				res, err := cs.CallTool(ctx, params)
				if err == nil && res.IsError {
					err = errors.New(text(res))
				}
				errc <- err
			}
			go call(&mcp.CallToolParams{Name: upstreamName(macA, slowTool)})
			finish := func() {
				t.Helper()
				select {
				case release <- struct{}{}: // taken once the board reaches the hold
				case err := <-errc:
					t.Fatalf("the call ended before the board finished it: %v", err)
				}
				require.NoError(t, <-errc)
			}
			finish() // after the board's 400ms
			assert.Empty(t, rec.All(), "no token, no heartbeats")

			// With a token: the board holds the call until two heartbeats
			// have arrived.
			params := &mcp.CallToolParams{Name: upstreamName(macA, slowTool)}
			params.SetProgressToken("lamp-" + era)
			go call(params)
			// Notifications are handled asynchronously by the client.
			require.Eventually(t, func() bool { return len(heartbeats(rec.All())) >= 2 }, 10*time.Second, 5*time.Millisecond,
				"heartbeats every 50ms while the board works")
			finish()
			var events []*mcp.ProgressNotificationParams
			require.Eventually(t, func() bool {
				events = rec.All()
				return strings.Contains(events[len(events)-1].Message, "answered")
			}, 10*time.Second, 5*time.Millisecond, "the last step is the answer")
			board := `board "dev_000001" (bread-compact-wifi, 02:00:00:00:00:01)`
			assert.Equal(t, "received call of self.lamp.turn_on for "+board, events[0].Message)
			assert.Equal(t, "sent self.lamp.turn_on to "+board, events[1].Message)
			assert.Regexp(t, `^`+regexp.QuoteMeta(board)+` answered self.lamp.turn_on in [0-9.]+(µs|ms|s)$`, events[len(events)-1].Message)
			assert.Len(t, heartbeats(events), len(events)-3, "between sent and answered, only heartbeats")
			for i, ev := range events {
				assert.Equal(t, "lamp-"+era, ev.ProgressToken)
				if i > 0 {
					assert.Greater(t, ev.Progress, events[i-1].Progress, "progress increases")
				}
			}
		})
	}
}

// TestCancelStopsWaiting: cancelling a slow call (notifications/cancelled
// in the legacy era, closing the stream in the modern one) returns on the
// client and stops the bridge waiting for the board while the board is
// still working; the board stays usable.
func TestCancelStopsWaiting(t *testing.T) {
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			release := make(chan struct{})
			b, board := slowBridge(t, 0, release)
			rec := bridgetest.NewProgress()
			cs := b.Client(era, &mcp.ClientOptions{ProgressNotificationHandler: rec.Handle})

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			params := &mcp.CallToolParams{Name: upstreamName(macA, slowTool)}
			params.SetProgressToken("slow")
			errc := make(chan error, 1)
			go func() {
				_, err := cs.CallTool(ctx, params)
				errc <- err
			}()
			// A heartbeat: the call is running on the board.
			require.Eventually(t, func() bool { return len(heartbeats(rec.All())) > 0 }, 10*time.Second, 5*time.Millisecond,
				"no heartbeat from the slow call")
			cancel()
			// The board holds the call until release is closed, so both of
			// these happen while it is still working.
			select {
			case err := <-errc:
				require.ErrorIs(t, err, context.Canceled)
			case <-time.After(10 * time.Second):
				t.Fatal("the cancelled call did not return")
			}
			require.Eventually(t, func() bool { return cancelledOutcome(b) }, 10*time.Second, 5*time.Millisecond,
				"the bridge did not stop waiting for the board")
			require.Zero(t, board.Stats().CallsRun, "the board has not finished the cancelled call")

			// The board finishes its work and takes the next call.
			close(release)
			res := callTool(t, cs, upstreamName(macA, "self.lamp.get_state"), nil)
			require.False(t, res.IsError, text(res))
			assert.Equal(t, uint64(2), board.Stats().CallsRun)
		})
	}
}

// TestCancelledCallGetsNoResult (legacy, on the wire): after
// notifications/cancelled the call's stream ends without a response, and a
// resumed stream does not replay one either; other calls are unaffected.
func TestCancelledCallGetsNoResult(t *testing.T) {
	release := make(chan struct{})
	b, board := slowBridge(t, 0, release)
	sid := rawSession(b, legacy)
	hdr := map[string]string{"Mcp-Session-Id": sid, "MCP-Protocol-Version": legacy}

	// A normal call: its result arrives.
	resp := do(b, rawRequest(b, "POST", `{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"`+
		upstreamName(macA, "self.lamp.get_state")+`"}}`, hdr))
	msg := rawMessage(t, resp)
	require.Contains(t, msg, "result")

	// The slow call, read as a live stream.
	req := rawRequest(b, "POST", `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"`+
		upstreamName(macA, slowTool)+`","_meta":{"progressToken":"p7"}}}`, hdr)
	ctx, cancel := withTimeout(10 * time.Second)
	defer cancel()
	resp, err := b.HTTP.Do(req.WithContext(ctx))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	events := make(chan sseEvent, 64)
	done := make(chan struct{})
	go func() { defer close(done); readSSE(resp.Body, events) }()
	defer func() { cancel(); <-done }()

	var lastID string
	for sawProgress := false; !sawProgress; {
		ev, ok := nextEvent(t, events, 5*time.Second)
		require.True(t, ok, "stream ended early")
		if ev.ID != "" {
			lastID = ev.ID
		}
		sawProgress = strings.Contains(ev.Data, "notifications/progress")
	}
	require.NotEmpty(t, lastID, "legacy streams carry event ids (resumable)")

	status, _, _ := rawStatus(b, "POST", `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"user stop"}}`, hdr)
	require.Equal(t, http.StatusAccepted, status)

	// The stream ends; no event is the response to 7.
	for {
		ev, ok := nextEvent(t, events, 5*time.Second)
		if !ok {
			break
		}
		require.False(t, isResponseTo(ev, 7), "late result sent: %s", ev.Data)
		if ev.ID != "" {
			lastID = ev.ID
		}
	}
	require.Eventually(t, func() bool { return cancelledOutcome(b) }, 10*time.Second, 5*time.Millisecond, "the bridge did not log the cancellation")

	// The board now finishes the call and sends its late result. It
	// answers in order, so once call 8 is answered the late result has
	// reached the bridge.
	close(release)
	resp = do(b, rawRequest(b, "POST", `{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"`+
		upstreamName(macA, "self.lamp.get_state")+`"}}`, hdr))
	msg = rawMessage(t, resp)
	require.Contains(t, msg, "result", "the session is still fine")
	data, _ := json.Marshal(msg)
	require.Contains(t, string(data), "power")
	require.Equal(t, uint64(3), board.Stats().CallsRun, "the board ran the cancelled call too")

	// Resuming the stream replays nothing of the response either.
	resume := rawRequest(b, "GET", "", map[string]string{"Mcp-Session-Id": sid, "MCP-Protocol-Version": legacy,
		"Last-Event-ID": streamStart(lastID)})
	resume.Header.Set("Accept", "text/event-stream")
	rresp := do(b, resume)
	defer rresp.Body.Close()
	require.Equal(t, http.StatusOK, rresp.StatusCode)
	replayed := make(chan sseEvent, 64)
	readSSE(rresp.Body, replayed)
	for ev := range replayed {
		require.False(t, isResponseTo(ev, 7), "late result replayed: %s", ev.Data)
	}
}

// heartbeats are the progress notifications that say a call still waits
// for its board.
func heartbeats(events []*mcp.ProgressNotificationParams) []*mcp.ProgressNotificationParams {
	var out []*mcp.ProgressNotificationParams
	for _, ev := range events {
		if strings.Contains(ev.Message, `still waiting for board "dev_000001" to finish self.lamp.turn_on`) {
			out = append(out, ev)
		}
	}
	return out
}

// streamStart turns an event id "<stream>_<n>" into the id of the stream's
// first event, so that a resumption replays everything after it.
func streamStart(id string) string {
	stream, _, _ := strings.Cut(id, "_")
	return fmt.Sprintf("%s_0", stream)
}
