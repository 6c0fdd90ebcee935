package device

import (
	"context"
	"fmt"
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

// TestFailedInitializationsAreThrottledAndCut: a board can fail its
// initialization at every connection, with an error text of its choosing;
// a flood of them is one warning per interval with the count of the rest,
// and the board's text is cut. So is the name a ready board gives itself.
func TestFailedInitializationsAreThrottledAndCut(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	h := NewHub(HubConfig{ReadyWait: 2 * time.Second}, zap.New(core))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, h.Close(ctx))
	})
	long := strings.Repeat("w", 20_000)
	attach := func(i int, reply func(testlink.Request) string) *Session {
		bridge, end := testlink.Pair(32)
		b := testlink.NewBoard(end, reply)
		t.Cleanup(b.Close)
		s, err := h.Attach(bridge, Identity{DeviceID: fmt.Sprintf("aa:bb:cc:dd:ef:%02x", i), Transport: "test", HasMCP: true})
		require.NoError(t, err)
		return s
	}
	failing := func(r testlink.Request) string { return testlink.ErrorReply(r, long) }
	fail := func(i int) {
		s := attach(i, failing)
		<-s.Done()
		require.Equal(t, CauseInitFailed, s.Info().CloseCause)
	}

	const n = 20
	const msg = "device initialization failed; closing its connection"
	h.initFailedLog.SetInterval(time.Hour)
	for i := range n {
		fail(i)
	}
	require.Equal(t, 1, logs.FilterMessage(msg).Len(), "one line for a flood of %d", n)
	h.initFailedLog.SetInterval(time.Nanosecond)
	fail(n)
	lines := logs.FilterMessage(msg).All()
	require.Len(t, lines, 2)
	assert.EqualValues(t, n-1, lines[1].ContextMap()["suppressed"])
	assert.LessOrEqual(t, len(lines[0].ContextMap()["error"].(string)), clip.Max+40, "the board's text is cut")

	ready := attach(n+1, func(r testlink.Request) string {
		if r.Method == "initialize" {
			return testlink.Result(r, `{"protocolVersion":"2024-11-05","capabilities":{},"serverInfo":{"name":"`+long+`","version":"`+long+`"}}`)
		}
		return testlink.Result(r, `{"tools":`+twoTools+`}`)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, ready.WaitReady(ctx))
	// The session is ready before it writes its line: wait for the line.
	require.Eventually(t, func() bool { return logs.FilterMessage("device ready").Len() == 1 }, 5*time.Second, time.Millisecond)
	line := logs.FilterMessage("device ready").All()
	assert.Equal(t, clip.String(long), line[0].ContextMap()["board"])
	assert.Equal(t, clip.String(long), line[0].ContextMap()["firmware"])
}
