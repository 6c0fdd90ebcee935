//lint:file-ignore SA1019 logging is deprecated in 2026-07-28 (SEP-2577) but still defined there, per request, and served in both eras

package mcpserver

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"golang.org/x/time/rate"
)

func TestPasses(t *testing.T) {
	assert.True(t, passes("debug", "debug"))
	assert.True(t, passes("warning", "info"))
	assert.True(t, passes("emergency", "debug"))
	assert.False(t, passes("info", "warning"))
	assert.False(t, passes("debug", "info"))
	assert.False(t, passes("emergency", ""), "no level asked, nothing sent")
	assert.False(t, passes("error", "verbose"), "not a level: nothing sent")
}

// TestClientLogBounds: a client's messages stop at its bucket; the
// ones dropped are counted, and said once in the next message that
// passes. Messages below the client's level are not sent, and not counted
// as dropped either.
func TestClientLogBounds(t *testing.T) {
	var got []*mcp.LoggingMessageParams
	c := &clientLog{
		out:     func(_ context.Context, p *mcp.LoggingMessageParams) error { got = append(got, p); return nil },
		level:   "info",
		bucket:  rate.NewLimiter(0, 3), // three, then nothing until the test allows more
		dropped: new(atomic.Int64),
	}
	ctx := context.Background()
	for i := range 10 {
		c.send(ctx, zap.NewNop(), "info", map[string]any{"message": fmt.Sprint("m", i)})
		c.send(ctx, zap.NewNop(), "debug", map[string]any{"message": "below the level"})
	}
	require.Len(t, got, 3)
	for i, p := range got {
		assert.Equal(t, fmt.Sprint("m", i), p.Data.(map[string]any)["message"])
		assert.Equal(t, mcp.LoggingLevel("info"), p.Level)
		assert.Equal(t, "devicebridge", p.Logger)
	}
	assert.EqualValues(t, 7, c.dropped.Load())

	c.bucket.SetLimit(rate.Inf)
	c.send(ctx, zap.NewNop(), "warning", map[string]any{"message": "after"})
	require.Len(t, got, 5)
	assert.Equal(t, mcp.LoggingLevel("warning"), got[3].Level)
	assert.Equal(t, map[string]any{"event": "dropped", "dropped": int64(7),
		"message": "some log messages to this client were left out: more than the bridge sends a client a second"}, got[3].Data)
	assert.Equal(t, "after", got[4].Data.(map[string]any)["message"])
	assert.Zero(t, c.dropped.Load())

	var none *clientLog
	assert.False(t, none.wants("emergency"), "a caller that asked for nothing")
}

// TestNewsFor: a few boards are named one by one; more, or any that were
// only counted, make one summary; the policy's view applies to both.
func TestNewsFor(t *testing.T) {
	ev := func(i int, ready bool) boardEvent {
		return boardEvent{ready: ready, id: fmt.Sprintf("02:00:00:00:00:%02x", i), alias: fmt.Sprint("b", i),
			label: fmt.Sprintf("%q", fmt.Sprint("b", i)), tools: 3, cause: "disconnected", reason: causeWords["disconnected"]}
	}
	all := func(boardEvent) bool { return true }

	msgs := newsFor([]boardEvent{ev(1, true), ev(2, false)}, nil, false, all)
	require.Len(t, msgs, 2)
	assert.Equal(t, map[string]any{"event": "board_ready", "board": "b1", "device_id": "02:00:00:00:00:01", "tools": 3,
		"message": `board "b1" is ready (3 tools)`}, msgs[0])
	assert.Equal(t, map[string]any{"event": "board_offline", "board": "b2", "device_id": "02:00:00:00:00:02", "cause": "disconnected",
		"message": `board "b2" went offline: it closed the connection or the network dropped it`}, msgs[1])

	var many []boardEvent
	for i := range 12 {
		many = append(many, ev(i, i%3 != 0))
	}
	msgs = newsFor(many, nil, false, all)
	require.Len(t, msgs, 1, "one summary")
	assert.Equal(t, "boards_changed", msgs[0]["event"])
	assert.Equal(t, 8, msgs[0]["ready"])
	assert.Equal(t, 4, msgs[0]["offline"])
	assert.Equal(t, "8 boards became ready and 4 went offline (among them b0, b1, b2, b3, b4); list the tools again to see them",
		msgs[0]["message"])

	// Counted past maxNews: a summary, even with one board named.
	msgs = newsFor([]boardEvent{ev(1, true)}, map[bool]int{true: 300}, false, all)
	require.Len(t, msgs, 1)
	assert.Equal(t, 301, msgs[0]["ready"])

	// With a policy: only the boards the session may see, and no counts
	// of boards nobody checked.
	even := func(ev boardEvent) bool { return ev.id[len(ev.id)-1]%2 == 0 }
	msgs = newsFor(many, map[bool]int{true: 300}, true, even)
	require.Len(t, msgs, 1)
	assert.Equal(t, 4, msgs[0]["ready"])
	assert.Equal(t, 2, msgs[0]["offline"])
	msgs = newsFor([]boardEvent{ev(1, true), ev(2, true)}, nil, true, even)
	require.Len(t, msgs, 1)
	assert.Equal(t, "b2", msgs[0]["board"])
	assert.Empty(t, newsFor([]boardEvent{ev(1, true)}, map[bool]int{true: 9}, true, even))
}
