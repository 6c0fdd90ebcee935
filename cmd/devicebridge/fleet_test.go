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

// TestFleetHolderShowsNode: the node that holds every board, asked
// directly, still shows the NODE column ("here" for each), and its
// /api/devices names it; a bridge alone has neither.
func TestFleetHolderShowsNode(t *testing.T) {
	ns := natstest.Start(t)
	b := startBridgeBoards(t, func(c *app.Config) {
		c.Cluster.NATSURL, c.Cluster.NodeID = ns.ClientURL(), "b"
		c.Cluster.User, c.Cluster.Password = natstest.User, natstest.Password
	}, "02:00:00:00:00:07")
	var list struct {
		Node    string           `json:"node"`
		Devices []map[string]any `json:"devices"`
	}
	require.True(t, b.get(t, "/api/devices", &list))
	assert.Equal(t, "b", list.Node, "a node in a fleet names itself")
	require.Len(t, list.Devices, 1)
	assert.NotContains(t, list.Devices[0], "node", "a board held here names no other node")

	code, out, errOut := runCLI(t, context.Background(), map[string]string{"DEVICEBRIDGE_URL": b.Base}, "", "devices")
	require.Equal(t, exitOK, code, out+errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2, out)
	assert.Regexp(t, `NODE$`, lines[0])
	assert.Regexp(t, `^02:00:00:00:00:07 .* here$`, lines[1])

	alone := startBridgeBoards(t, nil, "02:00:00:00:00:08")
	var aloneList map[string]any
	require.True(t, alone.get(t, "/api/devices", &aloneList))
	assert.NotContains(t, aloneList, "node", "a bridge alone is in no fleet")
	code, out, errOut = runCLI(t, context.Background(), map[string]string{"DEVICEBRIDGE_URL": alone.Base}, "", "devices")
	require.Equal(t, exitOK, code, out+errOut)
	assert.NotContains(t, out, "NODE")
}
