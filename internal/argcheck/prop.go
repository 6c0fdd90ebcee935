package argcheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
)

// Prop is one declared (or required but undeclared) argument: what the
// teaching layer and prompt builders need to know about it, read from the
// property's schema. Treat it as read-only.
type Prop struct {
	Name        string
	Title       string
	Description string
	// Types are the declared types; empty means any JSON value. Type is
	// the first one that is not "null" ("" for any).
	Types []string
	Type  string
	// Required is set when the object schema lists the argument in
	// required.
	Required bool
	// Default is the declared default, compact JSON (nil when none, or
	// when the declared one is prose: see ProseDefault).
	Default json.RawMessage
	// IgnoredDefault is a declared default that is prose about the
	// argument rather than a value for it (ProseDefault), compact JSON:
	// it is not used as a default or an example.
	IgnoredDefault json.RawMessage
	// Min and Max are the declared numeric bounds, inclusive. For
	// integers, exclusive bounds are turned into inclusive ones and the
	// bounds are narrowed to int32 (a board keeps integers in a C int).
	// A side the schema does not declare is nil, though integers are
	// still held to int32 there.
	Min, Max *float64
	// ExclMin and ExclMax are the exclusive bounds of non-integer numbers.
	ExclMin, ExclMax *float64
	MinLen, MaxLen   *int
	Pattern          string
	Format           string
	// Enum lists the allowed values as compact JSON; Labels names each
	// (from the common "enumNames" keyword, the title of a oneOf/anyOf
	// member, or the value itself). EnumStyle says how the schema wrote
	// them: EnumPlain, EnumNames, EnumOneOf or EnumAnyOf.
	Enum      []json.RawMessage
	Labels    []string
	EnumStyle EnumStyle
	// Items is what each element of an array argument accepts (nil for
	// other types, or an array schema without items); MinItems and
	// MaxItems bound how many elements it takes.
	Items              *Prop
	MinItems, MaxItems *int
	// Describe says what the argument accepts, e.g. "an integer from 0
	// to 100".
	Describe string

	// resolved validates one value of the property; nil when the
	// property cannot be resolved on its own, in which case the
	// object-level verdict covers it.
	resolved *jsonschema.Resolved
	// patternCost is the Shape.PatternCost of the property's schema.
	patternCost int
}

func newProp(name string, s *jsonschema.Schema) *Prop {
	p := &Prop{Name: name, Title: s.Title, Description: s.Description,
		MinLen: s.MinLength, MaxLen: s.MaxLength, Pattern: s.Pattern, Format: s.Format}
	if r, err := s.Resolve(nil); err == nil {
		p.resolved = r
	}
	switch {
	case s.Type != "":
		p.Types = []string{s.Type}
	case len(s.Types) > 0:
		p.Types = s.Types
	}
	for _, t := range p.Types {
		if t != "null" {
			p.Type = t
			break
		}
	}
	if len(s.Default) > 0 {
		p.Default = Compact(s.Default)
		if ProseDefault(name, s.Description, s.Format, p.Default) {
			p.Default, p.IgnoredDefault = nil, p.Default
		}
	}
	for _, e := range s.Enum {
		if b, err := json.Marshal(e); err == nil {
			p.Enum = append(p.Enum, Compact(b)) // Marshal writes & < > as \u0026…
		}
	}
	p.Labels = enumLabels(s, p.Enum)
	if names, _ := s.Extra["enumNames"].([]any); len(p.Enum) > 0 && len(names) == len(p.Enum) {
		p.EnumStyle = EnumNames
	}
	if len(s.Enum) == 0 {
		p.Enum, p.Labels, p.EnumStyle = constChoices(s)
	}
	if p.Type == "array" && s.Items != nil {
		p.Items = newProp(name, s.Items)
		p.MinItems, p.MaxItems = s.MinItems, s.MaxItems
	}
	p.Min, p.Max = s.Minimum, s.Maximum
	if p.intOnly() {
		if s.ExclusiveMinimum != nil {
			p.Min = maxPtr(p.Min, math.Floor(*s.ExclusiveMinimum)+1)
		}
		if s.ExclusiveMaximum != nil {
			p.Max = minPtr(p.Max, math.Ceil(*s.ExclusiveMaximum)-1)
		}
		if p.Min != nil {
			p.Min = maxPtr(p.Min, minBoardInt)
		}
		if p.Max != nil {
			p.Max = minPtr(p.Max, maxBoardInt)
		}
	} else {
		p.ExclMin, p.ExclMax = s.ExclusiveMinimum, s.ExclusiveMaximum
	}
	p.Describe = p.describe()
	return p
}

// EnumStyle is how a schema lists the values an argument may take.
type EnumStyle string

// The ways a schema lists allowed values.
const (
	// EnumPlain is "enum" alone: the values are their own labels.
	EnumPlain EnumStyle = ""
	// EnumNames is "enum" with the common (non-standard) "enumNames".
	EnumNames EnumStyle = "enumNames"
	// EnumOneOf and EnumAnyOf are "oneOf" or "anyOf" whose every member
	// is a "const" (with its "title"): MCP's titled single- and
	// multi-select choices.
	EnumOneOf EnumStyle = "oneOf"
	EnumAnyOf EnumStyle = "anyOf"
)

// constChoices reads a oneOf or anyOf whose members are all consts as the
// values they allow, each labelled by its title (or itself).
func constChoices(s *jsonschema.Schema) ([]json.RawMessage, []string, EnumStyle) {
	members, style := s.OneOf, EnumOneOf
	if len(members) == 0 {
		members, style = s.AnyOf, EnumAnyOf
	}
	if len(members) == 0 {
		return nil, nil, EnumPlain
	}
	values := make([]json.RawMessage, 0, len(members))
	labels := make([]string, 0, len(members))
	for _, m := range members {
		if m == nil || m.Const == nil {
			return nil, nil, EnumPlain
		}
		b, err := json.Marshal(*m.Const)
		if err != nil {
			return nil, nil, EnumPlain
		}
		label := m.Title
		if label == "" {
			label = string(b)
			if str, ok := (*m.Const).(string); ok {
				label = str
			}
		}
		values = append(values, b)
		labels = append(labels, label)
	}
	return values, labels, style
}

// enumLabels reads human labels for enum values from the non-standard but
// common "enumNames" keyword; the values themselves otherwise.
func enumLabels(s *jsonschema.Schema, enum []json.RawMessage) []string {
	names, _ := s.Extra["enumNames"].([]any)
	labels := make([]string, len(enum))
	for i, e := range enum {
		if len(names) == len(enum) {
			if l, ok := names[i].(string); ok {
				labels[i] = l
				continue
			}
		}
		var str string
		if json.Unmarshal(e, &str) == nil {
			labels[i] = str
		} else {
			labels[i] = string(e)
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

// Allows reports whether the property accepts values of a JSON kind (as
// Kind names them); "integer" is allowed where "number" is.
func (p *Prop) Allows(kind string) bool {
	if len(p.Types) == 0 {
		return true
	}
	for _, t := range p.Types {
		if t == kind || t == "number" && kind == "integer" {
			return true
		}
	}
	return false
}

// intOnly: numbers must be whole (and, on a board, int32).
func (p *Prop) intOnly() bool {
	return len(p.Types) > 0 && p.Allows("integer") && !p.Allows("number")
}

// Choices lists the enum values, e.g. `"eco", "turbo"`.
func (p *Prop) Choices() string {
	parts := make([]string, len(p.Enum))
	for i, e := range p.Enum {
		parts[i] = string(e)
	}
	return strings.Join(parts, ", ")
}

// describe renders what the property accepts, e.g. "an integer from 0 to
// 100" or "a string, default \"light\"".
func (p *Prop) describe() string {
	var b strings.Builder
	switch {
	case len(p.Types) == 0 && len(p.Enum) > 0:
		return "one of " + p.Choices()
	case len(p.Types) == 0:
		b.WriteString("any JSON value")
	case len(p.Types) > 1:
		b.WriteString(strings.Join(p.Types, " or "))
	case p.Type == "string" && p.Format == "date":
		b.WriteString("a date (YYYY-MM-DD)")
	case p.Type == "string" && p.Format == "date-time":
		b.WriteString("a date and time (RFC 3339, e.g. 2025-01-31T18:30:00Z)")
	case p.URLish():
		b.WriteString("a URL")
	default:
		b.WriteString(article(p.Types[0]) + " " + p.Types[0])
	}
	switch lo, hi := p.Min, p.Max; {
	case lo != nil && hi != nil:
		fmt.Fprintf(&b, " from %s to %s", fmtNum(*lo), fmtNum(*hi))
	case lo != nil:
		fmt.Fprintf(&b, " of at least %s", fmtNum(*lo))
	case hi != nil:
		fmt.Fprintf(&b, " of at most %s", fmtNum(*hi))
	}
	if p.ExclMin != nil {
		fmt.Fprintf(&b, " greater than %s", fmtNum(*p.ExclMin))
	}
	if p.ExclMax != nil {
		fmt.Fprintf(&b, " less than %s", fmtNum(*p.ExclMax))
	}
	if len(p.Enum) > 0 {
		fmt.Fprintf(&b, ", one of %s", p.Choices())
	}
	switch {
	case p.MinLen != nil && p.MaxLen != nil:
		fmt.Fprintf(&b, " of %d to %d characters", *p.MinLen, *p.MaxLen)
	case p.MinLen != nil:
		fmt.Fprintf(&b, " of at least %d characters", *p.MinLen)
	case p.MaxLen != nil:
		fmt.Fprintf(&b, " of at most %d characters", *p.MaxLen)
	}
	if p.Pattern != "" {
		fmt.Fprintf(&b, " matching %s", p.Pattern)
	}
	return b.String()
}

func article(typ string) string {
	if typ == "integer" || typ == "object" || typ == "array" {
		return "an"
	}
	return "a"
}

func fmtNum(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// Check validates one present value of the argument. jsonschema-go gives
// the verdict; the teaching layer says what is wrong in the caller's terms
// and, when the intent is clear, a corrected value (Problem.Fix). Two
// rules of the firmware are added to the library's: integers are whole
// int32 values, and strings declared as dates must be dates (the library
// records "format" without checking it). A value of the wrong type is
// refused like any other, where a board would take it as absent and
// silently use the default. It returns nil when the value is good.
func (p *Prop) Check(raw json.RawMessage) *Problem {
	raw = bytes.TrimSpace(raw)
	if limit, why := bytesLimit(p.patternCost); len(raw) > limit {
		return p.Refuse(fmt.Sprintf("argument %q is %d bytes, more than the %d %s", p.Name, len(raw), limit, why), "")
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		if json.Valid(raw) {
			return p.Refuse(fmt.Sprintf("argument %q is %s, a number too large to use", p.Name, cut(string(raw))), "")
		}
		return p.Refuse(fmt.Sprintf("argument %q is not valid JSON (%v)", p.Name, err), "")
	}
	verdict := safeValidate(p.resolved, v)
	own, firmware := p.explain(raw, v)
	switch {
	case own != nil && (verdict != nil || firmware):
		return own
	case verdict != nil:
		return p.Refuse(fmt.Sprintf("argument %q is %s, which the tool's schema does not accept: %s",
			p.Name, DescribeValue(raw), libraryReason(verdict)), "")
	}
	return nil
}

// Refuse builds the problem for a refused value: msg says what is wrong,
// the suggestion what the argument accepts, with fix (JSON) as the example
// when the intent was clear, or an example value.
func (p *Prop) Refuse(msg, fix string) *Problem {
	ex := fix
	if ex == "" {
		ex = p.example(maxShownExample)
	}
	sugg := fmt.Sprintf("Send %s for %q, for example %s.", p.Describe, p.Name, ex)
	if len(ex) > maxShownExample {
		sugg = fmt.Sprintf("Send %s for %q.", p.Describe, p.Name) // an example that long says nothing more
	}
	return &Problem{Arg: p.Name, Msg: msg, Fix: fix, Suggestion: sugg}
}

// explain diagnoses v in the caller's terms. firmware is set when the
// problem is one of the firmware's rules, which stand even where the
// library accepts the value; the other diagnoses only word the library's
// refusal.
func (p *Prop) explain(raw json.RawMessage, v any) (pr *Problem, firmware bool) {
	kind := Kind(v)
	x, isNum := v.(float64)
	switch {
	case isNum && kind == "number" && p.intOnly():
		return p.Refuse(fmt.Sprintf("argument %q must be a whole number (%s), but got %s; the board would cut it to %s",
			p.Name, p.Describe, cut(string(raw)), fmtNum(math.Trunc(x))), p.clamp(math.Round(x))), false
	case !p.Allows(kind):
		msg := fmt.Sprintf("argument %q must be %s, but got %s", p.Name, p.Describe, DescribeValue(raw))
		if p.Type == "boolean" {
			msg += "; send true or false"
		}
		if len(p.Default) > 0 {
			msg += fmt.Sprintf("; a board treats a value of the wrong type as absent and would silently use the default %s instead, so it is refused", p.Default)
		}
		return p.Refuse(msg, p.coerce(v)), false
	case isNum:
		if pr, firmware := p.checkRange(x); pr != nil {
			return pr, firmware
		}
	case kind == "string":
		s := v.(string)
		n := utf8.RuneCountInString(s)
		if p.MinLen != nil && n < *p.MinLen {
			return p.Refuse(fmt.Sprintf("argument %q is too short: %d characters, at least %d needed", p.Name, n, *p.MinLen), ""), false
		}
		if p.MaxLen != nil && n > *p.MaxLen {
			return p.Refuse(fmt.Sprintf("argument %q is too long: %d characters, at most %d allowed", p.Name, n, *p.MaxLen), ""), false
		}
		switch p.Format {
		case "date":
			if _, err := time.Parse("2006-01-02", s); err != nil {
				return p.Refuse(fmt.Sprintf("argument %q must be a date as YYYY-MM-DD, but got %s", p.Name, DescribeValue(raw)), ""), true
			}
		case "date-time":
			if _, err := time.Parse(time.RFC3339, s); err != nil {
				return p.Refuse(fmt.Sprintf("argument %q must be a date and time in RFC 3339 form, but got %s", p.Name, DescribeValue(raw)), ""), true
			}
		}
	}
	if len(p.Enum) > 0 {
		c := Compact(raw)
		for _, e := range p.Enum {
			if bytes.Equal(c, e) {
				return nil, false
			}
		}
		return p.Refuse(fmt.Sprintf("argument %q must be %s, but got %s", p.Name, p.Describe, DescribeValue(raw)), string(p.Enum[0])), false
	}
	return nil, false
}

// checkRange checks a number against the bounds; for integers, outside
// int32 is a firmware rule.
func (p *Prop) checkRange(f float64) (*Problem, bool) {
	lo, hi := p.Min, p.Max
	if p.intOnly() {
		lo, hi = maxPtr(lo, minBoardInt), minPtr(hi, maxBoardInt)
	}
	board := p.intOnly() && (f < minBoardInt || f > maxBoardInt)
	switch {
	case lo != nil && f < *lo:
		return p.Refuse(fmt.Sprintf("argument %q is %s, below the minimum of %s (%s)", p.Name, fmtNum(f), fmtNum(*lo), p.Describe), p.clamp(f)), board
	case hi != nil && f > *hi:
		return p.Refuse(fmt.Sprintf("argument %q is %s, above the maximum of %s (%s)", p.Name, fmtNum(f), fmtNum(*hi), p.Describe), p.clamp(f)), board
	case p.ExclMin != nil && f <= *p.ExclMin:
		return p.Refuse(fmt.Sprintf("argument %q must be greater than %s, but got %s", p.Name, fmtNum(*p.ExclMin), fmtNum(f)), ""), false
	case p.ExclMax != nil && f >= *p.ExclMax:
		return p.Refuse(fmt.Sprintf("argument %q must be less than %s, but got %s", p.Name, fmtNum(*p.ExclMax), fmtNum(f)), ""), false
	}
	return nil, false
}

// clamp brings f into the declared range (and int32, for integers) and
// renders it.
func (p *Prop) clamp(f float64) string {
	if p.Min != nil && f < *p.Min {
		f = *p.Min
	}
	if p.Max != nil && f > *p.Max {
		f = *p.Max
	}
	if p.intOnly() {
		f = math.Max(minBoardInt, math.Min(maxBoardInt, math.Trunc(f)))
	}
	return fmtNum(f)
}

// coerce guesses the intended value when the type is wrong but the intent
// is plain: "50" for an integer, "true" or "yes" for a boolean, 1/0 for a
// boolean, a number or boolean for a string. "" when unclear.
func (p *Prop) coerce(v any) string {
	switch x := v.(type) {
	case string:
		s := strings.TrimSpace(x)
		if p.Allows("integer") {
			f, err := strconv.ParseFloat(s, 64)
			if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
				return ""
			}
			if !p.Allows("number") {
				f = math.Round(f)
			}
			return p.clamp(f)
		}
		if p.Allows("boolean") {
			switch strings.ToLower(s) {
			case "true", "yes", "on", "1":
				return "true"
			case "false", "no", "off", "0":
				return "false"
			}
		}
	case float64:
		if p.Allows("boolean") && (x == 0 || x == 1) {
			return strconv.FormatBool(x == 1)
		}
		if p.Allows("string") && len(p.Enum) == 0 {
			b, _ := json.Marshal(fmtNum(x))
			return string(b)
		}
	case bool:
		if p.Allows("string") && len(p.Enum) == 0 {
			return strconv.Quote(strconv.FormatBool(x))
		}
	}
	return ""
}

// Example renders a value the argument accepts (as JSON): its default,
// its first enum value, or one built from its type and bounds.
func (p *Prop) Example() string { return p.example(maxExampleLen) }

// example is Example with string placeholders cut to at most limit
// characters (a placeholder then no longer meets a larger minLength).
func (p *Prop) example(limit int) string {
	if len(p.Default) > 0 {
		return string(p.Default)
	}
	if len(p.Enum) > 0 {
		return string(p.Enum[0])
	}
	typ := p.Type
	if typ == "" && len(p.Types) > 0 {
		typ = p.Types[0]
	}
	switch typ {
	case "integer", "number":
		lo, hi := p.Min, p.Max
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
		case p.ExclMin != nil:
			return fmtNum(*p.ExclMin + 1)
		case p.ExclMax != nil:
			return fmtNum(*p.ExclMax - 1)
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
	switch p.Format {
	case "date":
		return `"2025-01-31"`
	case "date-time":
		return `"2025-01-31T18:30:00Z"`
	}
	if p.URLish() && p.Pattern == "" && (p.MinLen == nil || *p.MinLen <= len(exampleURL)) &&
		(p.MaxLen == nil || *p.MaxLen >= len(exampleURL)) && limit >= len(exampleURL)+2 {
		return `"` + exampleURL + `"`
	}
	// A placeholder of "...", stretched or cut to the length bounds, so
	// that the example passes them; stretched only up to what a board could
	// be sent at all, since a schema may ask for any minimum in a few bytes.
	n := 3
	if p.MinLen != nil && *p.MinLen > n {
		n = min(*p.MinLen, maxExampleLen)
	}
	if p.MaxLen != nil && *p.MaxLen < n {
		n = max(*p.MaxLen, 0)
	}
	n = min(n, max(limit, 0))
	return `"` + strings.Repeat(".", n) + `"`
}

// maxExampleLen bounds a placeholder string in an example: a board's
// largest message (MaxArgsBytes, with room for the rest of the call)
// could not carry a longer argument anyway.
const maxExampleLen = MaxArgsBytes - 1<<10

// maxShownExample bounds an example value quoted in a suggestion.
const maxShownExample = 100

// Kind names the JSON type of a decoded value, with whole numbers as
// "integer" as JSON Schema does.
func Kind(v any) string {
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

// DescribeValue renders a value for a message, e.g. `the string "loud"`,
// `the number 50.5` or `a list [40]`, cut to a readable length.
func DescribeValue(raw json.RawMessage) string {
	c := cut(string(Compact(raw)))
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case 'n':
		return "null"
	case 't', 'f':
		return "the boolean " + c
	case '{':
		return "an object " + c
	case '[':
		return "a list " + c
	case '"':
		return "the string " + c
	}
	return "the number " + c
}

// cut shortens a value quoted in a message to about 60 bytes, at a
// character boundary.
func cut(s string) string {
	if len(s) <= 60 {
		return s
	}
	i := 57
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "..."
}

// Compact returns raw without insignificant white space, its strings as
// readable UTF-8 (raw itself when it is not valid JSON). Boards and hosts
// may escape every non-ASCII character (Python's json.dumps does:
// "\u5317\u4eac" for 北京), and the values are quoted back in messages
// that people and models read; the value is the same JSON either way.
// Quotes, backslashes, control characters, the line and paragraph
// separators and the bidirectional controls stay escaped (jsonString).
func Compact(raw json.RawMessage) json.RawMessage {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return append(json.RawMessage(nil), raw...)
	}
	if plainASCII(b.Bytes()) {
		return b.Bytes() // nothing escaped, nothing to escape
	}
	return readableStrings(b.Bytes())
}

// plainASCII reports whether compact JSON is printable ASCII without
// escapes, which readableStrings would leave as it is.
func plainASCII(b []byte) bool {
	for _, c := range b {
		if c == '\\' || c >= 0x7f {
			return false
		}
	}
	return true
}

// readableStrings rewrites the string literals of valid, compact JSON with
// jsonString, leaving everything between them as it is.
func readableStrings(js []byte) json.RawMessage {
	out := make([]byte, 0, len(js))
	for i := 0; i < len(js); {
		if js[i] != '"' {
			out = append(out, js[i])
			i++
			continue
		}
		end := i + 1
		for end < len(js) && js[end] != '"' {
			if js[end] == '\\' {
				end++
			}
			end++
		}
		if end >= len(js) {
			return append(json.RawMessage(nil), js...) // cannot happen in valid JSON
		}
		var s string
		if json.Unmarshal(js[i:end+1], &s) != nil {
			return append(json.RawMessage(nil), js...)
		}
		out = appendJSONString(out, s)
		i = end + 1
	}
	return out
}

// appendJSONString appends s as a JSON string literal that shows its text:
// UTF-8 as it is, with only what could mislead or break a message escaped.
func appendJSONString(out []byte, s string) []byte {
	out = append(out, '"')
	for _, r := range s {
		switch {
		case r == '"':
			out = append(out, '\\', '"')
		case r == '\\':
			out = append(out, '\\', '\\')
		case r == '\n':
			out = append(out, '\\', 'n')
		case r == '\r':
			out = append(out, '\\', 'r')
		case r == '\t':
			out = append(out, '\\', 't')
		case escapedRune(r): // all within the Basic Multilingual Plane
			out = fmt.Appendf(out, "\\u%04x", r)
		default:
			out = utf8.AppendRune(out, r)
		}
	}
	return append(out, '"')
}

// escapedRune reports whether a character stays escaped in a shown value:
// control characters (C0, DEL, C1), the line and paragraph separators, the
// bidirectional controls (which can make text read other than it is) and
// the byte-order mark.
func escapedRune(r rune) bool {
	switch {
	case r < 0x20, r >= 0x7f && r <= 0x9f:
		return true
	case r == 0x2028, r == 0x2029, r == 0xfeff:
		return true
	case r == 0x061c, r == 0x200e, r == 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

// safeValidate runs jsonschema-go's validation (nil r accepts anything),
// turning a panic into an error: the library is not fuzzed against every
// odd schema, and a panic there must not take the bridge down.
func safeValidate(r *jsonschema.Resolved, v any) (err error) {
	if r == nil {
		return nil
	}
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
	for strings.HasPrefix(msg, "validating ") {
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
