package flow

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/devicebridge/devicebridge/internal/argcheck"
	"github.com/google/jsonschema-go/jsonschema"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestElicitSchema(t *testing.T) {
	s := `{"type":"object","properties":{
		"volume":{"type":"integer","minimum":0,"maximum":100},
		"ratio":{"type":"number","minimum":0.5},
		"enable":{"type":"boolean","default":true},
		"mode":{"type":"string","enum":["eco","turbo"],"enumNames":["Eco","Turbo"]},
		"day":{"type":"string","format":"date"},
		"name":{"type":"string","minLength":2,"maxLength":20,"pattern":"^[a-z]+$"},
		"level":{"type":"integer","enum":[1,2]}
	},"required":["volume","ratio","mode","day","name","level"]}`
	tool := &Tool{Name: "t", InputSchema: raw(s), Confirm: true}
	p, err := tool.Plan(nil, false)
	require.NoError(t, err)
	got, err := ElicitSchema(p.Asks())
	require.NoError(t, err)
	assert.JSONEq(t, `{"type":"object","properties":{
		"volume":{"type":"integer","minimum":0,"maximum":100,"title":"volume","description":"volume: a whole number from 0 to 100."},
		"ratio":{"type":"number","minimum":0.5,"title":"ratio","description":"ratio: a number of at least 0.5."},
		"mode":{"type":"string","enum":["eco","turbo"],"enumNames":["Eco","Turbo"],"title":"mode","description":"mode: choose one of \"eco\", \"turbo\"."},
		"day":{"type":"string","format":"date","title":"day","description":"day: a date (YYYY-MM-DD)."},
		"name":{"type":"string","minLength":2,"maxLength":20,"title":"name","description":"name: a string of 2 to 20 characters matching ^[a-z]+$."},
		"level":{"type":"number","title":"level","description":"level: choose one of 1, 2. Allowed: 1, 2."},
		"confirm":{"type":"boolean","default":false,"title":"Confirm","description":"Run t?"}
	},"required":["volume","ratio","mode","day","name","level","confirm"]}`, string(got))
	assert.NotContains(t, string(got), "pattern", "elicitation has no pattern")

	// Key order follows the prompts.
	var order []string
	dec := json.NewDecoder(bytesReader(got))
	_, _ = dec.Token()
	for dec.More() {
		tok, _ := dec.Token()
		if tok == "properties" {
			order, _, _ = argcheck.Split(mustRaw(dec))
		} else {
			mustRaw(dec)
		}
	}
	assert.Equal(t, []string{"volume", "ratio", "mode", "day", "name", "level", "confirm"}, order)

	// The result is a schema jsonschema-go reads.
	var js jsonschema.Schema
	require.NoError(t, json.Unmarshal(got, &js))
	_, err = js.Resolve(nil)
	require.NoError(t, err)

	// Defaults of optional properties (guided).
	opt := &Tool{Name: "t", InputSchema: raw(`{"type":"object","properties":{"enable":{"type":"boolean","default":true},"q":{"type":"integer","default":80,"minimum":1,"maximum":100}}}`)}
	p, err = opt.Plan(nil, true)
	require.NoError(t, err)
	got, err = ElicitSchema(p.Asks())
	require.NoError(t, err)
	assert.JSONEq(t, `{"type":"object","properties":{
		"enable":{"type":"boolean","default":true,"title":"enable","description":"enable: answer true or false (default true)."},
		"q":{"type":"integer","default":80,"minimum":1,"maximum":100,"title":"q","description":"q: a whole number from 1 to 100 (default 80)."}}}`, string(got))
}

func TestElicitSchemaRefusesWhatFormsCannotCarry(t *testing.T) {
	for _, s := range []string{
		`{"type":"object","properties":{"tags":{"type":"array"}},"required":["tags"]}`,
		`{"type":"object","properties":{"o":{"type":"object"}},"required":["o"]}`,
		`{"type":"object","properties":{"m":{"enum":["a",1]}},"required":["m"]}`,
	} {
		p, err := (&Tool{Name: "t", InputSchema: raw(s)}).Plan(nil, false)
		require.NoError(t, err)
		_, err = ElicitSchema(p.Asks())
		fe := requireCode(t, err, CodeNotInteractive)
		assert.Contains(t, fe.Message, "arguments", s)
	}
	// A property named like the confirmation field collides with it.
	p, err := (&Tool{Name: "t", Confirm: true, InputSchema: raw(`{"type":"object","properties":{"confirm":{"type":"string"}},"required":["confirm"]}`)}).Plan(nil, false)
	require.NoError(t, err)
	_, err = ElicitSchema(p.Asks())
	requireCode(t, err, CodeNotInteractive)
	_, err = ElicitSchema(p.Prompts)
	require.NoError(t, err)
}

// TestElicitSchemaEnumForms: a choice is asked in the form the board's
// schema wrote it (MCP's SEP-1330 forms): values alone stay an untitled
// enum, titled consts (oneOf) stay titled consts, enumNames stay the
// legacy form, and an array of enumerated items becomes a multi-select,
// untitled or titled; the answers are checked against the board's schema.
func TestElicitSchemaEnumForms(t *testing.T) {
	s := `{"type":"object","properties":{
		"plain":{"type":"string","enum":["a","b"]},
		"titled":{"type":"string","oneOf":[{"const":"v1","title":"First"},{"const":"v2","title":"Second"}]},
		"legacy":{"type":"string","enum":["o1","o2"],"enumNames":["One","Two"]},
		"multi":{"type":"array","items":{"type":"string","enum":["a","b","c"]},"minItems":1,"maxItems":2},
		"titledMulti":{"type":"array","items":{"anyOf":[{"const":"v1","title":"First"},{"const":"v2","title":"Second"}]},"default":["v1"]}
	},"required":["plain","titled","legacy","multi","titledMulti"]}`
	tool := &Tool{Name: "t", InputSchema: raw(s)}
	p, err := tool.Plan(nil, false)
	require.NoError(t, err)
	require.Len(t, p.Prompts, 5)
	assert.True(t, p.Prompts[3].Multiple)
	got, err := ElicitSchema(p.Asks())
	require.NoError(t, err)
	assert.JSONEq(t, `{"type":"object","properties":{
		"plain":{"type":"string","enum":["a","b"],"title":"plain","description":"plain: choose one of \"a\", \"b\"."},
		"titled":{"type":"string","oneOf":[{"const":"v1","title":"First"},{"const":"v2","title":"Second"}],"title":"titled","description":"titled: choose one of \"v1\", \"v2\"."},
		"legacy":{"type":"string","enum":["o1","o2"],"enumNames":["One","Two"],"title":"legacy","description":"legacy: choose one of \"o1\", \"o2\"."},
		"multi":{"type":"array","items":{"type":"string","enum":["a","b","c"]},"minItems":1,"maxItems":2,"title":"multi","description":"multi: choose any of \"a\", \"b\", \"c\" (a list)."},
		"titledMulti":{"type":"array","items":{"anyOf":[{"const":"v1","title":"First"},{"const":"v2","title":"Second"}]},"default":["v1"],"title":"titledMulti","description":"titledMulti: choose any of \"v1\", \"v2\" (a list) (default [\"v1\"])."}
	},"required":["plain","titled","legacy","multi","titledMulti"]}`, string(got))

	// Answers are held to the board's schema, and refused ones asked again.
	p, err = tool.Answer(p, map[string]json.RawMessage{"plain": raw(`"a"`), "titled": raw(`"v3"`), "legacy": raw(`"o2"`),
		"multi": raw(`["a","b","c"]`), "titledMulti": raw(`["v2"]`)})
	require.NoError(t, err)
	var asked []string
	for _, pr := range p.Prompts {
		asked = append(asked, pr.Property)
	}
	assert.Equal(t, []string{"titled", "multi"}, asked)
	p, err = tool.Answer(p, map[string]json.RawMessage{"titled": raw(`"v1"`), "multi": raw(`["c","a"]`)})
	require.NoError(t, err)
	require.True(t, p.Ready())
	assert.JSONEq(t, `{"plain":"a","titled":"v1","legacy":"o2","multi":["c","a"],"titledMulti":["v2"]}`, string(p.Args))
}

// TestElicitationPath walks the standard MCP path: plan, elicit, answer,
// re-ask a refused answer, confirm, execute.
func TestElicitationPath(t *testing.T) {
	c := &calls{}
	tool := recordingTool("self.camera.take_photo", photoSchema, c)
	tool.Confirm = true
	p, err := tool.Plan(raw(`{"quality":500}`), false)
	require.NoError(t, err)
	require.Len(t, p.Prompts, 2)
	assert.Equal(t, "url", p.Prompts[0].Property)
	assert.Equal(t, "quality", p.Prompts[1].Property)
	assert.Contains(t, p.Prompts[1].Error, "maximum of 100")
	require.NotNil(t, p.Confirm)

	// The form comes back with a bad quality and a premature yes.
	p, err = tool.Answer(p, map[string]json.RawMessage{"url": raw(`"http://v/x"`), "quality": raw(`0`), ConfirmField: raw(`true`)})
	require.NoError(t, err)
	assert.False(t, p.Ready())
	require.Len(t, p.Prompts, 1)
	assert.Contains(t, p.Prompts[0].Error, "minimum of 1")
	require.NotNil(t, p.Confirm, "confirmation is asked again with the final arguments")
	assert.JSONEq(t, `{"url":"http://v/x"}`, string(p.Args))

	p, err = tool.Answer(p, map[string]json.RawMessage{"quality": raw(`90`), ConfirmField: raw(`"yes"`)})
	require.NoError(t, err)
	require.Empty(t, p.Prompts)
	require.NotNil(t, p.Confirm)
	assert.Contains(t, p.Confirm.Error, "true or false")
	assert.Equal(t, "Run self.camera.take_photo with quality=90 url=http://v/x?", p.Confirm.Message, "with the final arguments")

	declined, err := tool.Answer(p, map[string]json.RawMessage{ConfirmField: raw(`false`)})
	require.NoError(t, err)
	assert.True(t, declined.Declined)
	assert.False(t, declined.Ready())

	p, err = tool.Answer(p, map[string]json.RawMessage{ConfirmField: raw(`true`)})
	require.NoError(t, err)
	require.True(t, p.Ready())
	_, err = tool.Execute(context.Background(), p.Args)
	require.NoError(t, err)
	assert.Equal(t, []string{`{"quality":90,"url":"http://v/x"}`}, c.list())
}

func TestMerge(t *testing.T) {
	got, err := Merge(raw(`{"a":1,"b":2}`), map[string]json.RawMessage{"b": raw(`null`), "c": raw(` "x" `)})
	require.NoError(t, err)
	assert.JSONEq(t, `{"a":1,"c":"x"}`, string(got))
	got, err = Merge(nil, nil)
	require.NoError(t, err)
	assert.JSONEq(t, `{}`, string(got))
	_, err = Merge(raw(`[1]`), nil)
	requireCode(t, err, CodeValidationFailed)
	_, err = Merge(nil, map[string]json.RawMessage{"a": raw(`{`)})
	requireCode(t, err, CodeValidationFailed)
}
