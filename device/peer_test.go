package device_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/simulator"
	"github.com/devicebridge/devicebridge/ws"
)

// These tests share a simulated board's MCP channel between the bridge and
// a peer, over a real WebSocket endpoint on loopback: the board is the
// simulator, which runs one request at a time and answers the firmware's
// way (errors with a message only, unescaped).

// peerProfile: self.echo answers with its arguments, so each reply can be
// matched with its call; self.slow answers only when the test lets it (the
// board's Hold); self.fail throws; self.reboot restarts the board.
const peerProfile = `board: peer-test
firmware: 2.4.2
language: en-US
tools:
  - name: self.echo
    description: Echoes its arguments.
    properties:
      - {name: n, type: integer}
    behavior: echo
  - name: self.slow
    description: Answers when the test lets it.
    behavior: const
    text: slow done
  - name: self.fail
    description: Always throws.
    behavior: fail
    text: it broke
  - name: self.reboot
    description: Restarts the board.
    behavior: reboot
`

type peerBridge struct {
	hub *device.Hub
	url string
}

// newPeerBridge is a Hub behind a real WebSocket endpoint on loopback.
func newPeerBridge(t *testing.T, cfg device.HubConfig) *peerBridge {
	t.Helper()
	hub := device.NewHub(cfg, nil)
	srv := ws.NewServer(ws.Config{}, hub, nil)
	mux := http.NewServeMux()
	mux.Handle(srv.Path(), srv)
	hs := httptest.NewServer(mux)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, hub.Close(ctx))
		srv.Close(nil)
		hs.Close()
	})
	return &peerBridge{hub: hub, url: "ws" + strings.TrimPrefix(hs.URL, "http") + srv.Path()}
}

// connect starts a simulated board of peerProfile and waits until its
// session is ready.
func (b *peerBridge) connect(t *testing.T, cfg simulator.Config) (*simulator.Board, *device.Session) {
	t.Helper()
	p, err := simulator.ParseProfile([]byte(peerProfile), "peer-test")
	require.NoError(t, err)
	cfg.Profile = p
	board, err := simulator.NewBoard(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = board.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, board.ConnectWebSocket(ctx, b.url))
	var sess *device.Session
	require.Eventually(t, func() bool {
		s, ok := b.hub.Session(board.MAC())
		if ok && s.Info().State == device.StateReady {
			sess = s
			return true
		}
		return false
	}, 10*time.Second, 5*time.Millisecond)
	return board, sess
}

// peerReply is a reply ServePeer made, decoded.
type peerReply struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  json.RawMessage `json:"result"`
	Error   *struct {
		Code    *int64          `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	} `json:"error"`
}

func decodeReply(raw json.RawMessage) (peerReply, error) {
	var r peerReply
	if err := json.Unmarshal(raw, &r); err != nil {
		return r, fmt.Errorf("reply %q: %w", raw, err)
	}
	if r.JSONRPC != "2.0" || (r.Result == nil) == (r.Error == nil) {
		return r, fmt.Errorf("reply %q is not a JSON-RPC response", raw)
	}
	return r, nil
}

// request is a peer's JSON-RPC request.
func request(id, method, params string) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"method":%q,"params":%s}`, id, method, params))
}

// echoText is the text of self.echo's result, or why there is none.
func echoText(r peerReply) (string, error) {
	if r.Error != nil {
		return "", fmt.Errorf("error reply: %s", r.Error.Message)
	}
	var res device.CallResult
	if err := json.Unmarshal(r.Result, &res); err != nil {
		return "", err
	}
	return res.Text(), nil
}

// TestPeerSharesBoardWithBridge: peers using ids 1 and 2 (the ids the
// bridge's own first requests had) call the board from many goroutines
// while the bridge calls it too; every reply reaches whoever asked, with
// its own id and the result of its own arguments.
func TestPeerSharesBoardWithBridge(t *testing.T) {
	b := newPeerBridge(t, device.HubConfig{})
	board, s := b.connect(t, simulator.Config{MAC: "02:00:00:00:0a:01"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const peers, bridges, rounds = 4, 4, 10
	errs := make(chan error, (peers+bridges)*rounds)
	var wg sync.WaitGroup
	for g := range peers {
		id := fmt.Sprint(g%2 + 1)
		wg.Go(func() {
			for i := range rounds {
				n := 1000*g + i
				r, err := decodeReply(s.ServePeer(ctx, request(id, "tools/call", fmt.Sprintf(`{"name":"self.echo","arguments":{"n":%d}}`, n))))
				if err != nil {
					errs <- err
					continue
				}
				if string(r.ID) != id {
					errs <- fmt.Errorf("peer %d asked with id %s, got id %s", g, id, r.ID)
				}
				if text, err := echoText(r); err != nil || text != fmt.Sprintf(`{"n":%d}`, n) {
					errs <- fmt.Errorf("peer %d asked for %d, got %q (%v)", g, n, text, err)
				}
			}
		})
	}
	for g := range bridges {
		wg.Go(func() {
			for i := range rounds {
				n := 100000 + 1000*g + i
				res, err := b.hub.CallTool(ctx, board.MAC(), "self.echo", json.RawMessage(fmt.Sprintf(`{"n":%d}`, n)))
				if err != nil {
					errs <- fmt.Errorf("bridge call %d: %w", n, err)
				} else if res.Text() != fmt.Sprintf(`{"n":%d}`, n) {
					errs <- fmt.Errorf("bridge asked for %d, got %q", n, res.Text())
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st := s.PeerStats()
	assert.EqualValues(t, peers*rounds, st.Requests)
	assert.Zero(t, st.Errors)
	assert.EqualValues(t, (peers+bridges)*rounds, board.Stats().CallsRun)
}

// TestPeerBoardErrorsPassThrough: the board's error replies reach the peer
// as the board gave them (a message, no code), the firmware's unescaped
// message included.
func TestPeerBoardErrorsPassThrough(t *testing.T) {
	b := newPeerBridge(t, device.HubConfig{})
	_, s := b.connect(t, simulator.Config{MAC: "02:00:00:00:0a:02"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct{ req, want string }{
		{`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"self.fail"}}`,
			`{"jsonrpc":"2.0","id":7,"error":{"message":"it broke"}}`},
		{`{"jsonrpc":"2.0","id":"a<b>","method":"tools/call","params":{"name":"self.no\"pe"}}`,
			`{"jsonrpc":"2.0","id":"a<b>","error":{"message":"Unknown tool: self.no\"pe"}}`},
		{`{"jsonrpc":"2.0","id":8,"method":"ping"}`,
			`{"jsonrpc":"2.0","id":8,"error":{"message":"Method not implemented: ping"}}`},
		{`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"self.echo","arguments":{}}}`,
			`{"jsonrpc":"2.0","id":9,"error":{"message":"Missing valid argument: n"}}`},
	} {
		assert.Equal(t, tc.want, string(s.ServePeer(ctx, json.RawMessage(tc.req))), tc.req)
	}
	assert.Equal(t, device.PeerStats{Requests: 4, Errors: 4}, s.PeerStats())
}

// TestPeerWaitsItsTurnBehindSlowTool: while the bridge's call of a slow
// tool runs, a peer's call waits its turn and times out by its own
// deadline, never sent; a peer request with a longer deadline waits and is
// answered after the slow tool; the bridge's call is not cut short.
func TestPeerWaitsItsTurnBehindSlowTool(t *testing.T) {
	b := newPeerBridge(t, device.HubConfig{Client: device.ClientOptions{
		ToolTimeouts: map[string]time.Duration{"self.echo": 100 * time.Millisecond}}})
	hold := make(chan struct{})
	board, s := b.connect(t, simulator.Config{MAC: "02:00:00:00:0a:03", Hold: map[string]<-chan struct{}{"self.slow": hold}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	sent := make(chan struct{})
	var once sync.Once
	slow := make(chan error, 1)
	go func() {
		sctx := device.WithCallStages(ctx, func(st device.CallStage) {
			if st.Kind == device.StageSent {
				once.Do(func() { close(sent) })
			}
		})
		res, err := b.hub.CallTool(sctx, board.MAC(), "self.slow", nil)
		if err == nil && res.Text() != "slow done" {
			err = fmt.Errorf("slow tool answered %q", res.Text())
		}
		slow <- err
	}()
	<-sent

	r, err := decodeReply(s.ServePeer(ctx, request("1", "tools/call", `{"name":"self.echo","arguments":{"n":1}}`)))
	require.NoError(t, err)
	require.NotNil(t, r.Error, "the peer's call times out behind the slow tool")
	assert.Equal(t, "1", string(r.ID))
	assert.EqualValues(t, device.PeerCodeTimeout, *r.Error.Code)
	assert.Contains(t, r.Error.Message, "not sent, nothing happened")

	listed := make(chan json.RawMessage, 1)
	go func() { listed <- s.ServePeer(ctx, request("2", "tools/list", `{}`)) }()
	require.Eventually(t, func() bool { return s.Pending() == 2 }, 5*time.Second, time.Millisecond,
		"the peer's tools/list queued behind the slow tool")
	close(hold)
	require.NoError(t, <-slow, "the bridge's call runs to its end, whatever the peer's deadlines")
	r, err = decodeReply(<-listed)
	require.NoError(t, err)
	assert.Equal(t, "2", string(r.ID))
	require.Nil(t, r.Error)
	assert.Contains(t, string(r.Result), `"name":"self.slow"`)
	assert.EqualValues(t, 1, board.Stats().CallsRun, "the peer's timed out call never reached the board")
}

// TestPeerBoundRefusesAtOnce: past PeerMaxPending the peer is refused at
// once, naming the bound, while the bridge's own calls still find room.
func TestPeerBoundRefusesAtOnce(t *testing.T) {
	b := newPeerBridge(t, device.HubConfig{PeerMaxPending: 2})
	hold := make(chan struct{})
	board, s := b.connect(t, simulator.Config{MAC: "02:00:00:00:0a:04", Hold: map[string]<-chan struct{}{"self.slow": hold}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	slow := make(chan error, 1)
	go func() {
		_, err := b.hub.CallTool(ctx, board.MAC(), "self.slow", nil)
		slow <- err
	}()
	require.Eventually(t, func() bool { return s.Pending() == 1 }, 5*time.Second, time.Millisecond)
	replies := make(chan json.RawMessage, 2)
	for id := range 2 {
		go func() { replies <- s.ServePeer(ctx, request(fmt.Sprint(id+1), "tools/list", `{}`)) }()
	}
	require.Eventually(t, func() bool { return s.Pending() == 3 }, 5*time.Second, time.Millisecond)

	r, err := decodeReply(s.ServePeer(ctx, request("3", "tools/list", `{}`)))
	require.NoError(t, err)
	require.NotNil(t, r.Error)
	assert.Equal(t, "3", string(r.ID))
	assert.EqualValues(t, device.PeerCodeBusy, *r.Error.Code)
	assert.Contains(t, r.Error.Message, "at most 2")
	assert.Contains(t, r.Error.Message, "peer_max_pending")

	mine := make(chan error, 1)
	go func() {
		_, err := b.hub.CallTool(ctx, board.MAC(), "self.echo", json.RawMessage(`{"n":5}`))
		mine <- err
	}()
	require.Eventually(t, func() bool { return s.Pending() == 4 }, 5*time.Second, time.Millisecond,
		"the bridge's own call is admitted past the peer's bound")
	close(hold)
	require.NoError(t, <-slow)
	require.NoError(t, <-mine)
	for range 2 {
		r, err := decodeReply(<-replies)
		require.NoError(t, err)
		assert.Nil(t, r.Error)
	}
	st := s.PeerStats()
	assert.EqualValues(t, 3, st.Requests)
	assert.EqualValues(t, 1, st.Errors)
}

// TestPeerSessionClosesMidCall: the board goes while the peer's call runs;
// the peer gets an error reply at once, and so does a later request.
func TestPeerSessionClosesMidCall(t *testing.T) {
	b := newPeerBridge(t, device.HubConfig{})
	hold := make(chan struct{})
	defer close(hold)
	board, s := b.connect(t, simulator.Config{MAC: "02:00:00:00:0a:05", Hold: map[string]<-chan struct{}{"self.slow": hold}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	sent := make(chan struct{})
	var once sync.Once
	sctx := device.WithCallStages(ctx, func(st device.CallStage) {
		if st.Kind == device.StageSent {
			once.Do(func() { close(sent) })
		}
	})
	reply := make(chan json.RawMessage, 1)
	go func() { reply <- s.ServePeer(sctx, request("1", "tools/call", `{"name":"self.slow"}`)) }()
	<-sent
	require.NoError(t, board.Close())

	for _, raw := range []json.RawMessage{<-reply, s.ServePeer(ctx, request("2", "tools/list", `{}`))} {
		r, err := decodeReply(raw)
		require.NoError(t, err)
		require.NotNil(t, r.Error, "%s", raw)
		assert.EqualValues(t, device.PeerCodeUnavailable, *r.Error.Code)
		assert.Contains(t, r.Error.Message, "device offline")
	}
	assert.EqualValues(t, 2, s.PeerStats().Errors)
}

// TestPeerRebootIsTheOutcome: a peer's call of a tool that restarts the
// board is answered as the bridge's own would be: the disconnect is the
// outcome.
func TestPeerRebootIsTheOutcome(t *testing.T) {
	b := newPeerBridge(t, device.HubConfig{})
	_, s := b.connect(t, simulator.Config{MAC: "02:00:00:00:0a:06"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := decodeReply(s.ServePeer(ctx, request("4", "tools/call", `{"name":"self.reboot"}`)))
	require.NoError(t, err)
	text, err := echoText(r)
	require.NoError(t, err)
	assert.Contains(t, text, "restarts it")
	<-s.Done()
}
