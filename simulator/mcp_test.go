package simulator

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMCPSilentDrops(t *testing.T) {
	h := newHarness(t, Config{})
	cases := map[string]string{
		"wrong jsonrpc version":         `{"jsonrpc":"1.0","id":1,"method":"tools/list"}`,
		"jsonrpc missing":               `{"id":1,"method":"tools/list"}`,
		"jsonrpc as number":             `{"jsonrpc":2.0,"id":1,"method":"tools/list"}`,
		"method missing (a response)":   `{"jsonrpc":"2.0","id":1,"result":{}}`,
		"method not a string":           `{"jsonrpc":"2.0","id":1,"method":5}`,
		"notification without id":       `{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		"notification with id":          `{"jsonrpc":"2.0","id":3,"method":"notifications/cancelled","params":{}}`,
		"notifications prefix only":     `{"jsonrpc":"2.0","id":3,"method":"notificationsfoo"}`,
		"params array on tools/call":    `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":[]}`,
		"params string":                 `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":"x"}`,
		"params null":                   `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":null}`,
		"params checked before id":      `{"jsonrpc":"2.0","method":"ping","params":1}`,
		"string id":                     `{"jsonrpc":"2.0","id":"1","method":"tools/list"}`,
		"null id":                       `{"jsonrpc":"2.0","id":null,"method":"tools/list"}`,
		"missing id":                    `{"jsonrpc":"2.0","method":"tools/list"}`,
		"bool id":                       `{"jsonrpc":"2.0","id":true,"method":"ping"}`,
		"jsonrpc with trailing garbage": `{"jsonrpc":"2.0x","id":1,"method":"ping"}`,
	}
	for _, payload := range cases {
		h.requireNoReply(payload)
	}
	assert.EqualValues(t, len(cases), h.b.Stats().MCPDropped)
}

func TestMCPEnvelopeIgnored(t *testing.T) {
	h := newHarness(t, Config{})
	for _, msg := range []string{
		`{"type":"mcp","payload":"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}"}`, // string payload
		`{"type":"mcp"}`,
		`{"type":"mcp","payload":[1]}`,
		`{"payload":{"jsonrpc":"2.0","id":1,"method":"ping"}}`, // no type
		`{"type":5,"payload":{"jsonrpc":"2.0","id":1,"method":"ping"}}`,
		`{"type":"MCP","payload":{"jsonrpc":"2.0","id":1,"method":"ping"}}`, // type values are case-sensitive
		`{"type":"goodbye"}`,                                                // MQTT only
		`{"type":"iot","commands":[]}`,
		`not json`,
		`[]`,
		``,
	} {
		h.deliver(msg)
	}
	h.requireNoReply(`{"jsonrpc":"2.0","method":"notifications/x"}`)
	assert.EqualValues(t, 11, h.b.Stats().Ignored)
}

func TestMCPIDEcho(t *testing.T) {
	h := newHarness(t, Config{})
	for raw, echoed := range map[string]string{
		"1":           "1",
		"7.9":         "7",
		"-7.9":        "-7",
		"-0.5":        "0",
		"1e3":         "1000",
		"-5":          "-5",
		"3000000000":  "2147483647",
		"-3000000000": "-2147483648",
		"1e400":       "2147483647",
	} {
		got := h.call(`{"jsonrpc":"2.0","id":` + raw + `,"method":"ping"}`)
		assert.Equal(t, `{"jsonrpc":"2.0","id":`+echoed+`,"error":{"message":"Method not implemented: ping"}}`, got, "id %s", raw)
	}
}

func TestMCPCJSONQuirks(t *testing.T) {
	h := newHarness(t, Config{})
	// Keys match regardless of case; values do not.
	assert.Equal(t, `{"jsonrpc":"2.0","id":5,"error":{"message":"Method not implemented: PING"}}`,
		h.call(`{"JSONRPC":"2.0","Id":5,"METHOD":"PING"}`))
	// The first of two duplicate keys wins.
	assert.Equal(t, `{"jsonrpc":"2.0","id":1,"error":{"message":"Method not implemented: ping"}}`,
		h.call(`{"jsonrpc":"2.0","id":1,"id":2,"method":"ping","method":"tools/list"}`))
	// Bytes after the JSON value are ignored, at both levels.
	h.deliver(`{"type":"mcp","payload":{"jsonrpc":"2.0","id":3,"method":"ping"}} trailing {junk`)
	assert.Equal(t, `{"jsonrpc":"2.0","id":3,"error":{"message":"Method not implemented: ping"}}`, h.nextPayload())
	// Other unknown methods are treated like ping.
	assert.Equal(t, `{"jsonrpc":"2.0","id":4,"error":{"message":"Method not implemented: resources/list"}}`,
		h.call(`{"jsonrpc":"2.0","id":4,"method":"resources/list"}`))
}

func TestMCPInitialize(t *testing.T) {
	h := newHarness(t, Config{})
	want := `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"bread-compact-wifi","version":"2.4.2"}}}`
	assert.Equal(t, want, h.call(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"vision":{"url":"http://vision.local/explain","token":"vt"}},"clientInfo":{"name":"x"}}}`))
	url, token := h.b.Vision()
	assert.Equal(t, "http://vision.local/explain", url)
	assert.Equal(t, "vt", token)

	// No params at all is fine; the vision endpoint stays.
	assert.Equal(t, strings.Replace(want, `"id":1`, `"id":2`, 1), h.call(`{"jsonrpc":"2.0","id":2,"method":"initialize"}`))
	url, _ = h.b.Vision()
	assert.Equal(t, "http://vision.local/explain", url)

	// A new url without a token resets the token.
	h.call(`{"jsonrpc":"2.0","id":3,"method":"initialize","params":{"capabilities":{"vision":{"url":"http://other/"}}}}`)
	url, token = h.b.Vision()
	assert.Equal(t, "http://other/", url)
	assert.Empty(t, token)
}

// breadboardSchemas are the expected inputSchema (and annotations) of each
// breadboard tool, in registration order, as the firmware renders them.
var breadboardSchemas = []struct{ name, rest string }{
	{"self.get_device_status", `"inputSchema":{"type":"object","properties":{}}`},
	{"self.audio_speaker.set_volume", `"inputSchema":{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}`},
	{"self.screen.set_theme", `"inputSchema":{"type":"object","properties":{"theme":{"type":"string"}},"required":["theme"]}`},
	{"self.lamp.get_state", `"inputSchema":{"type":"object","properties":{}}`},
	{"self.lamp.turn_on", `"inputSchema":{"type":"object","properties":{}}`},
	{"self.lamp.turn_off", `"inputSchema":{"type":"object","properties":{}}`},
	{"self.get_system_info", `"inputSchema":{"type":"object","properties":{}},"annotations":{"audience":["user"]}`},
	{"self.reboot", `"inputSchema":{"type":"object","properties":{}},"annotations":{"audience":["user"]}`},
	{"self.upgrade_firmware", `"inputSchema":{"type":"object","properties":{"url":{"type":"string","default":"The URL of the firmware binary file to download and install"}}},"annotations":{"audience":["user"]}`},
	{"self.screen.get_info", `"inputSchema":{"type":"object","properties":{}},"annotations":{"audience":["user"]}`},
	{"self.screen.snapshot", `"inputSchema":{"type":"object","properties":{"url":{"type":"string"},"quality":{"type":"integer","default":80,"minimum":1,"maximum":100}},"required":["url"]},"annotations":{"audience":["user"]}`},
	{"self.screen.preview_image", `"inputSchema":{"type":"object","properties":{"url":{"type":"string"}},"required":["url"]},"annotations":{"audience":["user"]}`},
	{"self.assets.set_download_url", `"inputSchema":{"type":"object","properties":{"url":{"type":"string"}},"required":["url"]},"annotations":{"audience":["user"]}`},
}

// quoteJSON encodes s like cJSON does for plain text (no HTML escaping).
func quoteJSON(t *testing.T, s string) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	require.NoError(t, enc.Encode(s))
	return strings.TrimSuffix(buf.String(), "\n")
}

func TestMCPToolsListBreadboard(t *testing.T) {
	p := mustProfile(t, "breadboard")
	h := newHarness(t, Config{Profile: p})
	require.Len(t, p.Tools, len(breadboardSchemas))

	var all []string
	for i, s := range breadboardSchemas {
		require.Equal(t, s.name, p.Tools[i].Name)
		all = append(all, `{"name":"`+s.name+`","description":`+quoteJSON(t, p.Tools[i].Description)+`,`+s.rest+`}`)
	}
	visible := `{"tools":[` + strings.Join(all[:6], ",") + `]}`
	full := `{"tools":[` + strings.Join(all, ",") + `]}`

	reply := func(id, params string) string {
		return h.call(`{"jsonrpc":"2.0","id":` + id + `,"method":"tools/list"` + params + `}`)
	}
	result := func(id, res string) string { return `{"jsonrpc":"2.0","id":` + id + `,"result":` + res + `}` }

	assert.Equal(t, result("1", visible), reply("1", ``))
	assert.Equal(t, result("2", visible), reply("2", `,"params":{}`))
	assert.Equal(t, result("3", full), reply("3", `,"params":{"withUserTools":true}`))
	// Only a JSON true counts.
	assert.Equal(t, result("4", visible), reply("4", `,"params":{"withUserTools":1}`))
	assert.Equal(t, result("5", visible), reply("5", `,"params":{"withUserTools":"true"}`))
	assert.Equal(t, result("6", visible), reply("6", `,"params":{"withUserTools":false}`))
	// A non-string cursor is ignored.
	assert.Equal(t, result("7", visible), reply("7", `,"params":{"cursor":5}`))
	// The cursor is inclusive.
	assert.Equal(t, result("8", `{"tools":[`+strings.Join(all[3:6], ",")+`]}`), reply("8", `,"params":{"cursor":"self.lamp.get_state"}`))
	assert.Equal(t, result("9", `{"tools":[`+strings.Join(all[8:], ",")+`]}`), reply("9", `,"params":{"cursor":"self.upgrade_firmware","withUserTools":true}`))

	// An unknown cursor, or one where nothing visible follows, fails with
	// an empty tool name: two spaces.
	twoSpaces := `{"jsonrpc":"2.0","id":34,"error":{"message":"Failed to add tool  because of payload size limit"}}`
	assert.Equal(t, twoSpaces, reply("34", `,"params":{"cursor":"self.nope"}`))
	assert.Equal(t, twoSpaces, reply("34", `,"params":{"cursor":"self.reboot"}`))

	// The whole reply is valid JSON and under the page budget.
	var parsed struct {
		Result struct {
			Tools      []json.RawMessage `json:"tools"`
			NextCursor *string           `json:"nextCursor"`
		} `json:"result"`
	}
	require.NoError(t, json.Unmarshal([]byte(result("3", full)), &parsed))
	assert.Len(t, parsed.Result.Tools, 13)
	assert.Nil(t, parsed.Result.NextCursor)
	assert.Less(t, len(full), toolsPageLimit)
}

// listPage is one decoded tools/list result.
type listPage struct {
	raw   string
	names []string
	next  string
}

func (h *harness) listPage(id int, cursor string, withUser bool) listPage {
	h.t.Helper()
	params := map[string]any{}
	if cursor != "" {
		params["cursor"] = cursor
	}
	if withUser {
		params["withUserTools"] = true
	}
	req, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": params})
	require.NoError(h.t, err)
	reply := h.call(string(req))
	var msg struct {
		Result json.RawMessage `json:"result"`
	}
	require.NoError(h.t, json.Unmarshal([]byte(reply), &msg), reply)
	var res struct {
		Tools []struct {
			Name string `json:"name"`
		} `json:"tools"`
		NextCursor string `json:"nextCursor"`
	}
	require.NoError(h.t, json.Unmarshal(msg.Result, &res))
	pg := listPage{raw: string(msg.Result), next: res.NextCursor}
	for _, tl := range res.Tools {
		pg.names = append(pg.names, tl.Name)
	}
	return pg
}

func TestMCPToolsListPaging(t *testing.T) {
	p := mustProfile(t, "catalog")
	h := newHarness(t, Config{Profile: p})

	for _, withUser := range []bool{false, true} {
		var want []string
		for _, tl := range p.Tools {
			if withUser || !tl.UserOnly {
				want = append(want, tl.Name)
			}
		}
		var got []string
		var pages []listPage
		cursor := ""
		for i := 0; ; i++ {
			require.Less(t, i, 50, "paging does not end")
			pg := h.listPage(100+i, cursor, withUser)
			require.NotEmpty(t, pg.names)
			if cursor != "" {
				assert.Equal(t, cursor, pg.names[0], "the cursor tool starts the next page")
			}
			assert.Less(t, len(pg.raw), toolsPageLimit, "page %d is over budget", i)
			pages = append(pages, pg)
			got = append(got, pg.names...)
			if pg.next == "" {
				break
			}
			// The page is full: the cursor tool would not have fitted.
			idx := toolIndex(p, pg.next)
			toolsPart := len(pg.raw) - len(`,"nextCursor":"`+pg.next+`"}`) - 1 // without "]"
			assert.Greater(t, toolsPart+1+len(h.b.tools[idx].json)+1+toolsPageMargin, toolsPageLimit)
			cursor = pg.next
		}
		assert.GreaterOrEqual(t, len(pages), 3, "the catalog must need at least three pages")
		assert.Equal(t, want, got, "pages together list every tool once, in order")
	}
}

func toolIndex(p *Profile, name string) int {
	for i, tl := range p.Tools {
		if tl.Name == name {
			return i
		}
	}
	return -1
}

func TestMCPToolsListEdgeCases(t *testing.T) {
	t.Run("no tools", func(t *testing.T) {
		h := newHarness(t, Config{Profile: mustParseProfile(t, "board: empty-board\n")})
		assert.Equal(t, `{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}`, h.call(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	})
	t.Run("only hidden tools", func(t *testing.T) {
		h := newHarness(t, Config{Profile: mustParseProfile(t, "board: b\ntools:\n  - {name: self.x, user_only: true, behavior: reboot}\n")})
		assert.Equal(t, `{"jsonrpc":"2.0","id":1,"error":{"message":"Failed to add tool  because of payload size limit"}}`,
			h.call(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	})
	t.Run("oversized tool", func(t *testing.T) {
		big := strings.Repeat("x", toolsPageLimit)
		h := newHarness(t, Config{Profile: mustParseProfile(t, "board: b\ntools:\n  - {name: self.big, description: "+big+", behavior: set}\n  - {name: self.small, behavior: set}\n")})
		assert.Equal(t, `{"jsonrpc":"2.0","id":1,"error":{"message":"Failed to add tool self.big because of payload size limit"}}`,
			h.call(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		assert.Equal(t, `{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"self.small","description":"","inputSchema":{"type":"object","properties":{}}}]}}`,
			h.call(`{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"cursor":"self.small"}}`))
	})
}

// textResult is the success reply of a call returning text.
func textResult(t *testing.T, id, text string) string {
	return `{"jsonrpc":"2.0","id":` + id + `,"result":{"content":[{"type":"text","text":` + quoteJSON(t, text) + `}],"isError":false}}`
}

func errorReply(id, msg string) string {
	return `{"jsonrpc":"2.0","id":` + id + `,"error":{"message":"` + msg + `"}}`
}

func call(name, args string) string {
	s := `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"` + name + `"`
	if args != "" {
		s += `,"arguments":` + args
	}
	return s + `}}`
}

func TestMCPToolsCall(t *testing.T) {
	robot := mustProfile(t, "robot")
	cases := []struct {
		name    string
		profile *Profile
		payload string
		want    string
	}{
		{"success", nil, call("self.audio_speaker.set_volume", `{"volume":35}`), textResult(t, "9", "true")},
		{"truncated integer", nil, call("self.audio_speaker.set_volume", `{"volume":100.9}`), textResult(t, "9", "true")},
		{"extra arguments ignored", nil, call("self.audio_speaker.set_volume", `{"volume":1,"loud":true}`), textResult(t, "9", "true")},
		{"missing argument", nil, call("self.audio_speaker.set_volume", `{}`), errorReply("9", "Missing valid argument: volume")},
		{"arguments omitted", nil, call("self.audio_speaker.set_volume", ``), errorReply("9", "Missing valid argument: volume")},
		{"wrong type without default", nil, call("self.audio_speaker.set_volume", `{"volume":"35"}`), errorReply("9", "Missing valid argument: volume")},
		{"above maximum", nil, call("self.audio_speaker.set_volume", `{"volume":101}`), errorReply("9", "Value exceeds maximum allowed: 100")},
		{"below minimum", nil, call("self.audio_speaker.set_volume", `{"volume":-1}`), errorReply("9", "Value is below minimum allowed: 0")},
		{"huge value clamps then fails range", nil, call("self.audio_speaker.set_volume", `{"volume":1e12}`), errorReply("9", "Value exceeds maximum allowed: 100")},
		{"key case ignored", nil, call("self.audio_speaker.set_volume", `{"VOLUME":5}`), textResult(t, "9", "true")},
		{"unknown tool", nil, call("self.nope", `{}`), errorReply("9", "Unknown tool: self.nope")},
		{"arguments array", nil, call("self.lamp.turn_on", `[]`), errorReply("9", "Invalid arguments")},
		{"arguments string", nil, call("self.lamp.turn_on", `"x"`), errorReply("9", "Invalid arguments")},
		{"arguments null", nil, call("self.lamp.turn_on", `null`), errorReply("9", "Invalid arguments")},
		{"params missing", nil, `{"jsonrpc":"2.0","id":9,"method":"tools/call"}`, errorReply("9", "Missing params")},
		{"name missing", nil, `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{}}`, errorReply("9", "Missing name")},
		{"name not a string", nil, `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":1}}`, errorReply("9", "Missing name")},
		{"name checked before arguments", nil, `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"arguments":[]}}`, errorReply("9", "Missing name")},
		{"user-only tool is callable", nil, call("self.screen.get_info", ``), textResult(t, "9", `{"width":128,"height":32,"monochrome":true}`)},
		{"lamp state text", nil, call("self.lamp.get_state", ``), textResult(t, "9", `{"power": false}`)},
		{"unknown theme is false", nil, call("self.screen.set_theme", `{"theme":"neon"}`), textResult(t, "9", "false")},
		{"default used when absent", nil, call("self.screen.snapshot", `{"url":"http://x/"}`), textResult(t, "9", "true")},
		{"default used on wrong type", robot, call("self.otto.walk", `{"steps":"5"}`), textResult(t, "9", "true")},
		{"range on a defaulted property", robot, call("self.otto.walk", `{"direction":2}`), errorReply("9", "Value exceeds maximum allowed: 1")},
		{"first failing property reported", robot, call("self.otto.set_trim", `{"trim":99}`), errorReply("9", "Missing valid argument: servo")},
		{"range after earlier property", robot, call("self.otto.set_trim", `{"servo":"left_leg","trim":-51}`), errorReply("9", "Value is below minimum allowed: -50")},
		{"number is not a boolean", robot, call("self.otto.hands_up", `{"both":1}`), errorReply("9", "Missing valid argument: both")},
		{"boolean accepted", robot, call("self.otto.hands_up", `{"both":false}`), textResult(t, "9", "true")},
		{"battery", robot, call("self.battery.get_level", ``), textResult(t, "9", `{"level":76,"charging":false}`)},
		{"const", robot, call("self.otto.stop", ``), textResult(t, "9", "true")},
		{"get", robot, call("self.otto.get_status", ``), textResult(t, "9", "standing")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Config{Profile: tc.profile})
			assert.Equal(t, tc.want, h.call(tc.payload))
		})
	}
}

func TestMCPUnescapedErrorIsInvalidJSON(t *testing.T) {
	h := newHarness(t, Config{})
	got := h.call(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"self.nope\"x"}}`)
	assert.Equal(t, `{"jsonrpc":"2.0","id":9,"error":{"message":"Unknown tool: self.nope"x"}}`, got)
	assert.False(t, json.Valid([]byte(got)), "real boards send invalid JSON here")
}

func TestMCPStateAcrossCalls(t *testing.T) {
	h := newHarness(t, Config{})
	assert.Equal(t, textResult(t, "9", "true"), h.call(call("self.audio_speaker.set_volume", `{"volume":50.7}`)))
	assert.Equal(t, 50, h.b.State()["audio_speaker.volume"])
	assert.Equal(t, textResult(t, "9", "true"), h.call(call("self.audio_speaker.set_volume", `{"volume":35}`)))
	assert.Equal(t, textResult(t, "9", `{"audio_speaker":{"volume":35},"screen":{},"network":{"type":"wifi","ssid":"devicebridge-lab","signal":"strong"}}`),
		h.call(call("self.get_device_status", ``)))

	assert.Equal(t, textResult(t, "9", "true"), h.call(call("self.lamp.turn_on", ``)))
	assert.Equal(t, textResult(t, "9", `{"power": true}`), h.call(call("self.lamp.get_state", ``)))
	assert.Equal(t, textResult(t, "9", "true"), h.call(call("self.screen.set_theme", `{"theme":"dark"}`)))
	assert.Equal(t, "dark", h.b.State()["screen.theme"])
	assert.Equal(t, textResult(t, "9", "true"), h.call(call("self.screen.snapshot", `{"url":"http://x/"}`)))
	assert.Equal(t, 80, h.b.State()["screen.snapshot.quality"])
}

func TestMCPRobotStatusAndDefaults(t *testing.T) {
	h := newHarness(t, Config{Profile: mustProfile(t, "robot")})
	assert.Equal(t, textResult(t, "9", `{"audio_speaker":{"volume":60},"screen":{"brightness":75,"theme":"dark"},"battery":{"level":76,"charging":false},"network":{"type":"wifi","ssid":"devicebridge-lab","signal":"medium"},"chip":{"temperature":41.5}}`),
		h.call(call("self.get_device_status", ``)))
	h.call(call("self.otto.walk", `{"steps":"5","speed":150.9}`))
	st := h.b.State()
	assert.Equal(t, 3, st["otto.walk.steps"], "wrong type falls back to the default")
	assert.Equal(t, 150, st["otto.walk.speed"])
	assert.Equal(t, 1, st["otto.walk.direction"])
	h.call(call("self.screen.set_brightness", `{"brightness":20}`))
	assert.Equal(t, 20, h.b.State()["screen.brightness"])
}

func TestMCPCatalogBehaviours(t *testing.T) {
	h := newHarness(t, Config{Profile: mustProfile(t, "catalog")})
	assert.Equal(t, textResult(t, "9", "780"), h.call(call("self.sensor.co2.read", ``)))
	assert.Equal(t, textResult(t, "9", "-18.5"), h.call(call("self.sensor.freezer_temperature.read", ``)))
	assert.Equal(t, textResult(t, "9", "dry"), h.call(call("self.sensor.water_leak.read", ``)))
	assert.Equal(t, errorReply("9", "Sensor bus not responding"), h.call(call("self.sensor.firmware_check", ``)))
	// 47.25 survives the firmware's float; the 64 px screen hides the theme.
	assert.Equal(t, textResult(t, "9", `{"audio_speaker":{"volume":50},"screen":{},"network":{"type":"wifi","ssid":"devicebridge-lab","signal":"weak"},"chip":{"temperature":47.25}}`),
		h.call(call("self.get_device_status", ``)))
}

func TestMCPTextEscaping(t *testing.T) {
	p := mustParseProfile(t, "board: b\ntools:\n  - {name: self.t, behavior: const, text: \"q\\\" b\\\\ nl\\n tab\\t ctl\\x01 del\\x7f </é>&/\"}\n")
	h := newHarness(t, Config{Profile: p})
	assert.Equal(t, `{"jsonrpc":"2.0","id":9,"result":{"content":[{"type":"text","text":"q\" b\\ nl\n tab\t ctl\u0001 del`+"\x7f"+` </é>&/"}],"isError":false}}`,
		h.call(call("self.t", ``)))
}

func TestMCPSystemInfo(t *testing.T) {
	h := newHarness(t, Config{MAC: "AA:BB:CC:DD:EE:FF", ClientID: "1f0a2b3c-0000-4000-8000-000000000001"})
	info := h.b.SystemInfoJSON()
	assert.True(t, json.Valid([]byte(info)), info)
	assert.True(t, strings.HasPrefix(info, `{"version":2,"language":"zh-CN","flash_size":16777216,"minimum_free_heap_size":"8318916","mac_address":"aa:bb:cc:dd:ee:ff","uuid":"1f0a2b3c-0000-4000-8000-000000000001","chip_model_name":"esp32s3",`), info)
	assert.Contains(t, info, `"partition_table": [{"label":"nvs"`)
	assert.True(t, strings.HasSuffix(info, `"display":{"monochrome":true,"width":128,"height":32},"board":{"type":"bread-compact-wifi","name":"bread-compact-wifi","manufacturer":"","ssid":"devicebridge-lab","rssi":-52,"channel":6,"ip":"192.168.1.23","mac":"aa:bb:cc:dd:ee:ff"}}`), info)
	assert.Equal(t, textResult(t, "9", info), h.call(call("self.get_system_info", ``)))
}

func TestMCPSerialExecution(t *testing.T) {
	const delay = 200 * time.Millisecond
	h := newHarness(t, Config{ToolDelay: map[string]time.Duration{"self.lamp.turn_on": delay}})
	start := time.Now()
	h.request(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"self.lamp.turn_on"}}`)
	h.request(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	h.request(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"self.nope"}}`)
	h.request(`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"self.lamp.get_state"}}`)

	// Nothing is answered while the tool runs. The replies queued during
	// the run go first; the slow tool's reply was queued after them, and
	// the next call only runs after that.
	first := h.nextPayload()
	assert.GreaterOrEqual(t, time.Since(start), delay)
	assert.True(t, strings.HasPrefix(first, `{"jsonrpc":"2.0","id":2,"result":{"tools":[`), first)
	assert.Equal(t, errorReply("3", "Unknown tool: self.nope"), h.nextPayload())
	assert.Equal(t, textResult(t, "1", "true"), h.nextPayload())
	assert.Equal(t, textResult(t, "4", `{"power": true}`), h.nextPayload())
	assert.EqualValues(t, 2, h.b.Stats().CallsRun)
}

func TestMCPRebootNeverReplies(t *testing.T) {
	h := newHarness(t, Config{RebootDelay: 10 * time.Millisecond})
	h.request(call("self.reboot", ``))
	require.ErrorIs(t, h.waitClosed(), ErrRebooted)
	h.stop()
	assert.Empty(t, h.link.out, "a rebooting board sends no reply")
	assert.EqualValues(t, 1, h.b.Stats().Reboots)
}

func TestMCPSystemRebootCommand(t *testing.T) {
	h := newHarness(t, Config{RebootDelay: time.Millisecond})
	h.deliver(`{"type":"system","command":"reboot"}`)
	require.ErrorIs(t, h.waitClosed(), ErrRebooted)
}

func TestMCPUpgradeClosesChannelFirst(t *testing.T) {
	h := newHarness(t, Config{})
	h.request(call("self.upgrade_firmware", ``))
	require.ErrorIs(t, h.waitClosed(), ErrFirmwareUpgrade)
	h.stop()
	assert.Empty(t, h.link.out)
}

func TestMCPDisconnectOn(t *testing.T) {
	h := newHarness(t, Config{DisconnectOn: map[string]bool{"self.lamp.turn_on": true}})
	h.request(call("self.lamp.turn_on", ``))
	require.ErrorIs(t, h.waitClosed(), ErrInjectedDisconnect)
	h.stop()
	assert.Empty(t, h.link.out)
	assert.Equal(t, false, h.b.State()["lamp.power"], "the dropped call did not run")
}

func TestMCPOptions(t *testing.T) {
	t.Run("omit session id", func(t *testing.T) {
		h := newHarness(t, Config{OmitSessionID: true})
		h.request(`{"jsonrpc":"2.0","id":1,"method":"ping"}`)
		assert.Equal(t, `{"type":"mcp","payload":{"jsonrpc":"2.0","id":1,"error":{"message":"Method not implemented: ping"}}}`, h.next())
	})
	t.Run("board without mcp", func(t *testing.T) {
		h := newHarness(t, Config{OmitMCPFeature: true})
		h.request(`{"jsonrpc":"2.0","id":1,"method":"ping"}`)
		assert.EqualValues(t, 1, h.b.Stats().Ignored)
		h.stop()
		assert.Empty(t, h.link.out)
	})
}

// Tools beyond the stock firmware: a schema given whole (listed as written,
// only its required arguments checked), a result given whole, and echo.
func TestMCPContentAndSchemaTools(t *testing.T) {
	p := mustParseProfile(t, `board: b
tools:
  - name: pic
    description: a picture
    behavior: content
    result: {content: [{type: image, mimeType: image/png, data: aGk=}], isError: true}
  - name: form
    description: a form
    input_schema: {type: object, properties: {score: {type: number}, tags: {type: array}}, required: [score]}
    behavior: echo
  - name: fw
    description: firmware properties
    properties: [{name: n, type: integer}, {name: s, type: string, default: "x\"y"}]
    behavior: echo
`)
	h := newHarness(t, Config{Profile: p})
	assert.Equal(t, `{"jsonrpc":"2.0","id":9,"result":{"content":[{"type":"image","mimeType":"image/png","data":"aGk="}],"isError":true}}`,
		h.call(call("pic", ``)))
	assert.Equal(t, errorReply("9", "Missing valid argument: score"), h.call(call("form", `{"tags":[1]}`)))
	assert.Equal(t, textResult(t, "9", `{"score":95.5,"tags":["a",true,null],"o":{"k":-1}}`),
		h.call(call("form", `{"score":95.5,"tags":["a",true,null],"o":{"k":-1}}`)))
	assert.Equal(t, textResult(t, "9", `{"n":3,"s":"x\"y"}`), h.call(call("fw", `{"n":3.7}`)))

	list := h.call(`{"jsonrpc":"2.0","id":9,"method":"tools/list"}`)
	assert.Contains(t, list, `{"name":"form","description":"a form","inputSchema":{"type":"object","properties":{"score":{"type":"number"},"tags":{"type":"array"}},"required":["score"]}}`)
}

// TestMCPSleepAnswersLater: a sleep tool answers when its time is up, and
// the board answers other calls meanwhile; seconds 0 answers at once; the
// text is the profile's or says how long it slept. A link that ends first
// gets no reply.
func TestMCPSleepAnswersLater(t *testing.T) {
	p := mustParseProfile(t, `board: b
tools:
  - name: slow
    properties:
      - {name: seconds, type: integer, min: 0, max: 300}
    behavior: sleep
  - name: slow_text
    properties:
      - {name: seconds, type: integer, default: 0}
    behavior: sleep
    text: computed
  - {name: quick, behavior: const, text: fast}
`)
	h := newHarness(t, Config{Profile: p})
	assert.Equal(t, textResult(t, "9", "done after 0 s"), h.call(call("slow", `{"seconds":0}`)))
	assert.Equal(t, textResult(t, "9", "computed"), h.call(call("slow_text", ``)))

	h.request(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow","arguments":{"seconds":1}}}`)
	h.request(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"quick"}}`)
	assert.Equal(t, textResult(t, "2", "fast"), h.nextPayload(), "the board is free while the sleep runs")
	assert.Equal(t, textResult(t, "1", "done after 1 s"), h.nextPayload())

	// A sleep still running when the link ends never answers.
	h.request(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"slow","arguments":{"seconds":300}}}`)
	h.stop()
	assert.Empty(t, h.link.out)
}

func TestProfileSleepBounds(t *testing.T) {
	_, err := ParseProfile([]byte("board: b\ntools:\n  - {name: s, behavior: sleep}\n"), "x")
	assert.ErrorContains(t, err, `behavior sleep needs a integer property "seconds"`)
	_, err = ParseProfile([]byte("board: b\ntools:\n  - name: s\n    behavior: sleep\n    properties:\n      - {name: seconds, type: integer, min: 0, max: 301}\n"), "x")
	assert.ErrorContains(t, err, "at most 300 seconds")
}

// TestMCPFormat: a format tool answers its text with each {name} replaced
// by that argument, the default where the call gives none.
func TestMCPFormat(t *testing.T) {
	p := mustParseProfile(t, `board: b
tools:
  - name: greet
    properties:
      - {name: name, type: string, default: World}
      - {name: times, type: integer, default: 1}
    behavior: format
    text: "Hello, {name}! x{times} {other}"
`)
	h := newHarness(t, Config{Profile: p})
	assert.Equal(t, textResult(t, "9", "Hello, sep-2243! x2 {other}"), h.call(call("greet", `{"name":"sep-2243","times":2}`)))
	assert.Equal(t, textResult(t, "9", "Hello, World! x1 {other}"), h.call(call("greet", ``)))

	_, err := ParseProfile([]byte("board: b\ntools:\n  - {name: g, behavior: format}\n"), "x")
	assert.ErrorContains(t, err, "behavior format needs a text")
}
