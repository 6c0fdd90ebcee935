package mcpserver

// Prompts: two, both to help a person drive a board from a host that shows
// prompts as commands. "board" describes one board to the model (who it
// is, its state, its tools and their arguments, its last status) with the
// board's resource attached; "board_tool" asks the model to run one of its
// tools with arguments the person typed. Their arguments complete
// (complete.go): boards by alias or MAC, a board's tools, and a tool's
// argument names and values.

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

const (
	promptBoard     = "board"
	promptBoardTool = "board_tool"

	promptArgBoard = "board"
	promptArgTool  = "tool"
	promptArgArgs  = "arguments"

	// maxPromptArgBytes bounds an argument of a prompt we look at.
	maxPromptArgBytes = 4096
)

func (s *Server) addPrompts() {
	boardArg := &mcp.PromptArgument{Name: promptArgBoard, Title: "Board", Required: true,
		Description: "The board's alias or MAC (completes)."}
	s.mcp.AddPrompt(&mcp.Prompt{
		Name:  promptBoard,
		Title: "Drive a board",
		Description: "Tell the model about one board: who it is, its state, its tools with their arguments, and its last " +
			"status, with the board's state attached as a resource.",
		Arguments: []*mcp.PromptArgument{boardArg},
	}, s.promptBoard)
	s.mcp.AddPrompt(&mcp.Prompt{
		Name:        promptBoardTool,
		Title:       "Run a board tool",
		Description: "Ask the model to run one tool of one board with the arguments you give.",
		Arguments: []*mcp.PromptArgument{boardArg,
			{Name: promptArgTool, Title: "Tool", Required: true,
				Description: "The tool, by the board's name for it, e.g. self.audio_speaker.set_volume (completes)."},
			{Name: promptArgArgs, Title: "Arguments",
				Description: "The tool's arguments as name=value pairs separated by spaces (volume=40), or a JSON object " +
					"(names and values complete)."},
		},
	}, s.promptBoardTool)
}

// invalidParams is a -32602 error with a message for the person.
func invalidParams(format string, args ...any) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf(format, args...)}
}

// promptArg returns a prompt argument, bounded.
func promptArg(req *mcp.GetPromptRequest, name string) (string, error) {
	v := strings.TrimSpace(req.Params.Arguments[name])
	if len(v) > maxPromptArgBytes {
		return "", invalidParams("The argument %q is %d bytes, more than the %d the bridge reads.", name, len(v), maxPromptArgBytes)
	}
	return v, nil
}

// promptDevice resolves a prompt's board argument for the caller in ctx.
func (s *Server) promptDevice(ctx context.Context, req *mcp.GetPromptRequest) (*deviceView, error) {
	ref, err := promptArg(req, promptArgBoard)
	if err != nil {
		return nil, err
	}
	if ref == "" {
		return nil, invalidParams("The prompt needs the argument %q: a board's alias or MAC.", promptArgBoard)
	}
	v, _ := s.cat.Load().findDevice(ref)
	if v == nil || !s.mayView(ctx, v) {
		return nil, invalidParams("No board %q is connected. Its alias or MAC completes, and resources/list lists the boards.", ref)
	}
	return s.callersView(ctx, v), nil
}

// callHint says how the model calls tool e of board v.
func (s *Server) callHint(v *deviceView, e *entry) string {
	if s.opts.Compact {
		return fmt.Sprintf("%s with device %q and tool %q", toolCallDeviceTool, v.alias, e.tool.Name)
	}
	return e.name
}

func (s *Server) promptBoard(ctx context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
	v, err := s.promptDevice(ctx, req)
	if err != nil {
		return nil, err
	}
	st := s.boardState(v)
	data, err := json.Marshal(st)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "You can drive board %s through its tools below. ", boardLabel(v))
	fmt.Fprintf(&b, "It is %s", v.info.State)
	if v.info.Transport != "" {
		fmt.Fprintf(&b, ", connected over %s", v.info.Transport)
	}
	if fw := boardText(v.info.FirmwareVersion); fw != "" {
		fmt.Fprintf(&b, ", firmware %s", fw)
	}
	b.WriteString(".")
	if st.Note != "" {
		fmt.Fprintf(&b, " Note: %s.", st.Note)
	}
	if len(v.tools) == 0 {
		b.WriteString("\nIt offers no tools you may call.")
	} else {
		b.WriteString("\nIts tools:")
	}
	for _, e := range v.tools {
		fmt.Fprintf(&b, "\n- %s (the board's %s)", s.callHint(v, e), boardText(e.tool.Name))
		if d := boardText(e.tool.Description); d != "" {
			b.WriteString(": «" + d + "»")
		}
		if e.schema != nil && len(e.schema.Props()) > 0 {
			b.WriteString("; arguments: " + boardText(e.schema.ArgList()))
		}
		if e.confirm {
			b.WriteString("; the bridge asks the user to confirm before it runs")
		}
	}
	switch {
	case st.Status != nil && st.Status.Result != nil:
		fmt.Fprintf(&b, "\nIts last status (%s at %s): %s", StatusTool, st.Status.At.UTC().Format("2006-01-02 15:04:05Z"),
			boardText(string(st.Status.Result)))
	case v.findTool(StatusTool) != nil:
		fmt.Fprintf(&b, "\nIts status has not been read yet; %s reads it.", s.callHint(v, v.findTool(StatusTool)))
	}
	b.WriteString("\nThe board runs one tool at a time. A call that timed out may still have been carried out: " +
		"read the board's status before repeating it.")
	return &mcp.GetPromptResult{
		Description: "Board " + v.alias,
		Messages: []*mcp.PromptMessage{
			{Role: "user", Content: &mcp.TextContent{Text: b.String()}},
			{Role: "user", Content: &mcp.EmbeddedResource{Resource: &mcp.ResourceContents{
				URI: boardURI(v.info.DeviceID), MIMEType: boardMIME, Text: string(data)}}},
		},
	}, nil
}

func (s *Server) promptBoardTool(ctx context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
	v, err := s.promptDevice(ctx, req)
	if err != nil {
		return nil, err
	}
	e, err := s.promptTool(v, req)
	if err != nil {
		return nil, err
	}
	raw, err := promptArg(req, promptArgArgs)
	if err != nil {
		return nil, err
	}
	args, err := parseToolArgs(e, raw)
	if err != nil {
		return nil, err
	}
	if e.schema != nil {
		if _, bad := e.schema.Validate(args); bad != nil {
			return nil, invalidParams("%s", bad.Explain(e.tool.Name, e.schema))
		}
	}
	text := fmt.Sprintf("Run %s (the tool %s of board %s) with the arguments %s, and tell me what it returned.",
		s.callHint(v, e), boardText(e.tool.Name), boardLabel(v), args)
	if e.confirm {
		text += " The bridge asks me to confirm before it runs."
	}
	return &mcp.GetPromptResult{
		Description: fmt.Sprintf("Run %s on %s", boardText(e.tool.Name), v.alias),
		Messages:    []*mcp.PromptMessage{{Role: "user", Content: &mcp.TextContent{Text: text}}},
	}, nil
}

// promptTool resolves the tool argument among the tools of v.
func (s *Server) promptTool(v *deviceView, req *mcp.GetPromptRequest) (*entry, error) {
	name, err := promptArg(req, promptArgTool)
	if err != nil {
		return nil, err
	}
	if e := v.findTool(name); e != nil && name != "" {
		return e, nil
	}
	names := make([]string, len(v.tools))
	for i, e := range v.tools {
		names[i] = boardText(e.tool.Name)
	}
	if len(names) == 0 {
		return nil, invalidParams("Board %s offers no tools you may call.", boardLabel(v))
	}
	return nil, invalidParams("Board %s has no tool %q. Its tools are: %s.", boardLabel(v), name, strings.Join(names, ", "))
}

// parseToolArgs turns the arguments a person typed into a JSON object: a
// JSON object as it is, or name=value pairs (separated by spaces or
// commas) with each value read as its argument's type declares.
func parseToolArgs(e *entry, raw string) (json.RawMessage, error) {
	if raw == "" {
		return json.RawMessage(`{}`), nil
	}
	if strings.HasPrefix(raw, "{") {
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(raw), &m); err != nil {
			return nil, invalidParams("The arguments are not a JSON object: %v.", err)
		}
		return json.RawMessage(raw), nil
	}
	out := map[string]json.RawMessage{}
	for _, tok := range strings.FieldsFunc(raw, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' }) {
		name, val, ok := strings.Cut(tok, "=")
		if !ok || name == "" {
			return nil, invalidParams("The arguments %q are not name=value pairs (e.g. volume=40) nor a JSON object.", tok)
		}
		out[name] = typedValue(e, name, val)
	}
	data, err := json.Marshal(out)
	if err != nil {
		return nil, err
	}
	return data, nil
}

// typedValue reads val as the type tool e declares for its argument name:
// a number, a boolean or null where the schema takes one and val reads as
// one, else a string.
func typedValue(e *entry, name, val string) json.RawMessage {
	var types []string
	if e.schema != nil {
		if p := e.schema.Prop(name); p != nil {
			types = p.Types
		}
	}
	for _, t := range types {
		switch t {
		case "integer":
			if _, err := strconv.ParseInt(val, 10, 64); err == nil {
				return json.RawMessage(val)
			}
		case "number":
			if f, err := strconv.ParseFloat(val, 64); err == nil {
				return json.RawMessage(strconv.FormatFloat(f, 'f', -1, 64))
			}
		case "boolean":
			if b, err := strconv.ParseBool(val); err == nil {
				return json.RawMessage(strconv.FormatBool(b))
			}
		case "null":
			if val == "null" {
				return json.RawMessage(`null`)
			}
		}
	}
	data, _ := json.Marshal(strings.Trim(val, `"`))
	return data
}
