package mcpserver

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/device"
)

func TestDefaultAlias(t *testing.T) {
	for _, tc := range []struct{ id, want string }{
		{"aa:bb:cc:dd:ee:ff", "dev_ddeeff"},
		{"AA:BB:CC:DD:EE:FF", "dev_ddeeff"},
		{"aa-bb-cc-dd-ee-ff", "dev_ddeeff"},
		{"aabbccddeeff", "dev_ddeeff"},
		{"02:00:00:00:00:01", "dev_000001"},
		{"kitchen-speaker", "kitchen-speaker"},
		{"board #7 (hall)", "board_7_hall"},
		{"a-very-long-device-identifier-that-goes-on", "a-very-long-device-ident"},
		{"设备", "dev_" + shortHash("设备")},
	} {
		got := DefaultAlias(tc.id)
		assert.Equal(t, tc.want, got, "DefaultAlias(%q)", tc.id)
		assert.True(t, ValidToolName(got), "alias %q is usable in names", got)
	}
}

func TestToolPart(t *testing.T) {
	for _, tc := range []struct{ tool, want string }{
		{"self.audio_speaker.set_volume", "audio_speaker_set_volume"},
		{"self.get_device_status", "get_device_status"},
		{"self.AEC.get_mode", "AEC_get_mode"},
		{"self.led_strip.set_single_color", "led_strip_set_single_color"},
		{"set-mode", "set-mode"},
		{"self..double..dot.", "double_dot"},
		{"self.灯.打开", "tool"},
		{"self.light.颜色", "light"},
		{"self.dim ålight", "dim_light"},
		{"self.", "tool"},
		{"", "tool"},
	} {
		assert.Equal(t, tc.want, toolPart(tc.tool), "toolPart(%q)", tc.tool)
	}
}

// names is a helper: assignNames for devices given as id → tools.
func names(t *testing.T, aliases map[string]string, devices map[string][]string) naming {
	t.Helper()
	var in []namingDevice
	for id, tools := range devices {
		in = append(in, namingDevice{DeviceID: id, Alias: aliases[id], Tools: tools})
	}
	n := assignNames(in)
	checkNaming(t, n)
	return n
}

// checkNaming asserts the invariants: every name is host-safe and unique
// (ignoring case), so it maps back to exactly one board tool.
func checkNaming(t *testing.T, n naming) {
	t.Helper()
	seen := map[string]toolRef{}
	for ref, name := range n.Names {
		require.True(t, ValidToolName(name), "%q is not host-safe", name)
		k := strings.ToLower(name)
		if other, dup := seen[k]; dup {
			t.Fatalf("%q names both %v and %v", name, other, ref)
		}
		seen[k] = ref
	}
}

func TestAssignNames(t *testing.T) {
	const a, b = "aa:bb:cc:dd:ee:01", "aa:bb:cc:dd:ee:02"
	long := "self." + strings.Repeat("very_long_component.", 5) + "action"

	for _, tc := range []struct {
		name    string
		aliases map[string]string
		devices map[string][]string
		want    map[toolRef]string
	}{
		{
			name:    "plain",
			devices: map[string][]string{a: {"self.audio_speaker.set_volume", "self.get_device_status"}},
			want: map[toolRef]string{
				{a, "self.audio_speaker.set_volume"}: "dev_ddee01_audio_speaker_set_volume",
				{a, "self.get_device_status"}:        "dev_ddee01_get_device_status",
			},
		},
		{
			name:    "configured aliases are sanitized",
			aliases: map[string]string{a: "Kitchen Speaker", b: "büro"},
			devices: map[string][]string{a: {"self.lamp.turn_on"}, b: {"self.lamp.turn_on"}},
			want: map[toolRef]string{
				{a, "self.lamp.turn_on"}: "Kitchen_Speaker_lamp_turn_on",
				{b, "self.lamp.turn_on"}: "b_ro_lamp_turn_on",
			},
		},
		{
			name:    "same alias on two boards: both get a hash of their MAC",
			aliases: map[string]string{a: "kitchen", b: "KITCHEN"},
			devices: map[string][]string{a: {"self.lamp.turn_on"}, b: {"self.lamp.turn_on"}},
			want: map[toolRef]string{
				{a, "self.lamp.turn_on"}: "kitchen_" + shortHash(a) + "_lamp_turn_on",
				{b, "self.lamp.turn_on"}: "KITCHEN_" + shortHash(b) + "_lamp_turn_on",
			},
		},
		{
			name:    "dot and underscore spellings clash: both get a hash",
			devices: map[string][]string{a: {"self.led.strip_on", "self.led_strip.on", "self.other"}},
			want: map[toolRef]string{
				{a, "self.led.strip_on"}: "dev_ddee01_led_strip_on_" + shortHash(a, "self.led.strip_on"),
				{a, "self.led_strip.on"}: "dev_ddee01_led_strip_on_" + shortHash(a, "self.led_strip.on"),
				{a, "self.other"}:        "dev_ddee01_other",
			},
		},
		{
			name:    "names differing only in case clash",
			devices: map[string][]string{a: {"self.AEC.mode", "self.aec.mode"}},
			want: map[toolRef]string{
				{a, "self.AEC.mode"}: "dev_ddee01_AEC_mode_" + shortHash(a, "self.AEC.mode"),
				{a, "self.aec.mode"}: "dev_ddee01_aec_mode_" + shortHash(a, "self.aec.mode"),
			},
		},
		{
			name:    "non-ASCII names",
			devices: map[string][]string{a: {"self.灯.打开", "self.灯.关闭", "self.状态"}},
			want: map[toolRef]string{
				{a, "self.灯.打开"}: "dev_ddee01_tool_" + shortHash(a, "self.灯.打开"),
				{a, "self.灯.关闭"}: "dev_ddee01_tool_" + shortHash(a, "self.灯.关闭"),
				{a, "self.状态"}:   "dev_ddee01_tool_" + shortHash(a, "self.状态"),
			},
		},
		{
			name:    "very long names are cut to 64 with a hash of the full name",
			devices: map[string][]string{a: {long, long + "2"}},
			want: map[toolRef]string{
				{a, long}:       withSuffix("dev_ddee01_"+toolPart(long), shortHash("dev_ddee01_"+toolPart(long)), 64),
				{a, long + "2"}: withSuffix("dev_ddee01_"+toolPart(long+"2"), shortHash("dev_ddee01_"+toolPart(long+"2")), 64),
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := names(t, tc.aliases, tc.devices)
			for ref, want := range tc.want {
				assert.Equal(t, want, n.Names[ref], "name of %v", ref)
				assert.LessOrEqual(t, len(n.Names[ref]), 64)
			}
		})
	}
}

func TestAssignNamesIsStable(t *testing.T) {
	devs := []namingDevice{
		{DeviceID: "aa:bb:cc:00:00:01", Tools: []string{"self.a.b", "self.a_b", "self.x"}},
		{DeviceID: "aa:bb:cc:00:00:02", Alias: "dup", Tools: []string{"self.x"}},
		{DeviceID: "aa:bb:cc:00:00:03", Alias: "DUP", Tools: []string{"self.x", "self.灯"}},
	}
	want := assignNames(devs)
	r := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		shuffled := append([]namingDevice(nil), devs...)
		r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		got := assignNames(shuffled)
		require.Equal(t, want, got, "naming must not depend on the order boards are listed in")
	}
}

// TestAssignNamesRandom throws awkward names at the naming and checks the
// invariants.
func TestAssignNamesRandom(t *testing.T) {
	alphabet := []rune("aA._-zZ09 .灯é🙂")
	r := rand.New(rand.NewPCG(3, 4))
	word := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteRune(alphabet[r.IntN(len(alphabet))])
		}
		return b.String()
	}
	for round := range 200 {
		var devs []namingDevice
		for d := range 1 + r.IntN(6) {
			nd := namingDevice{DeviceID: fmt.Sprintf("aa:bb:cc:dd:%02x:%02x", round%256, d)}
			if r.IntN(2) == 0 {
				nd.Alias = word(r.IntN(30))
			}
			for range r.IntN(12) {
				nd.Tools = append(nd.Tools, "self."+word(1+r.IntN(90)))
			}
			devs = append(devs, nd)
		}
		n := assignNames(devs)
		checkNaming(t, n)
	}
}

// TestCatalogRoundTrip checks that every published name maps back to the
// board and tool it came from, through the catalogue the server uses.
func TestCatalogRoundTrip(t *testing.T) {
	schema := json.RawMessage(`{"type":"object","properties":{}}`)
	mk := func(names ...string) []device.Tool {
		var out []device.Tool
		for _, n := range names {
			out = append(out, device.Tool{Name: n, InputSchema: schema})
		}
		return out
	}
	infos := []device.Info{
		{Identity: device.Identity{DeviceID: "aa:bb:cc:dd:ee:01", HasMCP: true}, State: device.StateReady, Board: "b1",
			Tools: mk("self.a.b", "self.a_b", "self.灯", "self.reboot")},
		{Identity: device.Identity{DeviceID: "aa:bb:cc:dd:ee:02", HasMCP: true}, State: device.StateReady, Board: "b2",
			Tools: mk("self.a.b")},
		{Identity: device.Identity{DeviceID: "aa:bb:cc:dd:ee:03", HasMCP: true}, State: device.StateInitializing},
	}
	c := buildCatalog(infos, nil, catalogOptions{aliases: MustAliases(map[string]string{"aa:bb:cc:dd:ee:02": "dev_ddee01"})})
	require.Len(t, c.byName, 5)
	for name, e := range c.byName {
		require.Equal(t, name, e.mcpTool.Name)
		v := c.byDevice[e.deviceID]
		require.NotNil(t, v)
		require.Same(t, e, v.findTool(e.tool.Name), "%s maps back to %s on %s", name, e.tool.Name, e.deviceID)
		require.Contains(t, e.mcpTool.Description, e.deviceID, "the description names the board")
	}
	require.Empty(t, c.byDevice["aa:bb:cc:dd:ee:03"].tools, "a board still initializing has no tools yet")

	// A reconnecting board keeps the tools it had.
	infos[1].State = device.StateInitializing
	c2 := buildCatalog(infos, map[string][]device.Tool{"aa:bb:cc:dd:ee:02": infos[1].Tools}, catalogOptions{})
	require.True(t, c2.byDevice["aa:bb:cc:dd:ee:02"].stale)
	require.Len(t, c2.byDevice["aa:bb:cc:dd:ee:02"].tools, 1)
}
