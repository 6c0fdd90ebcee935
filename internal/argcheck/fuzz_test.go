package argcheck

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzParseValidate: any schema bytes a board sends and any argument bytes
// a caller sends. Parse always gives a usable schema whose published form
// is JSON; Validate never panics; what it forwards is a JSON object; the
// example it offers with a refusal is valid JSON.
func FuzzParseValidate(f *testing.F) {
	for _, seed := range [][2]string{
		{`{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}`, `{"volume":35}`},
		{`{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}`, `{"volume":"loud"}`},
		{`{"type":"object","properties":{"theme":{"type":"string","enum":["light","dark"]}}}`, `{"theme":"blue","x":1}`},
		{`{"type":"object","properties":{"a":{"type":["integer","string"],"minimum":"x"}},"required":"a"}`, `[]`},
		{`{"properties":{"a":{"type":"number","exclusiveMinimum":1e308,"default":"d"}},"additionalProperties":{}}`, `{"a":1e309}`},
		{`"object"`, `null`},
		{`{"type":"object","properties":{"s":{"type":"string","minLength":3,"maxLength":1}},"required":["s","ghost"]}`, `{"s":"\u00e9\u00e9"}`},
		{``, `{"a":1,"a":2}`},
		// Past the ceilings: too deep, a reference that made checking
		// exponential in the arguments' depth, a costly pattern.
		{strings.Repeat(`{"items":`, 70) + `{}` + strings.Repeat(`}`, 70), `{}`},
		{`{"type":"object","properties":{"a":{"$ref":"#/$defs/n"}},"$defs":{"n":{"anyOf":[` +
			`{"type":"object","properties":{"x":{"$ref":"#/$defs/n"}},"required":["y"]},` +
			`{"type":"object","properties":{"x":{"$ref":"#/$defs/n"}},"required":["z"]}]}}}`,
			`{"a":` + strings.Repeat(`{"x":`, 30) + `{}` + strings.Repeat(`}`, 30) + `}`},
		{`{"type":"object","properties":{"s":{"type":"string","pattern":"(?:(?:[a-z]{20}){10}x?)+y"}}}`,
			`{"s":"` + strings.Repeat("a", 900) + `"}`},
		{`{"type":"object","properties":{"s":{"type":"string","minLength":60000},"t":{"type":"string","minLength":60000}},"required":["s","t"]}`, `{}`},
	} {
		f.Add([]byte(seed[0]), []byte(seed[1]))
	}
	f.Fuzz(func(t *testing.T, schema, args []byte) {
		if len(schema) > 4*maxFuzzString || len(args) > 4*maxFuzzString {
			return // see maxFuzzString
		}
		s, _ := Parse(schema)
		if s == nil {
			t.Fatal("Parse returned no schema")
		}
		if !json.Valid(s.Published()) {
			t.Fatalf("published schema is not JSON: %q", s.Published())
		}
		_ = s.ArgList()
		fwd, bad := s.Validate(args)
		if bad == nil {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(fwd, &obj); err != nil {
				t.Fatalf("forwarded arguments %q are not an object: %v", fwd, err)
			}
			return
		}
		if len(bad.Problems) == 0 {
			t.Fatal("a refusal without a problem")
		}
		if !json.Valid([]byte(bad.Example)) {
			t.Fatalf("example %q is not JSON (schema %q, args %q)", bad.Example, schema, args)
		}
		_ = bad.Explain("tool", s)
	})
}

// maxFuzzString bounds the strings (and byte slices) a fuzz target here
// takes. Checking is linear in them, so long ones find nothing short ones
// do not; but when one gains coverage the fuzzer minimizes it, and its
// minimizer tries every pair of cut points: a 2 KB string kept
// FuzzValidArgsAccepted at 0 executions/s for a minute (-fuzzminimizetime),
// which is how `.ci/run` timed out. Long inputs are the unit tests' job
// (TestCheckingIsBoundedInTime).
const maxFuzzString = 256

// FuzzValidArgsAccepted builds a schema and arguments that satisfy it
// from the fuzzer's values, the way boards declare arguments (integer with
// bounds, number, boolean, string with length bounds or an enum), and
// checks Validate accepts them and forwards them unchanged.
func FuzzValidArgsAccepted(f *testing.F) {
	f.Add("volume", uint8(0), int32(0), int32(100), int32(35), "x", true)
	f.Add("theme", uint8(3), int32(0), int32(0), int32(0), "dark", false)
	f.Add("é\"\\", uint8(4), int32(-5), int32(5), int32(9), "\x00", true)
	f.Fuzz(func(t *testing.T, name string, kind uint8, lo, hi, v int32, str string, required bool) {
		if !utf8.ValidString(name) || !utf8.ValidString(str) {
			return // JSON would replace invalid bytes: another argument
		}
		if len(name) > maxFuzzString || len(str) > maxFuzzString {
			return // long strings only stall the fuzzer (see maxFuzzString)
		}
		if lo > hi {
			lo, hi = hi, lo
		}
		key, _ := json.Marshal(name)
		sval, _ := json.Marshal(str)
		var prop, value string
		switch kind % 5 {
		case 0: // integer in [lo, hi]
			n := int64(lo) + (int64(v)-int64(lo))%(int64(hi)-int64(lo)+1+0)
			if n < int64(lo) {
				n += int64(hi) - int64(lo) + 1
			}
			prop = fmt.Sprintf(`{"type":"integer","minimum":%d,"maximum":%d}`, lo, hi)
			value = fmt.Sprint(n)
		case 1: // number
			prop = `{"type":"number"}`
			value = fmt.Sprintf("%d.5", v)
		case 2: // boolean
			prop = `{"type":"boolean"}`
			value = fmt.Sprint(v%2 == 0)
		case 3: // string with length bounds around it
			n := utf8.RuneCountInString(str)
			prop = fmt.Sprintf(`{"type":"string","minLength":%d,"maxLength":%d}`, n, n)
			value = string(sval)
		case 4: // enum
			prop = `{"type":"string","enum":[` + string(sval) + `]}`
			value = string(sval)
		}
		req := ""
		if required {
			req = `,"required":[` + string(key) + `]`
		}
		schema := `{"type":"object","properties":{` + string(key) + `:` + prop + `}` + req + `}`
		s, err := Parse(json.RawMessage(schema))
		if err != nil {
			t.Fatalf("schema %s: %v", schema, err)
		}
		args := `{` + string(key) + `:` + value + `}`
		fwd, bad := s.Validate(json.RawMessage(args))
		if bad != nil {
			t.Fatalf("schema %s refused valid arguments %s: %s", schema, args, bad.Explain("tool", s))
		}
		if string(fwd) != args {
			t.Fatalf("forwarded %s, want %s", fwd, args)
		}
		// With nothing given, the example offered must itself pass.
		if _, bad := s.Validate(nil); bad != nil {
			if _, again := s.Validate(json.RawMessage(bad.Example)); again != nil {
				t.Fatalf("schema %s: the example %s is refused: %s", schema, bad.Example, again.Explain("tool", s))
			}
		}
	})
}
