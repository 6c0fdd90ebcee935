// Package argcheck is the one argument validator of the bridge: it reads a
// board tool's input schema with github.com/google/jsonschema-go, checks a
// call's arguments with it before the board sees them, and explains what
// to change: the problem with each argument, the accepted arguments, and
// an example call that would pass. The device layer runs it for every
// caller (the control API, /mcp), and the interaction engine (flow/)
// builds its prompts and plans on its Schema and Prop, so there is one
// validation path and one wording.
package argcheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/devicebridge/devicebridge/internal/editdist"
)

// The firmware declares arguments of three types only (boolean, integer,
// string), with optional defaults and integer ranges, and no per-property
// descriptions. Board-side, a value of the wrong type counts as absent (so
// a default silently replaces it), integers are truncated, and undeclared
// arguments are ignored. The bridge is stricter on purpose: it checks every
// argument against the declared schema before the board sees the call and
// explains what to change, rather than letting a mistyped value turn into
// a default.
//
// jsonschema-go gives the verdict on each value and on the whole object.
// On top of it stand the firmware's rules, which no schema states:
// integers are whole int32 values (boards keep them in a C int), and
// arguments the schema does not declare are refused unless
// additionalProperties allows them (a board would ignore them silently).
// Strings declared with format date or date-time must be such (the
// library records format without checking it). Then the teaching layer
// words every refusal.

// int32 bounds: boards keep integer arguments in a C int.
const (
	minBoardInt = math.MinInt32
	maxBoardInt = math.MaxInt32
)

// Schema is a board tool's input schema, parsed for Validate.
type Schema struct {
	root   *jsonschema.Resolved
	props  []*Prop // declaration order
	byName map[string]*Prop
	// extra is true when the schema allows undeclared arguments
	// (additionalProperties true or a schema).
	extra bool
	// published is the schema sent upstream: the board's own, unless it
	// had to be repaired into an object schema.
	published json.RawMessage
	// unchecked is set when the board's schema could not be understood
	// (err says why); arguments are then passed through as long as they
	// form an object.
	unchecked bool
	err       error
	// wholeCheck: the schema says something about the object as a whole
	// that the checks of each argument do not cover (allOf, $defs, a
	// schema for additional properties, ...), so Validate also runs
	// jsonschema-go on the whole object. Without it that run would only
	// repeat the per-argument verdicts.
	wholeCheck bool
	// patternCost is Shape.PatternCost: it narrows how many bytes of
	// arguments are checked (argsLimit).
	patternCost int
}

// Bounds on checking one call, so that its time is bounded whatever the
// schema and the arguments (a board sends the one, a host the other).
const (
	// MaxArgsBytes bounds a call's arguments: a board takes at most 64 KiB
	// in one message, so longer arguments could never reach it.
	MaxArgsBytes = 64 << 10
	// patternBudget bounds bytes of arguments times Shape.PatternCost, the
	// work of matching them against the schema's regular expressions
	// (about 0.2 s at worst).
	patternBudget = 1 << 21
	// maxProblems bounds the problems described for one call: describing
	// one costs up to the size of the schema, and a caller needs the first
	// few to fix its call.
	maxProblems = 16
)

// bytesLimit is how many bytes of arguments (or of one value) may be
// checked against a schema whose patterns cost patternCost, with what
// bounds it, in words.
func bytesLimit(patternCost int) (int, string) {
	if patternCost > 0 && patternBudget/patternCost < MaxArgsBytes {
		return patternBudget / patternCost, "the tool's patterns can be checked against in bounded time"
	}
	return MaxArgsBytes, "a board takes in one message"
}

// perArgumentKeywords are the object-level keywords the per-argument
// checks cover completely (with additionalProperties a boolean).
var perArgumentKeywords = map[string]bool{
	"type": true, "properties": true, "required": true, "additionalProperties": true,
	"title": true, "description": true, "$schema": true, "$comment": true, "examples": true,
}

var emptyObjectSchema = json.RawMessage(`{"type":"object","properties":{}}`)

// Parse reads a board tool's inputSchema. It never fails: a schema it
// cannot understand (not an object schema, or one jsonschema-go cannot
// read or resolve) is replaced by an empty object schema with Validate
// reduced to "arguments form an object", and the reason is returned (and
// kept, see Err) so the caller can log it.
func Parse(raw json.RawMessage) (s *Schema, err error) {
	s = &Schema{byName: map[string]*Prop{}}
	fail := func(err error) (*Schema, error) {
		return &Schema{byName: map[string]*Prop{}, published: emptyObjectSchema, unchecked: true, err: err}, err
	}
	defer func() {
		// jsonschema-go is not fuzzed against every odd schema; a panic
		// there must not take the bridge down.
		if r := recover(); r != nil {
			s, err = fail(fmt.Errorf("the schema library failed on the input schema: %v", r))
		}
	}()
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		s.published = emptyObjectSchema
		return s, nil
	}
	// Measured before any library sees it: past the ceilings, resolving or
	// checking against it could take seconds per call, or fail.
	shape, err := Measure(raw)
	if err != nil {
		return fail(fmt.Errorf("input schema is not a JSON object: %w", err))
	}
	if why := shape.Exceeds(); why != "" {
		return fail(fmt.Errorf("input schema is not checked: %s", why))
	}
	s.patternCost = shape.PatternCost
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		return fail(fmt.Errorf("input schema is not a JSON object: %w", err))
	}
	repaired := false
	if t, ok := top["type"]; !ok {
		top["type"] = json.RawMessage(`"object"`)
		repaired = true
	} else if string(bytes.TrimSpace(t)) != `"object"` {
		return fail(fmt.Errorf("input schema has type %s, want \"object\"", bytes.TrimSpace(t)))
	}
	var order []string
	var propRaw []json.RawMessage
	if props, ok := top["properties"]; !ok {
		top["properties"] = json.RawMessage(`{}`)
		repaired = true
	} else if order, propRaw, err = orderedObject(props); err != nil {
		return fail(fmt.Errorf("input schema: properties: %w", err))
	}
	var js jsonschema.Schema
	if err := json.Unmarshal(raw, &js); err != nil {
		return fail(fmt.Errorf("input schema: jsonschema-go cannot read it: %w", err))
	}
	js.Type = "object" // a schema without type is taken as an object schema
	if s.root, err = js.Resolve(nil); err != nil {
		return fail(fmt.Errorf("input schema: jsonschema-go cannot resolve it: %w", err))
	}
	if ap, ok := top["additionalProperties"]; ok {
		s.extra = string(bytes.TrimSpace(ap)) != "false"
	}
	for i, name := range order {
		if sub := js.Properties[name]; sub != nil {
			p := newProp(name, sub)
			if sh, err := Measure(propRaw[i]); err == nil {
				p.patternCost = sh.PatternCost
			}
			s.add(p)
		}
	}
	for _, name := range js.Required {
		p := s.byName[name]
		if p == nil {
			// Required but undeclared: still enforce presence.
			p = newProp(name, &jsonschema.Schema{})
			s.add(p)
		}
		p.Required = true
	}
	for k, v := range top {
		if !perArgumentKeywords[k] {
			s.wholeCheck = true
		}
		if b := string(bytes.TrimSpace(v)); k == "additionalProperties" && b != "true" && b != "false" {
			s.wholeCheck = true
		}
	}
	for _, p := range s.props {
		if p.resolved == nil {
			s.wholeCheck = true // only the whole-object run checks it
		}
	}
	if repaired {
		s.published, _ = json.Marshal(top)
	} else {
		s.published = append(json.RawMessage(nil), raw...)
	}
	return s, nil
}

func (s *Schema) add(p *Prop) {
	s.props = append(s.props, p)
	s.byName[p.Name] = p
}

// Props lists the declared arguments, in declaration order, then those
// required without a declaration.
func (s *Schema) Props() []*Prop { return s.props }

// Prop returns the argument of that name, or nil.
func (s *Schema) Prop(name string) *Prop { return s.byName[name] }

// HasRequired reports whether any argument is required.
func (s *Schema) HasRequired() bool {
	for _, p := range s.props {
		if p.Required {
			return true
		}
	}
	return false
}

// Err says why the schema could not be understood (nil when it could).
func (s *Schema) Err() error { return s.err }

// orderedObject splits a JSON object into its keys, in document order, and
// raw values. Duplicate keys are an error.
func orderedObject(raw json.RawMessage) ([]string, []json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, nil, errNotObject
	}
	var keys []string
	var vals []json.RawMessage
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, err
		}
		key, _ := tok.(string)
		if seen[key] {
			return nil, nil, fmt.Errorf("%w: %q", errDuplicateKey, key)
		}
		seen[key] = true
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, nil, err
		}
		keys = append(keys, key)
		vals = append(vals, v)
	}
	if _, err := dec.Token(); err != nil {
		return nil, nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, nil, errors.New("unexpected data after the object")
	}
	return keys, vals, nil
}

var (
	errNotObject    = errors.New("not a JSON object")
	errDuplicateKey = errors.New("key given twice")
)

// Split reads a call's arguments (a JSON object; empty or null for none)
// into their names, in order, and raw values. When they do not form an
// object of distinct names, the problem says so in the caller's terms.
func Split(args json.RawMessage) ([]string, []json.RawMessage, *Problem) {
	args = bytes.TrimSpace(args)
	if len(args) == 0 || string(args) == "null" {
		return nil, nil, nil
	}
	keys, vals, err := orderedObject(args)
	switch {
	case err == nil:
		return keys, vals, nil
	case errors.Is(err, errDuplicateKey):
		return nil, nil, &Problem{Msg: "an argument is given twice (" +
			strings.TrimPrefix(err.Error(), errDuplicateKey.Error()+": ") + "); give each argument once"}
	case errors.Is(err, errNotObject):
		return nil, nil, &Problem{Msg: "arguments must be a JSON object of named values, got " + DescribeValue(args)}
	}
	return nil, nil, &Problem{Msg: "arguments are not valid JSON: " + err.Error()}
}

// Problem is one thing wrong with a call's arguments.
type Problem struct {
	// Arg names the argument at fault; empty for the arguments as a whole.
	Arg string
	// Msg says what is wrong.
	Msg string
	// Suggestion says what to send instead, with an example.
	Suggestion string
	// Fix is a corrected value (JSON) when the intent was clear.
	Fix string
}

// Invalid is the outcome of Schema.Validate.
type Invalid struct {
	Problems []Problem
	// Example is an argument object that would pass: valid values kept,
	// fixable ones fixed, missing required ones filled with an example,
	// unknown ones dropped.
	Example string
}

// Validate checks a call's arguments. args may be empty or null (no
// arguments). It returns the object to forward to the board (the
// arguments as given, or {} when there were none) when they are valid.
func (s *Schema) Validate(args json.RawMessage) (json.RawMessage, *Invalid) {
	args = bytes.TrimSpace(args)
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage(`{}`)
	}
	if limit, why := bytesLimit(s.patternCost); len(args) > limit {
		return nil, &Invalid{Problems: []Problem{{Msg: fmt.Sprintf("the arguments are %d bytes, more than the %d %s",
			len(args), limit, why), Suggestion: "Send shorter arguments."}}, Example: s.Example(nil)}
	}
	keys, vals, bad := Split(args)
	if bad != nil {
		return nil, &Invalid{Problems: []Problem{*bad}, Example: s.Example(nil)}
	}
	if s.unchecked {
		return args, nil
	}
	given := make(map[string]json.RawMessage, len(keys))
	var problems []Problem
	// Past maxProblems the rest is left unchecked: the call is refused
	// anyway.
	stopped := false
	full := func() bool {
		stopped = stopped || len(problems) >= maxProblems
		return stopped
	}
	for i, k := range keys {
		if full() {
			break
		}
		if pr := s.Unknown(k); pr != nil {
			problems = append(problems, *pr)
			continue
		}
		given[k] = vals[i]
	}
	for _, p := range s.props {
		if full() {
			break
		}
		raw, ok := given[p.Name]
		if !ok {
			if p.Required {
				problems = append(problems, Problem{Arg: p.Name,
					Msg: fmt.Sprintf("missing required argument %q (%s)", p.Name, p.Describe)})
			}
			continue
		}
		if pr := p.Check(raw); pr != nil {
			problems = append(problems, *pr)
		}
	}
	if stopped {
		problems = append(problems, Problem{Msg: fmt.Sprintf("the rest of the arguments were not checked after %d problems", maxProblems)})
	}
	if len(problems) == 0 {
		if !s.wholeCheck {
			return args, nil
		}
		pr := s.CheckObject(given)
		if pr == nil {
			return args, nil
		}
		problems = append(problems, *pr)
	}
	// Keep the valid values, apply the fixes; Example drops the rest.
	keep := map[string]json.RawMessage{}
	for name, raw := range given {
		keep[name] = raw
	}
	for _, pr := range problems {
		if pr.Fix != "" {
			keep[pr.Arg] = json.RawMessage(pr.Fix)
		}
	}
	return nil, &Invalid{Problems: problems, Example: s.Example(keep)}
}

// Unknown returns the problem with an argument of that name when the
// schema neither declares it nor allows undeclared ones (a board would
// ignore it), with the declared name it probably meant; nil when it is
// fine.
func (s *Schema) Unknown(name string) *Problem {
	if s.byName[name] != nil || s.extra || s.unchecked {
		return nil
	}
	msg := fmt.Sprintf("unknown argument %q", name)
	if guess := s.Closest(name); guess != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", guess)
	} else if len(s.props) == 0 {
		msg += "; this tool takes no arguments"
	} else {
		msg += "; this tool takes " + s.ArgList()
	}
	return &Problem{Arg: name, Msg: msg, Suggestion: "Remove it; this tool takes " + s.ArgList() + "."}
}

// CheckObject runs jsonschema-go on the whole argument object, for what
// no single argument carries (dependentRequired, allOf, $ref into the
// root...); nil when it passes. It assumes each argument passed Check.
func (s *Schema) CheckObject(args map[string]json.RawMessage) *Problem {
	if s.root == nil {
		return nil
	}
	obj := make(map[string]any, len(args))
	for k, raw := range args {
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			return &Problem{Arg: k, Msg: fmt.Sprintf("argument %q cannot be read (%v)", k, err),
				Suggestion: "Send a JSON value such as " + s.Example(nil) + "."}
		}
		obj[k] = v
	}
	if err := safeValidate(s.root, obj); err != nil {
		return &Problem{Msg: "the arguments together do not fit the tool's schema: " + libraryReason(err),
			Suggestion: "Change the arguments so that together they satisfy the tool's schema."}
	}
	return nil
}

// Example renders an argument object that passes, as far as single
// arguments go: the values in keep (argument name → JSON value) that pass
// Check, plus an example for every required argument still missing.
//
// The example is at most about MaxArgsBytes long: placeholders for long
// strings are cut to what is left of that, so that a schema asking for
// many long strings cannot make every refusal build megabytes.
func (s *Schema) Example(keep map[string]json.RawMessage) string {
	var parts []string
	left := MaxArgsBytes
	for _, p := range s.props {
		v, ok := keep[p.Name]
		if ok && p.Check(v) != nil {
			ok = false
		}
		k, _ := json.Marshal(p.Name)
		if !ok {
			if !p.Required {
				continue
			}
			v = json.RawMessage(p.example(max(left-len(k)-6, 0)))
		}
		part := string(k) + ": " + string(Compact(v))
		left -= len(part) + 2
		parts = append(parts, part)
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// ArgList describes the accepted arguments, e.g. `"volume" (an integer
// from 0 to 100, required)`.
func (s *Schema) ArgList() string {
	if len(s.props) == 0 {
		return "no arguments"
	}
	parts := make([]string, len(s.props))
	for i, p := range s.props {
		extra := "optional"
		if p.Required {
			extra = "required"
		} else if len(p.Default) > 0 {
			extra = "optional, default " + string(p.Default)
		}
		parts[i] = fmt.Sprintf("%q (%s, %s)", p.Name, p.Describe, extra)
	}
	return strings.Join(parts, "; ")
}

// Closest finds a declared argument an unknown name probably meant: the
// same name in another case, or one within a small edit distance.
func (s *Schema) Closest(name string) string {
	best, bestDist := "", 3
	for _, p := range s.props {
		if strings.EqualFold(p.Name, name) {
			return p.Name
		}
		if d := editDistance(strings.ToLower(p.Name), strings.ToLower(name)); d < bestDist {
			best, bestDist = p.Name, d
		}
	}
	return best
}

// editDistance is editdist.Distance for names a caller sent: longer ones
// are never close to anything, and the cost stays bounded.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return math.MaxInt
	}
	return editdist.Distance(a, b)
}

// Published is the schema to show callers: the board's own, unless it had
// to be repaired into an object schema.
func (s *Schema) Published() json.RawMessage { return s.published }

// Unchecked reports whether the board's schema could not be understood, in
// which case only "the arguments form an object" is checked.
func (s *Schema) Unchecked() bool { return s.unchecked }

// Explain renders the problems for a caller: what is wrong, what the tool
// takes, and arguments that would pass. tool names the tool as the caller
// knows it; s may be nil when the accepted arguments are not to be listed.
func (v *Invalid) Explain(tool string, s *Schema) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Invalid arguments for %s; nothing was sent to the board.\n", tool)
	for _, p := range v.Problems {
		b.WriteString("- ")
		b.WriteString(p.Msg)
		b.WriteString(".\n")
	}
	if s != nil {
		fmt.Fprintf(&b, "This tool takes %s.\n", s.ArgList())
	}
	fmt.Fprintf(&b, "Call it again with arguments like %s.", v.Example)
	return b.String()
}
