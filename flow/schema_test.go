package flow

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/devicebridge/devicebridge/internal/argcheck"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func plan(t *testing.T, schema, args string, guided bool) *Plan {
	t.Helper()
	tool := &Tool{Name: "tool", InputSchema: raw(schema)}
	p, err := tool.Plan(raw(args), guided)
	require.NoError(t, err)
	return p
}

func TestPromptsForFirmwareTypes(t *testing.T) {
	// integer with a range → number with min/max
	p := plan(t, volumeSchema, `{}`, false)
	require.Len(t, p.Prompts, 1)
	v := p.Prompts[0]
	assert.Equal(t, PromptNumber, v.Type)
	assert.Equal(t, "volume", v.Property)
	require.NotNil(t, v.Validation)
	assert.True(t, v.Validation.Required)
	assert.True(t, v.Validation.Integer)
	assert.Equal(t, 0.0, *v.Validation.Min)
	assert.Equal(t, 100.0, *v.Validation.Max)
	assert.Contains(t, v.Message, "from 0 to 100")
	assert.True(t, p.Ready() == false)

	// string → text
	p = plan(t, themeSchema, `{}`, false)
	require.Len(t, p.Prompts, 1)
	assert.Equal(t, PromptText, p.Prompts[0].Type)
	assert.Equal(t, "theme", p.Prompts[0].Property)

	// boolean → confirm
	p = plan(t, enableSchema, `null`, false)
	require.Len(t, p.Prompts, 1)
	assert.Equal(t, PromptConfirm, p.Prompts[0].Type)
	assert.Equal(t, "enable", p.Prompts[0].Property)

	// required string, optional integer with default: only the required one
	p = plan(t, photoSchema, ``, false)
	require.Len(t, p.Prompts, 1)
	assert.Equal(t, "url", p.Prompts[0].Property)

	// no properties: nothing to ask, even guided
	p = plan(t, emptySchema, `{}`, true)
	assert.Empty(t, p.Prompts)
	assert.True(t, p.Ready())
	assert.JSONEq(t, `{}`, string(p.Args))
}

func TestDefaultsBecomeDefaultValue(t *testing.T) {
	// Optional properties are asked only when guided and nothing is required.
	s := `{"type":"object","properties":{"quality":{"type":"integer","default":80,"minimum":1,"maximum":100},"mute":{"type":"boolean","default":false}}}`
	p := plan(t, s, `{}`, false)
	assert.Empty(t, p.Prompts)
	p = plan(t, s, `{}`, true)
	require.Len(t, p.Prompts, 2)
	assert.Equal(t, "quality", p.Prompts[0].Property, "declaration order")
	assert.JSONEq(t, `80`, string(p.Prompts[0].DefaultValue))
	assert.False(t, p.Prompts[0].Validation.Required)
	assert.Equal(t, "mute", p.Prompts[1].Property)
	assert.JSONEq(t, `false`, string(p.Prompts[1].DefaultValue))

	// Guided does not ask optional ones when the tool has required ones.
	p = plan(t, photoSchema, `{}`, true)
	require.Len(t, p.Prompts, 1)
	assert.Equal(t, "url", p.Prompts[0].Property)
}

func TestPromptsForOtherSchemaTypes(t *testing.T) {
	s := `{"type":"object","properties":{
		"mode":{"type":"string","enum":["eco","turbo"],"enumNames":["Eco mode","Turbo mode"]},
		"level":{"type":"integer","enum":[1,2,3]},
		"day":{"type":"string","format":"date"},
		"name":{"type":"string","minLength":3,"maxLength":50,"pattern":"^[a-z]+$"},
		"email":{"type":"string","format":"email"},
		"ratio":{"type":"number","minimum":0.5,"maximum":2.5},
		"tags":{"type":"array","items":{"type":"string"}},
		"opts":{"type":"object"},
		"anything":{},
		"maybe":{"type":["string","null"]}
	},"required":["mode","level","day","name","email","ratio","tags","opts","anything","maybe"]}`
	p := plan(t, s, `{}`, false)
	byProp := map[string]Prompt{}
	for _, q := range p.Prompts {
		byProp[q.Property] = q
	}
	require.Len(t, byProp, 10)

	mode := byProp["mode"]
	assert.Equal(t, PromptChoice, mode.Type)
	require.Len(t, mode.Choices, 2)
	assert.JSONEq(t, `"eco"`, string(mode.Choices[0].Value))
	assert.Equal(t, "Eco mode", mode.Choices[0].Label)

	level := byProp["level"]
	assert.Equal(t, PromptChoice, level.Type)
	require.Len(t, level.Choices, 3)
	assert.JSONEq(t, `2`, string(level.Choices[1].Value))
	assert.Equal(t, "2", level.Choices[1].Label)

	day := byProp["day"]
	assert.Equal(t, PromptDate, day.Type)
	assert.Equal(t, "date", day.Validation.Format)

	name := byProp["name"]
	assert.Equal(t, PromptText, name.Type)
	assert.Equal(t, "^[a-z]+$", name.Validation.Pattern)
	assert.Equal(t, 3.0, *name.Validation.Min)
	assert.Equal(t, 50.0, *name.Validation.Max)

	assert.Equal(t, PromptText, byProp["email"].Type)
	assert.Equal(t, "email", byProp["email"].Validation.Format)

	ratio := byProp["ratio"]
	assert.Equal(t, PromptNumber, ratio.Type)
	assert.False(t, ratio.Validation.Integer)
	assert.Equal(t, 0.5, *ratio.Validation.Min)
	assert.Equal(t, 2.5, *ratio.Validation.Max)

	assert.Equal(t, PromptCustom, byProp["tags"].Type)
	assert.Equal(t, PromptCustom, byProp["opts"].Type)
	assert.Equal(t, PromptCustom, byProp["anything"].Type)
	assert.Equal(t, PromptText, byProp["maybe"].Type, "the non-null type of a union")

	// The wire shape is the spec's (Appendix A).
	b, err := json.Marshal(mode)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"choices":[{"value":"eco","label":"Eco mode"}`)
	b, err = json.Marshal(byProp["ratio"])
	require.NoError(t, err)
	assert.Contains(t, string(b), `"validation":{"required":true,"min":0.5,"max":2.5}`)
}

func TestInvalidValuesArePromptedWithTeaching(t *testing.T) {
	p := plan(t, volumeSchema, `{"volume":150}`, false)
	require.Len(t, p.Prompts, 1)
	q := p.Prompts[0]
	assert.Contains(t, q.Error, "150")
	assert.Contains(t, q.Error, "maximum of 100")
	assert.Contains(t, q.Suggestion, "from 0 to 100")
	assert.Contains(t, q.Suggestion, "for example 100")
	require.Len(t, p.Problems, 1)
	assert.Equal(t, "volume", p.Problems[0].Property)
	assert.JSONEq(t, `{}`, string(p.Args), "invalid values are not kept")

	// A whole number is needed: the board would truncate 50.7.
	p = plan(t, volumeSchema, `{"volume":50.7}`, false)
	require.Len(t, p.Prompts, 1)
	assert.Contains(t, p.Prompts[0].Error, "whole number")
	assert.Contains(t, p.Prompts[0].Error, "cut it to 50")
	assert.Contains(t, p.Prompts[0].Suggestion, "for example 51")

	// A wrong type counts as absent on the board, where a default would
	// silently replace it: the bridge refuses it and says so.
	p = plan(t, photoSchema, `{"url":"http://x/y","quality":"90"}`, false)
	require.Len(t, p.Prompts, 1)
	assert.Equal(t, "quality", p.Prompts[0].Property)
	assert.Contains(t, p.Prompts[0].Error, "default 80")
	assert.Contains(t, p.Prompts[0].Suggestion, "for example 90")
	assert.JSONEq(t, `{"url":"http://x/y"}`, string(p.Args))

	p = plan(t, enableSchema, `{"enable":1}`, false)
	require.Len(t, p.Prompts, 1)
	assert.Contains(t, p.Prompts[0].Error, "true or false")
	assert.Contains(t, p.Prompts[0].Suggestion, "for example true")

	p = plan(t, themeSchema, `{"theme":7}`, false)
	require.Len(t, p.Prompts, 1)
	assert.Contains(t, p.Prompts[0].Suggestion, `"7"`)

	// Valid arguments: ready.
	p = plan(t, photoSchema, `{"url":"http://x/y","quality":90}`, false)
	assert.True(t, p.Ready())
	assert.JSONEq(t, `{"url":"http://x/y","quality":90}`, string(p.Args))
}

func TestIntegersAreInt32(t *testing.T) {
	s := `{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}`
	p := plan(t, s, `{"n":2147483647}`, false)
	assert.True(t, p.Ready())
	p = plan(t, s, `{"n":2147483648}`, false)
	require.Len(t, p.Prompts, 1)
	assert.Contains(t, p.Prompts[0].Error, "2147483647")
	p = plan(t, s, `{"n":-2147483649}`, false)
	require.Len(t, p.Prompts, 1)
	assert.Contains(t, p.Prompts[0].Error, "-2147483648")
	// A declared range wider than int32 is narrowed.
	s = `{"type":"object","properties":{"n":{"type":"integer","minimum":0,"maximum":1e12}},"required":["n"]}`
	p = plan(t, s, `{}`, false)
	assert.Equal(t, 2147483647.0, *p.Prompts[0].Validation.Max)
}

func TestLibraryVerdictWithoutOwnRule(t *testing.T) {
	// jsonschema-go checks what the engine has no rule of its own for
	// (pattern, multipleOf); its reason is passed on with a suggestion.
	s := `{"type":"object","properties":{"code":{"type":"string","pattern":"^[A-Z]{3}$"},"step":{"type":"integer","multipleOf":5}},"required":["code","step"]}`
	p := plan(t, s, `{"code":"abc","step":7}`, false)
	require.Len(t, p.Prompts, 2)
	assert.Contains(t, p.Prompts[0].Error, "regular expression")
	assert.Contains(t, p.Prompts[0].Suggestion, "matching ^[A-Z]{3}$")
	assert.Contains(t, p.Prompts[1].Error, "multiple")
	assert.True(t, plan(t, s, `{"code":"ABC","step":10}`, false).Ready())
}

func TestDateFormatChecked(t *testing.T) {
	s := `{"type":"object","properties":{"day":{"type":"string","format":"date"}},"required":["day"]}`
	p := plan(t, s, `{"day":"31/01/2025"}`, false)
	require.Len(t, p.Prompts, 1)
	assert.Contains(t, p.Prompts[0].Error, "YYYY-MM-DD")
	assert.True(t, plan(t, s, `{"day":"2025-01-31"}`, false).Ready())
}

func TestPlanErrorsTeach(t *testing.T) {
	tool := &Tool{Name: "self.audio_speaker.set_volume", InputSchema: raw(volumeSchema)}
	_, err := tool.Plan(raw(`{"volum":40}`), false)
	fe := requireCode(t, err, CodeValidationFailed)
	assert.Contains(t, fe.Message, `did you mean "volume"`)
	assert.Contains(t, fe.Message, `{"volume": 50}`)

	_, err = tool.Plan(raw(`[40]`), false)
	fe = requireCode(t, err, CodeValidationFailed)
	assert.Contains(t, fe.Message, "object")

	_, err = tool.Plan(raw(`{"volume":1,"volume":2}`), false)
	fe = requireCode(t, err, CodeValidationFailed)
	assert.Contains(t, fe.Message, "given twice")

	// Undeclared arguments are fine when the schema allows them.
	open := &Tool{Name: "t", InputSchema: raw(`{"type":"object","properties":{},"additionalProperties":true}`)}
	p, err := open.Plan(raw(`{"x":1}`), false)
	require.NoError(t, err)
	assert.True(t, p.Ready())

	// Constraints across properties come from jsonschema-go.
	dep := &Tool{Name: "t", InputSchema: raw(`{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"}},"dependentRequired":{"a":["b"]}}`)}
	_, err = dep.Plan(raw(`{"a":"x"}`), false)
	fe = requireCode(t, err, CodeValidationFailed)
	assert.Contains(t, fe.Message, "missing properties")

	for _, s := range []string{`{"type":"array"}`, `[1]`, `{"type":"object","properties":{"a":{"type":7}}}`} {
		bad := &Tool{Name: "t", InputSchema: raw(s)}
		_, err = bad.Plan(nil, false)
		fe = requireCode(t, err, CodeNotInteractive)
		assert.Contains(t, fe.Message, "tools/call", s)
	}
}

func TestConfirmationPlanned(t *testing.T) {
	tool := &Tool{Name: "self.reboot", InputSchema: raw(emptySchema), Confirm: true}
	p, err := tool.Plan(nil, false)
	require.NoError(t, err)
	assert.False(t, p.Ready())
	require.NotNil(t, p.Confirm)
	assert.Equal(t, PromptConfirm, p.Confirm.Type)
	assert.Empty(t, p.Confirm.Property)
	assert.JSONEq(t, `false`, string(p.Confirm.DefaultValue))
	assert.Equal(t, "Run self.reboot? The board restarts: it is offline until it reconnects.", p.Confirm.Message)
	assert.Len(t, p.Asks(), 1)

	tool.Label, tool.Board = "self.reboot", "kitchen"
	p, err = tool.Plan(nil, false)
	require.NoError(t, err)
	assert.Equal(t, "Run self.reboot on kitchen? The board restarts: it is offline until it reconnects.", p.Confirm.Message)

	tool.ConfirmMessage = "Reboot the board?"
	p, err = tool.Plan(nil, false)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(p.Confirm.Message, "Reboot the board?"))
}

func TestConfirmQuestion(t *testing.T) {
	for _, tc := range []struct{ args, want string }{
		{``, "Run self.x on desk?"},
		{`{}`, "Run self.x on desk?"},
		{`{"volume":35}`, "Run self.x on desk with volume=35?"},
		{`{"theme":"dark","on":true}`, "Run self.x on desk with theme=dark on=true?"},
		{`{"text":"hello world","list":[1,2],"o":{"a":null}}`, `Run self.x on desk with text="hello world" list=[1,2] o={"a":null}?`},
		{`{"s":""}`, `Run self.x on desk with s=""?`},
		{`{"long":"` + strings.Repeat("a", 100) + `"}`, "Run self.x on desk with long=" + strings.Repeat("a", 59) + "…?"},
	} {
		assert.Equal(t, tc.want, ConfirmQuestion("self.x", "desk", raw(tc.args)), tc.args)
	}
	assert.Equal(t, "Run self.upgrade_firmware with url=http://h/f.bin? The board installs the firmware and restarts: it is offline until it reconnects.",
		ConfirmQuestion("self.upgrade_firmware", "", raw(`{"url":"http://h/f.bin"}`)))
}

func TestSchemaCacheResolvesOnce(t *testing.T) {
	a := loadSchema(raw(volumeSchema))
	b := loadSchema(raw(" " + volumeSchema + "\n"))
	assert.Same(t, a, b)
	assert.NotSame(t, a, loadSchema(raw(themeSchema)))
}

// TestSameVerdictAsToolsCall: an interaction and a plain tools/call (or
// control-API call) judge and word the same arguments the same way: both
// run internal/argcheck.
func TestSameVerdictAsToolsCall(t *testing.T) {
	for _, args := range []string{`{"volume":150}`, `{"volume":"loud"}`, `{"volume":50.7}`, `{"volume":3000000000}`} {
		s, err := argcheck.Parse(raw(volumeSchema))
		require.NoError(t, err)
		_, bad := s.Validate(raw(args))
		require.NotNil(t, bad, args)
		p := plan(t, volumeSchema, args, false)
		require.Len(t, p.Problems, 1, args)
		assert.Equal(t, bad.Problems[0].Msg, p.Problems[0].Error, args)
	}
}
