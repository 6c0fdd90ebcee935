package mcpclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/devicebridge/devicebridge/envelope"
	"github.com/devicebridge/devicebridge/internal/logthrottle"
	"github.com/devicebridge/devicebridge/internal/testlink"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// request is what the fake board sees.
type request = testlink.Request

// fakeBoard is the shared scripted board; requests() lists what it saw.
type fakeBoard struct{ *testlink.Board }

func (fb fakeBoard) requests() []request { return fb.Requests() }

func newClient(t *testing.T, opts Options, reply func(r request) string) (*Client, fakeBoard) {
	t.Helper()
	bridge, end := testlink.Pair(64)
	fb := fakeBoard{testlink.NewBoard(end, reply)}
	c := New(envelope.NewStream(bridge, envelope.StreamOptions{}), opts)
	t.Cleanup(func() {
		_ = c.Close()
		bridge.Close(nil)
		fb.Close()
		assert.Empty(t, fb.Errs(), "the client sent something that is not MCP")
	})
	return c, fb
}

func result(r request, res string) string { return testlink.Result(r, res) }

// errorReply is a board's error reply; msg is inserted raw, as the
// firmware does (it does not escape quotes).
func errorReply(r request, msg string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"error":{"message":"%s"}}`, r.ID, msg)
}

func tool(name string) string {
	return fmt.Sprintf(`{"name":%q,"description":"d","inputSchema":{"type":"object","properties":{}}}`, name)
}

func TestInitializeSendsIntegerIDsAndVision(t *testing.T) {
	c, fb := newClient(t, Options{Vision: &Vision{URL: "http://v/explain", Token: "tk"}, ClientVersion: "1.2"}, func(r request) string {
		return result(r, `{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"bread-compact-wifi","version":"2.4.2"}}`)
	})
	res, err := c.Initialize(context.Background())
	require.NoError(t, err)
	assert.Equal(t, "bread-compact-wifi", res.ServerInfo.Name)
	assert.Equal(t, "2.4.2", res.ServerInfo.Version)

	reqs := fb.requests()
	require.Len(t, reqs, 1)
	assert.Equal(t, "2.0", reqs[0].JSONRPC)
	id, err := reqs[0].ID.Int64()
	require.NoError(t, err, "ids must be integers")
	assert.Positive(t, id)
	assert.JSONEq(t, `{"protocolVersion":"2024-11-05","capabilities":{"vision":{"url":"http://v/explain","token":"tk"}},"clientInfo":{"name":"devicebridge","version":"1.2"}}`, string(reqs[0].Params))
}

// pagedBoard serves tools in pages of size per page with an inclusive
// tool-name cursor, as the firmware does.
func pagedBoard(names []string, per int) func(r request) string {
	return func(r request) string {
		var p struct {
			Cursor string `json:"cursor"`
		}
		_ = json.Unmarshal(r.Params, &p)
		start := 0
		if p.Cursor != "" {
			start = -1
			for i, n := range names {
				if n == p.Cursor {
					start = i
				}
			}
			if start < 0 {
				return errorReply(r, "Failed to add tool  because of payload size limit")
			}
		}
		end := min(start+per, len(names))
		items := make([]string, 0, per)
		for _, n := range names[start:end] {
			items = append(items, tool(n))
		}
		res := `{"tools":[` + strings.Join(items, ",") + `]`
		if end < len(names) {
			res += fmt.Sprintf(`,"nextCursor":%q`, names[end])
		}
		return result(r, res+"}")
	}
}

func TestListToolsFollowsInclusiveCursor(t *testing.T) {
	var names []string
	for i := range 10 {
		names = append(names, fmt.Sprintf("self.tool_%02d", i))
	}
	c, fb := newClient(t, Options{WithUserTools: true}, pagedBoard(names, 4))
	tools, err := c.ListTools(context.Background())
	require.NoError(t, err)
	got := make([]string, 0, len(tools))
	for _, tl := range tools {
		got = append(got, tl.Name)
	}
	assert.Equal(t, names, got, "tools in device order, none lost or repeated")

	reqs := fb.requests()
	require.Len(t, reqs, 3)
	assert.JSONEq(t, `{"withUserTools":true}`, string(reqs[0].Params))
	assert.JSONEq(t, `{"cursor":"self.tool_04","withUserTools":true}`, string(reqs[1].Params), "withUserTools is re-sent on every page")
	assert.JSONEq(t, `{"cursor":"self.tool_08","withUserTools":true}`, string(reqs[2].Params))
}

func TestListToolsOmitsWithUserToolsWhenOff(t *testing.T) {
	c, fb := newClient(t, Options{}, pagedBoard([]string{"a"}, 4))
	_, err := c.ListTools(context.Background())
	require.NoError(t, err)
	assert.JSONEq(t, `{}`, string(fb.requests()[0].Params))
}

func TestListToolsLimits(t *testing.T) {
	tests := []struct {
		name    string
		opts    Options
		board   func(r request) string
		wantErr error
	}{
		{name: "cursor loop", board: func(r request) string {
			return result(r, `{"tools":[`+tool("self.a")+`],"nextCursor":"self.b"}`)
		}, wantErr: ErrCursorLoop},
		{name: "cursor alternating between two names", board: func() func(r request) string {
			n := 0
			return func(r request) string {
				n++
				return result(r, fmt.Sprintf(`{"tools":[],"nextCursor":"c%d"}`, n%2))
			}
		}(), wantErr: ErrCursorLoop},
		{name: "page cap", opts: Options{MaxPages: 3}, board: func() func(r request) string {
			n := 0
			return func(r request) string {
				n++
				return result(r, fmt.Sprintf(`{"tools":[%s],"nextCursor":"c%d"}`, tool(fmt.Sprint("t", n)), n))
			}
		}(), wantErr: ErrTooManyPages},
		{name: "tool cap", opts: Options{MaxTools: 5}, board: pagedBoard([]string{"a", "b", "c", "d", "e", "f", "g"}, 3), wantErr: ErrTooManyTools},
		// Pages each under the frame limit still add up: the whole list
		// is bounded too.
		{name: "size cap", opts: Options{MaxListBytes: 1000}, board: func() func(r request) string {
			n := 0
			return func(r request) string {
				n++
				return result(r, fmt.Sprintf(`{"tools":[%s],"nextCursor":"c%d"}`, tool(fmt.Sprint(strings.Repeat("t", 300), n)), n))
			}
		}(), wantErr: ErrListTooLarge},
		// Repeats count against the cap: a board listing one tool over
		// and over is refused, not read (and logged) without end.
		{name: "one tool repeated", opts: Options{MaxTools: 5}, board: func(r request) string {
			return result(r, `{"tools":[`+strings.Repeat(tool("a")+",", 9)+tool("a")+`]}`)
		}, wantErr: ErrTooManyTools},
		{name: "nameless tool", board: func(r request) string {
			return result(r, `{"tools":[{"description":"x"}]}`)
		}, wantErr: ErrBadReply},
		{name: "unknown cursor error", board: func(r request) string {
			if strings.Contains(string(r.Params), "cursor") {
				return errorReply(r, "Failed to add tool  because of payload size limit")
			}
			return result(r, `{"tools":[`+tool("a")+`],"nextCursor":"gone"}`)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := newClient(t, tt.opts, tt.board)
			_, err := c.ListTools(context.Background())
			require.Error(t, err)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
			} else {
				var de *DeviceError
				require.ErrorAs(t, err, &de)
				assert.Equal(t, "Failed to add tool  because of payload size limit", de.Message)
			}
		})
	}
}

// TestRepeatedToolsLoggedOnce: tools listed twice are kept once and
// reported in one line per listing, whatever the number of repeats.
func TestRepeatedToolsLoggedOnce(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	duplicateLog = logthrottle.Throttle{} // a fresh interval for this test
	names := []string{"a", "b", "a", "b", "a", "c"}
	var list []string
	for _, n := range names {
		list = append(list, tool(n))
	}
	c, _ := newClient(t, Options{Logger: zap.New(core)}, func(r request) string {
		return result(r, `{"tools":[`+strings.Join(list, ",")+`]}`)
	})
	tools, err := c.ListTools(context.Background())
	require.NoError(t, err)
	require.Len(t, tools, 3)
	lines := logs.FilterMessageSnippet("more than once").All()
	require.Len(t, lines, 1)
	assert.EqualValues(t, 3, lines[0].ContextMap()["repeats"])
}

// TestCallToolErrorsAndTimeouts runs in a synctest bubble: its timeouts
// and the slow tool's work run on the bubble's fake clock, so they are
// exact whatever the load on the machine.
func TestCallToolErrorsAndTimeouts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		c, _ := newClient(t, Options{CallTimeout: 200 * time.Millisecond, ToolTimeouts: map[string]time.Duration{"slow.but.allowed": 5 * time.Second}}, func(r request) string {
			var p callParams
			_ = json.Unmarshal(r.Params, &p)
			switch p.Name {
			case "ok":
				return result(r, `{"content":[{"type":"text","text":"true"}],"isError":false}`)
			case "fails":
				return errorReply(r, "Missing valid argument: volume")
			case "never":
				return ""
			case "slow.but.allowed":
				<-release
				return result(r, `{"content":[{"type":"text","text":"done"}],"isError":false}`)
			}
			return errorReply(r, "Unknown tool: "+p.Name)
		})
		ctx := context.Background()

		res, err := c.CallTool(ctx, "ok", json.RawMessage(`{"volume":5}`))
		require.NoError(t, err)
		assert.Equal(t, "true", res.Text())

		_, err = c.CallTool(ctx, "fails", nil)
		var de *DeviceError
		require.ErrorAs(t, err, &de)
		assert.Equal(t, "Missing valid argument: volume", de.Message)

		_, err = c.CallTool(ctx, "never", nil)
		require.ErrorIs(t, err, ErrTimeout)
		assert.Contains(t, err.Error(), "outcome unknown")

		// The client stays usable after a timeout.
		_, err = c.CallTool(ctx, "ok", nil)
		require.NoError(t, err)

		// A per-tool override outlives the default timeout.
		// The board works for 400ms of the bubble's clock, past the 200ms default.
		go func() { time.Sleep(400 * time.Millisecond); close(release) }()
		res, err = c.CallTool(ctx, "slow.but.allowed", nil)
		require.NoError(t, err)
		assert.Equal(t, "done", res.Text())
	})
}

func TestBusyQueueFailsFast(t *testing.T) {
	block := make(chan struct{})
	started := make(chan struct{}, 8)
	c, _ := newClient(t, Options{QueueSize: 1}, func(r request) string {
		started <- struct{}{}
		<-block
		return result(r, `{"content":[],"isError":false}`)
	})
	ctx := context.Background()
	errs := make(chan error, 2)
	go func() { _, err := c.CallTool(ctx, "a", nil); errs <- err }()
	<-started // one running on the board
	go func() { _, err := c.CallTool(ctx, "b", nil); errs <- err }()
	// Wait until the second call holds the single queue slot.
	require.Eventually(t, func() bool { return len(c.slots) == 2 }, 5*time.Second, 5*time.Millisecond)
	_, err := c.CallTool(ctx, "c", nil)
	require.ErrorIs(t, err, ErrBusy)
	close(block)
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
}

// TestOneRequestAtATime: concurrent calls reach the board one by one. The
// board holds each reply until every other goroutine is durably blocked
// (synctest.Wait), so a client that sent a second request before the first
// was answered would have done so by then; the test counts what the board
// has received but not yet answered.
func TestOneRequestAtATime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bridge, board := testlink.Pair(64)
		c := New(envelope.NewStream(bridge, envelope.StreamOptions{}), Options{})
		received := make(chan request, 64)
		boardDone := make(chan struct{})
		go func() {
			defer close(boardDone)
			for {
				msg, err := board.Receive(context.Background())
				if err != nil {
					return
				}
				env, err := envelope.Decode(msg, 0)
				if !assert.NoError(t, err) {
					return
				}
				var r request
				dec := json.NewDecoder(strings.NewReader(string(env.Payload)))
				dec.UseNumber()
				if !assert.NoError(t, dec.Decode(&r)) {
					return
				}
				received <- r
			}
		}()
		defer func() {
			_ = c.Close()
			bridge.Close(nil)
			<-boardDone
		}()

		const calls = 5
		errs := make(chan error, calls)
		for i := range calls {
			go func() {
				_, err := c.CallTool(context.Background(), fmt.Sprintf("tool%d", i), nil)
				errs <- err
			}()
		}
		for range calls {
			synctest.Wait() // every caller is waiting: for its turn, or for a reply
			var outstanding []request
			for len(received) > 0 {
				outstanding = append(outstanding, <-received)
			}
			var ids []string
			for _, r := range outstanding {
				ids = append(ids, r.ID.String())
			}
			require.Len(t, ids, 1, "ids of the requests outstanding on the board at once")
			r := outstanding[0]
			require.NoError(t, board.Send(context.Background(),
				[]byte(`{"session_id":"","type":"mcp","payload":`+result(r, `{"content":[],"isError":false}`)+`}`)))
		}
		for range calls {
			require.NoError(t, <-errs)
		}
	})
}

func TestDisconnectFailsPendingAtOnce(t *testing.T) {
	got := make(chan struct{})
	bridge, board := testlink.Pair(8)
	c := New(envelope.NewStream(bridge, envelope.StreamOptions{}), Options{CallTimeout: time.Minute})
	defer c.Close()
	go func() {
		_, _ = board.Receive(context.Background())
		close(got)
	}()
	errs := make(chan error, 2)
	go func() { _, err := c.CallTool(context.Background(), "self.audio_speaker.set_volume", nil); errs <- err }()
	go func() {
		<-got
		_, err := c.CallTool(context.Background(), "queued", nil) // waits behind the first
		errs <- err
	}()
	<-got
	// With a one-minute timeout, ErrDisconnected (not ErrTimeout) shows
	// the pending calls failed at the disconnect.
	board.Close(fmt.Errorf("board unplugged"))
	require.ErrorIs(t, <-errs, ErrDisconnected)
	require.ErrorIs(t, <-errs, ErrDisconnected)
}

func TestRestartingToolDisconnectIsTheOutcome(t *testing.T) {
	bridge, board := testlink.Pair(8)
	c := New(envelope.NewStream(bridge, envelope.StreamOptions{}), Options{})
	defer c.Close()
	go func() {
		_, _ = board.Receive(context.Background())
		board.Close(fmt.Errorf("rebooting"))
	}()
	res, err := c.CallTool(context.Background(), "self.reboot", nil)
	require.NoError(t, err)
	assert.Contains(t, res.Text(), "closed its connection")
}

func TestUserOnly(t *testing.T) {
	assert.True(t, Tool{Annotations: json.RawMessage(`{"audience":["user"]}`)}.UserOnly())
	assert.False(t, Tool{Annotations: json.RawMessage(`{"audience":["user","assistant"]}`)}.UserOnly())
	assert.False(t, Tool{}.UserOnly())
	assert.False(t, Tool{Annotations: json.RawMessage(`{"audience":"user"}`)}.UserOnly())
}

func TestIDsStayWithinInt32(t *testing.T) {
	c := &Client{}
	c.ids.Store(1<<31 - 3)
	a, b, d := c.nextID(), c.nextID(), c.nextID()
	assert.EqualValues(t, 1<<31-2, a)
	assert.EqualValues(t, 1, b, "wraps before reaching MaxInt32")
	assert.EqualValues(t, 2, d)
}

// TestQueuedCallsShareOneTimeout: a board that stops answering holds the
// call it was sent. Every call queued behind it ends within one timeout of
// when it was made, not one timeout per call ahead of it. Calls made
// together with the first never reach the board and say so ("not sent",
// not "outcome unknown"); calls made later are sent with what is left of
// their time. The bubble's clock makes the times exact.
func TestQueuedCallsShareOneTimeout(t *testing.T) {
	const timeout = 5 * time.Second
	type outcome struct {
		i    int
		err  error
		took time.Duration
	}
	// run makes calls one after another, gap apart, against a silent board.
	run := func(t *testing.T, calls int, gap time.Duration) ([]outcome, []request) {
		c, fb := newClient(t, Options{CallTimeout: timeout}, func(request) string { return "" })
		out := make(chan outcome, calls)
		for i := range calls {
			go func() {
				start := time.Now()
				_, err := c.CallTool(context.Background(), fmt.Sprintf("tool%d", i), nil)
				out <- outcome{i, err, time.Since(start)}
			}()
			synctest.Wait() // queued in order
			time.Sleep(gap)
		}
		got := make([]outcome, calls)
		for range calls {
			o := <-out
			got[o.i] = o
		}
		return got, fb.requests()
	}

	synctest.Test(t, func(t *testing.T) {
		got, seen := run(t, 8, 0)
		for _, o := range got {
			assert.LessOrEqual(t, o.took, timeout, "call %d answered %v after it was made", o.i, o.took)
			if o.i == 0 {
				assert.ErrorIs(t, o.err, ErrTimeout, "the call the board was sent")
				continue
			}
			assert.ErrorIs(t, o.err, ErrQueueTimeout, "call %d", o.i)
			assert.NotErrorIs(t, o.err, ErrTimeout, "call %d was not sent: its outcome is known", o.i)
			assert.Contains(t, fmt.Sprint(o.err), "not sent")
		}
		assert.Len(t, seen, 1, "only the first call reached the board")
	})
	synctest.Test(t, func(t *testing.T) {
		got, _ := run(t, 8, timeout/3)
		for _, o := range got {
			assert.LessOrEqual(t, o.took, timeout, "call %d answered %v after it was made", o.i, o.took)
			if !errors.Is(o.err, ErrQueueTimeout) {
				assert.ErrorIs(t, o.err, ErrTimeout, "call %d", o.i)
			}
		}
	})
}

// TestGivenUpCallIsNeverSent: a caller that gives up (its context ends)
// while its call waits is answered at once, and the call is not sent when
// the board is free again, even when the board frees up at the very moment
// the caller's time runs out.
func TestGivenUpCallIsNeverSent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, fb := newClient(t, Options{CallTimeout: time.Minute}, func(r request) string {
			var p callParams
			_ = json.Unmarshal(r.Params, &p)
			if p.Name == "slow" {
				time.Sleep(time.Second)
			}
			return result(r, `{"content":[],"isError":false}`)
		})
		first := make(chan error, 1)
		go func() { _, err := c.CallTool(context.Background(), "slow", nil); first <- err }()
		synctest.Wait()

		ctx, cancel := context.WithCancel(context.Background())
		queued := make(chan error, 1)
		go func() { _, err := c.CallTool(ctx, "given.up", nil); queued <- err }()
		synctest.Wait()
		cancel()
		require.ErrorIs(t, <-queued, context.Canceled)
		require.NoError(t, <-first)

		// The board is busy for exactly as long as the caller will wait.
		go func() { _, err := c.CallTool(context.Background(), "slow", nil); first <- err }()
		synctest.Wait()
		ctx, cancel = context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.CallTool(ctx, "out.of.time", nil)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.NoError(t, <-first)

		_, err = c.CallTool(context.Background(), "after", nil)
		require.NoError(t, err)
		var names []string
		for _, r := range fb.requests() {
			var p callParams
			_ = json.Unmarshal(r.Params, &p)
			names = append(names, p.Name)
		}
		assert.Equal(t, []string{"slow", "slow", "after"}, names)
	})
}

// TestStages: a call reports being sent; one that waits behind another
// reports how many are ahead first; a call whose context has no hook
// reports nothing and works as before.
func TestStages(t *testing.T) {
	block := make(chan struct{})
	started := make(chan struct{}, 8)
	c, _ := newClient(t, Options{}, func(r request) string {
		started <- struct{}{}
		<-block
		return result(r, `{"content":[],"isError":false}`)
	})
	record := func() (context.Context, func() []Stage) {
		ch := make(chan Stage, 8)
		ctx := WithStages(context.Background(), func(s Stage) { ch <- s })
		return ctx, func() []Stage {
			var out []Stage
			for {
				select {
				case s := <-ch:
					out = append(out, s)
				default:
					return out
				}
			}
		}
	}
	first, firstStages := record()
	second, secondStages := record()
	errs := make(chan error, 3)
	go func() { _, err := c.CallTool(first, "a", nil); errs <- err }()
	<-started // a is on the board
	go func() { _, err := c.CallTool(second, "b", nil); errs <- err }()
	go func() { _, err := c.CallTool(context.Background(), "c", nil); errs <- err }()
	require.Eventually(t, func() bool { return len(c.slots) == 3 }, 5*time.Second, 5*time.Millisecond)
	close(block)
	for range 3 {
		require.NoError(t, <-errs)
	}

	a := firstStages()
	require.Len(t, a, 1)
	assert.Equal(t, StageSent, a[0].Kind)
	assert.False(t, a[0].At.IsZero())
	b := secondStages()
	require.Len(t, b, 2)
	assert.Equal(t, StageQueued, b[0].Kind)
	assert.GreaterOrEqual(t, b[0].Ahead, 1, "a was on the board")
	assert.Equal(t, StageSent, b[1].Kind)
	assert.False(t, b[1].At.Before(b[0].At))
}
