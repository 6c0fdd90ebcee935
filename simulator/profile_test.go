package simulator

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/configs"
)

func TestLoadEmbeddedProfiles(t *testing.T) {
	for _, name := range configs.ProfileNames() {
		p, err := LoadProfile(name)
		require.NoError(t, err, name)
		assert.Equal(t, name, p.Name)
		assert.Equal(t, "2.4.2", p.Firmware)
		assert.NotEmpty(t, p.Tools)
		// User-only tools come last, as the firmware registers them.
		seenUser := false
		for _, tl := range p.Tools {
			if tl.UserOnly {
				seenUser = true
			} else {
				assert.False(t, seenUser, "%s: AI-visible tool %s after a user-only tool", name, tl.Name)
			}
		}
	}

	bb := mustProfile(t, "breadboard")
	assert.Equal(t, "bread-compact-wifi", bb.Board)
	assert.Equal(t, "bread-compact-wifi", bb.BoardType)
	assert.Equal(t, &Display{Width: 128, Height: 32, Monochrome: true}, bb.Display)
	assert.Equal(t, Font{Size: 14, BPP: 1, Charset: "basic"}, bb.Font)
	assert.Equal(t, 70, bb.State["audio_speaker.volume"])
	assert.Equal(t, "devicebridge-lab", bb.State["network.ssid"])

	robot := mustProfile(t, "robot")
	walk := robot.Tools[toolIndex(robot, "self.otto.walk")]
	require.Len(t, walk.Properties, 3)
	assert.Equal(t, Property{Name: "steps", Type: TypeInteger, Default: 3, Min: ptr(1), Max: ptr(100)}, walk.Properties[0])
	assert.Equal(t, Property{Name: "direction", Type: TypeInteger, Default: 1, Min: ptr(-1), Max: ptr(1)}, walk.Properties[2])
	assert.Empty(t, walk.Required())
	assert.Equal(t, "otto.walk", walk.Key)
	assert.Equal(t, 41.5, robot.State["chip.temperature"])
}

func ptr(i int) *int { return &i }

func TestLoadProfileFromFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mine.yaml")
	require.NoError(t, os.WriteFile(path, []byte("board: my-board\ntools:\n  - {name: self.ping, behavior: const, text: pong}\n"), 0o600))
	p, err := LoadProfile(path)
	require.NoError(t, err)
	assert.Equal(t, "mine", p.Name)
	assert.Equal(t, "my-board", p.Board)
	assert.Equal(t, "zh-CN", p.Language)
	assert.True(t, p.GlyphPush)
	assert.Nil(t, p.Display)

	_, err = LoadProfile(filepath.Join(t.TempDir(), "missing.yaml"))
	assert.ErrorIs(t, err, os.ErrNotExist)

	_, err = LoadProfile("nosuchprofile")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "breadboard, catalog, conformance, conformance-tasks, robot")
}

func TestProfileValidation(t *testing.T) {
	const head = "board: b\nstate: {audio_speaker: {volume: 1}}\ntools:\n"
	cases := map[string]struct{ yaml, want string }{
		"board name":           {"board: Bread_Board\n", "board \"Bread_Board\""},
		"missing board":        {"tools: []\n", "board \"\""},
		"unknown field":        {"board: b\ncolour: red\n", "field colour not found"},
		"bad firmware":         {"board: b\nfirmware: '2.4 \"x\"'\n", "firmware"},
		"range needs both":     {head + "  - {name: t, behavior: set, properties: [{name: n, type: integer, min: 1}]}\n", "needs both min and max"},
		"range only max":       {head + "  - {name: t, behavior: set, properties: [{name: n, type: integer, max: 1}]}\n", "needs both min and max"},
		"min above max":        {head + "  - {name: t, behavior: set, properties: [{name: n, type: integer, min: 5, max: 1}]}\n", "greater than max"},
		"default outside":      {head + "  - {name: t, behavior: set, properties: [{name: n, type: integer, default: 0, min: 1, max: 9}]}\n", "outside the range 1..9"},
		"range on string":      {head + "  - {name: t, behavior: set, properties: [{name: n, type: string, min: 1, max: 2}]}\n", "only allowed on integer"},
		"int default on str":   {head + "  - {name: t, behavior: set, properties: [{name: n, type: string, default: 80}]}\n", "not a string"},
		"str default on int":   {head + "  - {name: t, behavior: set, properties: [{name: n, type: integer, default: x}]}\n", "not a 32-bit integer"},
		"default beyond int32": {head + "  - {name: t, behavior: set, properties: [{name: n, type: integer, default: 3000000000}]}\n", "not a 32-bit integer"},
		"bool default":         {head + "  - {name: t, behavior: set, properties: [{name: n, type: boolean, default: 1}]}\n", "not a boolean"},
		"unknown type":         {head + "  - {name: t, behavior: set, properties: [{name: n, type: number}]}\n", "must be boolean, integer or string"},
		"duplicate property":   {head + "  - {name: t, behavior: set, properties: [{name: n, type: string}, {name: n, type: string}]}\n", "duplicate property name"},
		"duplicate tool":       {head + "  - {name: t, behavior: set}\n  - {name: t, behavior: set}\n", "duplicate tool name"},
		"empty tool name":      {head + "  - {behavior: set}\n", "name must be non-empty"},
		"quote in tool name":   {head + "  - {name: 'a\"b', behavior: set}\n", "no quotes"},
		"missing behavior":     {head + "  - {name: t}\n", "behavior is missing"},
		"unknown behavior":     {head + "  - {name: t, behavior: dance}\n", "unknown behavior \"dance\""},
		"volume needs prop":    {head + "  - {name: t, behavior: set_volume}\n", "needs a integer property \"volume\""},
		"get needs key":        {head + "  - {name: t, behavior: get}\n", "needs a key"},
		"get key in state":     {head + "  - {name: t, behavior: get, key: nope}\n", "needs state key \"nope\""},
		"fail needs text":      {head + "  - {name: t, behavior: fail}\n", "needs a text"},
		"text on set":          {head + "  - {name: t, behavior: set, text: x}\n", "text is only used"},
		"theme needs display":  {head + "  - {name: t, behavior: set_theme, properties: [{name: theme, type: string}]}\n", "needs a display"},
		"brightness needs key": {head + "  - {name: t, behavior: set_brightness, properties: [{name: brightness, type: integer}]}\n", "screen.brightness"},
		"state list":           {"board: b\nstate: {a: [1, 2]}\n", "only scalars and mappings"},
		"state dotted key":     {"board: b\nstate: {a.b: 1}\n", "contain no dots"},
		"state null":           {"board: b\nstate: {a: null}\n", "unsupported value"},
	}
	for name, tc := range cases {
		_, err := ParseProfile([]byte(tc.yaml), "t")
		if assert.Error(t, err, name) {
			assert.Contains(t, err.Error(), tc.want, name)
		}
	}

	// Every problem is reported, not only the first.
	_, err := ParseProfile([]byte("board: B\nfirmware: 'x y'\n"), "t")
	require.Error(t, err)
	assert.Equal(t, 2, strings.Count(err.Error(), "\n")+1)
}

func TestProfileContentAndInputSchema(t *testing.T) {
	p := mustParseProfile(t, `board: b
tools:
  - name: pic
    description: a picture
    behavior: content
    result:
      content:
        - {type: image, mimeType: image/png, data: aGk=}
        - {type: resource, resource: {uri: "test://r", mimeType: text/plain, text: hello}}
        - {type: resource_link, uri: "test://l", name: l, size: 3}
      structuredContent: {n: 1}
  - name: form
    description: takes a number and an enum
    input_schema:
      type: object
      $defs: {x: {type: string}}
      properties:
        score: {type: number, default: 95.5}
        status: {type: string, enum: [a, b]}
      required: [score, status]
      additionalProperties: false
    behavior: echo
`)
	pic := p.Tools[0]
	assert.JSONEq(t, `{"content":[{"type":"image","mimeType":"image/png","data":"aGk="},
		{"type":"resource","resource":{"uri":"test://r","mimeType":"text/plain","text":"hello"}},
		{"type":"resource_link","uri":"test://l","name":"l","size":3}],"structuredContent":{"n":1}}`, string(pic.Result))
	form := p.Tools[1]
	assert.Equal(t, []string{"score", "status"}, form.Required())
	assert.JSONEq(t, `{"type":"object","$defs":{"x":{"type":"string"}},"properties":{"score":{"type":"number","default":95.5},
		"status":{"type":"string","enum":["a","b"]}},"required":["score","status"],"additionalProperties":false}`, string(form.InputSchema))
}

func TestProfileContentValidation(t *testing.T) {
	const head = "board: b\ntools:\n"
	cases := map[string]struct{ yaml, want string }{
		"result needs content":   {head + "  - {name: t, behavior: content}\n", "needs a result"},
		"result on const":        {head + "  - {name: t, behavior: const, result: {content: []}}\n", "needs a result"},
		"content missing":        {head + "  - {name: t, behavior: content, result: {isError: true}}\n", "content is missing"},
		"unknown result key":     {head + "  - {name: t, behavior: content, result: {content: [], colour: red}}\n", "unknown key \"colour\""},
		"unknown type":           {head + "  - {name: t, behavior: content, result: {content: [{type: video}]}}\n", "type \"video\""},
		"text needs text":        {head + "  - {name: t, behavior: content, result: {content: [{type: text}]}}\n", "text content needs text"},
		"image needs mime":       {head + "  - {name: t, behavior: content, result: {content: [{type: image, data: aGk=}]}}\n", "needs mimeType"},
		"bad base64":             {head + "  - {name: t, behavior: content, result: {content: [{type: audio, data: '*', mimeType: audio/wav}]}}\n", "not standard base64"},
		"stray key":              {head + "  - {name: t, behavior: content, result: {content: [{type: text, text: x, data: y}]}}\n", "has no key \"data\""},
		"resource text and blob": {head + "  - {name: t, behavior: content, result: {content: [{type: resource, resource: {uri: u, text: x, blob: aGk=}}]}}\n", "exactly one of text and blob"},
		"resource needs uri":     {head + "  - {name: t, behavior: content, result: {content: [{type: resource, resource: {text: x}}]}}\n", "needs a uri"},
		"link needs name":        {head + "  - {name: t, behavior: content, result: {content: [{type: resource_link, uri: u}]}}\n", "needs name"},
		"isError not bool":       {head + "  - {name: t, behavior: content, result: {content: [], isError: 1}}\n", "isError must be"},
		"structured not mapping": {head + "  - {name: t, behavior: content, result: {content: [], structuredContent: [1]}}\n", "must be a mapping"},
		"schema not object":      {head + "  - {name: t, behavior: const, input_schema: {type: string}}\n", "type: object"},
		"schema and properties":  {head + "  - {name: t, behavior: const, input_schema: {type: object}, properties: [{name: n, type: string}]}\n", "not both"},
		"schema on set":          {head + "  - {name: t, behavior: set, input_schema: {type: object}}\n", "input_schema only goes with"},
		"schema required list":   {head + "  - {name: t, behavior: const, input_schema: {type: object, required: x}}\n", "list of argument names"},
		"schema int keys":        {head + "  - {name: t, behavior: const, input_schema: {type: object, properties: {1: {type: string}}}}\n", "mapping keys must be strings"},
		"result too large":       {head + "  - {name: t, behavior: content, result: {content: [{type: text, text: " + strings.Repeat("x", MaxResultBytes) + "}]}}\n", "more than 32768"},
		"tool over a page":       {head + "  - {name: t, behavior: const, input_schema: {type: object, description: " + strings.Repeat("x", 8000) + "}}\n", "more than a page holds"},
	}
	for name, tc := range cases {
		_, err := ParseProfile([]byte(tc.yaml), "t")
		if assert.Error(t, err, name) {
			assert.Contains(t, err.Error(), tc.want, name)
		}
	}
}
