package mcpserver

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

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
	n := assignNames(in, nil)
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
			name:    "same alias on two boards joining together: the first to connect (then the lower id) keeps it",
			aliases: map[string]string{a: "kitchen", b: "KITCHEN"},
			devices: map[string][]string{a: {"self.lamp.turn_on"}, b: {"self.lamp.turn_on"}},
			want: map[toolRef]string{
				{a, "self.lamp.turn_on"}: "kitchen_lamp_turn_on",
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
	want := assignNames(devs, nil)
	r := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		shuffled := append([]namingDevice(nil), devs...)
		r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		got := assignNames(shuffled, nil)
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
		n := assignNames(devs, nil)
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

// history drives an aliasBook through joins and leaves, one sync at a
// time, as Server.sync does: the tools keep the names of the sync before.
type history struct {
	t        *testing.T
	book     *aliasBook
	reserved map[string]string
	present  map[string]namingDevice
	last     naming
	now      time.Time
	clock    time.Duration // ConnectedAt of the next board to join
}

func newHistory(t *testing.T, reserved map[string]string) *history {
	return &history{t: t, book: newAliasBook(), reserved: reserved, present: map[string]namingDevice{},
		now: time.Unix(1_000_000, 0)}
}

// join connects boards (with one tool each, "self.lamp.turn_on", unless
// they name theirs), one after the other; they are named at the next sync.
func (h *history) join(ds ...namingDevice) {
	for _, d := range ds {
		h.clock += time.Second
		if d.ConnectedAt.IsZero() {
			d.ConnectedAt = time.Unix(0, 0).Add(h.clock)
		}
		if d.Tools == nil {
			d.Tools = []string{"self.lamp.turn_on"}
		}
		h.present[d.DeviceID] = d
	}
}

func (h *history) leave(ids ...string) {
	for _, id := range ids {
		delete(h.present, id)
	}
}

// sync names the boards present and checks that no board present before
// changed its alias or its tools' names, and that every name is host-safe
// and unique.
func (h *history) sync() naming {
	h.t.Helper()
	var devs []namingDevice
	for _, d := range h.present {
		devs = append(devs, d)
	}
	n := h.book.name(devs, h.reserved, keptIn(h.last.Names), h.book.mark(), h.now)
	checkNaming(h.t, n)
	aliases := map[string]string{}
	for id, a := range n.Aliases {
		require.True(h.t, ValidToolName(a) && len(a) <= maxAliasLen, "alias %q", a)
		k := strings.ToLower(a)
		require.Empty(h.t, aliases[k], "alias %q on two boards", a)
		aliases[k] = id
		if was, ok := h.last.Aliases[id]; ok {
			require.Equal(h.t, was, a, "board %s changed its alias while connected", id)
		}
	}
	for ref, name := range n.Names {
		if was, ok := h.last.Names[ref]; ok {
			require.Equal(h.t, was, name, "tool %v changed its name while connected", ref)
		}
	}
	h.last = n
	return n
}

func (h *history) alias(id string) string { return h.last.Aliases[id] }

// Boards whose MACs end alike: all have the default alias dev_000001.
const (
	clashA = "02:00:00:00:00:01"
	clashB = "02:11:22:00:00:01"
	clashC = "02:33:44:00:00:01"
)

var (
	longA = "dev_000001_" + shortHash(clashA)
	longB = "dev_000001_" + shortHash(clashB)
	longC = "dev_000001_" + shortHash(clashC)
)

// TestNamesNeverChangeWhileConnected: a board keeps its alias and its
// tools' names while it is connected, whoever joins or leaves; a newcomer
// whose alias would clash gets the one moved aside.
func TestNamesNeverChangeWhileConnected(t *testing.T) {
	h := newHistory(t, nil)
	h.join(namingDevice{DeviceID: clashA})
	h.sync()
	assert.Equal(t, "dev_000001", h.alias(clashA))

	h.join(namingDevice{DeviceID: clashB})
	n := h.sync()
	assert.Equal(t, "dev_000001", h.alias(clashA), "the board connected keeps its alias")
	assert.Equal(t, longB, h.alias(clashB), "the newcomer gets the one moved aside")
	assert.Equal(t, "dev_000001_lamp_turn_on", n.Names[toolRef{clashA, "self.lamp.turn_on"}])
	assert.Equal(t, longB+"_lamp_turn_on", n.Names[toolRef{clashB, "self.lamp.turn_on"}])

	// The first leaves: the second keeps its long alias though the short
	// one is free now.
	h.leave(clashA)
	h.sync()
	assert.Equal(t, longB, h.alias(clashB))

	// The first comes back: it gets its alias back.
	h.join(namingDevice{DeviceID: clashA})
	h.sync()
	assert.Equal(t, "dev_000001", h.alias(clashA))

	// A board that changes its tools keeps the names of the tools it kept.
	d := h.present[clashA]
	d.Tools = []string{"self.lamp.turn_on", "self.lamp.turn_off"}
	h.present[clashA] = d
	n = h.sync()
	assert.Equal(t, "dev_000001_lamp_turn_off", n.Names[toolRef{clashA, "self.lamp.turn_off"}])
}

// TestNamesAfterLeaving: the alias of a board that left is kept for it for
// the TTL (a newcomer does not take it meanwhile, so a host's call by the
// old name never reaches another board); after that it is free, and the
// board that comes back gets the long one if another holds the short one.
func TestNamesAfterLeaving(t *testing.T) {
	h := newHistory(t, nil)
	h.join(namingDevice{DeviceID: clashA})
	h.sync()
	h.leave(clashA)
	h.sync()

	// Within the TTL: B does not take A's alias.
	h.now = h.now.Add(recentAliasTTL / 2)
	h.join(namingDevice{DeviceID: clashB})
	h.sync()
	assert.Equal(t, longB, h.alias(clashB))
	// A is back after a blip: it keeps its name.
	h.join(namingDevice{DeviceID: clashA})
	h.sync()
	assert.Equal(t, "dev_000001", h.alias(clashA))

	// B blips while A is away: the short alias is free, but B keeps its
	// long one.
	h.leave(clashA)
	h.sync()
	h.leave(clashB)
	h.sync()
	h.join(namingDevice{DeviceID: clashB})
	h.sync()
	assert.Equal(t, longB, h.alias(clashB), "a board back after a blip keeps its name when nobody took it")

	// Past the TTL, C takes the short alias; A, back, gets its long one.
	h.now = h.now.Add(recentAliasTTL + time.Second)
	h.join(namingDevice{DeviceID: clashC})
	h.sync()
	assert.Equal(t, "dev_000001", h.alias(clashC))
	h.join(namingDevice{DeviceID: clashA})
	h.sync()
	assert.Equal(t, longA, h.alias(clashA), "the first board back while another holds its alias gets the long one")

	// A board that left more than the TTL ago comes back as a newcomer.
	h.leave(clashB)
	h.sync()
	h.now = h.now.Add(recentAliasTTL + time.Second)
	_, ok := h.book.lookup(clashB, h.now)
	assert.False(t, ok)
}

// TestNamesJoiningTogether: boards that join in the same sync are named in
// the order they connected, then by id.
func TestNamesJoiningTogether(t *testing.T) {
	h := newHistory(t, nil)
	h.join(namingDevice{DeviceID: clashC}, namingDevice{DeviceID: clashB}, namingDevice{DeviceID: clashA})
	h.sync()
	assert.Equal(t, "dev_000001", h.alias(clashC))
	assert.Equal(t, longB, h.alias(clashB))
	assert.Equal(t, longA, h.alias(clashA))

	at := time.Unix(5, 0)
	n := assignNames([]namingDevice{{DeviceID: clashC, ConnectedAt: at}, {DeviceID: clashB, ConnectedAt: at}}, nil)
	assert.Equal(t, "dev_000001", n.Aliases[clashB], "same time: the lower id first")
	assert.Equal(t, longC, n.Aliases[clashC])
}

// TestNamesOperatorAlias: an operator's alias is its board's, connected or
// not, whenever it joins; a default alias equal to it is moved aside.
func TestNamesOperatorAlias(t *testing.T) {
	reserved := map[string]string{"dev_000001": clashC}
	h := newHistory(t, reserved)
	h.join(namingDevice{DeviceID: clashA})
	h.sync()
	assert.Equal(t, longA, h.alias(clashA), "the operator gave dev_000001 to another board")
	h.join(namingDevice{DeviceID: clashC, Alias: "dev_000001"})
	h.sync()
	assert.Equal(t, "dev_000001", h.alias(clashC))

	// The operator's alias wins over the memory of a board that left.
	h = newHistory(t, map[string]string{"kitchen": clashC})
	h.join(namingDevice{DeviceID: "kitchen"}) // an id a board chose
	h.sync()
	assert.Equal(t, "kitchen_"+shortHash("kitchen"), h.alias("kitchen"))
	h.join(namingDevice{DeviceID: clashC, Alias: "kitchen"})
	h.sync()
	assert.Equal(t, "kitchen", h.alias(clashC))
}

// TestNamesFleet: a board another node holds gets the alias its holder
// publishes, when it is free here, so that the fleet shows one name; one
// that is not (two nodes named two boards at once) is named here by the
// usual rule, and no board here changes its name for it.
func TestNamesFleet(t *testing.T) {
	// A node that starts late sees B holding the short alias and A the
	// long one, although A connected first: the holders' choice stands.
	n := assignNames([]namingDevice{
		{DeviceID: clashA, Holder: longA, ConnectedAt: time.Unix(1, 0)},
		{DeviceID: clashB, Holder: "dev_000001", ConnectedAt: time.Unix(2, 0)},
		{DeviceID: clashC, ConnectedAt: time.Unix(0, 0)}, // this node's own, just connected
	}, nil)
	assert.Equal(t, longA, n.Aliases[clashA])
	assert.Equal(t, "dev_000001", n.Aliases[clashB])
	assert.Equal(t, longC, n.Aliases[clashC])

	// A race: this node gave A the short alias; B's holder gave B the same.
	h := newHistory(t, nil)
	h.join(namingDevice{DeviceID: clashA})
	h.sync()
	h.join(namingDevice{DeviceID: clashB, Holder: "dev_000001"})
	h.sync()
	assert.Equal(t, "dev_000001", h.alias(clashA))
	assert.Equal(t, longB, h.alias(clashB))

	// What a holder publishes is made host-safe, and an operator's alias
	// here is not given away.
	n = assignNames([]namingDevice{
		{DeviceID: clashA, Holder: "../Kitchen sink!" + strings.Repeat("x", 40)},
		{DeviceID: clashB, Holder: "office"},
	}, map[string]string{"office": clashC})
	assert.Equal(t, "Kitchen_sink_xxxxxxxxxxx", n.Aliases[clashA])
	assert.Equal(t, "dev_000001", n.Aliases[clashB], "not the operator's office: its own")
}

// TestNamesToolClash: a newcomer whose tool name would be that of a tool
// already published (another board's alias and tool that read alike)
// gets the hashed name; the tool published keeps its own.
func TestNamesToolClash(t *testing.T) {
	const a, b = "02:00:00:00:00:0a", "02:00:00:00:00:0b"
	for _, order := range [][2]string{{a, b}, {b, a}} {
		h := newHistory(t, map[string]string{"kitchen": a, "kitchen_lamp": b})
		alias := map[string]string{a: "kitchen", b: "kitchen_lamp"}
		tool := map[string]string{a: "self.lamp.on", b: "self.on"}
		for _, id := range order {
			h.join(namingDevice{DeviceID: id, Alias: alias[id], Tools: []string{tool[id]}})
			h.sync()
		}
		first, second := order[0], order[1]
		assert.Equal(t, "kitchen_lamp_on", h.last.Names[toolRef{first, tool[first]}])
		assert.Equal(t, "kitchen_lamp_on_"+shortHash(second, tool[second]), h.last.Names[toolRef{second, tool[second]}])
	}
}

// TestNamesHoldBeforeSync: a board named before any sync saw it (the
// control API or the fleet asked for its alias) keeps that alias; a sync
// that read the Hub before the board was named does not release it.
func TestNamesHoldBeforeSync(t *testing.T) {
	b := newAliasBook()
	now := time.Unix(100, 0)
	b.name([]namingDevice{{DeviceID: clashA}}, nil, nil, b.mark(), now)
	mark := b.mark()                                                         // a sync reads the Hub...
	assert.Equal(t, longB, b.hold(namingDevice{DeviceID: clashB}, nil, now)) // ...B connects, is named...
	n := b.name([]namingDevice{{DeviceID: clashA}}, nil, nil, mark, now)     // ...the sync did not see B
	assert.NotContains(t, n.Aliases, clashB)
	a, ok := b.lookup(clashB, now)
	assert.True(t, ok)
	assert.Equal(t, longB, a, "still held")
	n = b.name([]namingDevice{{DeviceID: clashA}, {DeviceID: clashB}}, nil, nil, b.mark(), now)
	assert.Equal(t, longB, n.Aliases[clashB])
	// A board named by hold that is gone at the next sync is released.
	assert.Equal(t, longC, b.hold(namingDevice{DeviceID: clashC}, nil, now))
	b.name([]namingDevice{{DeviceID: clashA}, {DeviceID: clashB}}, nil, nil, b.mark(), now)
	_, held := b.held[clashC]
	assert.False(t, held)
}

// TestNamesMemoryIsBounded: the book remembers at most max boards that
// left, forgetting the oldest first.
func TestNamesMemoryIsBounded(t *testing.T) {
	b := newAliasBook()
	b.max = 64
	now := time.Unix(100, 0)
	for i := range 1000 {
		id := fmt.Sprintf("02:00:00:00:%02x:%02x", i/256, i%256)
		b.name([]namingDevice{{DeviceID: id}}, nil, nil, b.mark(), now)
		now = now.Add(time.Second)
	}
	b.name(nil, nil, nil, b.mark(), now)
	assert.LessOrEqual(t, len(b.recent), b.max)
	assert.Equal(t, len(b.recent), len(b.recentOwner))
	assert.Empty(t, b.held)
	_, ok := b.lookup("02:00:00:00:03:e7", now)
	assert.True(t, ok, "the last to leave is remembered")
	_, ok = b.lookup("02:00:00:00:00:00", now)
	assert.False(t, ok, "the first is forgotten")
}

// TestNamesRandomHistory joins and leaves boards at random, with clashing
// default aliases, operator aliases and holders' aliases; history.sync
// checks at every step that no board present changes a name and that all
// names are host-safe and unique.
func TestNamesRandomHistory(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	ids := make([]string, 24)
	for i := range ids {
		ids[i] = fmt.Sprintf("02:%02x:00:00:00:%02x", i, i%3) // three default aliases
	}
	ids = append(ids, "kitchen", "dev_000001", "dev_000001_"+shortHash(ids[0]))
	reserved := map[string]string{"kitchen": ids[5], "dev_000002": ids[6]}
	for round := range 50 {
		h := newHistory(t, reserved)
		h.book.ttl = time.Duration(r.IntN(3)) * time.Minute
		h.book.max = 1 + r.IntN(8)
		for range 60 {
			id := ids[r.IntN(len(ids))]
			if _, ok := h.present[id]; ok && r.IntN(2) == 0 {
				h.leave(id)
			} else if !ok {
				d := namingDevice{DeviceID: id, Alias: map[string]string{ids[5]: "kitchen", ids[6]: "dev_000002"}[id]}
				if r.IntN(4) == 0 {
					d.Holder = []string{"dev_000001", "kitchen", "dev_000000", "x"}[r.IntN(4)]
				}
				for range r.IntN(4) {
					d.Tools = append(d.Tools, []string{"self.lamp.on", "self.lamp_on", "self.x", "self.LAMP.on"}[r.IntN(4)])
				}
				if d.Tools == nil {
					d.Tools = []string{}
				}
				h.join(d)
			}
			if r.IntN(3) == 0 {
				h.now = h.now.Add(time.Duration(r.IntN(90)) * time.Second)
			}
			if r.IntN(2) == 0 {
				h.sync()
			}
		}
		h.sync()
		require.LessOrEqual(t, len(h.book.recent), h.book.max, "round %d", round)
	}
}

// TestNamesBare: a board the operator gave an empty alias publishes its
// tools without a prefix, and still gets its default alias for everything
// else. A bare name that would clash with one already published (another
// bare board's, or a prefixed one that reads alike) goes to the newcomer
// with a hash; the board published keeps its own, and a bare board's
// names never change while it is connected. A bare board that gets a
// prefix (or loses it) gets fresh names.
func TestNamesBare(t *testing.T) {
	const a, b, c = "02:00:00:00:00:0a", "02:00:00:00:00:0b", "02:00:00:00:00:0c"
	h := newHistory(t, nil)
	h.join(namingDevice{DeviceID: a, Bare: true, Tools: []string{"self.get_device_status", "self.lamp.on"}})
	h.sync()
	assert.Equal(t, "dev_00000a", h.alias(a), "the board keeps a name of its own")
	assert.Equal(t, "get_device_status", h.last.Names[toolRef{a, "self.get_device_status"}])
	assert.Equal(t, "lamp_on", h.last.Names[toolRef{a, "self.lamp.on"}])

	// Another bare board with the same tool: the newcomer's is hashed.
	h.join(namingDevice{DeviceID: b, Bare: true, Tools: []string{"self.get_device_status"}})
	h.sync()
	assert.Equal(t, "get_device_status", h.last.Names[toolRef{a, "self.get_device_status"}])
	assert.Equal(t, "get_device_status_"+shortHash(b, "self.get_device_status"), h.last.Names[toolRef{b, "self.get_device_status"}])

	// A prefixed board whose name reads like a bare one: the newcomer's is hashed.
	h.join(namingDevice{DeviceID: c, Alias: "lamp", Tools: []string{"self.on"}})
	h.sync()
	assert.Equal(t, "lamp_on_"+shortHash(c, "self.on"), h.last.Names[toolRef{c, "self.on"}])

	// The first board leaves and comes back with a new tool; b keeps its
	// hashed name all along.
	h.leave(a)
	h.sync()
	assert.Equal(t, "get_device_status_"+shortHash(b, "self.get_device_status"), h.last.Names[toolRef{b, "self.get_device_status"}])
	h.join(namingDevice{DeviceID: a, Bare: true, Tools: []string{"self.get_device_status", "self.lamp.on", "self.new"}})
	h.sync()
	assert.Equal(t, "get_device_status", h.last.Names[toolRef{a, "self.get_device_status"}],
		"b kept its hashed name, so a gets its own back")
	assert.Equal(t, "new", h.last.Names[toolRef{a, "self.new"}])

	// A long tool name is cut and hashed as with a prefix; its name is
	// kept across syncs.
	long := "self." + strings.Repeat("x", 80)
	h.join(namingDevice{DeviceID: b, Bare: true, Tools: []string{"self.get_device_status", long}})
	h.sync()
	n := h.last.Names[toolRef{b, long}]
	assert.Len(t, n, MaxNameLen)
	h.sync()
	assert.Equal(t, n, h.last.Names[toolRef{b, long}])

	// A prefix given or taken away renames the board's tools.
	assert.False(t, keptUnder("dev_00000a_lamp_on", "", "lamp_on"))
	assert.False(t, keptUnder("lamp_on", "dev_00000a", "dev_00000a_lamp_on"))
	assert.True(t, keptUnder("lamp_on_"+shortHash(a, "x"), "", "lamp_on"))
}

// TestParseAliasesBare: an empty alias is a bare board; it names no board
// and takes no name.
func TestParseAliasesBare(t *testing.T) {
	a, err := ParseAliases(map[string]string{"02-00-00-00-00-01": "", "02:00:00:00:00:02": "kitchen"})
	require.NoError(t, err)
	assert.True(t, a.Bare("02:00:00:00:00:01"))
	assert.False(t, a.Bare("02:00:00:00:00:02"))
	_, ok := a.Of("02:00:00:00:00:01")
	assert.False(t, ok)
	_, ok = a.Named("")
	assert.False(t, ok)
	assert.Equal(t, "dev_000001", a.Alias("02:00:00:00:00:01"))
	_, err = ParseAliases(map[string]string{"02:00:00:00:00:01": "", "02-00-00-00-00-01": "x"})
	assert.ErrorContains(t, err, "same board")
}
