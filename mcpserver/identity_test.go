package mcpserver_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/simulator"
)

// Boards of the naming tests: kitchen is the operator's name for macReal;
// macPlain keeps its default alias (dev_000d02). Impostors connect with
// those names as their Device-Id, which websocket.allow_any_device_id
// lets through.
const (
	macReal  = "02:00:00:00:0d:01"
	macPlain = "02:00:00:00:0d:02"
)

func namingBridge(t *testing.T, compact bool) *bridge {
	return startBridge(t, func(c *app.Config) {
		c.WebSocket.AllowAnyDeviceID = true
		c.MCP.Aliases = map[string]string{"02-00-00-00-0D-01": "kitchen"}
		c.MCP.Compact = compact
	})
}

// impostor connects a board whose Device-Id is id.
func impostor(b *bridge, id string) *simulator.Board {
	t := b.T
	t.Helper()
	p, err := simulator.LoadProfile("breadboard")
	require.NoError(t, err)
	board, err := simulator.NewBoard(simulator.Config{Profile: p, Hostile: &simulator.Hostile{DeviceID: id}})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, board.ConnectWebSocket(ctx, b.App.DeviceURL()))
	t.Cleanup(func() { _ = board.Close() })
	b.WaitState(id, device.StateReady)
	b.WaitPublished(id)
	return board
}

// TestNamesWinOverChosenIDs: boards that name themselves after another
// board's alias (the operator's, or a MAC's default) do not take it: the
// real boards keep their tool names and receive the calls made by name.
func TestNamesWinOverChosenIDs(t *testing.T) {
	b := namingBridge(t, false)
	real := b.Board(macReal, "breadboard", simulator.Config{})
	plain := b.Board(macPlain, "breadboard", simulator.Config{})
	fakeKitchen := impostor(b, "kitchen")
	fakePlain := impostor(b, "dev_000d02")

	cs := b.Client(legacy, nil)
	names := toolNames(t, cs)
	for _, prefix := range []string{"kitchen_", "dev_000d02_"} {
		n := 0
		for _, name := range names {
			if name == prefix+"lamp_turn_on" {
				n++
			}
		}
		assert.Equal(t, 1, n, "%slamp_turn_on is published once, for the real board: %v", prefix, names)
	}
	require.False(t, callTool(t, cs, "kitchen_lamp_turn_on", nil).IsError)
	require.False(t, callTool(t, cs, "dev_000d02_lamp_turn_on", nil).IsError)
	assert.Equal(t, true, real.State()["lamp.power"])
	assert.Equal(t, true, plain.State()["lamp.power"])
	assert.Equal(t, false, fakeKitchen.State()["lamp.power"], "the impostor got nothing meant for kitchen")
	assert.Equal(t, false, fakePlain.State()["lamp.power"], "the impostor got nothing meant for dev_000d02")
}

// TestCompactNamesWinOverChosenIDs: compact /mcp resolves the operator's
// alias before a device id a board chose, even while the named board is
// away.
func TestCompactNamesWinOverChosenIDs(t *testing.T) {
	b := namingBridge(t, true)
	real := b.Board(macReal, "breadboard", simulator.Config{})
	fake := impostor(b, "kitchen")
	cs := b.Client(legacy, nil)

	res := callTool(t, cs, "describe_device", map[string]any{"device": "kitchen"})
	require.False(t, res.IsError, text(res))
	var d struct {
		Device   string `json:"device"`
		DeviceID string `json:"device_id"`
	}
	require.NoError(t, json.Unmarshal([]byte(text(res)), &d))
	assert.Equal(t, macReal, d.DeviceID)
	assert.Equal(t, "kitchen", d.Device)

	res = callTool(t, cs, "call_device_tool", map[string]any{"device": "KITCHEN", "tool": "self.lamp.turn_on"})
	require.False(t, res.IsError, text(res))
	assert.Equal(t, true, real.State()["lamp.power"])
	assert.Equal(t, false, fake.State()["lamp.power"])

	// The named board leaves: its name finds nothing rather than the board
	// that chose it as its id.
	require.NoError(t, real.Close())
	b.WaitState(macReal, device.StateClosed)
	res = callTool(t, cs, "call_device_tool", map[string]any{"device": "kitchen", "tool": "self.lamp.turn_on"})
	require.True(t, res.IsError)
	assert.Contains(t, text(res), `No board "kitchen" is connected`)
	assert.Equal(t, false, fake.State()["lamp.power"])

	// Listed, the impostor shows another alias than the operator's name.
	res = callTool(t, cs, "list_devices", nil)
	require.False(t, res.IsError)
	var list struct {
		Devices []struct {
			Device   string `json:"device"`
			DeviceID string `json:"device_id"`
		} `json:"devices"`
	}
	require.NoError(t, json.Unmarshal([]byte(text(res)), &list))
	require.Len(t, list.Devices, 1)
	assert.Equal(t, "kitchen", list.Devices[0].DeviceID)
	assert.True(t, strings.HasPrefix(list.Devices[0].Device, "kitchen_"), list.Devices[0].Device)
}
