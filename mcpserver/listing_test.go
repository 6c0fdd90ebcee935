package mcpserver_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/simulator"
)

// TestListNeverShowsHalfABoard: while a board comes and goes, a host
// listing tools sees all of its tools or none, never some of them (go-sdk
// announces the change 10 ms after the last tool it was given, which a
// loaded machine can take between two tools of one board).
func TestListNeverShowsHalfABoard(t *testing.T) {
	b := startBridge(t, func(c *app.Config) { c.MCP.PageSize = 1000 })
	cs := b.Client(legacy, nil)
	prefix := strings.TrimSuffix(upstreamName(macA, "x"), "x")
	board := b.Board(macA, "catalog", simulator.Config{})
	want := 0
	for _, name := range toolNames(t, cs) {
		if strings.HasPrefix(name, prefix) {
			want++
		}
	}
	require.Greater(t, want, 1)
	require.NoError(t, board.Close())
	b.WaitState(macA, device.StateClosed)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var seen []int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			res, err := cs.ListTools(ctx, nil)
			if err != nil {
				continue
			}
			n := 0
			for _, tool := range res.Tools {
				if strings.HasPrefix(tool.Name, prefix) {
					n++
				}
			}
			seen = append(seen, n)
		}
	}()
	for range 10 {
		board := b.Board(macA, "catalog", simulator.Config{})
		require.NoError(t, board.Close())
		b.WaitState(macA, device.StateClosed)
	}
	cancel()
	wg.Wait()
	require.NotEmpty(t, seen)
	for _, n := range seen {
		if n != 0 && n != want {
			assert.Failf(t, "a listing showed part of a board", "%d of its %d tools", n, want)
			return
		}
	}
}
