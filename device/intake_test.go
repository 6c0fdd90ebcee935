package device

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/devicebridge/devicebridge/internal/testlink"
)

// deepSchema nests levels of properties: at about 510 it panicked go-sdk's
// AddTool and took the bridge down (issue 24, defect 1).
func deepSchema(levels int) string {
	return strings.Repeat(`{"type":"object","properties":{"a":`, levels) + `{"type":"integer"}` + strings.Repeat(`}}`, levels)
}

func toolJSON(name, schema string) string {
	n, _ := json.Marshal(name)
	return `{"name":` + string(n) + `,"description":"d","inputSchema":` + schema + `}`
}

func TestCheckToolsRefusesPastEachLimit(t *testing.T) {
	l := ToolLimits{}.WithDefaults()
	obj := func(props string) string { return `{"type":"object","properties":{` + props + `}}` }
	var many []string
	for i := range l.MaxProperties + 1 {
		many = append(many, fmt.Sprintf(`"p%d":{"type":"integer"}`, i))
	}
	var values []string
	for i := range l.MaxEnumValues + 1 {
		values = append(values, fmt.Sprint(i))
	}
	for _, tc := range []struct {
		tool   Tool
		reason string // "" when kept
	}{
		{Tool{Name: "self.audio_speaker.set_volume", Description: "Set the volume.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}`)}, ""},
		{Tool{Name: "self.reboot", Annotations: json.RawMessage(`{"audience":["user"]}`)}, ""},
		{Tool{Name: "self.deep", InputSchema: json.RawMessage(deepSchema(510))}, "its input schema nests 1021 levels, more than devices.tool_limits.max_schema_depth (32)"},
		{Tool{Name: "self.deep", InputSchema: json.RawMessage(deepSchema(15))}, ""},
		{Tool{Name: "self.deep", InputSchema: json.RawMessage(deepSchema(16))}, "nests 33 levels"},
		{Tool{Name: strings.Repeat("n", 129)}, "its name is 129 bytes, more than devices.tool_limits.max_name_bytes (128)"},
		{Tool{Name: "self.\x1b]0;pwned\x07"}, "control characters"},
		{Tool{Name: "self.x", Description: strings.Repeat("d", 8<<10+1)}, "its description is 8193 bytes"},
		{Tool{Name: "self.x", InputSchema: json.RawMessage(obj(`"s":{"type":"string","default":"` + strings.Repeat("x", 32<<10) + `"}`))}, "more than devices.tool_limits.max_schema_bytes (32768)"},
		{Tool{Name: "self.x", Annotations: json.RawMessage(strings.Repeat(`[`, 40) + strings.Repeat(`]`, 40))}, "its annotations nest 40 levels"},
		{Tool{Name: "self.x", InputSchema: json.RawMessage(obj(strings.Join(many, ",")))}, "declares 129 properties, more than devices.tool_limits.max_properties (128)"},
		{Tool{Name: "self.x", InputSchema: json.RawMessage(obj(`"e":{"enum":[` + strings.Join(values, ",") + `]}`))}, "an enum of 257 values"},
		{Tool{Name: "self.x", InputSchema: json.RawMessage(obj(`"r":{"$ref":"#"}`))}, "uses $ref"},
		{Tool{Name: "self.x", InputSchema: json.RawMessage(obj(`"h":{"type":"string","x-mcp-header":"X-Board"}`))}, "x-mcp-header"},
		{Tool{Name: "self.x", InputSchema: json.RawMessage(obj(`"p":{"type":"string","pattern":"` + strings.Repeat(`[a-z]{999}`, 3) + `"}`))}, "too complex"},
	} {
		kept, refused := CheckTools([]Tool{tc.tool}, l)
		if tc.reason == "" {
			assert.Len(t, kept, 1, "%.80s", tc.tool.InputSchema)
			assert.Empty(t, refused)
			continue
		}
		assert.Empty(t, kept)
		require.Len(t, refused, 1)
		assert.Contains(t, refused[0].Reason, tc.reason)
		assert.LessOrEqual(t, len(refused[0].Name), maxShownName)
	}
}

// TestToolLimitsDefaults: zero and negative limits take the defaults, and
// no depth past what argcheck can check is ever used.
func TestToolLimitsDefaults(t *testing.T) {
	def := ToolLimits{}.WithDefaults()
	assert.Equal(t, DefaultMaxSchemaDepth, def.MaxSchemaDepth)
	l := ToolLimits{MaxSchemaDepth: 500, MaxNameBytes: -1}.WithDefaults()
	assert.Equal(t, MostSchemaDepth, l.MaxSchemaDepth)
	assert.Equal(t, DefaultMaxNameBytes, l.MaxNameBytes)
}

// TestRefusedToolsLeaveTheRestWorking: a board's tool past a bound is
// refused on its own, with its reason in Info, and logged once per
// interval however many boards list it; its other tools work.
func TestRefusedToolsLeaveTheRestWorking(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	h := NewHub(HubConfig{ReadyWait: 2 * time.Second}, zap.New(core))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, h.Close(ctx))
	})
	list := `[` + toolJSON("self.get_device_status", `{"type":"object","properties":{}}`) + `,` +
		toolJSON("self.deep", deepSchema(510)) + `]`
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := range 2 {
		_, link := startBoard(t, list)
		s, err := h.Attach(link, Identity{DeviceID: fmt.Sprintf("aa:bb:cc:dd:ee:%02x", i), Transport: "test", HasMCP: true})
		require.NoError(t, err)
		require.NoError(t, s.WaitReady(ctx))
		info := s.Info()
		require.Len(t, info.Tools, 1)
		assert.Equal(t, "self.get_device_status", info.Tools[0].Name)
		require.Len(t, info.RefusedTools, 1)
		assert.Equal(t, "self.deep", info.RefusedTools[0].Name)
		assert.Contains(t, info.RefusedTools[0].Reason, "max_schema_depth")
		_, err = h.CallTool(ctx, info.DeviceID, "self.get_device_status", nil)
		require.NoError(t, err)
		_, err = h.CallTool(ctx, info.DeviceID, "self.deep", nil)
		var unknown *UnknownToolError
		require.ErrorAs(t, err, &unknown, "a refused tool is not offered")
	}
	warned := logs.FilterMessageSnippet("board tools refused").FilterLevelExact(zapcore.WarnLevel).All()
	require.Len(t, warned, 1, "a board that lists it again does not flood the log")
	assert.Equal(t, "self.deep", warned[0].ContextMap()["tool"])

	data, err := json.Marshal(h.Devices()[0])
	require.NoError(t, err)
	assert.Contains(t, string(data), `"refused_tools":[{"name":"self.deep","reason":"its input schema nests`)
}

// TestBoardWithEveryToolRefusedIsClosed: a board with nothing the bridge
// can offer is closed with the reason, not left looking ready.
func TestBoardWithEveryToolRefusedIsClosed(t *testing.T) {
	h := newHub(t)
	_, link := startBoard(t, `[`+toolJSON("self.deep", deepSchema(510))+`]`)
	s, err := h.Attach(link, Identity{DeviceID: "aa:bb:cc:dd:ee:10", Transport: "test", HasMCP: true})
	require.NoError(t, err)
	<-s.Done()
	info := s.Info()
	assert.Equal(t, CauseInitFailed, info.CloseCause)
	assert.Contains(t, info.CloseReason, "refused every tool the board listed: all 1 of its tools, the first because its input schema nests")
	assert.Len(t, info.RefusedTools, 1)
}

func TestRefusedToolsShownAreBounded(t *testing.T) {
	h := newHub(t)
	var list []string
	for i := range 60 { // one message (64 KiB): 60 tools nesting 35 levels
		list = append(list, toolJSON(fmt.Sprint("self.deep", i), deepSchema(17)))
	}
	list = append(list, toolJSON("self.ok", `{}`))
	_, link := startBoard(t, `[`+strings.Join(list, ",")+`]`)
	s, err := h.Attach(link, Identity{DeviceID: "aa:bb:cc:dd:ee:12", Transport: "test", HasMCP: true})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, s.WaitReady(ctx))
	assert.Len(t, s.Info().RefusedTools, maxRefusedShown, "Info carries the first few refusals, not a list the board sizes")
	assert.Len(t, s.Info().Tools, 1)
}

func TestBoardNameIsCut(t *testing.T) {
	h := newHub(t)
	long := strings.Repeat("é", 200)
	bridge, end := testlink.Pair(32)
	b := testlink.NewBoard(end, func(r testlink.Request) string {
		if r.Method == "initialize" {
			return testlink.Result(r, `{"protocolVersion":"2024-11-05","capabilities":{},"serverInfo":{"name":"`+long+`","version":"`+long+`"}}`)
		}
		return testlink.Result(r, `{"tools":`+twoTools+`}`)
	})
	t.Cleanup(b.Close)
	s, err := h.Attach(bridge, Identity{DeviceID: "aa:bb:cc:dd:ee:11", Transport: "test", HasMCP: true})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, s.WaitReady(ctx))
	info := s.Info()
	assert.LessOrEqual(t, len(info.Board), DefaultMaxNameBytes)
	assert.True(t, strings.HasSuffix(info.Board, "…"))
	assert.LessOrEqual(t, len(info.FirmwareVersion), DefaultMaxNameBytes)
}

// TestRefuseToolWithdrawsIt: a tool a layer above could not offer leaves
// the board's Info, with the reason in RefusedTools, and subscribers hear
// that the tools changed; the board's other tools stay.
func TestRefuseToolWithdrawsIt(t *testing.T) {
	h := newHub(t)
	sub := h.Subscribe()
	t.Cleanup(sub.Close)
	_, link := startBoard(t, twoTools)
	s, err := h.Attach(link, Identity{DeviceID: "aa:bb:cc:dd:ee:31", HasMCP: true})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, s.WaitReady(ctx))
	require.True(t, h.RefuseTool("AA-BB-CC-DD-EE-31", "self.reboot", "the MCP server refused it: "+strings.Repeat("x", 1000)))
	info, ok := h.Device("aa:bb:cc:dd:ee:31")
	require.True(t, ok)
	require.Len(t, info.Tools, 1)
	assert.Equal(t, "self.get_device_status", info.Tools[0].Name)
	require.Len(t, info.RefusedTools, 1)
	assert.Equal(t, "self.reboot", info.RefusedTools[0].Name)
	assert.LessOrEqual(t, len(info.RefusedTools[0].Reason), maxShownReason+len("…"))
	assert.False(t, h.RefuseTool("aa:bb:cc:dd:ee:31", "self.reboot", "again"), "already withdrawn")
	assert.False(t, h.RefuseTool("aa:bb:cc:dd:ee:32", "self.reboot", "no such board"))
	for {
		for _, ev := range sub.Next() {
			if ev.Type == EventToolsChanged {
				return
			}
		}
		select {
		case <-sub.C():
		case <-ctx.Done():
			t.Fatal("no tools-changed event")
		}
	}
}
