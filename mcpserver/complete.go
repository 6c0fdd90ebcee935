package mcpserver

// completion/complete: board names (aliases and MACs) for the resource
// template's {board} and the prompts' board argument, a board's tools for
// board_tool's tool, and a tool's argument names and values (enum values,
// the default, booleans, integers in a declared range) for board_tool's
// arguments. Every answer lists at most maxCompletions values, with the
// total and hasMore.

import (
	"context"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/devicebridge/devicebridge/internal/argcheck"
)

const (
	// maxCompletions is the most values one answer lists (the spec's).
	maxCompletions = 100
	// maxRangeScan bounds the integers of a declared range offered one by
	// one; a wider range offers its bounds and default.
	maxRangeScan = 10000
)

func (s *Server) complete(ctx context.Context, req *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
	p := req.Params
	if p == nil || p.Ref == nil {
		// go-sdk checks this first, unless MCPGODEBUG turns its check off.
		return nil, invalidParams("completion/complete needs ref and argument.")
	}
	value := p.Argument.Value
	if len(value) > maxPromptArgBytes {
		return completion(nil), nil
	}
	var ctxArgs map[string]string
	if p.Context != nil {
		ctxArgs = p.Context.Arguments
	}
	switch p.Ref.Type {
	case "ref/resource":
		// Another template (or a plain URI) has nothing to complete.
		if p.Ref.URI == boardTemplate && p.Argument.Name == boardTemplateVar {
			return completion(s.boardsFor(ctx, value)), nil
		}
		return completion(nil), nil
	case "ref/prompt":
		switch p.Ref.Name {
		case promptBoard, promptBoardTool:
		default:
			// The spec's error for an unknown prompt.
			return nil, invalidParams("No prompt %q: the bridge's prompts are %q and %q.", p.Ref.Name, promptBoard, promptBoardTool)
		}
		switch {
		case p.Argument.Name == promptArgBoard:
			return completion(s.boardsFor(ctx, value)), nil
		case p.Ref.Name == promptBoardTool && p.Argument.Name == promptArgTool:
			return completion(s.toolsFor(ctx, ctxArgs[promptArgBoard], value)), nil
		case p.Ref.Name == promptBoardTool && p.Argument.Name == promptArgArgs:
			return completion(s.argsFor(ctx, ctxArgs[promptArgBoard], ctxArgs[promptArgTool], value)), nil
		}
		return completion(nil), nil
	}
	return nil, invalidParams("Unknown reference type %q: completion takes ref/prompt or ref/resource.", p.Ref.Type)
}

// completion is the answer listing the first maxCompletions of values.
func completion(values []string) *mcp.CompleteResult {
	res := &mcp.CompleteResult{Completion: mcp.CompletionResultDetails{Values: []string{}, Total: len(values)}}
	if len(values) > maxCompletions {
		values, res.Completion.HasMore = values[:maxCompletions], true
	}
	res.Completion.Values = append(res.Completion.Values, values...)
	return res
}

// boardsFor lists, sorted, the boards the caller in ctx may see whose alias
// or MAC starts with prefix (ignoring case): the alias where it matches,
// else the MAC.
func (s *Server) boardsFor(ctx context.Context, prefix string) []string {
	prefix = strings.ToLower(strings.TrimSpace(prefix))
	var out []string
	for _, v := range s.cat.Load().devices {
		var hit string
		switch {
		case strings.HasPrefix(strings.ToLower(v.alias), prefix):
			hit = v.alias
		case strings.HasPrefix(strings.ToLower(v.info.DeviceID), prefix):
			hit = v.info.DeviceID
		default:
			continue
		}
		if s.mayView(ctx, v) {
			out = append(out, hit)
		}
	}
	slices.Sort(out)
	return out
}

// completionDevice resolves the board a completion's context names, as the
// caller may see it; nil when there is none.
func (s *Server) completionDevice(ctx context.Context, ref string) *deviceView {
	ref = strings.TrimSpace(ref)
	if ref == "" || len(ref) > maxPromptArgBytes {
		return nil
	}
	v, _ := s.cat.Load().findDevice(ref)
	if v == nil || !s.mayView(ctx, v) {
		return nil
	}
	return s.callersView(ctx, v)
}

// toolsFor lists the tools of the board named board whose name, with or
// without "self.", starts with prefix.
func (s *Server) toolsFor(ctx context.Context, board, prefix string) []string {
	v := s.completionDevice(ctx, board)
	if v == nil {
		return nil
	}
	prefix = strings.ToLower(strings.TrimSpace(prefix))
	var out []string
	for _, e := range v.tools {
		n := strings.ToLower(e.tool.Name)
		if strings.HasPrefix(n, prefix) || strings.HasPrefix(strings.TrimPrefix(n, "self."), prefix) {
			out = append(out, e.tool.Name)
		}
	}
	return out
}

// argsFor completes board_tool's arguments: typed so far value, as
// name=value pairs, its last pair is completed. A name completes to the
// arguments not given yet ("volume="), a value to what the argument's
// schema offers; each candidate is the whole argument, the pairs before
// kept.
func (s *Server) argsFor(ctx context.Context, board, tool, value string) []string {
	v := s.completionDevice(ctx, board)
	if v == nil || strings.HasPrefix(strings.TrimSpace(value), "{") {
		return nil
	}
	e := v.findTool(strings.TrimSpace(tool))
	if e == nil || e.schema == nil {
		return nil
	}
	cut := strings.LastIndexAny(value, " ,") + 1
	before, last := value[:cut], value[cut:]
	given := map[string]bool{}
	for _, tok := range strings.FieldsFunc(before, func(r rune) bool { return r == ' ' || r == ',' }) {
		name, _, _ := strings.Cut(tok, "=")
		given[name] = true
	}
	var out []string
	if name, partial, ok := strings.Cut(last, "="); ok {
		p := e.schema.Prop(name)
		if p == nil {
			return nil
		}
		for _, c := range valuesOf(p) {
			if strings.HasPrefix(strings.ToLower(c), strings.ToLower(partial)) {
				out = append(out, before+name+"="+c)
			}
		}
		return out
	}
	for _, p := range e.schema.Props() {
		if !given[p.Name] && strings.HasPrefix(strings.ToLower(p.Name), strings.ToLower(last)) {
			out = append(out, before+p.Name+"=")
		}
	}
	return out
}

// valuesOf lists the values a person may give argument p, as typed in
// name=value form: its default first, then its enum values, booleans, or
// the integers of its declared range (its bounds alone past maxRangeScan).
func valuesOf(p *argcheck.Prop) []string {
	var out []string
	seen := map[string]bool{}
	add := func(raw json.RawMessage) {
		var str string
		v := string(raw)
		if json.Unmarshal(raw, &str) == nil {
			v = str
		}
		if v != "" && !seen[v] && !strings.ContainsAny(v, " ,") {
			seen[v] = true
			out = append(out, v)
		}
	}
	if p.Default != nil {
		add(p.Default)
	}
	for _, e := range p.Enum {
		add(e)
	}
	if len(p.Enum) > 0 {
		return out
	}
	switch {
	case slices.Contains(p.Types, "boolean"):
		add(json.RawMessage("true"))
		add(json.RawMessage("false"))
	case slices.Contains(p.Types, "integer") && p.Min != nil && p.Max != nil:
		lo, hi := math.Ceil(*p.Min), math.Floor(*p.Max)
		if hi-lo+1 > maxRangeScan {
			add(json.RawMessage(strconv.FormatFloat(lo, 'f', -1, 64)))
			add(json.RawMessage(strconv.FormatFloat(hi, 'f', -1, 64)))
			break
		}
		for i := int64(lo); i <= int64(hi); i++ {
			add(json.RawMessage(strconv.FormatInt(i, 10)))
		}
	case p.Min != nil || p.Max != nil:
		for _, b := range []*float64{p.Min, p.Max} {
			if b != nil {
				add(json.RawMessage(strconv.FormatFloat(*b, 'f', -1, 64)))
			}
		}
	}
	return out
}
