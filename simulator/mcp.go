package simulator

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/internal/ctxtime"
)

// The board's MCP server, reproducing the firmware's McpServer: its checks
// and their order, its silent drops, its paging and the exact bytes of its
// replies. Replies are built by concatenation wherever the firmware
// concatenates, so error messages and cursors are not escaped, and by the
// cJSON printer wherever the firmware prints with cJSON.

const (
	// mcpProtocolVersion is the MCP revision the firmware reports.
	mcpProtocolVersion = "2024-11-05"
	// toolsPageLimit and toolsPageMargin are the firmware's tools/list page
	// budget: a tool is only added while the page stays under the limit
	// with the margin to spare.
	toolsPageLimit  = 8000
	toolsPageMargin = 30
)

// renderTool prints a tool the way McpTool::to_json does: keys name,
// description, inputSchema{type, properties, required?}, annotations?, each
// property as {type, default?, minimum?, maximum?}.
func renderTool(t *Tool) string {
	b := []byte(`{"name":`)
	b = appendCJSONString(b, t.Name)
	b = append(b, `,"description":`...)
	b = appendCJSONString(b, t.Description)
	if t.InputSchema != nil {
		b = append(b, `,"inputSchema":`...)
		b = append(b, t.InputSchema...)
		if t.UserOnly {
			b = append(b, `,"annotations":{"audience":["user"]}`...)
		}
		return string(append(b, '}'))
	}
	b = append(b, `,"inputSchema":{"type":"object","properties":{`...)
	for i, p := range t.Properties {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendCJSONString(b, p.Name)
		b = append(b, `:{"type":`...)
		b = appendCJSONString(b, string(p.Type))
		if p.HasDefault() {
			b = append(b, `,"default":`...)
			switch v := p.Default.(type) {
			case bool:
				b = strconv.AppendBool(b, v)
			case int:
				b = strconv.AppendInt(b, int64(v), 10)
			case string:
				b = appendCJSONString(b, v)
			}
		}
		if p.Min != nil {
			b = append(b, `,"minimum":`...)
			b = strconv.AppendInt(b, int64(*p.Min), 10)
			b = append(b, `,"maximum":`...)
			b = strconv.AppendInt(b, int64(*p.Max), 10)
		}
		b = append(b, '}')
	}
	b = append(b, '}')
	if req := t.Required(); len(req) > 0 {
		b = append(b, `,"required":[`...)
		for i, r := range req {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendCJSONString(b, r)
		}
		b = append(b, ']')
	}
	b = append(b, '}')
	if t.UserOnly {
		b = append(b, `,"annotations":{"audience":["user"]}`...)
	}
	return string(append(b, '}'))
}

// handleMCP is McpServer::ParseMessage. It runs on the receive path, like
// the firmware's; everything it answers is scheduled on the main task.
func (s *session) handleMCP(msg *jsonValue) {
	if v := msg.get("jsonrpc"); !v.isString() || v.str != "2.0" {
		s.dropMCP("jsonrpc is not the string 2.0")
		return
	}
	m := msg.get("method")
	if !m.isString() {
		// Responses sent to the board end up here too: they have no method.
		s.dropMCP("method is not a string")
		return
	}
	method := m.str
	if strings.HasPrefix(method, "notifications") {
		s.dropMCP("notification")
		return
	}
	params := msg.get("params")
	if params != nil && !params.isObject() {
		s.dropMCP("params is not an object")
		return
	}
	idv := msg.get("id")
	if !idv.isNumber() {
		s.dropMCP("id is not a number")
		return
	}
	// The firmware keeps the id as a C int: fractions are cut and large
	// values clamp, and that is what the reply echoes.
	id := idv.valueInt()

	switch method {
	case "initialize":
		if caps := params.get("capabilities"); caps.isObject() {
			s.b.parseCapabilities(caps)
		}
		s.replyResult(id, s.b.initializeResult)
	case "tools/list":
		cursor := ""
		if c := params.get("cursor"); c.isString() {
			cursor = c.str
		}
		// Only a JSON true counts; 1 or "true" leave user-only tools out.
		withUser := params.get("withUserTools")
		s.toolsList(id, cursor, withUser != nil && withUser.kind == jsonTrue)
	case "tools/call":
		if !params.isObject() {
			s.replyError(id, "Missing params")
			return
		}
		name := params.get("name")
		if !name.isString() {
			s.replyError(id, "Missing name")
			return
		}
		args := params.get("arguments")
		if args != nil && !args.isObject() {
			s.replyError(id, "Invalid arguments")
			return
		}
		s.toolCall(id, name.str, args)
	default:
		s.replyError(id, "Method not implemented: "+method)
	}
}

func (s *session) dropMCP(reason string) {
	s.b.stats.mcpDropped.Add(1)
	s.log.Debug("mcp message dropped without reply", zap.String("reason", reason))
}

// toolsList builds one tools/list page. The cursor names the first tool of
// the page (it is inclusive), and a page ends before the first tool that
// would push it past the size budget; that tool becomes nextCursor.
func (s *session) toolsList(id int, cursor string, withUser bool) {
	tools := s.b.tools
	var sb strings.Builder
	sb.WriteString(`{"tools":[`)
	found := cursor == ""
	next := ""
	for i := range tools {
		t := &tools[i]
		if !found {
			if t.name != cursor {
				continue
			}
			found = true
		}
		// Hidden tools are skipped before the size test, so they can never
		// become a cursor.
		if t.userOnly && !withUser {
			continue
		}
		entry := t.json + ","
		if sb.Len()+len(entry)+toolsPageMargin > toolsPageLimit && !(t.unpaged && sb.Len() == len(`{"tools":[`)) {
			next = t.name
			break
		}
		sb.WriteString(entry)
	}
	page := strings.TrimSuffix(sb.String(), ",")
	if strings.HasSuffix(page, "[") && len(tools) > 0 {
		// Nothing fitted: an unknown cursor (next is empty, hence the two
		// spaces), nothing visible after the cursor, or one oversized tool.
		s.replyError(id, "Failed to add tool "+next+" because of payload size limit")
		return
	}
	if next == "" {
		page += "]}"
	} else {
		page += `],"nextCursor":"` + next + `"}`
	}
	s.replyResult(id, page)
}

// boundArg is one argument after binding, in declaration order.
type boundArg struct {
	name  string
	value any // bool, int or string
}

// toolCall is McpServer::DoToolCall: find the tool, bind its declared
// properties in order (wrong types count as absent, defaults fill gaps,
// integers are truncated and range-checked), then queue the call on the main
// task. User-only tools are callable even though they were not listed.
func (s *session) toolCall(id int, name string, args *jsonValue) {
	idx := -1
	for i := range s.b.profile.Tools {
		if s.b.profile.Tools[i].Name == name {
			idx = i
			break
		}
	}
	if idx < 0 {
		s.replyError(id, "Unknown tool: "+name)
		return
	}
	tool := &s.b.profile.Tools[idx]
	if tool.InputSchema != nil {
		// Not the firmware's binding: a board that declares a schema of its
		// own is only checked for its required arguments here.
		for _, name := range tool.Required() {
			if args.get(name) == nil {
				s.replyError(id, "Missing valid argument: "+name)
				return
			}
		}
		s.schedule(func(ctx context.Context) { s.runCall(ctx, id, tool, nil, args) })
		return
	}
	bound := make([]boundArg, 0, len(tool.Properties))
	for _, p := range tool.Properties {
		var val any
		a := args.get(p.Name)
		switch {
		case p.Type == TypeBoolean && a.isBool():
			val = a.kind == jsonTrue
		case p.Type == TypeInteger && a.isNumber():
			n := a.valueInt()
			if p.Min != nil && n < *p.Min {
				s.replyError(id, "Value is below minimum allowed: "+strconv.Itoa(*p.Min))
				return
			}
			if p.Max != nil && n > *p.Max {
				s.replyError(id, "Value exceeds maximum allowed: "+strconv.Itoa(*p.Max))
				return
			}
			val = n
		case p.Type == TypeString && a.isString():
			val = a.str
		}
		if val == nil {
			if !p.HasDefault() {
				s.replyError(id, "Missing valid argument: "+p.Name)
				return
			}
			val = p.Default
		}
		bound = append(bound, boundArg{name: p.Name, value: val})
	}
	s.schedule(func(ctx context.Context) { s.runCall(ctx, id, tool, bound, nil) })
}

// runCall executes a validated call on the main task. The reply is queued
// behind whatever was scheduled while the tool ran, as on the firmware.
// args are the bound arguments of a firmware tool, raw the arguments as
// they came for a tool with an InputSchema.
func (s *session) runCall(ctx context.Context, id int, tool *Tool, args []boundArg, raw *jsonValue) {
	if d := s.b.cfg.ToolDelay[tool.Name]; d > 0 {
		if !ctxtime.Sleep(ctx, d) {
			return // the link ended mid-call; there is nobody to answer
		}
	}
	if hold := s.b.cfg.Hold[tool.Name]; hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return // as above
		}
	}
	if s.b.cfg.DisconnectOn[tool.Name] {
		s.log.Info("dropping the connection mid-call (fault injection)", zap.String("tool", tool.Name))
		s.link.closeChannel(ErrInjectedDisconnect)
		return
	}
	s.b.stats.callsRun.Add(1)
	if tool.Behavior == BehaviorContent {
		s.replyResult(id, string(tool.Result))
		return
	}
	if tool.Behavior == BehaviorFormat {
		s.replyText(id, formatText(tool.Text, args))
		return
	}
	if tool.Behavior == BehaviorEcho {
		s.replyResult(id, echoResult(args, raw))
		return
	}
	if tool.Behavior == BehaviorSleep {
		s.sleepThenReply(id, tool, args)
		return
	}
	text, err := s.runTool(tool, args)
	if err != nil {
		s.replyError(id, err.Error())
		return
	}
	s.replyText(id, text)
}

// replyText is a tool's text result.
func (s *session) replyText(id int, text string) {
	b := []byte(`{"content":[{"type":"text","text":`)
	b = appendCJSONString(b, text)
	b = append(b, `}],"isError":false}`...)
	s.replyResult(id, string(b))
}

// sleepThenReply is the sleep behaviour: the reply is queued on the main
// task when the time is up, and the main task is free meanwhile.
func (s *session) sleepThenReply(id int, tool *Tool, args []boundArg) {
	secs := 0
	for _, a := range args {
		if a.name == "seconds" {
			secs, _ = a.value.(int)
		}
	}
	d := min(time.Duration(max(secs, 0))*time.Second, MaxSleep)
	text := tool.Text
	if text == "" {
		text = "done after " + strconv.Itoa(int(d/time.Second)) + " s"
	}
	if d == 0 {
		s.replyText(id, text)
		return
	}
	s.later(d, func() { s.schedule(func(context.Context) { s.replyText(id, text) }) })
}

// replyResult and replyError are McpServer::ReplyResult/ReplyError: plain
// concatenation, so an error message goes out unescaped and a quote in it
// yields invalid JSON, exactly as real boards produce. Both queue the send
// on the main task.
func (s *session) replyResult(id int, result string) {
	s.sendMCP(`{"jsonrpc":"2.0","id":` + strconv.Itoa(id) + `,"result":` + result + `}`)
}

func (s *session) replyError(id int, message string) {
	s.sendMCP(`{"jsonrpc":"2.0","id":` + strconv.Itoa(id) + `,"error":{"message":"` + message + `"}}`)
}

// sendMCP queues an MCP payload for sending. The envelope is built when the
// main task gets to it, so it carries the session id current at that time.
func (s *session) sendMCP(payload string) {
	s.schedule(func(context.Context) {
		s.sendText(s.b.envelope("mcp", payload))
	})
}

// echoResult answers an echo tool: the arguments it received, as a JSON
// object in one text item (so the bridge also gives them as
// structuredContent).
// formatText is the format behaviour's answer: text with each {name}
// replaced by the argument of that name (a property the tool declares).
func formatText(text string, args []boundArg) string {
	pairs := make([]string, 0, 2*len(args))
	for _, a := range args {
		pairs = append(pairs, "{"+a.name+"}", fmt.Sprint(a.value))
	}
	return strings.NewReplacer(pairs...).Replace(text)
}

func echoResult(args []boundArg, raw *jsonValue) string {
	var obj []byte
	if raw.isObject() {
		obj = appendCJSONValue(nil, raw)
	} else {
		obj = []byte{'{'}
		for i, a := range args {
			if i > 0 {
				obj = append(obj, ',')
			}
			obj = appendCJSONString(obj, a.name)
			obj = append(obj, ':')
			switch v := a.value.(type) {
			case bool:
				obj = strconv.AppendBool(obj, v)
			case int:
				obj = strconv.AppendInt(obj, int64(v), 10)
			case string:
				obj = appendCJSONString(obj, v)
			}
		}
		obj = append(obj, '}')
	}
	b := []byte(`{"content":[{"type":"text","text":`)
	b = appendCJSONString(b, string(obj))
	return string(append(b, `}],"isError":false}`...))
}
