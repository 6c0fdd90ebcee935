package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/simulator"
)

// TestNamesWinOverChosenIDs: a board that chose an operator's alias as its
// Device-Id (allowed by websocket.allow_any_device_id) does not receive
// what the CLI sends to that name; with the named board away, the name
// finds nothing rather than the impostor.
func TestNamesWinOverChosenIDs(t *testing.T) {
	const real = "02:00:00:00:00:01"
	br := startBridgeBoards(t, func(c *app.Config) {
		c.WebSocket.AllowAnyDeviceID = true
		c.MCP.Aliases = map[string]string{real: "kitchen"}
	}, real)
	profile, err := simulator.LoadProfile("breadboard")
	require.NoError(t, err)
	fake, err := simulator.NewBoard(simulator.Config{Profile: profile, Hostile: &simulator.Hostile{DeviceID: "kitchen"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = fake.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, fake.ConnectWebSocket(ctx, br.App.DeviceURL()))
	require.Eventually(t, func() bool {
		d, ok := br.App.Hub.Device("kitchen")
		return ok && d.State == device.StateReady && br.App.MCP().Published("kitchen")
	}, 10*time.Second, 20*time.Millisecond)

	env := map[string]string{"DEVICEBRIDGE_URL": br.Base}
	code, out, errOut := runCLI(t, ctx, env, "", "show", "kitchen")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "device     "+real+"\n")
	code, _, errOut = runCLI(t, ctx, env, "", "call", "kitchen", "self.audio_speaker.set_volume", "volume=17")
	require.Equal(t, exitOK, code, errOut)
	assert.Equal(t, 17, br.volume(t, real))
	assert.NotEqual(t, 17, fake.State()["audio_speaker.volume"], "the impostor got nothing meant for kitchen")

	// The named board leaves; its name no longer reaches any board.
	s, ok := br.App.Hub.Session(real)
	require.True(t, ok)
	s.Close(device.ErrShutdown)
	require.Eventually(t, func() bool { _, ok := br.App.Hub.Device(real); return !ok }, 10*time.Second, 20*time.Millisecond)
	code, _, _ = runCLI(t, ctx, env, "", "call", "kitchen", "self.audio_speaker.set_volume", "volume=33")
	assert.NotEqual(t, exitOK, code)
	assert.NotEqual(t, 33, fake.State()["audio_speaker.volume"])
}

// TestMatchBoardPrefersAliases: the CLI's own resolution puts a board's
// alias before another board's id.
func TestMatchBoardPrefersAliases(t *testing.T) {
	boards := []board{{DeviceID: "kitchen", Alias: "kitchen_3171d8"}, {DeviceID: "02:00:00:00:00:01", Alias: "kitchen"}}
	b, err := matchBoard(boards, "Kitchen")
	require.NoError(t, err)
	assert.Equal(t, "02:00:00:00:00:01", b.DeviceID)
	b, err = matchBoard(boards, "kitchen_3171d8")
	require.NoError(t, err)
	assert.Equal(t, "kitchen", b.DeviceID)
}
