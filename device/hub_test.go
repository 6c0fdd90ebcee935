package device

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/devicebridge/devicebridge/device/internal/mcpclient"
	"github.com/devicebridge/devicebridge/internal/testlink"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// board is the shared scripted board answering as a minimal MCP board.
type board struct {
	*testlink.Board
	hold chan struct{} // when non-nil, tools/call waits on it
}

// startBoard starts a board; at cleanup its link is closed and its
// goroutine waited for.
func startBoard(t *testing.T, tools string) (*board, *testlink.Link) {
	bridge, end := testlink.Pair(32)
	b := &board{}
	b.Board = testlink.NewBoard(end, func(r testlink.Request) string {
		switch r.Method {
		case "initialize":
			return testlink.Result(r, `{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"test-board","version":"2.4.2"}}`)
		case "tools/list":
			return testlink.Result(r, `{"tools":`+tools+`}`)
		case "tools/call":
			if b.hold != nil {
				<-b.hold
			}
			return testlink.Result(r, `{"content":[{"type":"text","text":"true"}],"isError":false}`)
		}
		return testlink.ErrorReply(r, "Method not implemented: "+r.Method)
	})
	t.Cleanup(b.Close)
	return b, bridge
}

func (b *board) calls() int { return b.Count("tools/call") }

const twoTools = `[{"name":"self.get_device_status","description":"d","inputSchema":{"type":"object","properties":{}}},{"name":"self.reboot","description":"r","inputSchema":{"type":"object","properties":{}},"annotations":{"audience":["user"]}}]`

func newHub(t *testing.T) *Hub {
	t.Helper()
	h := NewHub(HubConfig{ReadyWait: 2 * time.Second}, nil)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, h.Close(ctx))
	})
	return h
}

func waitEvents(t *testing.T, sub *Subscription, n int) []Event {
	t.Helper()
	var got []Event
	deadline := time.After(5 * time.Second)
	for len(got) < n {
		select {
		case <-sub.C():
			got = append(got, sub.Next()...)
		case <-deadline:
			t.Fatalf("got %d events, want %d: %+v", len(got), n, got)
		}
	}
	return got
}

func TestSessionLifecycle(t *testing.T) {
	h := newHub(t)
	sub := h.Subscribe()
	defer sub.Close()
	_, link := startBoard(t, twoTools)

	s, err := h.Attach(link, Identity{DeviceID: "aa:bb:cc:dd:ee:01", Transport: "test", HasMCP: true})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, s.WaitReady(ctx))

	info := s.Info()
	assert.Equal(t, StateReady, info.State)
	assert.Equal(t, "test-board", info.Board)
	assert.Equal(t, "2.4.2", info.FirmwareVersion)
	tools := info.ToolInfos()
	require.Len(t, tools, 2)
	assert.Equal(t, "self.get_device_status", tools[0].Name)
	assert.False(t, tools[0].UserOnly)
	assert.True(t, tools[1].UserOnly)

	ev := waitEvents(t, sub, 1)
	assert.Equal(t, EventOnline, ev[0].Type)

	var stages []CallStage
	res, err := h.CallTool(WithCallStages(ctx, func(st CallStage) { stages = append(stages, st) }),
		"aa:bb:cc:dd:ee:01", "self.get_device_status", nil)
	require.NoError(t, err)
	require.Len(t, stages, 1, "a ready board, nothing ahead: sent at once")
	assert.Equal(t, StageSent, stages[0].Kind)
	assert.Equal(t, "true", res.Text())

	link.Close(errors.New("unplugged"))
	ev = waitEvents(t, sub, 1)
	assert.Equal(t, EventOffline, ev[0].Type)
	assert.Equal(t, StateClosed, ev[0].Info.State)
	assert.Equal(t, "unplugged", ev[0].Info.CloseReason)
	_, ok := h.Session("aa:bb:cc:dd:ee:01")
	assert.False(t, ok)
	_, err = h.CallTool(ctx, "aa:bb:cc:dd:ee:01", "x", nil)
	require.ErrorIs(t, err, ErrUnknownDevice)
}

func TestReplacementOrdersEvents(t *testing.T) {
	h := newHub(t)
	sub := h.Subscribe()
	defer sub.Close()
	id := Identity{DeviceID: "aa:bb:cc:dd:ee:02", HasMCP: true}
	_, l1 := startBoard(t, twoTools)
	s1, err := h.Attach(l1, id)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, s1.WaitReady(ctx))
	waitEvents(t, sub, 1)

	_, l2 := startBoard(t, twoTools)
	s2, err := h.Attach(l2, id)
	require.NoError(t, err)
	require.NoError(t, s2.WaitReady(ctx))
	<-s1.Done()

	ev := waitEvents(t, sub, 2)
	require.Len(t, ev, 2, "the replaced session's own close must not add a second offline")
	assert.Equal(t, EventOffline, ev[0].Type)
	assert.Equal(t, ErrReplaced.Error(), ev[0].Info.CloseReason)
	assert.Equal(t, EventOnline, ev[1].Type)
	assert.Greater(t, ev[1].Info.Generation, ev[0].Info.Generation)
	assert.ErrorIs(t, l1.Err(), ErrReplaced)

	cur, ok := h.Session(id.DeviceID)
	require.True(t, ok)
	assert.Same(t, s2, cur)
	require.Len(t, h.Devices(), 1)
}

func TestDisconnectMidCallFailsFast(t *testing.T) {
	h := newHub(t)
	b, link := startBoard(t, twoTools)
	b.hold = make(chan struct{})
	defer close(b.hold)
	s, err := h.Attach(link, Identity{DeviceID: "aa:bb:cc:dd:ee:03", HasMCP: true})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, s.WaitReady(ctx))

	errs := make(chan error, 1)
	go func() {
		_, err := h.CallTool(ctx, "aa:bb:cc:dd:ee:03", "self.get_device_status", nil)
		errs <- err
	}()
	require.Eventually(t, func() bool { return b.calls() == 1 }, 5*time.Second, 5*time.Millisecond)
	link.Close(errors.New("wifi lost"))
	select {
	case err := <-errs:
		require.ErrorIs(t, err, ErrOffline)
		require.ErrorIs(t, err, mcpclient.ErrDisconnected)
	case <-time.After(5 * time.Second):
		t.Fatal("pending call did not fail on disconnect")
	}
}

func TestBoardWithoutMCPStaysConnected(t *testing.T) {
	h := newHub(t)
	bridge, end := testlink.Pair(4)
	defer end.Close(nil)
	s, err := h.Attach(bridge, Identity{DeviceID: "aa:bb:cc:dd:ee:04", HasMCP: false})
	require.NoError(t, err)
	assert.Equal(t, StateConnected, s.Info().State)
	require.ErrorIs(t, s.WaitReady(context.Background()), ErrNoMCP)
	_, err = h.CallTool(context.Background(), "aa:bb:cc:dd:ee:04", "x", nil)
	require.ErrorIs(t, err, ErrNoMCP)
	require.Len(t, h.Devices(), 1)
}

func TestCallWaitsForInitializingBoardThenNotReady(t *testing.T) {
	h := NewHub(HubConfig{ReadyWait: 200 * time.Millisecond, InitTimeout: time.Minute}, nil)
	defer h.Close(context.Background())
	bridge, end := testlink.Pair(4) // nobody answers: stuck initializing
	s, err := h.Attach(bridge, Identity{DeviceID: "aa:bb:cc:dd:ee:05", HasMCP: true})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return s.Info().State == StateInitializing }, 5*time.Second, 5*time.Millisecond)
	var stages []CallStage
	ctx := WithCallStages(context.Background(), func(st CallStage) { stages = append(stages, st) })
	_, err = h.CallTool(ctx, "aa:bb:cc:dd:ee:05", "x", nil)
	require.ErrorIs(t, err, ErrNotReady)
	assert.Contains(t, err.Error(), "initializing")
	require.Len(t, stages, 1, "the call said it waits for the board, and was never sent")
	assert.Equal(t, StageWaitReady, stages[0].Kind)
	end.Close(nil)
}

func TestInitFailureClosesLink(t *testing.T) {
	h := NewHub(HubConfig{InitTimeout: 100 * time.Millisecond}, nil)
	defer h.Close(context.Background())
	bridge, end := testlink.Pair(4)
	defer end.Close(nil)
	s, err := h.Attach(bridge, Identity{DeviceID: "aa:bb:cc:dd:ee:06", HasMCP: true})
	require.NoError(t, err)
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a board that never answers initialize must be dropped")
	}
	assert.Contains(t, s.Info().CloseReason, "initialization failed")
	assert.Contains(t, s.Info().InitError, "did not finish initializing within 100ms")
}

func TestSubscriptionOverflowResyncs(t *testing.T) {
	h := NewHub(HubConfig{SubscriptionBuffer: 2}, nil)
	sub := h.Subscribe()
	for i := range 5 {
		h.mu.Lock()
		h.publishLocked(Event{Type: EventOnline, DeviceID: fmt.Sprint(i)})
		h.mu.Unlock()
	}
	ev := sub.Next()
	require.Len(t, ev, 1)
	assert.Equal(t, EventResync, ev[0].Type, "the backlog collapses into one resync")
	h.mu.Lock()
	h.publishLocked(Event{Type: EventOffline, DeviceID: "a"})
	h.publishLocked(Event{Type: EventOnline, DeviceID: "b"})
	h.publishLocked(Event{Type: EventOnline, DeviceID: "c"})
	h.mu.Unlock()
	ev = sub.Next()
	require.Len(t, ev, 1, "overflow again")
	h.mu.Lock()
	h.publishLocked(Event{Type: EventOffline, DeviceID: "d"})
	h.mu.Unlock()
	ev = sub.Next()
	require.Len(t, ev, 1)
	assert.Equal(t, "d", ev[0].DeviceID, "events within the bound are delivered as they are")
	sub.Close()
	h.mu.Lock()
	h.publishLocked(Event{Type: EventOnline})
	h.mu.Unlock()
	assert.Empty(t, sub.Next())
}

func TestHubCloseClosesSessionsWithReason(t *testing.T) {
	h := NewHub(HubConfig{}, nil)
	_, link := startBoard(t, twoTools)
	s, err := h.Attach(link, Identity{DeviceID: "aa:bb:cc:dd:ee:07", HasMCP: true})
	require.NoError(t, err)
	require.NoError(t, h.Close(context.Background()))
	assert.Equal(t, StateClosed, s.Info().State)
	assert.Equal(t, ErrShutdown.Error(), s.Info().CloseReason)
	_, err = h.Attach(link, Identity{DeviceID: "x", HasMCP: true})
	require.ErrorIs(t, err, ErrHubClosed)
}

// TestBoardWithoutMCPIsDrained: a board that announced no MCP still has its
// messages read, so a transport's inbound queue never fills and stops its
// reader (which would leave pings unanswered).
func TestBoardWithoutMCPIsDrained(t *testing.T) {
	h := newHub(t)
	bridge, end := testlink.Pair(4)
	defer end.Close(nil)
	_, err := h.Attach(bridge, Identity{DeviceID: "aa:bb:cc:dd:ee:08", HasMCP: false})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 100 {
		require.NoError(t, end.Send(ctx, []byte(`{"session_id":"","type":"listen","state":"detect"}`)),
			"message %d: the bridge stopped reading a board without MCP", i)
	}
}

// TestDrainAnswersCallsInFlight: Drain answers a call the board has not
// replied to with ErrShutdown at once, and refuses new calls and boards.
func TestDrainAnswersCallsInFlight(t *testing.T) {
	h := newHub(t)
	b, link := startBoard(t, twoTools)
	b.hold = make(chan struct{})
	defer close(b.hold)
	s, err := h.Attach(link, Identity{DeviceID: "aa:bb:cc:dd:ee:09", HasMCP: true})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, s.WaitReady(ctx))

	errs := make(chan error, 1)
	go func() {
		_, err := h.CallTool(ctx, "aa:bb:cc:dd:ee:09", "self.get_device_status", nil)
		errs <- err
	}()
	require.Eventually(t, func() bool { return b.calls() == 1 }, 10*time.Second, 5*time.Millisecond)
	h.Drain()
	select {
	case err := <-errs:
		require.ErrorIs(t, err, ErrShutdown)
		assert.Equal(t, CodeShuttingDown, CodeOf(err))
		assert.Equal(t, "bridge shutting down while self.get_device_status ran; its outcome is unknown", err.Error(),
			"the cancellation that cut it off is no news to the caller")
	case <-ctx.Done():
		t.Fatal("Drain did not answer the call in flight")
	}
	_, err = h.CallTool(ctx, "aa:bb:cc:dd:ee:09", "self.get_device_status", nil)
	assert.Equal(t, CodeShuttingDown, CodeOf(err))
	_, other := testlink.Pair(1)
	_, err = h.Attach(other, Identity{DeviceID: "aa:bb:cc:dd:ee:10", HasMCP: true})
	require.ErrorIs(t, err, ErrHubClosed)
}

// TestCallChecksToolAndArguments: unknown tools and invalid arguments are
// refused with their codes before anything reaches the board.
func TestCallChecksToolAndArguments(t *testing.T) {
	h := newHub(t)
	tools := `[{"name":"self.audio_speaker.set_volume","inputSchema":{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}}]`
	b, link := startBoard(t, tools)
	s, err := h.Attach(link, Identity{DeviceID: "aa:bb:cc:dd:ee:0a", HasMCP: true})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, s.WaitReady(ctx))

	_, err = h.CallTool(ctx, s.ID(), "set_volume", json.RawMessage(`{"volume":3}`))
	var unknown *UnknownToolError
	require.ErrorAs(t, err, &unknown)
	assert.Equal(t, CodeUnknownTool, CodeOf(err))
	assert.Contains(t, err.Error(), `did you mean "self.audio_speaker.set_volume"`)

	_, err = h.CallTool(ctx, s.ID(), "self.audio_speaker.set_volume", json.RawMessage(`{"volume":300}`))
	var bad *ArgumentsError
	require.ErrorAs(t, err, &bad)
	assert.Equal(t, CodeInvalidArguments, CodeOf(err))
	assert.Contains(t, err.Error(), "above the maximum of 100")

	_, err = h.CallTool(ctx, s.ID(), "self.audio_speaker.set_volume", json.RawMessage(`{"volume":30}`))
	require.NoError(t, err)
	assert.Equal(t, 1, b.calls(), "only the valid call reached the board")
}

// TestFlappingNewcomerIsRefused: two live connections claiming one id
// replace each other a few times (the first replacement logged as a
// warning, repeats throttled), then the newcomer is refused and the
// current session kept.
func TestFlappingNewcomerIsRefused(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	h := NewHub(HubConfig{Flapping: FlapPolicy{Limit: 2, Window: time.Hour, Backoff: time.Hour}}, zap.New(core))
	defer h.Close(context.Background())
	id := Identity{DeviceID: "aa:bb:cc:dd:ee:0b", HasMCP: false}
	attach := func(addr string) (*Session, *testlink.Link, error) {
		bridge, end := testlink.Pair(4)
		t.Cleanup(func() { end.Close(nil) })
		id.RemoteAddr = addr
		s, err := h.Attach(bridge, id)
		return s, bridge, err
	}
	_, _, err := attach("10.0.0.1:1000")
	require.NoError(t, err)
	_, _, err = attach("10.0.0.2:2000")
	require.NoError(t, err)
	cur, _, err := attach("10.0.0.1:1001")
	require.NoError(t, err)
	warns := logs.FilterMessageSnippet("replacing the older one").All()
	require.Len(t, warns, 1, "a board claiming the same MAC again and again is logged once per interval")
	assert.Equal(t, zap.WarnLevel, warns[0].Level)
	assert.Equal(t, "10.0.0.1:1000", warns[0].ContextMap()["old_remote"])
	assert.Equal(t, "10.0.0.2:2000", warns[0].ContextMap()["new_remote"])

	_, refused, err := attach("10.0.0.2:2001")
	require.ErrorIs(t, err, ErrFlapping)
	assert.ErrorIs(t, refused.Err(), ErrFlapping, "the newcomer's link is closed with the reason")
	got, ok := h.Session(id.DeviceID)
	require.True(t, ok)
	assert.Same(t, cur, got, "the current session is kept")
	require.Len(t, logs.FilterMessageSnippet("keep replacing each other").All(), 1)

	// A board coming back after its old link died is never counted.
	cur.Close(errors.New("wifi lost"))
	<-cur.Done()
	_, _, err = attach("10.0.0.1:1002")
	require.NoError(t, err)
}

// TestFlapStatesAreBounded: the flap guard forgets ids with nothing recent
// to remember once they outnumber the sessions, and never tracks more than
// maxFlapStates ids (with auth off a board may name itself with any MAC).
func TestFlapStatesAreBounded(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	h := NewHub(HubConfig{Flapping: FlapPolicy{Limit: 3, Window: time.Minute, Backoff: time.Minute}}, zap.New(core))
	defer h.Close(context.Background())
	replaceTwice := func(mac string) {
		for range 2 {
			bridge, end := testlink.Pair(4)
			t.Cleanup(func() { end.Close(nil) })
			_, err := h.Attach(bridge, Identity{DeviceID: mac})
			require.NoError(t, err)
		}
	}
	long := time.Now().Add(-time.Hour)
	h.mu.Lock()
	for i := range 5000 {
		h.flaps[fmt.Sprintf("stale-%d", i)] = &flapState{replaced: []time.Time{long}, refusedUntil: long}
	}
	h.mu.Unlock()
	replaceTwice("aa:bb:cc:dd:ee:f1")
	h.mu.Lock()
	n := len(h.flaps)
	h.mu.Unlock()
	assert.Equal(t, 1, n, "stale ids are swept, the new one is tracked")

	h.mu.Lock()
	for i := range maxFlapStates {
		h.flaps[fmt.Sprintf("fresh-%d", i)] = &flapState{replaced: []time.Time{time.Now()}}
	}
	h.mu.Unlock()
	replaceTwice("aa:bb:cc:dd:ee:f2")
	h.mu.Lock()
	_, tracked := h.flaps["aa:bb:cc:dd:ee:f2"]
	n = len(h.flaps)
	h.mu.Unlock()
	assert.False(t, tracked)
	assert.Equal(t, maxFlapStates+1, n, "past the cap no id is added")
	assert.Len(t, logs.FilterMessageSnippet("tracks as many device ids as it may").All(), 1)
	got, ok := h.Session("aa:bb:cc:dd:ee:f2")
	require.True(t, ok, "the replacement still happened")
	assert.Equal(t, "aa:bb:cc:dd:ee:f2", got.Info().DeviceID)
}

// TestPendingCountsQueuedAndInFlightCalls: a session's Pending is the call
// outstanding on the board plus those queued behind it.
func TestPendingCountsQueuedAndInFlightCalls(t *testing.T) {
	h := newHub(t)
	b, link := startBoard(t, twoTools)
	b.hold = make(chan struct{})
	s, err := h.Attach(link, Identity{DeviceID: "aa:bb:cc:dd:ee:0c", HasMCP: true})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, s.WaitReady(ctx))
	assert.Equal(t, 0, s.Pending())

	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := h.CallTool(ctx, s.ID(), "self.get_device_status", nil)
			assert.NoError(t, err)
		}()
	}
	require.Eventually(t, func() bool { return s.Pending() == 3 }, 10*time.Second, 5*time.Millisecond,
		"one call on the board, two queued")
	sessions := h.Sessions()
	require.Len(t, sessions, 1)
	assert.Same(t, s, sessions[0])
	close(b.hold)
	wg.Wait()
	assert.Equal(t, 0, s.Pending())
}

// TestCallOutcomesReachOnlySubscribersThatAsked: a finished call is
// published as EventCall (tool, code, duration, transport; no arguments or
// results) to subscriptions made with Calls, and never to plain ones.
func TestCallOutcomesReachOnlySubscribersThatAsked(t *testing.T) {
	h := newHub(t)
	plain := h.Subscribe()
	defer plain.Close()
	calls := h.SubscribeWith(SubscribeOptions{Calls: true})
	_, link := startBoard(t, twoTools)
	s, err := h.Attach(link, Identity{DeviceID: "aa:bb:cc:dd:ee:0d", Transport: "test", HasMCP: true})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, s.WaitReady(ctx))
	assert.Equal(t, EventOnline, waitEvents(t, plain, 1)[0].Type)
	assert.Equal(t, EventOnline, waitEvents(t, calls, 1)[0].Type)

	_, err = h.CallTool(ctx, s.ID(), "self.get_device_status", json.RawMessage(`{}`))
	require.NoError(t, err)
	_, err = h.CallTool(ctx, s.ID(), "self.nope", nil)
	require.ErrorIs(t, err, ErrUnknownTool)
	_, err = h.CallTool(ctx, "ff:ff:ff:ff:ff:ff", "self.get_device_status", nil)
	require.ErrorIs(t, err, ErrUnknownDevice)

	ev := waitEvents(t, calls, 3)
	require.Len(t, ev, 3)
	for _, e := range ev {
		assert.Equal(t, EventCall, e.Type)
		assert.Equal(t, "call", e.Type.String())
		assert.Zero(t, e.Info, "a call event carries no session snapshot")
	}
	assert.Equal(t, s.ID(), ev[0].DeviceID)
	assert.Equal(t, CallOutcome{Transport: "test", Tool: "self.get_device_status", Code: "", Duration: ev[0].Call.Duration}, ev[0].Call)
	assert.Positive(t, ev[0].Call.Duration)
	assert.Equal(t, CodeUnknownTool, ev[1].Call.Code)
	assert.Equal(t, "test", ev[1].Call.Transport)
	assert.Equal(t, "ff:ff:ff:ff:ff:ff", ev[2].DeviceID)
	assert.Equal(t, CodeUnknownDevice, ev[2].Call.Code)
	assert.Empty(t, ev[2].Call.Transport, "no session was found")
	assert.Empty(t, plain.Next(), "plain subscriptions see board events only")

	calls.Close()
	calls.Close() // idempotent, and the Hub stops publishing calls
	assert.Zero(t, h.callSubs.Load())
	_, err = h.CallTool(ctx, s.ID(), "self.get_device_status", nil)
	require.NoError(t, err)
	assert.Empty(t, calls.Next())
}

// TestQueuedCallsOnSilentBoard: through the Hub, a board that stops
// answering costs each caller at most one call timeout from when it
// called, however many calls wait ahead of it; the call sent to the board
// is a timeout (outcome unknown), the ones that never left the queue are
// queue_timeout (nothing was sent), and the board sees only the first.
func TestQueuedCallsOnSilentBoard(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 5 * time.Second
		h := NewHub(HubConfig{ReadyWait: time.Second, Client: ClientOptions{CallTimeout: timeout}}, nil)
		defer func() { require.NoError(t, h.Close(context.Background())) }()
		b, link := startBoard(t, twoTools)
		b.hold = make(chan struct{})
		defer close(b.hold)
		s, err := h.Attach(link, Identity{DeviceID: "aa:bb:cc:dd:ee:0d", HasMCP: true})
		require.NoError(t, err)
		require.NoError(t, s.WaitReady(context.Background()))

		const calls = 6
		type outcome struct {
			code Code
			took time.Duration
		}
		out := make(chan outcome, calls)
		for range calls {
			go func() {
				start := time.Now()
				_, err := h.CallTool(context.Background(), s.ID(), "self.get_device_status", nil)
				out <- outcome{CodeOf(err), time.Since(start)}
			}()
		}
		codes := map[Code]int{}
		for range calls {
			o := <-out
			assert.LessOrEqual(t, o.took, timeout)
			codes[o.code]++
		}
		assert.Equal(t, map[Code]int{CodeTimeout: 1, CodeQueueTimeout: calls - 1}, codes)
		assert.Equal(t, 1, b.calls(), "only the first call reached the board")
	})
}

// TestOnResultSeesEveryResult: the OnResult observer is told about each
// call that returned a result, with the canonical id, and about nothing
// else; nil stops it.
func TestOnResultSeesEveryResult(t *testing.T) {
	h := newHub(t)
	_, link := startBoard(t, twoTools)
	s, err := h.Attach(link, Identity{DeviceID: "aa:bb:cc:dd:ee:0e", Transport: "test", HasMCP: true})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, s.WaitReady(ctx))

	var seen []string
	h.OnResult(func(deviceID, tool string, res *CallResult) {
		seen = append(seen, deviceID+" "+tool+" "+res.Text())
	})
	_, err = h.CallTool(ctx, "AA-BB-CC-DD-EE-0E", "self.get_device_status", json.RawMessage(`{}`))
	require.NoError(t, err)
	_, err = h.CallTool(ctx, s.ID(), "self.nope", nil)
	require.ErrorIs(t, err, ErrUnknownTool)
	require.Len(t, seen, 1)
	assert.Regexp(t, `^aa:bb:cc:dd:ee:0e self.get_device_status `, seen[0])

	h.OnResult(nil)
	_, err = h.CallTool(ctx, s.ID(), "self.get_device_status", nil)
	require.NoError(t, err)
	assert.Len(t, seen, 1)
}
