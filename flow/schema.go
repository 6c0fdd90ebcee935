package flow

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
)

// Boards keep integer arguments in a C int: integers outside int32 are
// refused, whatever the schema says.
const (
	minInt32 = math.MinInt32
	maxInt32 = math.MaxInt32
)

// maxValueBytes bounds one answer or argument value, so interactions (and
// stateless tokens) stay small.
const maxValueBytes = 16 << 10

// schemaInfo is a tool's input schema, parsed and resolved once by
// jsonschema-go, plus what the engine needs to prompt for its properties.
type schemaInfo struct {
	// err says why the schema cannot drive an interaction (not an object
	// schema, not valid JSON, rejected by jsonschema-go).
	err   error
	root  *jsonschema.Resolved
	props []*property // declaration order
	by    map[string]*property
	// extra is true when undeclared arguments are allowed
	// (additionalProperties present and not false).
	extra       bool
	hasRequired bool
}

// property is one declared (or required) argument.
type property struct {
	name     string
	schema   *jsonschema.Schema
	resolved *jsonschema.Resolved // nil when it cannot be resolved on its own ($ref into the root)
	types    []string             // declared types; empty means any
	typ      string               // the type prompts are built for: first non-null declared type, "" for any
	required bool
	def      json.RawMessage
	lo, hi   *float64 // inclusive numeric bounds; integers are clamped to int32
	exclLo   *float64 // exclusive bounds of non-integer numbers
	exclHi   *float64
	minLen   *int
	maxLen   *int
	pattern  string
	format   string
	enum     []json.RawMessage // compact JSON
	labels   []string          // one per enum value
	title    string
	descr    string
	describe string // e.g. "an integer from 0 to 100"
}

// schemaCache maps schema bytes to their parsed form, so each distinct
// schema is resolved once. It is bounded: when full it starts over.
var schemaCache = struct {
	sync.Mutex
	m map[string]*schemaInfo
}{m: map[string]*schemaInfo{}}

const schemaCacheMax = 2048

// loadSchema returns the parsed form of a tool's input schema.
func loadSchema(raw json.RawMessage) *schemaInfo {
	key := string(bytes.TrimSpace(raw))
	schemaCache.Lock()
	si, ok := schemaCache.m[key]
	schemaCache.Unlock()
	if ok {
		return si
	}
	si = parseSchema([]byte(key))
	schemaCache.Lock()
	if len(schemaCache.m) >= schemaCacheMax {
		schemaCache.m = map[string]*schemaInfo{}
	}
	schemaCache.m[key] = si
	schemaCache.Unlock()
	return si
}

func parseSchema(raw []byte) (si *schemaInfo) {
	si = &schemaInfo{by: map[string]*property{}}
	defer func() {
		// jsonschema-go is not fuzzed against every odd schema; a panic
		// there must not take the bridge down.
		if r := recover(); r != nil {
			si = &schemaInfo{err: fmt.Errorf("the schema library failed on it: %v", r)}
		}
	}()
	if len(raw) == 0 || string(raw) == "null" {
		raw = []byte(`{"type":"object","properties":{}}`)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		si.err = fmt.Errorf("it is not a JSON object: %v", err)
		return si
	}
	if t, ok := top["type"]; ok && string(bytes.TrimSpace(t)) != `"object"` {
		si.err = fmt.Errorf("its type is %s; an object schema is needed", bytes.TrimSpace(t))
		return si
	}
	var s jsonschema.Schema
	if err := json.Unmarshal(raw, &s); err != nil {
		si.err = fmt.Errorf("jsonschema-go cannot read it: %v", err)
		return si
	}
	s.Type = "object" // a schema without type is taken as an object schema
	root, err := s.Resolve(nil)
	if err != nil {
		si.err = fmt.Errorf("jsonschema-go cannot resolve it: %v", err)
		return si
	}
	si.root = root
	if ap, ok := top["additionalProperties"]; ok {
		si.extra = string(bytes.TrimSpace(ap)) != "false"
	}
	order := memberNames(top["properties"])
	seen := map[string]bool{}
	for _, name := range order {
		sub := s.Properties[name]
		if sub == nil || seen[name] {
			continue
		}
		seen[name] = true
		si.add(newProperty(name, sub))
	}
	for _, name := range s.Required {
		if p := si.by[name]; p != nil {
			p.required = true
		} else {
			// Required but undeclared: still asked for, any JSON value.
			p := newProperty(name, &jsonschema.Schema{})
			p.required = true
			si.add(p)
		}
		si.hasRequired = true
	}
	for _, p := range si.props {
		p.describe = p.describeSelf()
	}
	return si
}

func (si *schemaInfo) add(p *property) {
	si.props = append(si.props, p)
	si.by[p.name] = p
}

func newProperty(name string, s *jsonschema.Schema) *property {
	p := &property{name: name, schema: s, title: s.Title, descr: s.Description,
		minLen: s.MinLength, maxLen: s.MaxLength, pattern: s.Pattern, format: s.Format}
	if r, err := s.Resolve(nil); err == nil {
		p.resolved = r
	}
	switch {
	case s.Type != "":
		p.types = []string{s.Type}
	case len(s.Types) > 0:
		p.types = s.Types
	}
	for _, t := range p.types {
		if t != "null" {
			p.typ = t
			break
		}
	}
	if len(s.Default) > 0 {
		p.def = compact(s.Default)
	}
	for _, e := range s.Enum {
		b, err := json.Marshal(e)
		if err != nil {
			continue
		}
		p.enum = append(p.enum, b)
	}
	p.labels = enumLabels(s, len(p.enum))
	p.lo, p.hi = s.Minimum, s.Maximum
	if p.typ == "integer" {
		if s.ExclusiveMinimum != nil {
			p.lo = maxPtr(p.lo, math.Floor(*s.ExclusiveMinimum)+1)
		}
		if s.ExclusiveMaximum != nil {
			p.hi = minPtr(p.hi, math.Ceil(*s.ExclusiveMaximum)-1)
		}
		p.lo = maxPtr(p.lo, minInt32)
		p.hi = minPtr(p.hi, maxInt32)
	} else {
		p.exclLo, p.exclHi = s.ExclusiveMinimum, s.ExclusiveMaximum
	}
	return p
}

// enumLabels reads human labels for enum values from the non-standard but
// common "enumNames" keyword; the values themselves otherwise.
func enumLabels(s *jsonschema.Schema, n int) []string {
	labels := make([]string, 0, n)
	names, _ := s.Extra["enumNames"].([]any)
	for i, e := range s.Enum {
		if i < len(names) {
			if l, ok := names[i].(string); ok && len(names) == len(s.Enum) {
				labels = append(labels, l)
				continue
			}
		}
		if str, ok := e.(string); ok {
			labels = append(labels, str)
		} else {
			b, _ := json.Marshal(e)
			labels = append(labels, string(b))
		}
	}
	return labels
}

func maxPtr(p *float64, v float64) *float64 {
	if p != nil && *p >= v {
		return p
	}
	return &v
}

func minPtr(p *float64, v float64) *float64 {
	if p != nil && *p <= v {
		return p
	}
	return &v
}

// memberNames lists the keys of a JSON object in document order (nil if
// raw is not an object).
func memberNames(raw json.RawMessage) []string {
	names, _, err := members(raw)
	if err != nil {
		return nil
	}
	return names
}

var (
	errNotObject = errors.New("not a JSON object")
	errDuplicate = errors.New("key given twice")
)

// members splits a JSON object into its keys, in document order, and raw
// values. Duplicate keys are an error (which value would count is unclear).
func members(raw json.RawMessage) ([]string, []json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
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
			return nil, nil, fmt.Errorf("%w: %q", errDuplicate, key)
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
	if _, err := dec.Token(); err == nil {
		return nil, nil, errors.New("unexpected data after the object")
	}
	return keys, vals, nil
}

func compact(raw json.RawMessage) json.RawMessage {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return append(json.RawMessage(nil), raw...)
	}
	return b.Bytes()
}

func fmtNum(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

func article(word string) string {
	if word != "" && strings.ContainsRune("aeiou", rune(word[0])) {
		return "an"
	}
	return "a"
}

// label is how prompts and messages name the property.
func (p *property) label() string {
	if p.title != "" {
		return p.title
	}
	return p.name
}

// describeSelf renders what the property accepts, e.g. "an integer from 0
// to 100" or "a string of at most 20 characters".
func (p *property) describeSelf() string {
	var b strings.Builder
	switch {
	case len(p.enum) > 0:
		b.WriteString("one of " + p.choiceList())
		return b.String()
	case p.typ == "":
		b.WriteString("any JSON value")
	case p.typ == "boolean":
		b.WriteString("true or false")
	case p.format == "date" && p.typ == "string":
		b.WriteString("a date (YYYY-MM-DD)")
	case p.format == "date-time" && p.typ == "string":
		b.WriteString("a date and time (RFC 3339, e.g. 2025-01-31T18:30:00Z)")
	case p.typ == "integer":
		b.WriteString("a whole number")
	default:
		b.WriteString(article(p.typ) + " " + p.typ)
	}
	if p.typ == "integer" || p.typ == "number" {
		lo, hi := p.lo, p.hi
		switch {
		case lo != nil && hi != nil && (p.typ != "integer" || *lo > minInt32 || *hi < maxInt32):
			fmt.Fprintf(&b, " from %s to %s", fmtNum(*lo), fmtNum(*hi))
		case lo != nil && p.typ != "integer":
			fmt.Fprintf(&b, " of at least %s", fmtNum(*lo))
		case hi != nil && p.typ != "integer":
			fmt.Fprintf(&b, " of at most %s", fmtNum(*hi))
		}
		if p.exclLo != nil {
			fmt.Fprintf(&b, " greater than %s", fmtNum(*p.exclLo))
		}
		if p.exclHi != nil {
			fmt.Fprintf(&b, " less than %s", fmtNum(*p.exclHi))
		}
	}
	if p.typ == "string" {
		switch {
		case p.minLen != nil && p.maxLen != nil:
			fmt.Fprintf(&b, " of %d to %d characters", *p.minLen, *p.maxLen)
		case p.minLen != nil:
			fmt.Fprintf(&b, " of at least %d characters", *p.minLen)
		case p.maxLen != nil:
			fmt.Fprintf(&b, " of at most %d characters", *p.maxLen)
		}
		if p.pattern != "" {
			fmt.Fprintf(&b, " matching %s", p.pattern)
		}
	}
	return b.String()
}

func (p *property) choiceList() string {
	parts := make([]string, len(p.enum))
	for i, e := range p.enum {
		parts[i] = string(e)
	}
	return strings.Join(parts, ", ")
}

// problem is what is wrong with one value, in words for the caller.
type problem struct {
	prop       string
	err        string // what is wrong
	suggestion string // what to send instead, with an example
}

// check validates one present value of the property, with jsonschema-go
// for the verdict and the firmware's rules on top (integers are whole and
// int32; a value of the wrong type is refused rather than treated as
// absent). It returns nil when the value is good.
func (p *property) check(raw json.RawMessage) *problem {
	raw = bytes.TrimSpace(raw)
	if len(raw) > maxValueBytes {
		return p.fail(fmt.Sprintf("the value for %q is %d bytes long, more than the %d allowed", p.name, len(raw), maxValueBytes), "")
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return p.fail(fmt.Sprintf("the value for %q is not valid JSON (%v)", p.name, err), "")
	}
	if pr := p.ownCheck(raw, v); pr != nil {
		return pr
	}
	if p.resolved != nil {
		if err := safeValidate(p.resolved, v); err != nil {
			return p.fail(fmt.Sprintf("%s is not accepted for %q: %s", describeValue(raw), p.name, libraryReason(err)), "")
		}
	}
	return nil
}

// fail builds a problem whose suggestion says what the property accepts
// and gives an example (fix when the intent was clear).
func (p *property) fail(msg, fix string) *problem {
	ex := fix
	if ex == "" {
		ex = p.example()
	}
	return &problem{prop: p.name, err: msg,
		suggestion: fmt.Sprintf("Send %s for %q, for example %s.", p.describe, p.name, ex)}
}

func (p *property) ownCheck(raw json.RawMessage, v any) *problem {
	kind := jsonKind(v)
	if x, ok := v.(float64); ok && kind == "number" && p.allows("integer") && !p.allows("number") {
		return p.fail(fmt.Sprintf("%q must be a whole number, but got %s (a board would cut it to %s)",
			p.name, fmtNum(x), fmtNum(math.Trunc(x))), p.clamp(math.Round(x)))
	}
	if !p.allows(kind) {
		msg := fmt.Sprintf("%q must be %s, but got %s", p.name, p.describe, describeValue(raw))
		if len(p.def) > 0 {
			msg += fmt.Sprintf("; a board treats a value of the wrong type as absent and would silently use the default %s instead, so it is refused", p.def)
		}
		return p.fail(msg, p.coerce(v))
	}
	switch x := v.(type) {
	case float64:
		if p.typ == "integer" || p.typ == "number" {
			if p.lo != nil && x < *p.lo {
				return p.fail(fmt.Sprintf("%q is %s, below the minimum of %s", p.name, fmtNum(x), fmtNum(*p.lo)), p.clamp(x))
			}
			if p.hi != nil && x > *p.hi {
				return p.fail(fmt.Sprintf("%q is %s, above the maximum of %s", p.name, fmtNum(x), fmtNum(*p.hi)), p.clamp(x))
			}
		}
	case string:
		n := utf8.RuneCountInString(x)
		if p.minLen != nil && n < *p.minLen {
			return p.fail(fmt.Sprintf("%q is too short: %d characters, at least %d needed", p.name, n, *p.minLen), "")
		}
		if p.maxLen != nil && n > *p.maxLen {
			return p.fail(fmt.Sprintf("%q is too long: %d characters, at most %d allowed", p.name, n, *p.maxLen), "")
		}
		// jsonschema-go records "format" but does not check it; dates are
		// checked here because a prompt of type date promises it.
		switch p.format {
		case "date":
			if _, err := time.Parse("2006-01-02", x); err != nil {
				return p.fail(fmt.Sprintf("%q must be a date as YYYY-MM-DD, but got %q", p.name, x), "")
			}
		case "date-time":
			if _, err := time.Parse(time.RFC3339, x); err != nil {
				return p.fail(fmt.Sprintf("%q must be a date and time in RFC 3339 form, but got %q", p.name, x), "")
			}
		}
	}
	if len(p.enum) > 0 {
		c := compact(raw)
		for _, e := range p.enum {
			if bytes.Equal(c, e) {
				return nil
			}
		}
		return p.fail(fmt.Sprintf("%q must be one of %s, but got %s", p.name, p.choiceList(), describeValue(raw)), string(p.enum[0]))
	}
	return nil
}

func (p *property) allows(kind string) bool {
	if len(p.types) == 0 {
		return true
	}
	for _, t := range p.types {
		if t == kind || t == "number" && kind == "integer" {
			return true
		}
	}
	return false
}

// clamp brings f into the property's range and renders it.
func (p *property) clamp(f float64) string {
	if p.lo != nil && f < *p.lo {
		f = *p.lo
	}
	if p.hi != nil && f > *p.hi {
		f = *p.hi
	}
	if p.typ == "integer" {
		f = math.Trunc(f)
	}
	return fmtNum(f)
}

// coerce guesses the intended value when the type is wrong but the intent
// is plain ("50" for an integer, "yes" for a boolean); "" when unclear.
func (p *property) coerce(v any) string {
	switch x := v.(type) {
	case string:
		s := strings.TrimSpace(x)
		if p.typ == "integer" || p.typ == "number" {
			f, err := strconv.ParseFloat(s, 64)
			if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
				return ""
			}
			if p.typ == "integer" {
				f = math.Round(f)
			}
			return p.clamp(f)
		}
		if p.typ == "boolean" {
			switch strings.ToLower(s) {
			case "true", "yes", "on", "1":
				return "true"
			case "false", "no", "off", "0":
				return "false"
			}
		}
	case float64:
		if p.typ == "boolean" && (x == 0 || x == 1) {
			return strconv.FormatBool(x == 1)
		}
		if p.typ == "string" && len(p.enum) == 0 {
			b, _ := json.Marshal(fmtNum(x))
			return string(b)
		}
	case bool:
		if p.typ == "string" && len(p.enum) == 0 {
			return strconv.Quote(strconv.FormatBool(x))
		}
	}
	return ""
}

// example renders a value the property accepts.
func (p *property) example() string {
	if len(p.def) > 0 {
		return string(p.def)
	}
	if len(p.enum) > 0 {
		return string(p.enum[0])
	}
	switch p.typ {
	case "integer", "number":
		switch {
		case p.lo != nil && p.hi != nil:
			mid := *p.lo + (*p.hi-*p.lo)/2
			if p.typ == "integer" {
				mid = math.Trunc(mid)
			}
			return fmtNum(mid)
		case p.lo != nil:
			return fmtNum(math.Max(*p.lo, 0))
		case p.hi != nil:
			return fmtNum(math.Min(*p.hi, 0))
		case p.exclLo != nil:
			return fmtNum(*p.exclLo + 1)
		case p.exclHi != nil:
			return fmtNum(*p.exclHi - 1)
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
	case "string":
		switch p.format {
		case "date":
			return `"2025-01-31"`
		case "date-time":
			return `"2025-01-31T18:30:00Z"`
		}
		n := 1
		if p.minLen != nil && *p.minLen > 1 {
			n = min(*p.minLen, 64)
		}
		return strconv.Quote(strings.Repeat("x", n))
	}
	return `"..."`
}

// safeValidate runs jsonschema-go's validation, turning a panic into an
// error.
func safeValidate(r *jsonschema.Resolved, v any) (err error) {
	defer func() {
		if x := recover(); x != nil {
			err = fmt.Errorf("the schema library failed: %v", x)
		}
	}()
	return r.Validate(v)
}

// libraryReason strips jsonschema-go's "validating ...: " prefixes, which
// name schema internals rather than the problem.
func libraryReason(err error) string {
	msg := err.Error()
	for {
		i := strings.Index(msg, "validating ")
		if i != 0 {
			break
		}
		j := strings.Index(msg, ": ")
		if j < 0 {
			break
		}
		msg = msg[j+2:]
	}
	if len(msg) > 300 {
		msg = msg[:297] + "..."
	}
	return msg
}

// jsonKind names the JSON type of a decoded value, with whole numbers as
// "integer" as JSON Schema does.
func jsonKind(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case float64:
		if x == math.Trunc(x) && !math.IsInf(x, 0) {
			return "integer"
		}
		return "number"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return "unknown"
}

// describeValue renders a value for a message, e.g. `the string "loud"`.
func describeValue(raw json.RawMessage) string {
	c := string(compact(raw))
	if len(c) > 60 {
		c = c[:57] + "..."
	}
	var v any
	_ = json.Unmarshal(raw, &v)
	switch k := jsonKind(v); k {
	case "null":
		return "null"
	case "integer", "number":
		return "the number " + c
	case "array":
		return "the list " + c
	default:
		return "the " + k + " " + c
	}
}
