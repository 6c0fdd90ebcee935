// Package argcheck checks a call's arguments against a board tool's input
// schema before the board sees them, and explains what to change: the
// problem with each argument, the accepted arguments, and an example call
// that would pass. The device layer runs it for every caller (the control
// API, /mcp), so there is one validation path and one wording.
package argcheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The firmware declares arguments of three types only (boolean, integer,
// string), with optional defaults and integer ranges, and no per-property
// descriptions. Board-side, a value of the wrong type counts as absent (so
// a default silently replaces it), integers are truncated, and undeclared
// arguments are ignored. The bridge is stricter on purpose: it checks every
// argument against the declared schema before the board sees the call and
// explains what to change, rather than letting a mistyped value turn into
// a default.

// int32 bounds: boards keep integer arguments in a C int.
const (
	minBoardInt = math.MinInt32
	maxBoardInt = math.MaxInt32
)

// Schema is a board tool's input schema, parsed for Invalid.
type Schema struct {
	props  []*propSchema // declaration order
	byName map[string]*propSchema
	// extra is true when the schema allows undeclared arguments
	// (additionalProperties true or a schema).
	extra bool
	// published is the schema sent upstream: the board's own, unless it
	// had to be repaired into an object schema.
	published json.RawMessage
	// unchecked is set when the board's schema could not be understood;
	// arguments are then passed through as long as they form an object.
	unchecked bool
}

// propSchema is one declared argument. Only the keywords the bridge checks
// are kept; others are published but not enforced.
type propSchema struct {
	name      string
	types     []string // empty means any type
	def       json.RawMessage
	min, max  *float64
	exclMin   *float64
	exclMax   *float64
	minLen    *int
	maxLen    *int
	enum      []json.RawMessage
	required  bool
	describes string // short human description, e.g. "integer 0..100"
}

var emptyObjectSchema = json.RawMessage(`{"type":"object","properties":{}}`)

// Parse reads a board tool's inputSchema. It never fails: a schema it
// cannot understand is replaced by an empty object schema with Invalid
// reduced to "arguments form an object", and the reason is returned so the
// caller can log it.
func Parse(raw json.RawMessage) (*Schema, error) {
	s := &Schema{byName: map[string]*propSchema{}}
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		s.published = emptyObjectSchema
		return s, nil
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		s.published, s.unchecked = emptyObjectSchema, true
		return s, fmt.Errorf("input schema is not a JSON object: %w", err)
	}
	repaired := false
	if t, ok := top["type"]; !ok {
		top["type"] = json.RawMessage(`"object"`)
		repaired = true
	} else if string(bytes.TrimSpace(t)) != `"object"` {
		s.published, s.unchecked = emptyObjectSchema, true
		return s, fmt.Errorf("input schema has type %s, want \"object\"", t)
	}
	if ap, ok := top["additionalProperties"]; ok {
		ap = bytes.TrimSpace(ap)
		s.extra = string(ap) != "false"
	}
	var required []string
	if r, ok := top["required"]; ok {
		if err := json.Unmarshal(r, &required); err != nil {
			s.published, s.unchecked = emptyObjectSchema, true
			return s, fmt.Errorf("input schema: required is not a list of names: %w", err)
		}
	}
	props, ok := top["properties"]
	if !ok {
		top["properties"] = json.RawMessage(`{}`)
		repaired = true
	} else {
		names, values, err := orderedObject(props)
		if err != nil {
			s.published, s.unchecked = emptyObjectSchema, true
			return s, fmt.Errorf("input schema: properties: %w", err)
		}
		for i, name := range names {
			p, err := parseProp(name, values[i])
			if err != nil {
				s.published, s.unchecked = emptyObjectSchema, true
				return s, fmt.Errorf("input schema: property %q: %w", name, err)
			}
			s.props = append(s.props, p)
			s.byName[name] = p
		}
	}
	for _, name := range required {
		if p, ok := s.byName[name]; ok {
			p.required = true
		} else {
			// Required but undeclared: still enforce presence.
			p := &propSchema{name: name, required: true}
			s.props = append(s.props, p)
			s.byName[name] = p
		}
	}
	for _, p := range s.props {
		p.describes = p.describe()
	}
	if repaired {
		s.published, _ = json.Marshal(top)
	} else {
		s.published = append(json.RawMessage(nil), raw...)
	}
	return s, nil
}

func parseProp(name string, raw json.RawMessage) (*propSchema, error) {
	var m struct {
		Type             json.RawMessage   `json:"type"`
		Default          json.RawMessage   `json:"default"`
		Minimum          *float64          `json:"minimum"`
		Maximum          *float64          `json:"maximum"`
		ExclusiveMinimum *float64          `json:"exclusiveMinimum"`
		ExclusiveMaximum *float64          `json:"exclusiveMaximum"`
		MinLength        *int              `json:"minLength"`
		MaxLength        *int              `json:"maxLength"`
		Enum             []json.RawMessage `json:"enum"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	p := &propSchema{name: name, min: m.Minimum, max: m.Maximum, exclMin: m.ExclusiveMinimum,
		exclMax: m.ExclusiveMaximum, minLen: m.MinLength, maxLen: m.MaxLength}
	if len(m.Default) > 0 {
		p.def = m.Default
	}
	for _, e := range m.Enum {
		p.enum = append(p.enum, compactJSON(e))
	}
	if t := bytes.TrimSpace(m.Type); len(t) > 0 {
		switch t[0] {
		case '"':
			var one string
			if err := json.Unmarshal(t, &one); err != nil {
				return nil, err
			}
			p.types = []string{one}
		case '[':
			if err := json.Unmarshal(t, &p.types); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("type must be a string or a list, got %s", t)
		}
	}
	return p, nil
}

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

func compactJSON(raw json.RawMessage) json.RawMessage {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return raw
	}
	return b.Bytes()
}

// describe renders the property for error messages, e.g. "integer from 0
// to 100" or "string, default \"light\"".
func (p *propSchema) describe() string {
	var b strings.Builder
	switch len(p.types) {
	case 0:
		b.WriteString("any JSON value")
	case 1:
		b.WriteString(article(p.types[0]) + " " + p.types[0])
	default:
		b.WriteString(strings.Join(p.types, " or "))
	}
	if lo, hi := p.bounds(); lo != nil && hi != nil {
		fmt.Fprintf(&b, " from %s to %s", fmtNum(*lo), fmtNum(*hi))
	} else if lo != nil {
		fmt.Fprintf(&b, " of at least %s", fmtNum(*lo))
	} else if hi != nil {
		fmt.Fprintf(&b, " of at most %s", fmtNum(*hi))
	}
	if len(p.enum) > 0 {
		vals := make([]string, len(p.enum))
		for i, e := range p.enum {
			vals[i] = string(e)
		}
		fmt.Fprintf(&b, ", one of %s", strings.Join(vals, ", "))
	}
	if p.minLen != nil || p.maxLen != nil {
		switch {
		case p.minLen != nil && p.maxLen != nil:
			fmt.Fprintf(&b, " of %d to %d characters", *p.minLen, *p.maxLen)
		case p.minLen != nil:
			fmt.Fprintf(&b, " of at least %d characters", *p.minLen)
		default:
			fmt.Fprintf(&b, " of at most %d characters", *p.maxLen)
		}
	}
	return b.String()
}

func article(typ string) string {
	if typ == "integer" || typ == "object" || typ == "array" {
		return "an"
	}
	return "a"
}

// bounds merges minimum/maximum with their exclusive forms into inclusive
// bounds where possible (exclusive bounds on integers become inclusive).
func (p *propSchema) bounds() (lo, hi *float64) {
	lo, hi = p.min, p.max
	if p.exclMin != nil && p.isInteger() {
		v := math.Floor(*p.exclMin) + 1
		lo = &v
	}
	if p.exclMax != nil && p.isInteger() {
		v := math.Ceil(*p.exclMax) - 1
		hi = &v
	}
	return lo, hi
}

func (p *propSchema) isInteger() bool {
	return len(p.types) == 1 && p.types[0] == "integer"
}

func (p *propSchema) allows(typ string) bool {
	if len(p.types) == 0 {
		return true
	}
	for _, t := range p.types {
		if t == typ || t == "number" && typ == "integer" {
			return true
		}
	}
	return false
}

func fmtNum(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// Problem is one thing wrong with a call's arguments.
type Problem struct {
	Arg string
	Msg string
}

// Invalid is the outcome of Schema.validate.
type Invalid struct {
	Problems []Problem
	// fixed is an example argument object that would pass: valid values
	// kept, fixable ones fixed, missing required ones filled with an
	// example, unknown ones dropped.
	Example string
}

// validate checks a call's arguments. args may be empty or null (no
// arguments). It returns the object to forward to the board (the
// arguments as given, or {} when there were none) when they are valid.
func (s *Schema) Validate(args json.RawMessage) (json.RawMessage, *Invalid) {
	args = bytes.TrimSpace(args)
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage(`{}`)
	}
	keys, vals, err := orderedObject(args)
	if err != nil {
		v := &Invalid{}
		switch {
		case errors.Is(err, errDuplicateKey):
			v.Problems = append(v.Problems, Problem{Msg: "an argument is given twice (" +
				strings.TrimPrefix(err.Error(), errDuplicateKey.Error()+": ") + "); give each argument once"})
		case errors.Is(err, errNotObject):
			v.Problems = append(v.Problems, Problem{Msg: "arguments must be a JSON object of named values, got " + describeValue(args)})
		default:
			v.Problems = append(v.Problems, Problem{Msg: "arguments are not valid JSON: " + err.Error()})
		}
		v.Example = s.example(nil)
		return nil, v
	}
	if s.unchecked {
		return args, nil
	}
	given := make(map[string]json.RawMessage, len(keys))
	var problems []Problem
	for i, k := range keys {
		if _, ok := s.byName[k]; ok {
			given[k] = vals[i]
			continue
		}
		if s.extra {
			continue
		}
		msg := fmt.Sprintf("unknown argument %q", k)
		if guess := s.closest(k); guess != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", guess)
		} else if len(s.props) == 0 {
			msg += "; this tool takes no arguments"
		} else {
			msg += "; this tool takes " + s.ArgList()
		}
		problems = append(problems, Problem{Arg: k, Msg: msg})
	}
	fixes := map[string]string{}
	for _, p := range s.props {
		raw, ok := given[p.name]
		if !ok {
			if p.required {
				problems = append(problems, Problem{Arg: p.name,
					Msg: fmt.Sprintf("missing required argument %q (%s)", p.name, p.describes)})
			}
			continue
		}
		if msg, fix := p.check(raw); msg != "" {
			problems = append(problems, Problem{Arg: p.name, Msg: msg})
			if fix != "" {
				fixes[p.name] = fix
			}
		}
	}
	if len(problems) == 0 {
		return args, nil
	}
	// Keep the valid values, apply the fixes.
	keep := map[string]string{}
	for name, raw := range given {
		keep[name] = string(compactJSON(raw))
	}
	for name, fix := range fixes {
		keep[name] = fix
	}
	for _, pr := range problems {
		if _, fixed := fixes[pr.Arg]; !fixed && pr.Arg != "" {
			delete(keep, pr.Arg)
		}
	}
	return nil, &Invalid{Problems: problems, Example: s.example(keep)}
}

// check validates one present argument; it returns a problem and, when the
// intent is clear, a corrected value (as JSON).
func (p *propSchema) check(raw json.RawMessage) (problem, fix string) {
	raw = bytes.TrimSpace(raw)
	kind := jsonKind(raw)
	wrongType := func() (string, string) {
		return fmt.Sprintf("argument %q must be %s, but got %s", p.name, p.describes, describeValue(raw)), p.coerce(raw, kind)
	}
	switch {
	case kind == "number" && p.allows("integer") && !p.allows("number"):
		f, err := strconv.ParseFloat(string(raw), 64)
		if err != nil {
			return wrongType()
		}
		if f != math.Trunc(f) {
			return fmt.Sprintf("argument %q must be a whole number (%s), but got %s; the board would cut it to %s",
				p.name, p.describes, raw, fmtNum(math.Trunc(f))), p.clampString(math.Round(f))
		}
		return p.checkRange(f)
	case kind == "number" && p.allows("number"):
		f, err := strconv.ParseFloat(string(raw), 64)
		if err != nil {
			return wrongType()
		}
		return p.checkRange(f)
	case !p.allows(kind):
		return wrongType()
	case kind == "string":
		var s string
		_ = json.Unmarshal(raw, &s)
		n := utf8.RuneCountInString(s)
		if p.minLen != nil && n < *p.minLen {
			return fmt.Sprintf("argument %q is too short: %d characters, at least %d needed", p.name, n, *p.minLen), ""
		}
		if p.maxLen != nil && n > *p.maxLen {
			return fmt.Sprintf("argument %q is too long: %d characters, at most %d allowed", p.name, n, *p.maxLen), ""
		}
	}
	if len(p.enum) > 0 {
		c := compactJSON(raw)
		for _, e := range p.enum {
			if bytes.Equal(c, e) {
				return "", ""
			}
		}
		return fmt.Sprintf("argument %q must be %s, but got %s", p.name, p.describes, describeValue(raw)), string(p.enum[0])
	}
	return "", ""
}

func (p *propSchema) checkRange(f float64) (string, string) {
	lo, hi := p.bounds()
	if p.isInteger() {
		if lo == nil || *lo < minBoardInt {
			v := float64(minBoardInt)
			lo = &v
		}
		if hi == nil || *hi > maxBoardInt {
			v := float64(maxBoardInt)
			hi = &v
		}
	}
	switch {
	case lo != nil && f < *lo:
		return fmt.Sprintf("argument %q is %s, below the minimum of %s (%s)", p.name, fmtNum(f), fmtNum(*lo), p.describes), p.clampString(f)
	case hi != nil && f > *hi:
		return fmt.Sprintf("argument %q is %s, above the maximum of %s (%s)", p.name, fmtNum(f), fmtNum(*hi), p.describes), p.clampString(f)
	case p.exclMin != nil && !p.isInteger() && f <= *p.exclMin:
		return fmt.Sprintf("argument %q must be greater than %s, but got %s", p.name, fmtNum(*p.exclMin), fmtNum(f)), ""
	case p.exclMax != nil && !p.isInteger() && f >= *p.exclMax:
		return fmt.Sprintf("argument %q must be less than %s, but got %s", p.name, fmtNum(*p.exclMax), fmtNum(f)), ""
	}
	return "", ""
}

// clampString brings f into the declared range and renders it.
func (p *propSchema) clampString(f float64) string {
	lo, hi := p.bounds()
	if lo != nil && f < *lo {
		f = *lo
	}
	if hi != nil && f > *hi {
		f = *hi
	}
	if p.isInteger() {
		f = math.Max(minBoardInt, math.Min(maxBoardInt, math.Trunc(f)))
	}
	return fmtNum(f)
}

// coerce guesses the intended value when the type is wrong but the intent
// is plain: "50" for an integer, "true" for a boolean, 1/0 for a boolean, a
// number for a string.
func (p *propSchema) coerce(raw json.RawMessage, kind string) string {
	switch {
	case kind == "string" && (p.allows("integer") || p.allows("number")):
		var s string
		_ = json.Unmarshal(raw, &s)
		f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
			return ""
		}
		if p.allows("number") {
			return p.clampString(f)
		}
		return p.clampString(math.Round(f))
	case kind == "string" && p.allows("boolean"):
		var s string
		_ = json.Unmarshal(raw, &s)
		switch strings.ToLower(strings.TrimSpace(s)) {
		case "true", "yes", "on", "1":
			return "true"
		case "false", "no", "off", "0":
			return "false"
		}
	case kind == "number" && p.allows("boolean"):
		switch string(raw) {
		case "1":
			return "true"
		case "0":
			return "false"
		}
	case (kind == "number" || kind == "boolean") && p.allows("string"):
		b, _ := json.Marshal(string(raw))
		return string(b)
	}
	return ""
}

// example renders an argument object that satisfies the schema, starting
// from keep (argument name → JSON value) and adding an example for every
// required argument still missing.
func (s *Schema) example(keep map[string]string) string {
	var parts []string
	for _, p := range s.props {
		v, ok := keep[p.name]
		if !ok {
			if !p.required {
				continue
			}
			v = p.exampleValue()
		}
		k, _ := json.Marshal(p.name)
		parts = append(parts, string(k)+": "+v)
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func (p *propSchema) exampleValue() string {
	if len(p.def) > 0 {
		return string(compactJSON(p.def))
	}
	if len(p.enum) > 0 {
		return string(p.enum[0])
	}
	typ := "string"
	if len(p.types) > 0 {
		typ = p.types[0]
	}
	switch typ {
	case "integer", "number":
		lo, hi := p.bounds()
		switch {
		case lo != nil && hi != nil:
			mid := *lo + (*hi-*lo)/2
			if typ == "integer" {
				mid = math.Trunc(mid)
			}
			return fmtNum(mid)
		case lo != nil:
			return fmtNum(*lo)
		case hi != nil:
			return fmtNum(math.Min(*hi, 0))
		}
		return "1"
	case "boolean":
		return "true"
	case "object":
		return "{}"
	case "array":
		return "[]"
	case "null":
		return "null"
	}
	// A placeholder of "...", stretched or cut to the length bounds (up
	// to a sane size), so that the example passes them.
	n := 3
	if p.minLen != nil && *p.minLen > n {
		n = min(*p.minLen, 256)
	}
	if p.maxLen != nil && *p.maxLen < n {
		n = max(*p.maxLen, 0)
	}
	return `"` + strings.Repeat(".", n) + `"`
}

// ArgList describes the accepted arguments, e.g. `volume (an integer from
// 0 to 100, required)`.
func (s *Schema) ArgList() string {
	if len(s.props) == 0 {
		return "no arguments"
	}
	parts := make([]string, len(s.props))
	for i, p := range s.props {
		extra := "optional"
		if p.required {
			extra = "required"
		} else if len(p.def) > 0 {
			extra = "optional, default " + string(compactJSON(p.def))
		}
		parts[i] = fmt.Sprintf("%q (%s, %s)", p.name, p.describes, extra)
	}
	return strings.Join(parts, "; ")
}

// closest finds a declared argument the unknown name probably meant: the
// same name in another case, or one within a small edit distance.
func (s *Schema) closest(name string) string {
	best, bestDist := "", 3
	for _, p := range s.props {
		if strings.EqualFold(p.name, name) {
			return p.name
		}
		if d := editDistance(strings.ToLower(p.name), strings.ToLower(name)); d < bestDist {
			best, bestDist = p.name, d
		}
	}
	return best
}

func editDistance(a, b string) int {
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

// jsonKind names the JSON type of a raw value: object, array, string,
// number, boolean or null.
func jsonKind(raw json.RawMessage) string {
	if len(raw) == 0 {
		return "null"
	}
	switch raw[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

// describeValue renders a value for an error message, e.g. `the string
// "loud"` or `the number 50.5`, cut to a readable length.
func describeValue(raw json.RawMessage) string {
	c := string(compactJSON(raw))
	if len(c) > 60 {
		c = c[:57] + "..."
	}
	switch jsonKind(raw) {
	case "null":
		return "null"
	case "boolean":
		return "the boolean " + c
	case "object":
		return "an object " + c
	case "array":
		return "a list " + c
	}
	return "the " + jsonKind(raw) + " " + c
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
