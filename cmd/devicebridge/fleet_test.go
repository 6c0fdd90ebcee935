package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/internal/natstest"
)

// TestFleet runs the CLI against one node of a two-node fleet (a real,
// in-process NATS with JetStream): it lists and calls the other node's
// boards, and says which node holds each.
func TestFleet(t *testing.T) {
	ns := natstest.Start(t) // as configs/nats-fleet.conf runs it: credentials required
	node := func(id string) func(*app.Config) {
		return func(c *app.Config) {
			c.Cluster.NATSURL, c.Cluster.NodeID = ns.ClientURL(), id
			c.Cluster.User, c.Cluster.Password = natstest.User, natstest.Password
		}
	}
	startBridgeBoards(t, node("a"), "02:00:00:00:00:01", "02:00:00:00:00:02")
	b := startBridgeBoards(t, node("b"), "02:00:00:00:00:07")

	env := map[string]string{"DEVICEBRIDGE_URL": b.Base}
	ctx := context.Background()
	var out string
	require.Eventually(t, func() bool {
		var code int
		code, out, _ = runCLI(t, ctx, env, "", "devices")
		return code == exitOK && strings.Count(out, " ready ") == 3
	}, 10*time.Second, 50*time.Millisecond, "node b lists its board and node a's two")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 4, out)
	assert.Regexp(t, `^DEVICE +ALIAS +TRANSPORT +STATE +BOARD +FIRMWARE +TOOLS +CONNECTED +NODE$`, lines[0])
	assert.Regexp(t, `^02:00:00:00:00:01 +dev_000001 +websocket +ready .* a$`, lines[1])
	assert.Regexp(t, `^02:00:00:00:00:07 +dev_000007 +websocket +ready .* here$`, lines[3])

	code, out, _ := runCLI(t, ctx, env, "", "show", "01")
	require.Equal(t, exitOK, code, out)
	assert.Regexp(t, `(?m)^node +a$`, out)

	code, out, errOut := runCLI(t, ctx, env, "", "call", "01", "audio_speaker.set_volume", "volume=33")
	require.Equal(t, exitOK, code, out+errOut)
}
