package main

// key=value arguments, typed from the tool's input schema.

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/devicebridge/devicebridge/internal/argcheck"
)

// prop is one property of a tool's input schema.
type prop struct {
	Name        string
	Type        string
	Description string
	Enum        []any
	Min, Max    *float64
	Default     json.RawMessage
	Required    bool
}

// props lists a schema's properties, required ones first, then by name.
func props(schema json.RawMessage) []prop {
	var s struct {
		Properties map[string]struct {
			Type        any             `json:"type"`
			Description string          `json:"description"`
			Enum        []any           `json:"enum"`
			Minimum     *float64        `json:"minimum"`
			Maximum     *float64        `json:"maximum"`
			Default     json.RawMessage `json:"default"`
			Format      string          `json:"format"`
		} `json:"properties"`
		Required []string `json:"required"`
	}
	if json.Unmarshal(schema, &s) != nil {
		return nil
	}
	req := map[string]bool{}
	for _, r := range s.Required {
		req[r] = true
	}
	var out []prop
	for name, p := range s.Properties {
		t := ""
		switch v := p.Type.(type) {
		case string:
			t = v
		case []any:
			for _, x := range v {
				if xs, ok := x.(string); ok && xs != "null" {
					t = xs
					break
				}
			}
		}
		def := p.Default
		if len(def) > 0 && argcheck.ProseDefault(name, p.Description, p.Format, def) {
			def = nil // prose about the argument, not a value for it
		}
		out = append(out, prop{Name: name, Type: t, Description: p.Description, Enum: p.Enum, Min: p.Minimum, Max: p.Maximum, Default: def, Required: req[name]})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Required != out[j].Required {
			return out[i].Required
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// signature is how `tools` shows a property: volume:int(0..100),
// theme:string, quality:int=80, [optional ones in brackets].
func (p prop) signature() string {
	t := p.Type
	switch t {
	case "integer":
		t = "int"
	case "boolean":
		t = "bool"
	case "":
		t = "json"
	}
	s := p.Name + ":" + t
	if len(p.Enum) > 0 {
		var vs []string
		for _, v := range p.Enum {
			vs = append(vs, fmt.Sprint(v))
		}
		s = p.Name + ":" + strings.Join(vs, "|")
	}
	if p.Min != nil || p.Max != nil {
		s += "(" + num(p.Min) + ".." + num(p.Max) + ")"
	}
	if len(p.Default) > 0 {
		d := []rune(string(p.Default))
		if len(d) > 20 { // a long default would widen the whole table
			d = append(d[:18], '…')
		}
		s += "=" + string(d)
	}
	if !p.Required {
		s = "[" + s + "]"
	}
	return s
}

func num(f *float64) string {
	if f == nil {
		return ""
	}
	return strconv.FormatFloat(*f, 'f', -1, 64)
}

// parseArgs turns key=value (typed from the schema) and key:=JSON pairs
// into the arguments object.
func parseArgs(t tool, pairs []string) (map[string]any, error) {
	ps := props(t.InputSchema)
	byName := map[string]prop{}
	var names []string
	for _, p := range ps {
		byName[p.Name] = p
		names = append(names, p.Name)
	}
	args := map[string]any{}
	for _, pair := range pairs {
		key, val, ok := strings.Cut(pair, "=")
		raw := false
		if ok && strings.HasSuffix(key, ":") {
			key, raw = strings.TrimSuffix(key, ":"), true
		}
		if !ok || key == "" {
			return nil, errf(exitUsage, "argument %q is not key=value (e.g. volume=40; key:=JSON for raw JSON)", pair)
		}
		p, known := byName[key]
		if !known {
			if len(ps) == 0 {
				return nil, errf(exitInvalidArgs, "%s takes no arguments, so %s= cannot be given", t.Name, key)
			}
			return nil, errf(exitInvalidArgs, "%s has no argument %s%s (it takes: %s)", t.Name, key, didYouMean(key, names), strings.Join(names, ", "))
		}
		if raw {
			var v any
			if err := json.Unmarshal([]byte(val), &v); err != nil {
				return nil, errf(exitUsage, "%s:=%s is not JSON: %v", key, val, err)
			}
			args[key] = v
			continue
		}
		v, err := typed(p, val)
		if err != nil {
			return nil, errf(exitInvalidArgs, "%s=%s: %v", key, val, err)
		}
		args[key] = v
	}
	return args, nil
}

// typed converts a command-line value to the property's type. Range and
// enum checks are the bridge's: it answers with what to change.
func typed(p prop, s string) (any, error) {
	switch p.Type {
	case "integer":
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s is a whole number%s", p.Name, rangeHint(p))
		}
		return n, nil
	case "number":
		f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil {
			return nil, fmt.Errorf("%s is a number%s", p.Name, rangeHint(p))
		}
		return f, nil
	case "boolean":
		if b, ok := yesNo(s); ok {
			return b, nil
		}
		return nil, fmt.Errorf("%s is true or false", p.Name)
	case "string":
		return s, nil
	}
	var v any // object, array or untyped: JSON, else the text itself
	if json.Unmarshal([]byte(s), &v) == nil {
		return v, nil
	}
	return s, nil
}

// yesNo reads a yes or no typed in any of the usual ways; ok is false
// for anything else.
func yesNo(s string) (b, ok bool) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "true", "yes", "y", "on", "1":
		return true, true
	case "false", "no", "n", "off", "0":
		return false, true
	}
	return false, false
}

func rangeHint(p prop) string {
	switch {
	case p.Min != nil && p.Max != nil:
		return fmt.Sprintf(" from %s to %s", num(p.Min), num(p.Max))
	case p.Min != nil:
		return " of at least " + num(p.Min)
	case p.Max != nil:
		return " of at most " + num(p.Max)
	}
	return ""
}
