package mcpserver_test

import (
	"context"
	"encoding/json"
	"github.com/devicebridge/devicebridge/internal/bridgetest"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/mcpserver"
	"github.com/devicebridge/devicebridge/simulator"
)

const (
	macA = "02:00:00:00:00:01"
	macB = "02:00:00:00:00:02"
	macC = "02:00:00:00:00:03"
)

// upstreamName is the name the bridge gives a board tool by default.
var upstreamName = bridgetest.ToolName

// visibleTools lists a profile's AI-visible tools (user-only ones are
// hidden by default).
func visibleTools(t testing.TB, profile string) []simulator.Tool {
	p, err := simulator.LoadProfile(profile)
	require.NoError(t, err)
	var out []simulator.Tool
	for _, tool := range p.Tools {
		if !tool.UserOnly {
			out = append(out, tool)
		}
	}
	return out
}

func deviceInfo(t testing.TB, b *bridge, mac string) device.Info {
	for _, d := range b.App.Hub.Devices() {
		if d.DeviceID == mac {
			return d
		}
	}
	t.Fatalf("no device %s", mac)
	return device.Info{}
}

// TestFleetInBothEras: three boards, one of which needs several device-side
// tools/list pages; every AI-visible tool appears upstream (paged with an
// opaque cursor), with the board named in its description and the board's
// own input schema, and a call reaches the right board.
func TestFleetInBothEras(t *testing.T) {
	b := startBridge(t, func(c *app.Config) { c.MCP.PageSize = 7 })
	b.Board(macA, "breadboard", simulator.Config{})
	b.Board(macB, "catalog", simulator.Config{})
	robot := b.Board(macC, "robot", simulator.Config{})

	want := map[string]string{} // upstream name → device tool
	owner := map[string]string{}
	for mac, profile := range map[string]string{macA: "breadboard", macB: "catalog", macC: "robot"} {
		for _, tool := range visibleTools(t, profile) {
			want[upstreamName(mac, tool.Name)] = tool.Name
			owner[upstreamName(mac, tool.Name)] = mac
		}
	}
	require.Greater(t, len(visibleTools(t, "catalog")), 40, "the catalog board needs several device pages")

	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			cs := b.Client(era, nil)

			// First page: page size 7, opaque cursor.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			page, err := cs.ListTools(ctx, nil)
			require.NoError(t, err)
			require.Len(t, page.Tools, 7)
			require.NotEmpty(t, page.NextCursor)
			for _, name := range want {
				require.NotContains(t, page.NextCursor, name, "the cursor is opaque")
			}

			all := listTools(t, cs)
			require.Len(t, all, len(want))
			var got []string
			for _, tool := range all {
				got = append(got, tool.Name)
				require.True(t, mcpserver.ValidToolName(tool.Name), tool.Name)
				devTool, ok := want[tool.Name]
				require.True(t, ok, "unexpected tool %s", tool.Name)
				mac := owner[tool.Name]
				assert.Contains(t, tool.Description, mac, "the description names the board")
				assert.Contains(t, tool.Description, mcpserver.DefaultAlias(mac))
				assert.Contains(t, tool.Description, devTool)

				// The input schema is the board's.
				var devSchema json.RawMessage
				for _, dt := range deviceInfo(t, b, mac).Tools {
					if dt.Name == devTool {
						devSchema = dt.InputSchema
					}
				}
				gotSchema, err := json.Marshal(tool.InputSchema)
				require.NoError(t, err)
				assert.JSONEq(t, string(devSchema), string(gotSchema), "schema of %s", tool.Name)
			}
			assert.True(t, sort.StringsAreSorted(got), "deterministic order")

			res := callTool(t, cs, upstreamName(macC, "self.audio_speaker.set_volume"), map[string]any{"volume": 33})
			require.False(t, res.IsError, text(res))
			assert.Equal(t, "true", text(res))
			assert.EqualValues(t, 33, robot.State()["audio_speaker.volume"])

			res = callTool(t, cs, upstreamName(macC, "self.otto.walk"), map[string]any{"steps": 5})
			require.False(t, res.IsError, text(res))
		})
	}
}

// TestListChanged: a board connecting and leaving changes the tool list,
// subscribed clients hear list_changed, and a call to a tool of a board
// that just left gets a clear "offline" answer.
func TestListChanged(t *testing.T) {
	for i, era := range eras {
		t.Run(era, func(t *testing.T) {
			b := startBridge(t, nil)
			b.Board(macA, "breadboard", simulator.Config{})
			var changed signals
			cs := b.Client(era, &mcp.ClientOptions{
				ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed.Add() },
			})
			caps := cs.InitializeResult().Capabilities
			require.NotNil(t, caps.Tools)
			require.True(t, caps.Tools.ListChanged)

			mac := []string{macB, macC}[i]
			leaving := upstreamName(mac, "self.audio_speaker.set_volume")
			require.NotContains(t, toolNames(t, cs), leaving)

			n := changed.Count()
			robot := b.Board(mac, "robot", simulator.Config{})
			require.Eventually(t, func() bool { return changed.Count() > n }, 10*time.Second, 5*time.Millisecond, "no list_changed after a board connected")
			require.Contains(t, toolNames(t, cs), leaving)
			require.False(t, callTool(t, cs, leaving, map[string]any{"volume": 10}).IsError)

			n = changed.Count()
			require.NoError(t, robot.Close())
			b.WaitState(mac, device.StateClosed)
			require.Eventually(t, func() bool { return changed.Count() > n }, 10*time.Second, 5*time.Millisecond, "no list_changed after a board left")
			names := toolNames(t, cs)
			require.NotContains(t, names, leaving)
			require.Contains(t, names, upstreamName(macA, "self.audio_speaker.set_volume"), "the other board stays")

			res := callTool(t, cs, leaving, map[string]any{"volume": 10})
			require.True(t, res.IsError)
			assert.Contains(t, text(res), "is offline")
			assert.Contains(t, text(res), mac)
			assert.Contains(t, text(res), "self.audio_speaker.set_volume was not run")
		})
	}
}

// TestListChangedDeclaredWithoutBoards: listChanged is advertised even when
// no board is connected, and the first board to arrive is announced.
func TestListChangedDeclaredWithoutBoards(t *testing.T) {
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			b := startBridge(t, nil)
			var changed signals
			cs := b.Client(era, &mcp.ClientOptions{
				ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed.Add() },
			})
			caps := cs.InitializeResult().Capabilities
			require.NotNil(t, caps.Tools)
			require.True(t, caps.Tools.ListChanged)
			require.Empty(t, toolNames(t, cs))

			b.Board(macA, "breadboard", simulator.Config{})
			require.Eventually(t, func() bool { return changed.Count() > 0 }, 10*time.Second, 5*time.Millisecond, "no list_changed for the first board")
			require.Contains(t, toolNames(t, cs), upstreamName(macA, "self.audio_speaker.set_volume"))
		})
	}
}

// TestStructuredContent: board text that is a JSON object is also given
// as structuredContent; other text stays text only.
func TestStructuredContent(t *testing.T) {
	b := startBridge(t, nil)
	b.Board(macA, "breadboard", simulator.Config{})
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			cs := b.Client(era, nil)
			res := callTool(t, cs, upstreamName(macA, "self.get_device_status"), nil)
			require.False(t, res.IsError)
			require.NotNil(t, res.StructuredContent)
			data, err := json.Marshal(res.StructuredContent)
			require.NoError(t, err)
			assert.JSONEq(t, text(res), string(data), "the text is the same JSON")
			assert.Contains(t, res.StructuredContent, "audio_speaker")

			res = callTool(t, cs, upstreamName(macA, "self.lamp.get_state"), nil)
			assert.Equal(t, map[string]any{"power": false}, res.StructuredContent)

			res = callTool(t, cs, upstreamName(macA, "self.screen.set_theme"), map[string]any{"theme": "dark"})
			assert.Equal(t, "true", text(res))
			assert.Nil(t, res.StructuredContent)
		})
	}
}

// TestCallErrors: arguments are checked before the board sees them, and the
// board's own failures come back as readable isError results.
func TestCallErrors(t *testing.T) {
	b := startBridge(t, func(c *app.Config) {
		// Only the call that is about the timeout gets a short one; the
		// others must not depend on finishing within it.
		c.Devices.ToolTimeouts["self.lamp.turn_on"] = 300 * time.Millisecond
		c.Devices.QueueSize = 1
	})
	bread := b.Board(macA, "breadboard", simulator.Config{
		ToolDelay: map[string]time.Duration{"self.lamp.turn_on": time.Second, "self.lamp.get_state": 150 * time.Millisecond},
	})
	b.Board(macB, "catalog", simulator.Config{})
	b.Board(macC, "robot", simulator.Config{DisconnectOn: map[string]bool{"self.otto.stop": true}})
	cs := b.Client(legacy, nil)

	t.Run("invalid arguments never reach the board", func(t *testing.T) {
		before := bread.Stats().CallsRun
		res := callTool(t, cs, upstreamName(macA, "self.audio_speaker.set_volume"), map[string]any{"volume": "loud"})
		require.True(t, res.IsError)
		assert.Contains(t, text(res), `argument "volume" must be an integer from 0 to 100, but got the string "loud"`)
		assert.Contains(t, text(res), "nothing was sent to the board")
		assert.Contains(t, text(res), `{"volume": 50}`)
		res = callTool(t, cs, upstreamName(macA, "self.audio_speaker.set_volume"), map[string]any{"volume": 150})
		assert.Contains(t, text(res), `argument "volume" is 150, above the maximum of 100`)
		res = callTool(t, cs, upstreamName(macA, "self.audio_speaker.set_volume"), nil)
		assert.Contains(t, text(res), `missing required argument "volume"`)
		assert.Equal(t, before, bread.Stats().CallsRun)
	})
	t.Run("device error", func(t *testing.T) {
		res := callTool(t, cs, upstreamName(macB, "self.sensor.firmware_check"), nil)
		require.True(t, res.IsError)
		assert.Contains(t, text(res), "refused self.sensor.firmware_check: Sensor bus not responding")
		assert.Contains(t, text(res), macB)
	})
	t.Run("timeout", func(t *testing.T) {
		res := callTool(t, cs, upstreamName(macA, "self.lamp.turn_on"), nil)
		require.True(t, res.IsError)
		assert.Regexp(t, `did not answer self\.lamp\.turn_on within \d+ms`, text(res))
		assert.Contains(t, text(res), "outcome is unknown")
	})
	t.Run("busy", func(t *testing.T) {
		// The board is still running turn_on; one call may run and one
		// wait (queue size 1), the rest are turned away at once.
		var wg sync.WaitGroup
		results := make([]*mcp.CallToolResult, 4)
		for i := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: upstreamName(macA, "self.lamp.get_state")})
				if err == nil {
					results[i] = res
				}
			}()
		}
		wg.Wait()
		busy := 0
		for _, res := range results {
			if res != nil && strings.Contains(text(res), "is busy") {
				busy++
				assert.Contains(t, text(res), "was not sent")
			}
		}
		assert.Positive(t, busy, "some calls are turned away as busy")
	})
	t.Run("board leaves mid-call", func(t *testing.T) {
		res := callTool(t, cs, upstreamName(macC, "self.otto.stop"), nil)
		require.True(t, res.IsError)
		assert.Contains(t, text(res), "disconnected while running self.otto.stop")
		assert.Contains(t, text(res), "outcome is unknown")
	})
}

// TestUserOnlyTools: hidden by default, published (and marked) on request.
func TestUserOnlyTools(t *testing.T) {
	reboot := upstreamName(macA, "self.reboot")
	b := startBridge(t, nil)
	b.Board(macA, "breadboard", simulator.Config{})
	names := toolNames(t, b.Client(legacy, nil))
	require.Contains(t, names, upstreamName(macA, "self.audio_speaker.set_volume"), "the board is published")
	require.NotContains(t, names, reboot)

	b2 := startBridge(t, func(c *app.Config) { c.MCP.ShowUserOnlyTools = true })
	b2.Board(macA, "breadboard", simulator.Config{})
	for _, tool := range listTools(t, b2.Client(modern, nil)) {
		if tool.Name == reboot {
			assert.Contains(t, tool.Description, "User-only tool")
			return
		}
	}
	t.Fatalf("%s not published", reboot)
}

// TestAliases: configured aliases name the tools.
func TestAliases(t *testing.T) {
	b := startBridge(t, func(c *app.Config) { c.MCP.Aliases = map[string]string{"02-00-00-00-00-01": "kitchen"} })
	b.Board(macA, "breadboard", simulator.Config{})
	names := toolNames(t, b.Client(legacy, nil))
	assert.Contains(t, names, "kitchen_audio_speaker_set_volume")
}

// TestBareAlias: a board configured with an empty alias publishes its
// tools without a prefix and runs them; the board itself is still named
// by its default alias (and its MAC) in resources and /api. A second
// bare board listing the same tools gets them hashed, as any clash.
func TestBareAlias(t *testing.T) {
	b := startBridge(t, func(c *app.Config) {
		c.MCP.Aliases = map[string]string{"02-00-00-00-00-01": "", macC: ""}
	})
	b.Board(macA, "breadboard", simulator.Config{})
	b.Board(macB, "breadboard", simulator.Config{})
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			cs := b.Client(era, nil)
			names := toolNames(t, cs)
			assert.Contains(t, names, "get_device_status")
			assert.Contains(t, names, "audio_speaker_set_volume")
			assert.Contains(t, names, upstreamName(macB, "self.get_device_status"))
			assert.NotContains(t, names, upstreamName(macA, "self.get_device_status"))
			res := callTool(t, cs, "audio_speaker_set_volume", map[string]any{"volume": 30})
			require.False(t, res.IsError, text(res))

			for _, ref := range []string{"dev_000001", macA} {
				board, err := readBoard(t, cs, boardURI(ref))
				require.NoError(t, err, ref)
				assert.Equal(t, macA, board.DeviceID)
				assert.Equal(t, "dev_000001", board.Device)
				var mcpNames []string
				for _, tool := range board.Tools {
					mcpNames = append(mcpNames, tool.MCPName)
				}
				assert.Contains(t, mcpNames, "get_device_status")
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.Base+"/api/devices/"+macA, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var detail struct {
		Alias string `json:"alias"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&detail))
	assert.Equal(t, "dev_000001", detail.Alias)

	b.Board(macC, "breadboard", simulator.Config{})
	names := toolNames(t, b.Client(legacy, nil))
	assert.Contains(t, names, "get_device_status", "the first board keeps its names")
	assert.Contains(t, names, "get_device_status_"+mcpserver.ToolHash(macC, "self.get_device_status"))
}

// TestCompactMode: three fixed tools drive the whole fleet.
func TestCompactMode(t *testing.T) {
	b := startBridge(t, func(c *app.Config) { c.MCP.Compact = true })
	b.Board(macA, "breadboard", simulator.Config{})
	b.Board(macB, "catalog", simulator.Config{})
	robot := b.Board(macC, "robot", simulator.Config{})
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			cs := b.Client(era, nil)
			require.ElementsMatch(t, []string{"list_devices", "describe_device", "call_device_tool"}, toolNames(t, cs))
			require.False(t, cs.InitializeResult().Capabilities.Tools.ListChanged, "the compact list never changes")

			res := callTool(t, cs, "list_devices", nil)
			require.False(t, res.IsError, text(res))
			var list struct {
				Devices []struct {
					Device   string   `json:"device"`
					DeviceID string   `json:"device_id"`
					State    string   `json:"state"`
					Tools    []string `json:"tools"`
				} `json:"devices"`
				Total int `json:"total"`
			}
			require.NoError(t, json.Unmarshal([]byte(text(res)), &list))
			require.Equal(t, 3, list.Total)
			require.Equal(t, macC, list.Devices[2].DeviceID)
			assert.Equal(t, "ready", list.Devices[2].State)
			assert.Contains(t, list.Devices[2].Tools, "self.otto.walk")

			res = callTool(t, cs, "list_devices", map[string]any{"limit": 1, "offset": 1})
			require.NoError(t, json.Unmarshal([]byte(text(res)), &list))
			require.Len(t, list.Devices, 1)
			assert.Equal(t, macB, list.Devices[0].DeviceID)

			res = callTool(t, cs, "describe_device", map[string]any{"device": mcpserver.DefaultAlias(macC)})
			require.False(t, res.IsError, text(res))
			assert.Contains(t, text(res), `"name":"self.otto.walk"`)
			assert.Contains(t, text(res), `"minimum":100,"maximum":3000`)

			res = callTool(t, cs, "call_device_tool", map[string]any{
				"device": macC, "tool": "self.audio_speaker.set_volume", "arguments": map[string]any{"volume": 21}})
			require.False(t, res.IsError, text(res))
			assert.EqualValues(t, 21, robot.State()["audio_speaker.volume"])

			res = callTool(t, cs, "call_device_tool", map[string]any{
				"device": strings.ToUpper(macC), "tool": "audio_speaker_set_volume", "arguments": map[string]any{"volume": 101}})
			require.True(t, res.IsError)
			assert.Contains(t, text(res), `argument "volume" is 101, above the maximum of 100`)

			res = callTool(t, cs, "call_device_tool", map[string]any{"device": "nowhere", "tool": "x"})
			require.True(t, res.IsError)
			assert.Contains(t, text(res), `No board "nowhere" is connected`)

			res = callTool(t, cs, "call_device_tool", map[string]any{"device": macC, "tool": "self.fly"})
			require.True(t, res.IsError)
			assert.Contains(t, text(res), `has no tool "self.fly"`)

			res = callTool(t, cs, "call_device_tool", map[string]any{"device": macC})
			require.True(t, res.IsError)
			assert.Contains(t, text(res), `missing required argument "tool"`)
		})
	}
}
