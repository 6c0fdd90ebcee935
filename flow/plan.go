package flow

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/devicebridge/devicebridge/internal/argcheck"
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
	// on <board> with volume=35?" (see ConfirmQuestion).
	ConfirmMessage string
	// Label is the tool as people know it in the confirmation question
	// (a board's own tool name, self.reboot); default Name.
	Label string
	// Board names the board the tool runs on in the confirmation
	// question; "" leaves it out.
	Board string
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
	if si.Err() != nil {
		return nil, errBadSchema(t.Name, si.Err())
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
	askOptional := guided && !si.HasRequired()
	for _, prop := range si.Props() {
		raw, ok := given[prop.Name]
		if ok {
			pr := check(prop, raw)
			if pr == nil {
				continue
			}
			delete(good, prop.Name)
			is := issue(pr)
			p.Problems = append(p.Problems, is)
			q := prompt(prop)
			q.Error, q.Suggestion = is.Error, is.Suggestion
			p.Prompts = append(p.Prompts, q)
			continue
		}
		if prop.Required || askOptional {
			p.Prompts = append(p.Prompts, prompt(prop))
		}
	}
	p.Args = encodeArgs(good)
	if len(p.Prompts) == 0 {
		if err := objectCheck(t.Name, si, good); err != nil {
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
			if loadSchema(t.InputSchema).Prop(k) == nil {
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
			c.Error = fmt.Sprintf("the confirmation must be true or false, but got %s", argcheck.DescribeValue(confirm))
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
	keys, vals, bad := argcheck.Split(args)
	if bad != nil {
		return nil, newError(CodeValidationFailed, nil,
			"The arguments to merge into must be a JSON object like {\"volume\": 40}, but: %s. Pass {} when there are none.", bad.Msg)
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
		m[k] = argcheck.Compact(v)
	}
	return encodeArgs(m), nil
}

// decodeArgs splits the initial arguments into properties, refusing what
// prompting cannot fix.
func decodeArgs(tool string, si *argcheck.Schema, args json.RawMessage) (map[string]json.RawMessage, error) {
	keys, vals, bad := argcheck.Split(args)
	if bad != nil {
		return nil, newError(CodeValidationFailed, map[string]any{"tool": tool},
			"Invalid arguments for %s: %s. Send them as an object, for example %s, or {} to be asked for each one.", tool, bad.Msg, si.Example(nil))
	}
	given := make(map[string]json.RawMessage, len(keys))
	var problems []Problem
	for i, k := range keys {
		if pr := si.Unknown(k); pr != nil {
			problems = append(problems, issue(pr))
			continue
		}
		given[k] = argcheck.Compact(vals[i])
	}
	if len(problems) > 0 {
		return nil, problemsError(tool, si, problems, given)
	}
	return given, nil
}

// objectCheck runs the schema's verdict on the whole argument object, for
// the constraints that no single property carries (allOf,
// dependentRequired...).
func objectCheck(tool string, si *argcheck.Schema, args map[string]json.RawMessage) error {
	if pr := si.CheckObject(args); pr != nil {
		return problemsError(tool, si, []Problem{issue(pr)}, args)
	}
	return nil
}

func problemsError(tool string, si *argcheck.Schema, problems []Problem, keep map[string]json.RawMessage) *Error {
	var b strings.Builder
	fmt.Fprintf(&b, "Invalid arguments for %s; nothing was run.", tool)
	for _, p := range problems {
		b.WriteString(" " + p.Error + ".")
	}
	fmt.Fprintf(&b, " %s takes %s. Start again with initialParams like %s.", tool, si.ArgList(), si.Example(keep))
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
	return argcheck.Compact(b) // Marshal writes & < > as \u0026…; shown to people and models
}

// answer turns an answer to p's prompt into the value to store:
// null or nothing takes the default, or skips an optional property (set
// is false); anything else must pass check.
func answer(p *argcheck.Prop, raw json.RawMessage) (v json.RawMessage, set bool, pr *argcheck.Problem) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		if p.Allows("null") && len(p.Default) == 0 && p.Required {
			return json.RawMessage("null"), true, nil
		}
		switch {
		case len(p.Default) > 0:
			return p.Default, true, nil
		case !p.Required:
			return nil, false, nil
		}
		return nil, false, p.Refuse(fmt.Sprintf("an answer for %q is required", p.Name), "")
	}
	if pr := check(p, raw); pr != nil {
		return nil, false, pr
	}
	return argcheck.Compact(raw), true, nil
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
