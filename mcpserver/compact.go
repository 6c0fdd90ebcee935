package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/argcheck"
	"github.com/devicebridge/devicebridge/internal/clip"
)

// Compact mode: hosts that cap the number of tools (some at 40) cannot take
// a fleet's whole catalogue. In compact mode the server publishes three
// fixed tools instead, whatever the fleet size.
const (
	toolListDevices    = "list_devices"
	toolDescribeDevice = "describe_device"
	toolCallDeviceTool = "call_device_tool"

	defaultListLimit = 50
	maxListLimit     = 200
)

var (
	listDevicesSchema = json.RawMessage(`{"type":"object","properties":{` +
		`"query":{"type":"string","description":"Only boards whose alias, MAC or board type contains this text (case-insensitive)."},` +
		`"offset":{"type":"integer","minimum":0,"default":0,"description":"Skip this many boards (for paging)."},` +
		`"limit":{"type":"integer","minimum":1,"maximum":200,"default":50,"description":"Return at most this many boards."}}}`)
	describeDeviceSchema = json.RawMessage(`{"type":"object","properties":{` +
		`"device":{"type":"string","description":"The board's alias or MAC, as list_devices shows them."}},"required":["device"]}`)
	callDeviceToolSchema = json.RawMessage(`{"type":"object","properties":{` +
		`"device":{"type":"string","description":"The board's alias or MAC, as list_devices shows them."},` +
		`"tool":{"type":"string","description":"The tool's name as describe_device shows it, e.g. self.audio_speaker.set_volume."},` +
		`"arguments":{"type":"object","description":"The tool's arguments, as its inputSchema in describe_device describes them."}},` +
		`"required":["device","tool"]}`)
)

func (s *Server) addCompactTools() {
	add := func(name, title, desc string, schema json.RawMessage, h func(context.Context, *mcp.CallToolRequest, map[string]json.RawMessage) (*mcp.CallToolResult, error)) {
		parsed, err := argcheck.Parse(schema)
		if err != nil {
			panic(fmt.Sprintf("tools: compact schema %s: %v", name, err))
		}
		s.mcp.AddTool(&mcp.Tool{Name: name, Title: title, Description: desc, InputSchema: schema},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				args := req.Params.Arguments
				if _, bad := parsed.Validate(args); bad != nil {
					return errorResult("%s", bad.Explain(name, nil)), nil
				}
				m := map[string]json.RawMessage{}
				if len(args) > 0 {
					_ = json.Unmarshal(args, &m)
				}
				return h(ctx, req, m)
			})
	}
	// never fails the request: list_devices and describe_device answer
	// everything with a result.
	never := func(h func(context.Context, *mcp.CallToolRequest, map[string]json.RawMessage) *mcp.CallToolResult) func(context.Context, *mcp.CallToolRequest, map[string]json.RawMessage) (*mcp.CallToolResult, error) {
		return func(ctx context.Context, req *mcp.CallToolRequest, m map[string]json.RawMessage) (*mcp.CallToolResult, error) {
			return h(ctx, req, m), nil
		}
	}
	add(toolListDevices, "List boards",
		"List the boards connected to the bridge: alias, MAC, board type, firmware, state and the names of their tools. "+
			"Start here, then use describe_device for a board's tool arguments and call_device_tool to run one.",
		listDevicesSchema, never(s.compactList))
	add(toolDescribeDevice, "Describe a board's tools",
		"Show one board's tools with their descriptions and input schemas (argument names, types, ranges, defaults).",
		describeDeviceSchema, never(s.compactDescribe))
	add(toolCallDeviceTool, "Run a board tool",
		"Run one tool on one board. Arguments are checked against the tool's input schema before the board sees them. "+
			"A board runs one tool at a time; if it does not answer in time the action may still happen, so check its state before retrying.",
		callDeviceToolSchema, s.compactCall)
}

// jsonResult returns v as JSON text and as structuredContent.
func jsonResult(v any) *mcp.CallToolResult {
	data, err := json.Marshal(v)
	if err != nil {
		return errorResult("internal error: %v", err)
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(data)}}, StructuredContent: json.RawMessage(data)}
}

type deviceSummary struct {
	Device          string   `json:"device"`
	DeviceID        string   `json:"device_id"`
	Board           string   `json:"board,omitempty"`
	Firmware        string   `json:"firmware,omitempty"`
	Transport       string   `json:"transport,omitempty"`
	State           string   `json:"state"`
	Tools           []string `json:"tools"`
	HiddenUserTools int      `json:"hidden_user_only_tools,omitempty"`
	Note            string   `json:"note,omitempty"`
}

func summarize(v *deviceView) deviceSummary {
	d := deviceSummary{Device: v.alias, DeviceID: v.info.DeviceID, Board: v.info.Board, Firmware: v.info.FirmwareVersion,
		Transport: v.info.Transport, State: v.info.State.String(), Tools: []string{}, HiddenUserTools: v.hidden}
	for _, e := range v.tools {
		d.Tools = append(d.Tools, e.tool.Name)
	}
	switch {
	case !v.info.HasMCP:
		d.Note = "this board offers no tools (no MCP support)"
	case v.stale:
		d.Note = "reconnecting: the tools listed are those it had; calls wait until it is ready"
	case v.info.State != device.StateReady:
		d.Note = "starting up: its tools appear once it is ready"
	}
	return d
}

func (s *Server) compactList(ctx context.Context, _ *mcp.CallToolRequest, args map[string]json.RawMessage) *mcp.CallToolResult {
	var query string
	offset, limit := 0, defaultListLimit
	if raw, ok := args["query"]; ok {
		_ = json.Unmarshal(raw, &query)
	}
	if raw, ok := args["offset"]; ok {
		_ = json.Unmarshal(raw, &offset)
	}
	if raw, ok := args["limit"]; ok {
		_ = json.Unmarshal(raw, &limit)
	}
	q := strings.ToLower(strings.TrimSpace(query))
	var matched []deviceSummary
	for _, v := range s.viewCatalog(ctx).devices {
		if q != "" && !strings.Contains(strings.ToLower(v.alias+" "+v.info.DeviceID+" "+v.info.Board), q) {
			continue
		}
		matched = append(matched, summarize(v))
	}
	out := struct {
		Devices    []deviceSummary `json:"devices"`
		Total      int             `json:"total"`
		NextOffset *int            `json:"next_offset,omitempty"`
	}{Devices: []deviceSummary{}, Total: len(matched)}
	if offset < len(matched) {
		end := min(len(matched), offset+limit)
		out.Devices = matched[offset:end]
		if end < len(matched) {
			out.NextOffset = &end
		}
	}
	return jsonResult(out)
}

// resolveDevice finds the board a compact call names, or explains why not.
func (s *Server) resolveDevice(cat *catalog, ref string) (*deviceView, *mcp.CallToolResult) {
	v, ambiguous := cat.findDevice(ref)
	if v != nil {
		return v, nil
	}
	if len(ambiguous) > 1 {
		ids := make([]string, len(ambiguous))
		for i, a := range ambiguous {
			ids[i] = a.info.DeviceID
		}
		return nil, errorResult("%q names %d boards (%s); give the MAC instead.", ref, len(ambiguous), strings.Join(ids, ", "))
	}
	return nil, errorResult("No board %q is connected. Call list_devices to see the connected boards and their aliases.", ref)
}

type toolDetail struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"inputSchema"`
	UserOnly    bool            `json:"user_only,omitempty"`
}

func (s *Server) compactDescribe(ctx context.Context, _ *mcp.CallToolRequest, args map[string]json.RawMessage) *mcp.CallToolResult {
	var ref string
	_ = json.Unmarshal(args["device"], &ref)
	v, fail := s.resolveDevice(s.viewCatalog(ctx), ref)
	if fail != nil {
		return fail
	}
	out := struct {
		deviceSummary
		Tools []toolDetail `json:"tools"`
	}{deviceSummary: summarize(v), Tools: []toolDetail{}}
	for _, e := range v.tools {
		out.Tools = append(out.Tools, toolDetail{Name: e.tool.Name, Description: boardText(e.tool.Description),
			InputSchema: e.published, UserOnly: e.userOnly})
	}
	return jsonResult(out)
}

// compactCall is call_device_tool; its error is guardedCall's.
func (s *Server) compactCall(ctx context.Context, req *mcp.CallToolRequest, args map[string]json.RawMessage) (*mcp.CallToolResult, error) {
	var ref, tool string
	_ = json.Unmarshal(args["device"], &ref)
	_ = json.Unmarshal(args["tool"], &tool)
	cat := s.cat.Load()
	v, fail := s.resolveDevice(cat, ref)
	if fail != nil {
		s.lines().unknownDevice.Info(s.log, "tool call rejected", clip.Field("device", ref), clip.Field("tool", tool),
			zap.String("outcome", string(device.CodeUnknownDevice)))
		return fail, nil
	}
	e := v.findTool(tool)
	if e == nil {
		names := make([]string, len(v.tools))
		for i, t := range v.tools {
			names[i] = t.tool.Name
		}
		s.lines().unknownTool.Info(s.log, "tool call rejected", zap.String("device_id", v.info.DeviceID), clip.Field("tool", tool),
			zap.String("outcome", "unknown_tool"))
		switch {
		case len(v.tools) == 0 && v.info.State != device.StateReady:
			return errorResult("Board %s is still starting up and has no tools yet. Try again in a few seconds.", boardLabel(v)), nil
		case len(v.tools) == 0:
			return errorResult("Board %s offers no tools.", boardLabel(v)), nil
		}
		return errorResult("Board %s has no tool %q. Its tools are: %s. Call describe_device for their arguments.",
			boardLabel(v), tool, strings.Join(names, ", ")), nil
	}
	return s.guardedCall(ctx, req, e, args["arguments"])
}
