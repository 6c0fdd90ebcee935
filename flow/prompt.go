package flow

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/devicebridge/devicebridge/internal/argcheck"
)

// PromptType is the kind of answer a prompt asks for (spec Appendix A).
type PromptType string

// The prompt types of the spec. The engine builds text, choice, confirm,
// number, date and custom prompts; file is never built (boards take no
// files).
const (
	PromptText    PromptType = "text"
	PromptChoice  PromptType = "choice"
	PromptConfirm PromptType = "confirm"
	PromptNumber  PromptType = "number"
	PromptDate    PromptType = "date"
	PromptFile    PromptType = "file"
	// PromptCustom asks for any JSON value (objects, lists, untyped
	// properties); it has no elicitation form equivalent.
	PromptCustom PromptType = "custom"
)

// Prompt is one question, in the shape of the spec's prompt objects
// (Appendix A), plus the property it fills and, when it is offered again,
// why the previous answer was refused.
type Prompt struct {
	Type    PromptType `json:"type"`
	Message string     `json:"message"`
	// Property is the argument the answer becomes; empty for the
	// confirmation prompt that ends tools with Tool.Confirm.
	Property     string          `json:"property,omitempty"`
	Placeholder  string          `json:"placeholder,omitempty"`
	DefaultValue json.RawMessage `json:"defaultValue,omitempty"`
	Choices      []Choice        `json:"choices,omitempty"`
	// Multiple is set on a choice prompt whose answer is a list of any
	// number of the choices (an array argument of enumerated items);
	// Validation.Min and Max then bound how many.
	Multiple   bool   `json:"multiple,omitempty"`
	Validation *Rules `json:"validation,omitempty"`
	// Error and Suggestion are set when the prompt is offered again after
	// a refused answer (or because the initial value was invalid).
	Error      string `json:"error,omitempty"`
	Suggestion string `json:"suggestion,omitempty"`

	// enumStyle is how the schema listed a choice prompt's values, so that
	// an elicitation form lists them the same way. The MCP path rebuilds
	// prompts from the schema each round, so it is not carried in JSON.
	enumStyle argcheck.EnumStyle
}

// Choice is one option of a choice prompt. Value is the JSON value the
// answer must be.
type Choice struct {
	Value json.RawMessage `json:"value"`
	Label string          `json:"label"`
}

// Rules is a prompt's "validation" object. As in the spec, Min and Max are
// the value bounds of number prompts and the length bounds of text
// prompts; for multiple choice prompts, the bounds on how many are chosen. Integer and Format are additions: whole numbers only, and the
// string format (date, date-time, email, uri).
type Rules struct {
	Required bool     `json:"required,omitempty"`
	Pattern  string   `json:"pattern,omitempty"`
	Min      *float64 `json:"min,omitempty"`
	Max      *float64 `json:"max,omitempty"`
	Integer  bool     `json:"integer,omitempty"`
	Format   string   `json:"format,omitempty"`
}

// Progress tells where a prompt stands in the interaction.
type Progress struct {
	Current int    `json:"current"`
	Total   int    `json:"total"`
	Message string `json:"message,omitempty"`
}

// prompt builds the question for a property.
func prompt(p *argcheck.Prop) Prompt {
	pr := Prompt{Property: p.Name, DefaultValue: p.Default}
	rules := &Rules{Required: p.Required}
	what := p.Describe
	switch {
	case len(p.Enum) > 0:
		pr.Type = PromptChoice
		for i, e := range p.Enum {
			pr.Choices = append(pr.Choices, Choice{Value: e, Label: p.Labels[i]})
		}
		pr.enumStyle = p.EnumStyle
		what = "choose one of " + p.Choices()
	case p.Type == "array" && p.Items != nil && len(p.Items.Enum) > 0:
		pr.Type, pr.Multiple = PromptChoice, true
		for i, e := range p.Items.Enum {
			pr.Choices = append(pr.Choices, Choice{Value: e, Label: p.Items.Labels[i]})
		}
		pr.enumStyle = p.Items.EnumStyle
		if p.MinItems != nil {
			f := float64(*p.MinItems)
			rules.Min = &f
		}
		if p.MaxItems != nil {
			f := float64(*p.MaxItems)
			rules.Max = &f
		}
		what = "choose any of " + p.Items.Choices() + " (a list)"
	case p.Type == "integer" || p.Type == "number":
		pr.Type = PromptNumber
		// The schema's bounds (narrowed to int32 for integers); bounds
		// that are only int32's are not worth showing (they are still
		// enforced).
		rules.Min, rules.Max = p.Min, p.Max
		rules.Integer = p.Type == "integer"
		if rest, ok := strings.CutPrefix(what, "an integer"); ok {
			// Prompts are read by people: "a whole number from 0 to
			// 100" rather than the schema's word.
			what = "a whole number" + rest
		}
	case p.Type == "boolean":
		pr.Type = PromptConfirm
		what = "answer true or false"
	case p.Type == "string" && p.Format == "date":
		pr.Type = PromptDate
		rules.Format = p.Format
		pr.Placeholder = "YYYY-MM-DD"
	case p.Type == "string":
		pr.Type = PromptText
		rules.Pattern = p.Pattern
		rules.Format = p.Format
		if p.URLish() {
			var ex string
			if json.Unmarshal([]byte(p.Example()), &ex) == nil && strings.Trim(ex, ".") != "" {
				pr.Placeholder = ex // what a URL looks like
			}
		}
		if p.MinLen != nil {
			f := float64(*p.MinLen)
			rules.Min = &f
		}
		if p.MaxLen != nil {
			f := float64(*p.MaxLen)
			rules.Max = &f
		}
	default:
		pr.Type = PromptCustom
		what = "give " + p.Describe + " as JSON"
	}
	if *rules != (Rules{}) {
		pr.Validation = rules
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", label(p), what)
	if len(p.Default) > 0 {
		fmt.Fprintf(&b, " (default %s)", p.Default)
	} else if !p.Required {
		b.WriteString(" (optional; answer null to skip)")
	}
	b.WriteString(".")
	if p.Description != "" {
		b.WriteString(" " + p.Description)
	}
	pr.Message = b.String()
	return pr
}

// confirmPrompt is the last question of tools with Tool.Confirm. It is
// read by people (the console, the CLI, a host's form) and by models
// alike, so it is plain: what runs, where, with what. How to answer is
// the prompt's type (a confirm: yes or no, a boolean in a form).
func confirmPrompt(t *Tool, args json.RawMessage) Prompt {
	msg := t.ConfirmMessage
	if msg == "" {
		msg = ConfirmQuestion(cmp.Or(t.Label, t.Name), t.Board, args)
	}
	return Prompt{Type: PromptConfirm, DefaultValue: json.RawMessage("false"),
		Message: msg, Validation: &Rules{Required: true}}
}

// ConfirmQuestion asks whether to run tool on board with args: "Run
// self.reboot on kitchen?", "Run self.audio_speaker.set_volume on kitchen
// with volume=35?". Tools that take the board away (a restart, a firmware
// upgrade) say so.
func ConfirmQuestion(tool, board string, args json.RawMessage) string {
	var b strings.Builder
	b.WriteString("Run " + tool)
	if board != "" {
		b.WriteString(" on " + board)
	}
	if list := argList(args); list != "" {
		b.WriteString(" with " + list)
	}
	b.WriteString("?")
	base := tool[strings.LastIndex(tool, ".")+1:]
	if note, ok := confirmNotes[base]; ok {
		b.WriteString(" " + note)
	}
	return b.String()
}

// confirmNotes say what a tool does to the board's link, by the last part
// of its name: the firmware's self.reboot and self.upgrade_firmware.
var confirmNotes = map[string]string{
	"reboot":           "The board restarts: it is offline until it reconnects.",
	"upgrade_firmware": "The board installs the firmware and restarts: it is offline until it reconnects.",
}

// argList renders arguments for a person: volume=35 theme=dark, strings
// quoted when they hold spaces or quotes, other values as compact JSON,
// each cut to a readable length; "" for none.
func argList(args json.RawMessage) string {
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return ""
	}
	var parts []string
	for dec.More() {
		tok, err := dec.Token()
		key, ok := tok.(string)
		if err != nil || !ok {
			break
		}
		var v json.RawMessage
		if dec.Decode(&v) != nil {
			break
		}
		val := string(argcheck.Compact(v))
		var str string
		if json.Unmarshal(v, &str) == nil && str != "" && !strings.ContainsAny(str, " \t\n\"'=") {
			val = str
		}
		if r := []rune(val); len(r) > 60 {
			val = string(r[:59]) + "…"
		}
		parts = append(parts, key+"="+val)
	}
	return strings.Join(parts, " ")
}

// ConfirmField is the key under which ElicitSchema asks for the
// confirmation (the prompt with an empty Property).
const ConfirmField = "confirm"

// ElicitSchema builds one elicitation requestedSchema (MCP
// elicitation/create, also used by MRTR inputRequests) asking all the given
// prompts at once: a flat object of primitive properties, keyed by each
// prompt's Property (ConfirmField for the confirmation prompt).
//
// The mapping: number → "number" or "integer" with minimum/maximum;
// confirm → "boolean"; choice of strings → "string" in the form the
// schema used (MCP's SEP-1330 forms: enum alone when the values are their
// own labels, oneOf of titled consts, or the legacy enum with enumNames);
// multiple choice of strings → "array" with items (enum, or anyOf of
// titled consts) and minItems/maxItems; choice of other values → their
// type, the choices listed in the description; date → "string" with
// format "date"; text → "string" with minLength/maxLength and format
// (email, uri, date, date-time only).
// Defaults become "default"; a prompt's Message becomes the description.
// There is no "pattern" (elicitation has none): the engine still checks
// it when the answer comes back.
//
// It fails with CodeNotInteractive for custom and file prompts (objects,
// lists, untyped properties have no form equivalent: pass them in the
// arguments) and when a property is named like ConfirmField while a
// confirmation is also asked (ask the confirmation in its own request).
func ElicitSchema(prompts []Prompt) (json.RawMessage, error) {
	props := map[string]map[string]any{}
	var order, required []string
	for _, pr := range prompts {
		key := pr.Property
		if key == "" {
			key = ConfirmField
		}
		if _, dup := props[key]; dup {
			return nil, newError(CodeNotInteractive, map[string]any{"property": key},
				"Two prompts fill %q in one form. Ask them in separate elicitation requests.", key)
		}
		s, err := elicitProperty(pr)
		if err != nil {
			return nil, err
		}
		props[key] = s
		order = append(order, key)
		if pr.Validation != nil && pr.Validation.Required || pr.Property == "" {
			required = append(required, key)
		}
	}
	// Render properties in prompt order (encoding/json would sort them).
	var b strings.Builder
	b.WriteString(`{"type":"object","properties":{`)
	for i, key := range order {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(key)
		v, err := json.Marshal(props[key])
		if err != nil {
			return nil, newError(CodeNotInteractive, map[string]any{"property": key},
				"The prompt for %q cannot be rendered as a form field (%v); pass %q in the arguments instead.", key, err, key)
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteString("}")
	if len(required) > 0 {
		r, _ := json.Marshal(required)
		b.WriteString(`,"required":`)
		b.Write(r)
	}
	b.WriteString("}")
	return json.RawMessage(b.String()), nil
}

// elicitFormats are the string formats elicitation allows.
var elicitFormats = map[string]bool{"email": true, "uri": true, "date": true, "date-time": true}

func elicitProperty(pr Prompt) (map[string]any, error) {
	s := map[string]any{}
	title := pr.Property
	if title == "" {
		title = "Confirm"
	}
	s["title"] = title
	s["description"] = pr.Message
	if len(pr.DefaultValue) > 0 {
		var d any
		if json.Unmarshal(pr.DefaultValue, &d) == nil {
			s["default"] = d
		}
	}
	r := pr.Validation
	if r == nil {
		r = &Rules{}
	}
	switch pr.Type {
	case PromptNumber:
		s["type"] = "number"
		if r.Integer {
			s["type"] = "integer"
		}
		if r.Min != nil {
			s["minimum"] = *r.Min
		}
		if r.Max != nil {
			s["maximum"] = *r.Max
		}
	case PromptConfirm:
		s["type"] = "boolean"
	case PromptDate:
		s["type"] = "string"
		s["format"] = "date"
	case PromptText:
		s["type"] = "string"
		if r.Min != nil {
			s["minLength"] = int(*r.Min)
		}
		if r.Max != nil {
			s["maxLength"] = int(*r.Max)
		}
		if elicitFormats[r.Format] {
			s["format"] = r.Format
		}
	case PromptChoice:
		var vals, names []string
		kind := ""
		for _, c := range pr.Choices {
			var v any
			_ = json.Unmarshal(c.Value, &v)
			k := argcheck.Kind(v)
			if k == "integer" {
				k = "number"
			}
			if kind == "" {
				kind = k
			} else if kind != k {
				kind = "mixed"
			}
			if str, ok := v.(string); ok {
				vals = append(vals, str)
				names = append(names, c.Label)
			}
		}
		switch {
		case kind == "string" && pr.Multiple:
			// MCP's multi-select: untitled items list an enum, titled ones
			// an anyOf of consts.
			s["type"] = "array"
			if titled(vals, names) {
				s["items"] = map[string]any{"anyOf": constList(vals, names)}
			} else {
				s["items"] = map[string]any{"type": "string", "enum": vals}
			}
			if r.Min != nil {
				s["minItems"] = int(*r.Min)
			}
			if r.Max != nil {
				s["maxItems"] = int(*r.Max)
			}
		case kind == "string":
			// MCP's single-select, as the schema wrote it: values alone,
			// a oneOf of titled consts, or (the legacy form) enumNames.
			s["type"] = "string"
			switch {
			case !titled(vals, names):
				s["enum"] = vals
			case pr.enumStyle == argcheck.EnumOneOf || pr.enumStyle == argcheck.EnumAnyOf:
				s["oneOf"] = constList(vals, names)
			default:
				s["enum"] = vals
				s["enumNames"] = names
			}
		case (kind == "number" || kind == "boolean") && !pr.Multiple:
			s["type"] = kind
			labels := make([]string, len(pr.Choices))
			for i, c := range pr.Choices {
				labels[i] = string(c.Value)
			}
			s["description"] = pr.Message + " Allowed: " + strings.Join(labels, ", ") + "."
		default:
			return nil, errNoForm(pr)
		}
	default:
		return nil, errNoForm(pr)
	}
	return s, nil
}

// titled reports whether any choice has a label other than its value.
func titled(vals, names []string) bool {
	for i := range vals {
		if names[i] != vals[i] {
			return true
		}
	}
	return false
}

// constList is a titled choice's values as consts with titles.
func constList(vals, names []string) []map[string]any {
	out := make([]map[string]any, len(vals))
	for i := range vals {
		out[i] = map[string]any{"const": vals[i], "title": names[i]}
	}
	return out
}

func errNoForm(pr Prompt) *Error {
	return newError(CodeNotInteractive, map[string]any{"property": pr.Property, "type": pr.Type},
		"%q needs a %s answer, which an elicitation form cannot carry (forms hold only strings, numbers, booleans and string choices). "+
			"Pass %q in the tool's arguments instead, or use interaction.start, whose custom prompts take any JSON value.",
		pr.Property, pr.Type, pr.Property)
}
