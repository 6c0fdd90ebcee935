package envelope

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/internal/testlink"
)

// TestDroppedMessagesAreThrottled: a board can send messages the bridge
// drops as fast as its link carries them; a flood of them is one warning
// per interval, with the count of the rest, and a decoder error quoting
// the board's bytes is cut.
func TestDroppedMessagesAreThrottled(t *testing.T) {
	bridge, board := testlink.Pair(64)
	defer bridge.Close(nil)
	core, logs := observer.New(zapcore.InfoLevel)
	s := NewStream(bridge, StreamOptions{Logger: zap.New(core)})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	junk := `{"type":"mcp","payload":{"jsonrpc":"2.0","id":1,"method":` + strings.Repeat("9", 2000) + `}}`
	// flood sends n messages to drop, then one to read, and reads it.
	flood := func(n int) {
		for range n {
			require.NoError(t, board.Send(ctx, []byte(junk)))
		}
		require.NoError(t, board.Send(ctx, []byte(`{"type":"mcp","payload":{"jsonrpc":"2.0","id":1,"result":{}}}`)))
		var v any
		require.NoError(t, s.ReadObject(&v))
	}
	const n = 30
	s.dropLog.SetInterval(time.Hour)
	flood(n)
	require.EqualValues(t, n, s.Stats().Dropped)
	require.Equal(t, 1, logs.FilterMessage("dropped device message").Len(), "one line for a flood of %d", n)
	s.dropLog.SetInterval(time.Nanosecond)
	flood(1)
	lines := logs.FilterMessage("dropped device message").All()
	require.Len(t, lines, 2)
	assert.EqualValues(t, n-1, lines[1].ContextMap()["suppressed"])
	for _, l := range lines {
		if e, ok := l.ContextMap()["error"].(string); ok {
			assert.LessOrEqual(t, len(e), clip.Max+40)
		}
	}
}
