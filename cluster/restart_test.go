package cluster

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/internal/natstest"
)

// TestNATSRestart: NATS goes away and comes back (same port, same store).
// Local calls never fail meanwhile; afterwards both nodes see and call
// each other's boards again.
func TestNATSRestart(t *testing.T) {
	dir := t.TempDir()
	s, err := server.NewServer(natstest.Options(t, dir, -1))
	require.NoError(t, err)
	go s.Start()
	require.True(t, s.ReadyForConnections(10*time.Second))
	port := s.Addr().(*net.TCPAddr).Port
	url := s.ClientURL()

	a, b := startNode(t, url, "a"), startNode(t, url, "b")
	a.attach(t, "aa:00:00:00:00:01", nil)
	b.attach(t, "bb:00:00:00:00:01", nil)
	require.Eventually(t, func() bool { return len(readyIDs(a.hub)) == 2 && len(readyIDs(b.hub)) == 2 }, 10*time.Second, 20*time.Millisecond)

	s.Shutdown()
	s.WaitForShutdown()
	ctx := context.Background()
	_, err = a.hub.CallTool(ctx, "aa:00:00:00:00:01", "self.get_device_status", nil)
	require.NoError(t, err, "a node cut off from NATS keeps serving its own boards")

	s2, err := server.NewServer(natstest.Options(t, dir, port))
	require.NoError(t, err)
	go s2.Start()
	require.True(t, s2.ReadyForConnections(10*time.Second))
	t.Cleanup(func() { s2.Shutdown(); s2.WaitForShutdown() })
	back := time.Now()

	require.Eventually(t, func() bool {
		_, errA := a.hub.CallTool(ctx, "bb:00:00:00:00:01", "self.get_device_status", nil)
		_, errB := b.hub.CallTool(ctx, "aa:00:00:00:00:01", "self.get_device_status", nil)
		return errA == nil && errB == nil
	}, 20*time.Second, 50*time.Millisecond, "routed calls work again after NATS returns")
	_, err = b.hub.CallTool(ctx, "bb:00:00:00:00:01", "self.get_device_status", nil)
	require.NoError(t, err)
	t.Logf("fleet whole again %v after NATS returned", time.Since(back))
}
