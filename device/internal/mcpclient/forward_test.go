package mcpclient

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/envelope"
	"github.com/devicebridge/devicebridge/internal/testlink"
)

// TestForwardKeepsResultAndErrorRaw: a forwarded request goes out under
// the client's own integer id with its params as written, and comes back
// with the board's result byte for byte (spacing, key order, escapes), or
// with the board's error code and data.
func TestForwardKeepsResultAndErrorRaw(t *testing.T) {
	const page = `{ "tools" : [ {"name":"self.a","description":"<b>&\u00e9\u2028"} ],"nextCursor":"x" }`
	c, fb := newClient(t, Options{}, func(r request) string {
		switch r.Method {
		case "tools/list":
			return result(r, page)
		case "tools/call":
			return fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"error":{"code":-32602,"message":"bad <args>","data":{"why": "x"}}}`, r.ID)
		}
		return result(r, `null`)
	})
	ctx := context.Background()
	res, err := c.Forward(ctx, "tools/list", json.RawMessage(`{"cursor":"self.a"}`))
	require.NoError(t, err)
	assert.Equal(t, page, string(res))

	_, err = c.Forward(ctx, "tools/call", json.RawMessage(`{"name":"self.a","arguments":{}}`))
	var de *DeviceError
	require.ErrorAs(t, err, &de)
	assert.Equal(t, "bad <args>", de.Message)
	assert.EqualValues(t, -32602, de.Code)
	assert.JSONEq(t, `{"why":"x"}`, string(de.Data))

	res, err = c.Forward(ctx, "ping", nil)
	require.NoError(t, err)
	assert.Equal(t, "null", string(res), "a null result stays a JSON value")

	reqs := fb.requests()
	require.Len(t, reqs, 3)
	assert.JSONEq(t, `{"cursor":"self.a"}`, string(reqs[0].Params))
	assert.Empty(t, reqs[2].Params, "no params: none sent, not null (the board drops null params)")
	seen := map[string]bool{}
	for _, r := range reqs {
		_, err := r.ID.Int64()
		require.NoError(t, err, "the client's own integer ids")
		assert.False(t, seen[r.ID.String()], "ids are unique")
		seen[r.ID.String()] = true
	}
}

// TestForwardTimeouts: tools/call gets the tool's timeout, other methods
// the request timeout, each counted from the call, queue included.
func TestForwardTimeouts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, _ := newClient(t, Options{RequestTimeout: time.Second, CallTimeout: 2 * time.Second,
			ToolTimeouts: map[string]time.Duration{"slow": 5 * time.Second}}, func(request) string { return "" })
		for _, tc := range []struct {
			method, params string
			want           time.Duration
		}{
			{"tools/list", `{}`, time.Second},
			{"tools/call", `{"name":"fast"}`, 2 * time.Second},
			{"tools/call", `{"name":"slow"}`, 5 * time.Second},
			{"tools/call", `{"name":5}`, 2 * time.Second},
		} {
			start := time.Now()
			_, err := c.Forward(context.Background(), tc.method, json.RawMessage(tc.params))
			require.ErrorIs(t, err, ErrTimeout)
			assert.Equal(t, tc.want, time.Since(start), "%s %s", tc.method, tc.params)
		}
	})
}

// TestNotifyAndBoardNotifications: Notify sends a notification (no id)
// without a turn in the queue; the board's notifications reach
// OnNotification, its requests do not.
func TestNotifyAndBoardNotifications(t *testing.T) {
	bridge, end := testlink.Pair(64)
	got := make(chan json.RawMessage, 4)
	hold := make(chan struct{})
	fb := testlink.NewBoard(end, func(r request) string {
		if r.Method == "tools/call" {
			// A request and a notification of the board's own, then the
			// reply once the test has notified meanwhile.
			_ = end.Send(context.Background(), []byte(`{"type":"mcp","payload":{"jsonrpc":"2.0","id":99,"method":"sampling/createMessage"}}`))
			_ = end.Send(context.Background(), []byte(`{"type":"mcp","payload":{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info"}}}`))
			<-hold
			return result(r, `{"content":[],"isError":false}`)
		}
		return ""
	})
	c := New(envelope.NewStream(bridge, envelope.StreamOptions{}), Options{OnNotification: func(m json.RawMessage) { got <- m }})
	released := false
	defer func() {
		if !released {
			close(hold)
		}
		_ = c.Close()
		fb.Close()
	}()
	done := make(chan error, 1)
	go func() {
		_, err := c.CallTool(context.Background(), "x", nil)
		done <- err
	}()
	select {
	case m := <-got:
		assert.JSONEq(t, `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info"}}`, string(m))
	case <-time.After(5 * time.Second):
		t.Fatal("the board's notification never arrived")
	}
	// The call holds the turn (and the board, which reads nothing until
	// the tool is done); a notification does not wait for the turn.
	require.Equal(t, 1, c.Pending())
	require.NoError(t, c.Notify(context.Background(), "notifications/initialized", nil))
	close(hold)
	released = true
	require.NoError(t, <-done)
	require.Eventually(t, func() bool { return fb.Count("notifications/initialized") == 1 }, 5*time.Second, time.Millisecond)
	assert.Empty(t, got, "the board's request is not handed on")
	for _, r := range fb.Requests() {
		if r.Method == "notifications/initialized" {
			assert.Empty(t, r.ID.String(), "a notification has no id")
			assert.Empty(t, r.Params)
		}
	}
	require.NoError(t, c.Close())
	assert.ErrorIs(t, c.Notify(context.Background(), "notifications/initialized", nil), ErrDisconnected)
}
