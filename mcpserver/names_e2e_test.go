package mcpserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/mcpserver"
	"github.com/devicebridge/devicebridge/simulator"
)

// Two boards whose MACs end alike: both have the default alias dev_000001.
const (
	macFirst  = "02:00:00:00:00:01"
	macSecond = "02:11:22:00:00:01"
)

// apiAliases reads GET /api/devices: device id → alias shown.
func apiAliases(t *testing.T, b *bridge) map[string]string {
	t.Helper()
	resp, err := b.HTTP.Get(b.Base + "/api/devices")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var list struct {
		Devices []struct {
			DeviceID string `json:"device_id"`
			Alias    string `json:"alias"`
		} `json:"devices"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
	out := map[string]string{}
	for _, d := range list.Devices {
		out[d.DeviceID] = d.Alias
	}
	return out
}

// withPrefix keeps the names that start with prefix + "_".
func withPrefix(names []string, prefix string) []string {
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, prefix+"_") {
			out = append(out, n)
		}
	}
	return out
}

// TestNamesStayWhenACollidingBoardJoins: a host lists the first board's
// tools; a second board whose default alias is the same joins. The first
// board's tools keep their names (the host is told of the newcomer's
// tools, and none of the first board's disappear); the newcomer's carry a
// hash of its MAC; /api/devices shows each board under the alias its
// tools are published under.
func TestNamesStayWhenACollidingBoardJoins(t *testing.T) {
	require.Equal(t, mcpserver.DefaultAlias(macFirst), mcpserver.DefaultAlias(macSecond), "the two MACs collide")
	short := mcpserver.DefaultAlias(macFirst)
	b := startBridge(t, nil)
	firstBoard := b.Board(macFirst, "breadboard", simulator.Config{})

	// One host of each era lists the first board's tools.
	hosts := map[string]*mcp.ClientSession{}
	var changed signals
	var first []string
	for _, era := range eras {
		hosts[era] = b.Client(era, &mcp.ClientOptions{
			ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed.Add() },
		})
		first = toolNames(t, hosts[era])
		require.NotEmpty(t, withPrefix(first, short))
		require.Len(t, withPrefix(first, short), len(first))
	}
	assert.Equal(t, map[string]string{macFirst: short}, apiAliases(t, b))

	secondBoard := b.Board(macSecond, "breadboard", simulator.Config{})
	require.Eventually(t, func() bool { return changed.Count() > 0 }, 10*time.Second, 5*time.Millisecond,
		"the legacy host is told the list changed")

	aliases := apiAliases(t, b)
	assert.Equal(t, short, aliases[macFirst], "/api/devices: the first board keeps its alias")
	second := aliases[macSecond]
	assert.NotEqual(t, aliases[macFirst], second, "/api/devices: two boards, two aliases")
	assert.True(t, mcpserver.ValidAlias(second), second)
	for i, era := range eras {
		cs := hosts[era]
		after := toolNames(t, cs)
		for _, n := range first {
			assert.Contains(t, after, n, "%s: the first board's tool %s keeps its name", era, n)
		}
		assert.Len(t, withPrefix(after, second), len(first), "%s: the newcomer's tools are published under its alias %s", era, second)
		assert.Len(t, after, 2*len(first))

		// A call by the first board's name reaches the first board.
		volume := 11 + i
		res := callTool(t, cs, short+"_audio_speaker_set_volume", map[string]any{"volume": volume})
		require.False(t, res.IsError, text(res))
		assert.EqualValues(t, volume, firstBoard.State()["audio_speaker.volume"])
		assert.NotEqualValues(t, volume, secondBoard.State()["audio_speaker.volume"])
	}
}

// TestNamesAcrossReconnects: with real boards, the second board keeps its
// long alias through a reconnect while the first is away (nobody took
// it), and the first, back, gets its own again.
func TestNamesAcrossReconnects(t *testing.T) {
	short := mcpserver.DefaultAlias(macFirst)
	b := startBridge(t, nil)
	firstBoard := b.Board(macFirst, "breadboard", simulator.Config{})
	secondBoard := b.Board(macSecond, "breadboard", simulator.Config{})
	long := apiAliases(t, b)[macSecond]
	require.NotEqual(t, short, long)

	gone := func(mac string) {
		t.Helper()
		b.WaitState(mac, device.StateClosed)
		require.Eventually(t, func() bool { _, ok := apiAliases(t, b)[mac]; return !ok && !b.App.MCP().Published(mac) },
			10*time.Second, 5*time.Millisecond)
	}
	require.NoError(t, firstBoard.Close())
	gone(macFirst)
	require.NoError(t, secondBoard.Close())
	gone(macSecond)

	b.Board(macSecond, "breadboard", simulator.Config{})
	assert.Equal(t, map[string]string{macSecond: long}, apiAliases(t, b), "back after a blip, the second board keeps its name")
	b.Board(macFirst, "breadboard", simulator.Config{})
	assert.Equal(t, map[string]string{macFirst: short, macSecond: long}, apiAliases(t, b))

	cs := b.Client(legacy, nil)
	names := toolNames(t, cs)
	assert.Contains(t, names, short+"_lamp_turn_on")
	assert.Contains(t, names, long+"_lamp_turn_on")
}

// TestNamesCompact: compact mode shows the same aliases, one per board,
// and resolves each to its board.
func TestNamesCompact(t *testing.T) {
	short := mcpserver.DefaultAlias(macFirst)
	b := startBridge(t, func(c *app.Config) { c.MCP.Compact = true })
	firstBoard := b.Board(macFirst, "breadboard", simulator.Config{})
	b.Board(macSecond, "breadboard", simulator.Config{})
	long := apiAliases(t, b)[macSecond]
	assert.Equal(t, map[string]string{macFirst: short, macSecond: long}, apiAliases(t, b))

	cs := b.Client(modern, nil)
	res := callTool(t, cs, "list_devices", nil)
	require.False(t, res.IsError, text(res))
	var list struct {
		Devices []struct {
			Device   string `json:"device"`
			DeviceID string `json:"device_id"`
		} `json:"devices"`
	}
	require.NoError(t, json.Unmarshal([]byte(text(res)), &list))
	shown := map[string]string{}
	for _, d := range list.Devices {
		shown[d.DeviceID] = d.Device
	}
	assert.Equal(t, map[string]string{macFirst: short, macSecond: long}, shown)

	res = callTool(t, cs, "call_device_tool", map[string]any{
		"device": short, "tool": "self.audio_speaker.set_volume", "arguments": map[string]any{"volume": 33}})
	require.False(t, res.IsError, text(res))
	assert.EqualValues(t, 33, firstBoard.State()["audio_speaker.volume"])
}

// stalledBoard connects a board over a real WebSocket that says hello and
// then never answers: the bridge keeps it initializing, so no catalogue
// sync has named it.
func stalledBoard(t *testing.T, b *bridge, mac string) {
	t.Helper()
	h := http.Header{"Protocol-Version": {"1"}, "Client-Id": {"0b9c3d5e-0000-4000-8000-0000000000bb"}, "Device-Id": {mac}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, _, err := websocket.DefaultDialer.DialContext(ctx, b.App.DeviceURL(), h)
	require.NoError(t, err)
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = conn.Close(); wg.Wait() })
	require.NoError(t, conn.WriteMessage(websocket.TextMessage, []byte(`{"type":"hello","version":1,"features":{"mcp":true},`+
		`"transport":"websocket","audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`)))
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			if _, _, err := conn.ReadMessage(); err != nil {
				return
			}
		}
	}()
}

// TestNamesOfABoardStillInitializing: /api/devices shows a board that is
// still initializing (no sync has named it yet) by the alias it will keep,
// not by the alias another board holds.
func TestNamesOfABoardStillInitializing(t *testing.T) {
	short := mcpserver.DefaultAlias(macFirst)
	b := startBridge(t, nil)
	b.Board(macFirst, "breadboard", simulator.Config{})
	stalledBoard(t, b, macSecond)
	require.Eventually(t, func() bool { _, ok := apiAliases(t, b)[macSecond]; return ok }, 10*time.Second, 5*time.Millisecond)
	aliases := apiAliases(t, b)
	assert.Equal(t, short, aliases[macFirst])
	assert.Equal(t, withPrefix([]string{aliases[macSecond]}, short), []string{aliases[macSecond]}, "moved aside: %s", aliases[macSecond])
	assert.Equal(t, aliases[macSecond], b.App.MCP().Alias(macSecond), "the alias it keeps")
	b.App.MCP().Sync()
	assert.Equal(t, aliases, apiAliases(t, b), "a sync keeps it")
}
