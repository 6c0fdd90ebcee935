package flow

import (
	"encoding/json"
	"testing"
)

// FuzzPlan feeds arbitrary schemas and arguments to Plan (and what is
// built from its result): it must never panic, and what it returns must
// hold together.
func FuzzPlan(f *testing.F) {
	for _, s := range []string{volumeSchema, themeSchema, photoSchema, emptySchema, enableSchema,
		`{"type":"object","properties":{"m":{"enum":["a","b"]},"d":{"type":"string","format":"date"},"n":{"type":["number","null"],"exclusiveMinimum":0}},"required":["m","d","n"]}`,
		`{"type":"object","properties":{"a":{"$ref":"#/$defs/x"}},"$defs":{"x":{"type":"integer"}},"required":["a"]}`,
		`{"type":"object","allOf":[{"required":["z"]}],"additionalProperties":false}`,
		`{"properties":{"p":{"pattern":"("}}}`, `true`, `null`, ``, `{"type":"string"}`,
	} {
		for _, a := range []string{`{}`, `{"volume":150}`, `{"volume":"40"}`, `{"quality":1e400}`, `[]`, `null`, `{"a":{"b":[1,2]}}`, `{"x":1,"x":2}`} {
			f.Add([]byte(s), []byte(a), true)
		}
	}
	f.Fuzz(func(t *testing.T, schema, args []byte, guided bool) {
		tool := &Tool{Name: "fuzz", InputSchema: schema, Confirm: guided}
		p, err := tool.Plan(args, guided)
		if err != nil {
			if _, ok := err.(*Error); !ok {
				t.Fatalf("Plan returned a %T, want *Error: %v", err, err)
			}
			return
		}
		if !json.Valid(p.Args) {
			t.Fatalf("Plan.Args is not JSON: %q", p.Args)
		}
		for _, q := range p.Prompts {
			if q.Message == "" || q.Type == "" {
				t.Fatalf("empty prompt: %+v", q)
			}
			if _, err := json.Marshal(q); err != nil {
				t.Fatalf("prompt does not marshal: %v", err)
			}
		}
		_, _ = ElicitSchema(p.Asks())
		// Answering every prompt with its default (or null) must not panic.
		answers := map[string]json.RawMessage{}
		for _, q := range p.Asks() {
			answers[q.Property] = q.DefaultValue
		}
		_, _ = tool.Answer(p, answers)
	})
}
