package flow

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Tool is what the engine needs to run one tool: its input schema and a
// function that executes it. It knows nothing about where the tool lives.
type Tool struct {
	Name        string
	Description string
	// InputSchema is the tool's JSON Schema for its arguments: an object
	// schema. Empty or null means "no arguments".
	InputSchema json.RawMessage
	// Confirm asks for an explicit yes before Execute runs; answering no
	// cancels the interaction with nothing executed.
	Confirm bool
	// ConfirmMessage is the confirmation question; by default "Run <name>
	// with <arguments>?".
	ConfirmMessage string
	// Execute runs the tool with arguments that passed validation (a JSON
	// object). It runs with the context of the Start or Respond call that
	// completed the interaction, cancelled early if the interaction is
	// cancelled meanwhile. A returned error ends the interaction in state
	// error; a Result with IsError ends it in state completed with the
	// result marked as an error (the tool ran and reported a failure).
	Execute func(ctx context.Context, args json.RawMessage) (Result, error)
}

// Result is what a tool returned.
type Result struct {
	Text    string
	Data    any
	IsError bool
}

// Problem is one thing wrong with the arguments, worded for the caller:
// what is wrong, and what to send instead with an example.
type Problem struct {
	Property   string `json:"property,omitempty"`
	Error      string `json:"error"`
	Suggestion string `json:"suggestion,omitempty"`
}

// Plan says what a call still needs before the tool may run: the
// prompts for missing or invalid properties, and the confirmation. It is
// what the standard MCP path (elicitation, MRTR) needs: elicit
// Plan.Asks() with ElicitSchema, apply the answers with Tool.Answer, and
// call Execute with Args once the plan is Ready.
type Plan struct {
	Tool string `json:"tool"`
	// Args holds the valid arguments so far, as a JSON object; invalid
	// values are left out (and asked for again).
	Args json.RawMessage `json:"args"`
	// Prompts asks for each property that is required and missing, or
	// given with an invalid value (then the prompt's Error and Suggestion
	// say why), in declaration order. With guided planning and a tool
	// without required properties, the optional ones are asked as well.
	Prompts []Prompt `json:"prompts,omitempty"`
	// Problems lists what was wrong with the given values.
	Problems []Problem `json:"problems,omitempty"`
	// Confirm is the confirmation prompt when the tool needs one and it
	// has not been given yet.
	Confirm *Prompt `json:"confirm,omitempty"`
	// Declined is set by Tool.Answer when the confirmation was refused:
	// the tool must not run.
	Declined bool `json:"declined,omitempty"`
}

// Ready reports whether the tool may run now with Args.
func (p *Plan) Ready() bool { return len(p.Prompts) == 0 && p.Confirm == nil && !p.Declined }

// Asks lists the prompts to put to the user now: the property prompts,
// then the confirmation. Ask the confirmation only once the properties are
// settled if the confirmation message should show the final arguments.
func (p *Plan) Asks() []Prompt {
	out := append([]Prompt(nil), p.Prompts...)
	if p.Confirm != nil {
		out = append(out, *p.Confirm)
	}
	return out
}

// Plan checks args (a JSON object; empty or null for none) against the
// tool's schema and says what is missing or invalid. guided also asks the
// optional properties when the tool has no required ones.
//
// Errors (*Error): CodeNotInteractive when the schema is unusable;
// CodeValidationFailed when prompting cannot fix the arguments (not an
// object, an argument given twice, an unknown argument, a constraint
// across arguments).
func (t *Tool) Plan(args json.RawMessage, guided bool) (*Plan, error) {
	si := loadSchema(t.InputSchema)
	if si.err != nil {
		return nil, errBadSchema(t.Name, si.err)
	}
	given, err := decodeArgs(t.Name, si, args)
	if err != nil {
		return nil, err
	}
	p := &Plan{Tool: t.Name}
	good := map[string]json.RawMessage{}
	for k, v := range given {
		good[k] = v
	}
	askOptional := guided && !si.hasRequired
	for _, prop := range si.props {
		raw, ok := given[prop.name]
		if ok {
			pr := prop.check(raw)
			if pr == nil {
				continue
			}
			delete(good, prop.name)
			p.Problems = append(p.Problems, Problem{Property: prop.name, Error: pr.err, Suggestion: pr.suggestion})
			q := prop.prompt()
			q.Error, q.Suggestion = pr.err, pr.suggestion
			p.Prompts = append(p.Prompts, q)
			continue
		}
		if prop.required || askOptional {
			p.Prompts = append(p.Prompts, prop.prompt())
		}
	}
	p.Args = encodeArgs(good)
	if len(p.Prompts) == 0 {
		if err := si.objectCheck(t.Name, good); err != nil {
			return nil, err
		}
	}
	if t.Confirm {
		c := confirmPrompt(t, p.Args)
		p.Confirm = &c
	}
	return p, nil
}

// Answer applies answers (from an elicitation form: property → value,
// ConfirmField → the confirmation) to a plan and plans again. A null or
// absent answer leaves a property out (the tool's default then applies).
// The returned plan is Ready when the tool may run; it is Declined when
// the confirmation was refused; otherwise ask its Prompts again (their
// Error and Suggestion say what was wrong).
func (t *Tool) Answer(p *Plan, answers map[string]json.RawMessage) (*Plan, error) {
	props := map[string]json.RawMessage{}
	var confirm json.RawMessage
	for k, v := range answers {
		if k == ConfirmField && p.Confirm != nil {
			if _, declared := loadSchema(t.InputSchema).by[k]; !declared {
				confirm = v
				continue
			}
		}
		props[k] = v
	}
	merged, err := Merge(p.Args, props)
	if err != nil {
		return nil, err
	}
	next, err := t.Plan(merged, false)
	if err != nil {
		return nil, err
	}
	if p.Confirm != nil && next.Confirm != nil && len(confirm) > 0 {
		yes, ok := parseConfirm(confirm)
		switch {
		case !ok:
			c := *next.Confirm
			c.Error = fmt.Sprintf("the confirmation must be true or false, but got %s", describeValue(confirm))
			c.Suggestion = "Answer true to run " + t.Name + ", or false to cancel."
			next.Confirm = &c
		case yes && len(next.Prompts) == 0:
			next.Confirm = nil
		case !yes:
			next.Declined = true
		}
	}
	return next, nil
}

// Merge returns args (a JSON object; empty or null for none) with answers
// applied: each answer sets its property, and a null answer removes it.
func Merge(args json.RawMessage, answers map[string]json.RawMessage) (json.RawMessage, error) {
	keys, vals, err := membersOrEmpty(args)
	if err != nil {
		return nil, newError(CodeValidationFailed, nil,
			"The arguments to merge into must be a JSON object like {\"volume\": 40}, but: %v. Pass {} when there are none.", err)
	}
	m := make(map[string]json.RawMessage, len(keys)+len(answers))
	for i, k := range keys {
		m[k] = vals[i]
	}
	for k, v := range answers {
		v = bytes.TrimSpace(v)
		if len(v) == 0 || string(v) == "null" {
			delete(m, k)
			continue
		}
		if !json.Valid(v) {
			return nil, newError(CodeValidationFailed, map[string]any{"property": k},
				"The answer for %q is not valid JSON. Send a JSON value, for example 40, true or \"text\".", k)
		}
		m[k] = compact(v)
	}
	return encodeArgs(m), nil
}

func membersOrEmpty(raw json.RawMessage) ([]string, []json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil, nil
	}
	return members(raw)
}

// decodeArgs splits the initial arguments into properties, refusing what
// prompting cannot fix.
func decodeArgs(tool string, si *schemaInfo, args json.RawMessage) (map[string]json.RawMessage, error) {
	keys, vals, err := membersOrEmpty(args)
	if err != nil {
		var msg string
		switch {
		case errors.Is(err, errDuplicate):
			msg = "an argument is given twice (" + strings.TrimPrefix(err.Error(), errDuplicate.Error()+": ") + "); give each argument once"
		case errors.Is(err, errNotObject):
			msg = "the arguments must be a JSON object of named values, got " + describeValue(args)
		default:
			msg = "the arguments are not valid JSON (" + err.Error() + ")"
		}
		return nil, newError(CodeValidationFailed, map[string]any{"tool": tool},
			"Invalid arguments for %s: %s. Send them as an object, for example %s, or {} to be asked for each one.", tool, msg, si.example(nil))
	}
	given := make(map[string]json.RawMessage, len(keys))
	var problems []Problem
	for i, k := range keys {
		if _, ok := si.by[k]; !ok && !si.extra {
			msg := fmt.Sprintf("unknown argument %q", k)
			if guess := si.closest(k); guess != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", guess)
			}
			problems = append(problems, Problem{Property: k, Error: msg,
				Suggestion: "Remove it; " + tool + " takes " + si.argList() + "."})
			continue
		}
		given[k] = compact(vals[i])
	}
	if len(problems) > 0 {
		return nil, problemsError(tool, si, problems, given)
	}
	return given, nil
}

// objectCheck runs jsonschema-go on the whole argument object, for the
// constraints that no single property carries (additionalProperties,
// allOf, dependentRequired...).
func (si *schemaInfo) objectCheck(tool string, args map[string]json.RawMessage) error {
	if si.root == nil {
		return nil
	}
	obj := map[string]any{}
	for k, raw := range args {
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			return newError(CodeValidationFailed, map[string]any{"tool": tool, "property": k},
				"The value for %q is not valid JSON. Send a JSON value such as %s.", k, si.example(nil))
		}
		obj[k] = v
	}
	if err := safeValidate(si.root, obj); err != nil {
		return problemsError(tool, si, []Problem{{Error: libraryReason(err),
			Suggestion: "Change the arguments so that together they satisfy the tool's schema."}}, args)
	}
	return nil
}

func problemsError(tool string, si *schemaInfo, problems []Problem, keep map[string]json.RawMessage) *Error {
	var b strings.Builder
	fmt.Fprintf(&b, "Invalid arguments for %s; nothing was run.", tool)
	for _, p := range problems {
		b.WriteString(" " + p.Error + ".")
	}
	fmt.Fprintf(&b, " %s takes %s. Start again with initialParams like %s.", tool, si.argList(), si.example(keep))
	return newError(CodeValidationFailed, map[string]any{"tool": tool, "problems": problems}, "%s", b.String())
}

func errBadSchema(tool string, why error) *Error {
	return newError(CodeNotInteractive, map[string]any{"tool": tool},
		"%s cannot be run as an interaction: its input schema cannot be turned into prompts (%v). Call it directly with tools/call and complete arguments.", tool, why)
}

// encodeArgs renders an argument map as a JSON object (keys sorted).
func encodeArgs(m map[string]json.RawMessage) json.RawMessage {
	if len(m) == 0 {
		return json.RawMessage("{}")
	}
	b, err := json.Marshal(m)
	if err != nil {
		return json.RawMessage("{}")
	}
	return b
}

// example renders an argument object that would pass: the values in keep,
// plus an example for each required property still missing.
func (si *schemaInfo) example(keep map[string]json.RawMessage) string {
	var parts []string
	for _, p := range si.props {
		v, ok := keep[p.name]
		if ok && p.check(v) != nil {
			ok = false
		}
		if !ok {
			if !p.required {
				continue
			}
			v = json.RawMessage(p.example())
		}
		k, _ := json.Marshal(p.name)
		parts = append(parts, string(k)+": "+string(v))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// argList describes the accepted arguments.
func (si *schemaInfo) argList() string {
	if len(si.props) == 0 {
		return "no arguments"
	}
	parts := make([]string, len(si.props))
	for i, p := range si.props {
		extra := "optional"
		switch {
		case p.required:
			extra = "required"
		case len(p.def) > 0:
			extra = "optional, default " + string(p.def)
		}
		parts[i] = fmt.Sprintf("%q (%s, %s)", p.name, p.describe, extra)
	}
	return strings.Join(parts, "; ")
}

// closest finds the declared property an unknown name probably meant.
func (si *schemaInfo) closest(name string) string {
	best, bestDist := "", 3
	names := make([]string, 0, len(si.props))
	for _, p := range si.props {
		names = append(names, p.name)
	}
	sort.Strings(names)
	for _, n := range names {
		if strings.EqualFold(n, name) {
			return n
		}
		if d := editDistance(strings.ToLower(n), strings.ToLower(name)); d < bestDist {
			best, bestDist = n, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 99
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// answer turns an answer to a property's prompt into the value to store:
// null or nothing takes the default, or skips an optional property (set
// is false); anything else must pass check.
func (p *property) answer(raw json.RawMessage) (v json.RawMessage, set bool, pr *problem) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		if p.allows("null") && len(p.def) == 0 && p.required {
			return json.RawMessage("null"), true, nil
		}
		switch {
		case len(p.def) > 0:
			return p.def, true, nil
		case !p.required:
			return nil, false, nil
		}
		return nil, false, p.fail(fmt.Sprintf("an answer for %q is required", p.name), "")
	}
	if pr := p.check(raw); pr != nil {
		return nil, false, pr
	}
	return compact(raw), true, nil
}

// parseConfirm reads a confirmation answer: true or false; null (no
// answer) is the default, false.
func parseConfirm(raw json.RawMessage) (yes, ok bool) {
	switch string(bytes.TrimSpace(raw)) {
	case "true":
		return true, true
	case "false", "null", "":
		return false, true
	}
	return false, false
}
