package device

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/internal/testlink"
)

// These tests give the peer a scripted board (the package's test link),
// where the exact bytes the board sends are the test's to choose, and
// where the board can do what the simulator never does (notifications,
// error codes). peer_test.go shares the real simulator.

// peerPage is a tools/list page the board sends to the peer only, spaced
// and escaped as no encoder would redo it.
const peerPage = `{ "tools":[{"name":"self.other","description":"<b>&amp;\u00e9\u2028 é","inputSchema":{"type":"object","properties":{}}}] , "nextCursor" : "z" }`

// peerBoard is a board whose first tools/list (the bridge's) lists
// twoTools and whose later ones list peerPage; tools/call answers with its
// params, or with an error carrying a code and data for "coded"; it waits
// for hold (when not nil) before answering self.get_device_status, and
// sends a notification and a request of its own before answering "chatty".
func peerBoard(t *testing.T, hold chan struct{}) (*testlink.Board, *testlink.Link) {
	bridge, end := testlink.Pair(64)
	var lists atomic.Int32
	b := testlink.NewBoard(end, func(r testlink.Request) string {
		switch r.Method {
		case "initialize":
			return testlink.Result(r, `{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"test-board","version":"2.4.2"}}`)
		case "tools/list":
			if lists.Add(1) == 1 {
				return testlink.Result(r, `{"tools":`+twoTools+`}`)
			}
			return testlink.Result(r, peerPage)
		case "tools/call":
			var p struct{ Name string }
			_ = json.Unmarshal(r.Params, &p)
			switch p.Name {
			case "coded":
				return fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"error":{"code":-32602,"message":"bad <x>","data":{"a": [1]}}}`, r.ID)
			case "self.get_device_status":
				if hold != nil {
					<-hold
				}
			case "chatty":
				_ = end.Send(context.Background(), []byte(`{"type":"mcp","payload":{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info"}}}`))
				_ = end.Send(context.Background(), []byte(`{"type":"mcp","payload":{"jsonrpc":"2.0","id":77,"method":"roots/list"}}`))
			}
			return testlink.Result(r, `{"params":`+string(r.Params)+`}`)
		}
		return testlink.ErrorReply(r, "Method not implemented: "+r.Method)
	})
	t.Cleanup(b.Close)
	return b, bridge
}

func attachPeerBoard(t *testing.T, cfg HubConfig, mac string, hold chan struct{}) (*Hub, *testlink.Board, *Session) {
	t.Helper()
	cfg.ReadyWait = 2 * time.Second
	h := NewHub(cfg, nil)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, h.Close(ctx))
	})
	b, link := peerBoard(t, hold)
	s, err := h.Attach(link, Identity{DeviceID: mac, HasMCP: true})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, s.WaitReady(ctx))
	return h, b, s
}

// TestPeerToolsListIsTheBoardsOwn: the peer's tools/list result is the
// board's, byte for byte, and leaves the bridge's catalogue alone; a board
// error with a code and data reaches the peer with both.
func TestPeerToolsListIsTheBoardsOwn(t *testing.T) {
	h, b, s := attachPeerBoard(t, HubConfig{}, "aa:bb:cc:dd:ee:a1", nil)
	sub := h.Subscribe()
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	got := s.ServePeer(ctx, json.RawMessage(`{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"cursor":"a"}}`))
	assert.Equal(t, `{"jsonrpc":"2.0","id":2,"result":`+peerPage+`}`, string(got))
	assert.JSONEq(t, `{"cursor":"a"}`, string(b.Requests()[2].Params), "params go to the board as the peer wrote them")
	assert.Equal(t, []string{"self.get_device_status", "self.reboot"}, toolNames(s.Info().Tools),
		"the bridge's catalogue is the board's first listing")
	assert.Empty(t, sub.Next(), "no tools_changed event")

	got = s.ServePeer(ctx, json.RawMessage(`{"jsonrpc":"2.0","id":"x<1>","method":"tools/call","params":{"name":"coded"}}`))
	assert.Equal(t, `{"jsonrpc":"2.0","id":"x<1>","error":{"code":-32602,"message":"bad <x>","data":{"a": [1]}}}`, string(got))
}

func toolNames(tools []Tool) []string {
	names := make([]string, len(tools))
	for i, t := range tools {
		names[i] = t.Name
	}
	return names
}

// TestPeerNotifications: the peer's notifications reach the board as
// notifications; the board's reach the peer while it is registered, its
// requests never; notifications/cancelled cancels the peer's own request
// of that id, which then never reaches the board.
func TestPeerNotifications(t *testing.T) {
	hold := make(chan struct{})
	released := false
	defer func() {
		if !released {
			close(hold)
		}
	}()
	_, b, s := attachPeerBoard(t, HubConfig{}, "aa:bb:cc:dd:ee:a2", hold)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	assert.Nil(t, s.ServePeer(ctx, json.RawMessage(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)))
	require.Eventually(t, func() bool { return b.Count("notifications/initialized") == 1 }, 5*time.Second, time.Millisecond)
	for _, r := range b.Requests() {
		if r.Method == "notifications/initialized" {
			assert.Empty(t, r.ID.String(), "forwarded without an id")
		}
	}

	heard := make(chan json.RawMessage, 4)
	s.SetPeerNotify(func(m json.RawMessage) { heard <- m })
	_, err := decodePeer(s.ServePeer(ctx, json.RawMessage(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"chatty"}}`)))
	require.NoError(t, err)
	select {
	case m := <-heard:
		assert.JSONEq(t, `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info"}}`, string(m))
	case <-time.After(5 * time.Second):
		t.Fatal("the board's notification never reached the peer")
	}
	s.SetPeerNotify(nil)
	_, err = decodePeer(s.ServePeer(ctx, json.RawMessage(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"chatty"}}`)))
	require.NoError(t, err)
	assert.Empty(t, heard, "neither the board's request nor a notification after unregistering")

	// A bridge call holds the board; the peer's request queues behind it
	// and is cancelled by the peer before its turn.
	held := make(chan error, 1)
	go func() {
		_, err := s.CallTool(ctx, "self.get_device_status", nil)
		held <- err
	}()
	require.Eventually(t, func() bool { return s.Pending() == 1 }, 5*time.Second, time.Millisecond)
	reply := make(chan json.RawMessage, 1)
	go func() {
		reply <- s.ServePeer(ctx, json.RawMessage(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"never"}}`))
	}()
	require.Eventually(t, func() bool { return s.Pending() == 2 }, 5*time.Second, time.Millisecond)
	assert.Nil(t, s.ServePeer(ctx, json.RawMessage(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5}}`)))
	r, err := decodePeer(<-reply)
	require.NoError(t, err)
	require.NotNil(t, r.Error)
	assert.Equal(t, "5", string(r.ID))
	assert.Contains(t, r.Error.Message, "cancelled by the peer")
	close(hold)
	released = true
	require.NoError(t, <-held)
	for _, r := range b.Requests() {
		assert.NotContains(t, string(r.Params), "never", "the cancelled request was never sent")
		assert.NotEqual(t, "notifications/cancelled", r.Method, "the peer's id means nothing to the board")
	}
	assert.Equal(t, PeerStats{Requests: 3, Errors: 1, Notifications: 2, FromBoard: 1}, s.PeerStats())
}

// TestPeerNotReadyInTime: a board that never finishes initializing gets
// the peer an error reply within ReadyWait.
func TestPeerNotReadyInTime(t *testing.T) {
	h := NewHub(HubConfig{ReadyWait: 50 * time.Millisecond, InitTimeout: time.Minute}, nil)
	defer h.Close(context.Background())
	bridge, end := testlink.Pair(4) // nobody answers: stuck initializing
	defer end.Close(nil)
	s, err := h.Attach(bridge, Identity{DeviceID: "aa:bb:cc:dd:ee:a3", HasMCP: true})
	require.NoError(t, err)
	r, err := decodePeer(s.ServePeer(context.Background(), json.RawMessage(`{"jsonrpc":"2.0","id":1,"method":"initialize"}`)))
	require.NoError(t, err)
	require.NotNil(t, r.Error)
	assert.EqualValues(t, PeerCodeUnavailable, *r.Error.Code)
	assert.Contains(t, r.Error.Message, "device not ready: still initializing")
	assert.Nil(t, s.ServePeer(context.Background(), json.RawMessage(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)))
	assert.EqualValues(t, 1, s.PeerStats().Dropped, "a notification to a board not ready is dropped")
}

// TestServePeerMalformed: what is not a request the bridge can forward is
// answered with an invalid-request error when it has a method and an id,
// and dropped otherwise; nothing reaches the board.
func TestServePeerMalformed(t *testing.T) {
	_, b, s := attachPeerBoard(t, HubConfig{}, "aa:bb:cc:dd:ee:a4", nil)
	before := len(b.Requests())
	const invalid = `{"jsonrpc":"2.0","id":%s,"error":{"code":-32600,"message":"invalid request: %s"}}`
	for _, tc := range []struct{ in, want string }{
		{`not json`, ""},
		{``, ""},
		{`null`, ""},
		{`5`, ""},
		{`"tools/list"`, ""},
		{`{"jsonrpc":"2.0","id":3}`, ""},
		{`{"jsonrpc":"2.0","id":3,"result":{}}`, ""},
		{`{"jsonrpc":"2.0","id":3,"error":{"message":"x"}}`, ""},
		{`{"method":5}`, ""},
		{`{"method":null,"id":1}`, ""},
		{`[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]`, fmt.Sprintf(invalid, "null", "batches are not supported; send one message at a time")},
		{`{"jsonrpc":"2.0","id":{"a":1},"method":"tools/list"}`, fmt.Sprintf(invalid, "null", "id must be a number or a string")},
		{`{"jsonrpc":"2.0","id":true,"method":"tools/list"}`, fmt.Sprintf(invalid, "null", "id must be a number or a string")},
		{`{"jsonrpc":"2.0","id":null,"method":"tools/list"}`, fmt.Sprintf(invalid, "null", "id must be a number or a string")},
		{`{"jsonrpc":"2.0","id":[1],"method":"tools/list"}`, fmt.Sprintf(invalid, "null", "id must be a number or a string")},
		{`{"jsonrpc":"2.0","id":3,"method":5}`, fmt.Sprintf(invalid, "3", "method must be a non-empty string")},
		{`{"jsonrpc":"2.0","id":3,"method":""}`, fmt.Sprintf(invalid, "3", "method must be a non-empty string")},
		{`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":[1]}`, fmt.Sprintf(invalid, "3", "params must be an object")},
		{`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":"x"}`, fmt.Sprintf(invalid, "3", "params must be an object")},
		{`{"jsonrpc":"2.0","id":"c","method":"notifications/cancelled","params":{"requestId":1}}`, fmt.Sprintf(invalid, `"c"`, "a notification has no id")},
		{`{"jsonrpc":"2.0","id":4,"method":"` + strings.Repeat("m", 200) + `"}`, fmt.Sprintf(invalid, "4", "method longer than 128 bytes")},
		{`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"pad":"` + strings.Repeat("x", maxPeerMessage) + `"}}`, fmt.Sprintf(invalid, "4", "larger than 65536 bytes")},
	} {
		got := s.ServePeer(context.Background(), json.RawMessage(tc.in))
		assert.Equal(t, tc.want, string(got), "%.80s", tc.in)
	}
	assert.Len(t, b.Requests(), before, "nothing reached the board")
	assert.Equal(t, PeerStats{Requests: 12, Errors: 12, Dropped: 10}, s.PeerStats())
}

// peerReplyOf is a reply ServePeer made, decoded.
type peerReplyOf struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  json.RawMessage `json:"result"`
	Error   *struct {
		Code    *int64 `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func decodePeer(raw json.RawMessage) (peerReplyOf, error) {
	var r peerReplyOf
	if err := json.Unmarshal(raw, &r); err != nil {
		return r, fmt.Errorf("reply %q: %w", raw, err)
	}
	if r.JSONRPC != "2.0" || (r.Result == nil) == (r.Error == nil) {
		return r, fmt.Errorf("reply %q is not a JSON-RPC response", raw)
	}
	return r, nil
}

// FuzzServePeer: whatever a peer sends, ServePeer never panics, and its
// reply is nil or one JSON-RPC response; a request with a method and a
// number or string id is always answered, under that id, byte for byte.
func FuzzServePeer(f *testing.F) {
	for _, seed := range []string{
		`not json`,
		`[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]`,
		`{"jsonrpc":"2.0","id":{"a":1},"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":true,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":3}`,
		`{"jsonrpc":"2.0","id":3,"result":{}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":"x\u003c","method":"tools/call","params":{"name":"self.reboot","arguments":{}}}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"coded"}}`,
		`{"jsonrpc":"2.0","id":-1.5e3,"method":"initialize","params":null}`,
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		"\x00\xff{",
	} {
		f.Add([]byte(seed))
	}
	h := NewHub(HubConfig{ReadyWait: time.Second, Client: ClientOptions{RequestTimeout: time.Second, CallTimeout: time.Second}}, nil)
	defer h.Close(context.Background())
	bridge, end := testlink.Pair(64)
	board := testlink.NewBoard(end, func(r testlink.Request) string {
		switch r.Method {
		case "initialize":
			return testlink.Result(r, `{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"b","version":"1"}}`)
		case "tools/list":
			return testlink.Result(r, `{"tools":`+twoTools+`}`)
		}
		return testlink.ErrorReply(r, "Method not implemented: "+r.Method)
	})
	defer board.Close()
	s, err := h.Attach(bridge, Identity{DeviceID: "aa:bb:cc:dd:ee:a5", HasMCP: true})
	require.NoError(f, err)
	require.NoError(f, s.WaitReady(context.Background()))

	f.Fuzz(func(t *testing.T, msg []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		reply := s.ServePeer(ctx, msg)
		var in struct {
			ID     json.RawMessage `json:"id"`
			Method json.RawMessage `json:"method"`
		}
		var method string
		request := json.Unmarshal(msg, &in) == nil && validID(in.ID) && json.Unmarshal(in.Method, &method) == nil && method != ""
		if reply == nil {
			if request {
				t.Fatalf("request %q got no reply", msg)
			}
			return
		}
		r, err := decodePeer(reply)
		if err != nil {
			t.Fatal(err)
		}
		if request && string(r.ID) != string(in.ID) {
			t.Fatalf("request id %s answered as %s", in.ID, r.ID)
		}
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			t.Fatalf("%q: no reply within 5 s", msg)
		}
	})
}

// TestPeerMaxPendingIsHeldToHalfTheQueue: whatever the configuration, the
// peer never holds more than half a board's places.
func TestPeerMaxPendingIsHeldToHalfTheQueue(t *testing.T) {
	for _, tc := range []struct{ peer, queue, want int }{
		{0, 0, DefaultPeerMaxPending},
		{100, 0, (DefaultQueueSize + 1) / 2},
		{100, 3, 2},
		{5, 1, 1},
		{-1, 0, DefaultPeerMaxPending},
	} {
		cfg := HubConfig{PeerMaxPending: tc.peer, Client: ClientOptions{QueueSize: tc.queue}}.withDefaults()
		assert.Equal(t, tc.want, cfg.PeerMaxPending, "peer %d, queue %d", tc.peer, tc.queue)
	}
}
