package argcheck

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Schemas exactly as the firmware renders them (docs/firmware.md,
// "Schemas").
const (
	volumeSchema   = `{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}`
	themeSchema    = `{"type":"object","properties":{"theme":{"type":"string"}},"required":["theme"]}`
	snapshotSchema = `{"type":"object","properties":{"url":{"type":"string"},"quality":{"type":"integer","default":80,"minimum":1,"maximum":100}},"required":["url"]}`
	noArgsSchema   = `{"type":"object","properties":{}}`
	enableSchema   = `{"type":"object","properties":{"enable":{"type":"boolean"}},"required":["enable"]}`
	walkSchema     = `{"type":"object","properties":{"steps":{"type":"integer","default":3,"minimum":1,"maximum":100},"direction":{"type":"integer","default":1,"minimum":-1,"maximum":1}}}`
	unrangedSchema = `{"type":"object","properties":{"count":{"type":"integer"}},"required":["count"]}`
	upgradeSchema  = `{"type":"object","properties":{"url":{"type":"string","default":"The URL of the firmware binary file to download and install"}}}`
)

func mustSchema(t *testing.T, raw string) *Schema {
	t.Helper()
	s, err := Parse(json.RawMessage(raw))
	require.NoError(t, err)
	require.False(t, s.unchecked)
	return s
}

func TestParseSchemaKeepsTheBoardsSchema(t *testing.T) {
	for _, raw := range []string{volumeSchema, themeSchema, snapshotSchema, noArgsSchema, walkSchema, upgradeSchema} {
		s := mustSchema(t, raw)
		assert.JSONEq(t, raw, string(s.published), "published upstream unchanged")
	}
	s := mustSchema(t, snapshotSchema)
	require.Len(t, s.props, 2)
	assert.Equal(t, "url", s.props[0].Name, "declaration order is kept")
	assert.True(t, s.props[0].Required)
	assert.False(t, s.props[1].Required)
	assert.Equal(t, "an integer from 1 to 100", s.props[1].Describe)
}

func TestParseSchemaRepairs(t *testing.T) {
	s, err := Parse(nil)
	require.NoError(t, err)
	assert.JSONEq(t, noArgsSchema, string(s.published))

	s, err = Parse(json.RawMessage(`{"properties":{"x":{"type":"string"}}}`))
	require.NoError(t, err)
	assert.JSONEq(t, `{"type":"object","properties":{"x":{"type":"string"}}}`, string(s.published))

	for _, bad := range []string{`[]`, `{"type":"string"}`, `{"type":"object","properties":[]}`, `{"type":"object","required":"x"}`} {
		s, err = Parse(json.RawMessage(bad))
		require.Error(t, err, bad)
		assert.True(t, s.unchecked)
		assert.JSONEq(t, noArgsSchema, string(s.published))
		fwd, v := s.Validate(json.RawMessage(`{"anything":1}`))
		assert.Nil(t, v, "unchecked schemas pass object arguments through")
		assert.JSONEq(t, `{"anything":1}`, string(fwd))
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name     string
		schema   string
		args     string
		problems []string // substrings, one per problem, in order
		fixed    string
	}{
		// Integers with a range.
		{name: "integer in range", schema: volumeSchema, args: `{"volume":40}`},
		{name: "integer at the bounds", schema: volumeSchema, args: `{"volume":100}`},
		{name: "integer written as 40.0", schema: volumeSchema, args: `{"volume":40.0}`},
		{name: "integer missing", schema: volumeSchema, args: `{}`,
			problems: []string{`missing required argument "volume" (an integer from 0 to 100)`}, fixed: `{"volume": 50}`},
		{name: "no arguments at all", schema: volumeSchema, args: ``,
			problems: []string{`missing required argument "volume"`}, fixed: `{"volume": 50}`},
		{name: "integer as a string", schema: volumeSchema, args: `{"volume":"40"}`,
			problems: []string{`argument "volume" must be an integer from 0 to 100, but got the string "40"`}, fixed: `{"volume": 40}`},
		{name: "integer as a word", schema: volumeSchema, args: `{"volume":"loud"}`,
			problems: []string{`argument "volume" must be an integer from 0 to 100, but got the string "loud"`}, fixed: `{"volume": 50}`},
		{name: "integer with a fraction", schema: volumeSchema, args: `{"volume":50.7}`,
			problems: []string{`argument "volume" must be a whole number (an integer from 0 to 100), but got 50.7; the board would cut it to 50`},
			fixed:    `{"volume": 51}`},
		{name: "integer below the minimum", schema: volumeSchema, args: `{"volume":-5}`,
			problems: []string{`argument "volume" is -5, below the minimum of 0 (an integer from 0 to 100)`}, fixed: `{"volume": 0}`},
		{name: "integer above the maximum", schema: volumeSchema, args: `{"volume":101}`,
			problems: []string{`argument "volume" is 101, above the maximum of 100`}, fixed: `{"volume": 100}`},
		{name: "integer as a boolean", schema: volumeSchema, args: `{"volume":true}`,
			problems: []string{`must be an integer from 0 to 100, but got the boolean true`}, fixed: `{"volume": 50}`},
		{name: "integer null", schema: volumeSchema, args: `{"volume":null}`,
			problems: []string{`must be an integer from 0 to 100, but got null`}, fixed: `{"volume": 50}`},
		{name: "integer beyond a C int", schema: unrangedSchema, args: `{"count":3000000000}`,
			problems: []string{`argument "count" is 3000000000, above the maximum of 2147483647`}, fixed: `{"count": 2147483647}`},
		{name: "negative range", schema: walkSchema, args: `{"direction":-2}`,
			problems: []string{`argument "direction" is -2, below the minimum of -1`}, fixed: `{"direction": -1}`},
		// Defaults: optional, but a wrong type is still an error (the
		// board would silently use the default instead).
		{name: "defaults may be left out", schema: walkSchema, args: `{}`},
		{name: "default with a wrong type", schema: walkSchema, args: `{"steps":"five"}`,
			problems: []string{`argument "steps" must be an integer from 1 to 100, but got the string "five"`}, fixed: `{}`},
		{name: "string default", schema: upgradeSchema, args: `{}`},
		// Strings.
		{name: "string", schema: themeSchema, args: `{"theme":"dark"}`},
		{name: "empty string is a string", schema: themeSchema, args: `{"theme":""}`},
		{name: "string as a number", schema: themeSchema, args: `{"theme":5}`,
			problems: []string{`argument "theme" must be a string, but got the number 5`}, fixed: `{"theme": "5"}`},
		{name: "string as an object", schema: themeSchema, args: `{"theme":{"name":"dark"}}`,
			problems: []string{`must be a string, but got an object {"name":"dark"}`}, fixed: `{"theme": "..."}`},
		{name: "string missing", schema: themeSchema, args: `{}`,
			problems: []string{`missing required argument "theme" (a string)`}, fixed: `{"theme": "..."}`},
		// Booleans.
		{name: "boolean", schema: enableSchema, args: `{"enable":false}`},
		{name: "boolean as a string", schema: enableSchema, args: `{"enable":"true"}`,
			problems: []string{`argument "enable" must be a boolean, but got the string "true"`}, fixed: `{"enable": true}`},
		{name: "boolean as 0", schema: enableSchema, args: `{"enable":0}`,
			problems: []string{`argument "enable" must be a boolean, but got the number 0`}, fixed: `{"enable": false}`},
		// Unknown and malformed arguments.
		{name: "unknown argument in another case", schema: volumeSchema, args: `{"Volume":40}`,
			problems: []string{`unknown argument "Volume" (did you mean "volume"?)`, `missing required argument "volume"`},
			fixed:    `{"volume": 50}`},
		{name: "misspelled argument", schema: volumeSchema, args: `{"volum":40}`,
			problems: []string{`unknown argument "volum" (did you mean "volume"?)`, `missing required argument "volume"`}},
		{name: "extra argument", schema: volumeSchema, args: `{"volume":40,"fade":true}`,
			problems: []string{`unknown argument "fade"; this tool takes "volume" (an integer from 0 to 100, required)`}, fixed: `{"volume": 40}`},
		{name: "argument to a tool without arguments", schema: noArgsSchema, args: `{"x":1}`,
			problems: []string{`unknown argument "x"; this tool takes no arguments`}, fixed: `{}`},
		{name: "no arguments for a tool without arguments", schema: noArgsSchema, args: `null`},
		{name: "arguments not an object", schema: volumeSchema, args: `[40]`,
			problems: []string{`arguments must be a JSON object of named values, got a list [40]`}, fixed: `{"volume": 50}`},
		{name: "argument given twice", schema: volumeSchema, args: `{"volume":1,"volume":2}`,
			problems: []string{`an argument is given twice ("volume")`}},
		{name: "several problems at once", schema: snapshotSchema, args: `{"quality":0,"colour":true}`,
			problems: []string{`unknown argument "colour"`, `missing required argument "url"`, `argument "quality" is 0, below the minimum of 1`},
			fixed:    `{"url": "http://example.com/file", "quality": 1}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := mustSchema(t, tc.schema)
			fwd, v := s.Validate(json.RawMessage(tc.args))
			if len(tc.problems) == 0 {
				require.Nil(t, v, "unexpected problems: %+v", v)
				want := tc.args
				if strings.TrimSpace(want) == "" || want == "null" {
					want = "{}"
				}
				assert.JSONEq(t, want, string(fwd), "the arguments are forwarded as given")
				return
			}
			require.NotNil(t, v, "expected problems")
			assert.Nil(t, fwd)
			require.Len(t, v.Problems, len(tc.problems), "%+v", v.Problems)
			for i, want := range tc.problems {
				assert.Contains(t, v.Problems[i].Msg, want)
			}
			if tc.fixed != "" {
				assert.Equal(t, tc.fixed, v.Example)
				var probe map[string]any
				require.NoError(t, json.Unmarshal([]byte(v.Example), &probe), "the suggestion is JSON")
				_, again := s.Validate(json.RawMessage(v.Example))
				if tc.fixed != `{"theme": "..."}` && tc.fixed != `{"url": "http://example.com/file", "quality": 1}` {
					assert.Nil(t, again, "the suggested arguments pass")
				}
			}
		})
	}
}

// TestExampleRespectsStringLength: the example offered with a refusal
// must itself pass; for strings with length bounds the placeholder "..."
// did not (found by FuzzValidArgsAccepted).
func TestExampleRespectsStringLength(t *testing.T) {
	for _, bounds := range []string{`"maxLength":1`, `"minLength":5`, `"minLength":2,"maxLength":2`, `"maxLength":0`} {
		s, err := Parse(json.RawMessage(`{"type":"object","properties":{"s":{"type":"string",` + bounds + `}},"required":["s"]}`))
		if err != nil {
			t.Fatal(err)
		}
		_, bad := s.Validate(nil)
		if bad == nil {
			t.Fatalf("%s: a missing required argument passed", bounds)
		}
		if _, again := s.Validate(json.RawMessage(bad.Example)); again != nil {
			t.Errorf("%s: the example %s is refused: %s", bounds, bad.Example, again.Explain("t", s))
		}
	}
}

// TestTrailingDataIsRefused: arguments with bytes after the object are
// not valid JSON; they were accepted and forwarded as they were (found by
// FuzzParseValidate).
func TestTrailingDataIsRefused(t *testing.T) {
	for _, schema := range []string{`{"type":"object","properties":{"volume":{"type":"integer"}}}`, `0`} {
		s, _ := Parse(json.RawMessage(schema))
		for _, args := range []string{`{}A`, `{"volume":35}x`, `{} {}`, `{"volume":35}]`} {
			fwd, bad := s.Validate(json.RawMessage(args))
			if bad == nil {
				t.Errorf("schema %s: %s accepted and forwarded as %s", schema, args, fwd)
			}
		}
	}
}

// TestLibraryVerdict: jsonschema-go decides what the teaching layer has
// no words of its own for (pattern, multipleOf, constraints across
// arguments); its reason is passed on.
func TestLibraryVerdict(t *testing.T) {
	s := mustSchema(t, `{"type":"object","properties":{"code":{"type":"string","pattern":"^[A-Z]{3}$"},"step":{"type":"integer","multipleOf":5}},"required":["code","step"]}`)
	_, v := s.Validate(json.RawMessage(`{"code":"abc","step":7}`))
	require.NotNil(t, v)
	require.Len(t, v.Problems, 2)
	assert.Contains(t, v.Problems[0].Msg, `argument "code" is the string "abc", which the tool's schema does not accept`)
	assert.Contains(t, v.Problems[0].Suggestion, "matching ^[A-Z]{3}$")
	assert.Contains(t, v.Problems[1].Msg, "multiple")
	_, v = s.Validate(json.RawMessage(`{"code":"ABC","step":10}`))
	assert.Nil(t, v)

	dep := mustSchema(t, `{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"}},"dependentRequired":{"a":["b"]}}`)
	_, v = dep.Validate(json.RawMessage(`{"a":"x"}`))
	require.NotNil(t, v)
	assert.Contains(t, v.Problems[0].Msg, "do not fit the tool's schema")
	_, v = dep.Validate(json.RawMessage(`{"a":"x","b":"y"}`))
	assert.Nil(t, v)

	// What the library cannot read or resolve is not checked (and says why).
	s, err := Parse(json.RawMessage(`{"type":"object","properties":{"p":{"type":"string","pattern":"("}}}`))
	require.Error(t, err)
	assert.True(t, s.Unchecked())
	assert.Equal(t, err, s.Err())
}

// TestFirmwareRules: the rules the library does not know stand on their
// own: integers beyond int32 are refused though the schema allows them,
// undeclared arguments are refused unless additionalProperties allows
// them, and a wrong type is refused even where a default would apply,
// saying so.
func TestFirmwareRules(t *testing.T) {
	s := mustSchema(t, unrangedSchema)
	_, v := s.Validate(json.RawMessage(`{"count":2147483647}`))
	assert.Nil(t, v)
	_, v = s.Validate(json.RawMessage(`{"count":-2147483649}`))
	require.NotNil(t, v)
	assert.Contains(t, v.Problems[0].Msg, "below the minimum of -2147483648")
	assert.Equal(t, `{"count": -2147483648}`, v.Example)

	wide := mustSchema(t, `{"type":"object","properties":{"n":{"type":"integer","minimum":0,"maximum":1e12}}}`)
	assert.Equal(t, "an integer from 0 to 2147483647", wide.Prop("n").Describe, "a range wider than int32 is narrowed")

	open := mustSchema(t, `{"type":"object","properties":{},"additionalProperties":true}`)
	_, v = open.Validate(json.RawMessage(`{"x":1}`))
	assert.Nil(t, v)

	snap := mustSchema(t, snapshotSchema)
	_, v = snap.Validate(json.RawMessage(`{"url":"http://x/y","quality":"90"}`))
	require.NotNil(t, v)
	assert.Contains(t, v.Problems[0].Msg, "would silently use the default 80 instead")
	assert.Equal(t, "90", v.Problems[0].Fix)

	day := mustSchema(t, `{"type":"object","properties":{"day":{"type":"string","format":"date"}},"required":["day"]}`)
	_, v = day.Validate(json.RawMessage(`{"day":"31/01/2025"}`))
	require.NotNil(t, v)
	assert.Contains(t, v.Problems[0].Msg, "YYYY-MM-DD")
	assert.Equal(t, `{"day": "2025-01-31"}`, v.Example)
	_, v = day.Validate(json.RawMessage(v.Example))
	assert.Nil(t, v)
}

// TestCheckingIsBoundedInTime: a schema comes from a board and arguments
// from a host, and neither may make checking one call take long. Before
// the bounds, a $ref with anyOf took 30 s on arguments nested 18 deep
// (doubling with each level), a pattern of 200 instructions took 1.4 s on
// a 64 KiB string, and 500 long required strings built a 32 MB example
// for every refusal.
func TestCheckingIsBoundedInTime(t *testing.T) {
	t.Run("references are not followed", func(t *testing.T) {
		s, err := Parse(json.RawMessage(`{"type":"object","properties":{"a":{"$ref":"#/$defs/n"}},"$defs":{"n":{"anyOf":[` +
			`{"type":"object","properties":{"x":{"$ref":"#/$defs/n"}},"required":["y"]},` +
			`{"type":"object","properties":{"x":{"$ref":"#/$defs/n"}},"required":["z"]}]}}}`))
		require.ErrorContains(t, err, "$ref")
		assert.True(t, s.Unchecked(), "a schema the bridge cannot check in bounded time is not checked")
		deep := `{"a":` + strings.Repeat(`{"x":`, 40) + `{}` + strings.Repeat(`}`, 40) + `}`
		_, bad := s.Validate(json.RawMessage(deep))
		assert.Nil(t, bad)
	})
	t.Run("deep schemas are not read", func(t *testing.T) {
		deep := strings.Repeat(`{"type":"object","properties":{"a":`, 40) + `{}` + strings.Repeat(`}}`, 40)
		s, err := Parse(json.RawMessage(deep))
		require.ErrorContains(t, err, "nests 81 levels")
		assert.True(t, s.Unchecked())
		assert.JSONEq(t, noArgsSchema, string(s.Published()), "what is published is the empty schema, not the deep one")
	})
	t.Run("costly patterns bound the arguments", func(t *testing.T) {
		s := mustSchema(t, `{"type":"object","properties":{"s":{"type":"string","pattern":"(?:(?:[a-z]{20}){10}x?)+y"}}}`)
		_, bad := s.Validate(json.RawMessage(`{"s":"` + strings.Repeat("a", 60<<10) + `"}`))
		require.NotNil(t, bad)
		assert.Contains(t, bad.Problems[0].Msg, "patterns can be checked against in bounded time")
		_, err := Parse(json.RawMessage(`{"type":"object","properties":{"s":{"type":"string","pattern":"` + strings.Repeat(`[a-z]{999}`, 3) + `"}}}`))
		require.ErrorContains(t, err, "too complex")
	})
	t.Run("arguments past what a board takes", func(t *testing.T) {
		s := mustSchema(t, themeSchema)
		_, bad := s.Validate(json.RawMessage(`{"theme":"` + strings.Repeat("x", MaxArgsBytes) + `"}`))
		require.NotNil(t, bad)
		assert.Contains(t, bad.Problems[0].Msg, "a board takes in one message")
	})
	t.Run("refusals stay small", func(t *testing.T) {
		var props, req []string
		for i := range 500 {
			props = append(props, fmt.Sprintf(`"p%d":{"type":"string","minLength":100000}`, i))
			req = append(req, fmt.Sprintf(`"p%d"`, i))
		}
		schema := `{"type":"object","properties":{` + strings.Join(props, ",") + `},"required":[` + strings.Join(req, ",") + `]}`
		s := mustSchema(t, schema)
		_, bad := s.Validate(json.RawMessage(`{}`))
		require.NotNil(t, bad)
		assert.Len(t, bad.Problems, maxProblems+1, "the first problems and a line saying the rest was not checked")
		assert.LessOrEqual(t, len(bad.Example), MaxArgsBytes+len(schema), "long placeholders share one budget")
		assert.True(t, json.Valid([]byte(bad.Example)))
		assert.Less(t, len(bad.Explain("t", s)), 2*MaxArgsBytes)
	})
}

func TestMeasure(t *testing.T) {
	sh, err := Measure(json.RawMessage(volumeSchema))
	require.NoError(t, err)
	assert.Equal(t, Shape{Bytes: len(volumeSchema), Depth: 3, Properties: 1}, sh)

	sh, err = Measure(json.RawMessage(`{"type":"object","properties":{"a":{"enum":[1,2,3],"default":{"$ref":"x","x-mcp-header":"h"}},` +
		`"b":{"type":"array","items":{"enum":["x"],"x-mcp-header":"H"}},"properties":{"pattern":"x"}},"$defs":{"d":{"$dynamicRef":"#x"}}}`))
	require.NoError(t, err)
	assert.Equal(t, 3, sh.Properties, "a property may be called properties")
	assert.Equal(t, 3, sh.MaxEnum)
	assert.True(t, sh.Header, "found in a schema, not in a default value")
	assert.Equal(t, "$dynamicRef", sh.Ref, "a $ref inside a default value is a value, not a reference")
	assert.Equal(t, 2, sh.PatternCost, "pattern counts where it is a keyword")

	for _, bad := range []string{`{`, `{"a":1}x`, `{} {}`, `[1,]`, ``, ` `} {
		_, err := Measure(json.RawMessage(bad))
		assert.Error(t, err, bad)
	}
}
