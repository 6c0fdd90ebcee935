package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkCall compares a call to a board on this node with the same call
// routed through NATS to the node that holds it (scripted in-memory boards,
// in-process NATS: the difference is the routing cost).
func BenchmarkCall(b *testing.B) {
	url := startNATS(b)
	x, y := startNode(b, url, "x"), startNode(b, url, "y")
	y.attach(b, "bb:00:00:00:00:01", nil)
	require.Eventually(b, func() bool { _, ok := x.hub.Device("bb:00:00:00:00:01"); return ok && len(readyIDs(x.hub)) == 1 },
		10*time.Second, 10*time.Millisecond)
	ctx := context.Background()
	for _, c := range []struct {
		name string
		n    *node
	}{{"local", y}, {"remote", x}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := c.n.hub.CallTool(ctx, "bb:00:00:00:00:01", "self.get_device_status", nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
