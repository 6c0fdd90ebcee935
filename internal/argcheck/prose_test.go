package argcheck

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProseDefault(t *testing.T) {
	for _, tc := range []struct {
		name, desc, format, def string
		prose                   bool
	}{
		// The firmware's self.upgrade_firmware.
		{name: "url", def: `"The URL of the firmware binary file to download and install"`, prose: true},
		{name: "url", desc: "Where to upload the picture", def: `"Where to upload the picture."`, prose: true},
		{name: "upload_url", def: `"see the manual"`, prose: true},
		{name: "target", format: "uri", def: `"a web address"`, prose: true},
		{name: "theme", def: `"The theme of the screen, light or dark"`, prose: true},
		{name: "text", desc: "Text to say aloud through the speaker", def: `"text to say aloud"`, prose: true},
		{name: "text", desc: "Text to say aloud through the speaker", def: `"Text to say aloud through speaker"`, prose: true},
		// Values.
		{name: "url", def: `"http://192.168.1.10/firmware.bin"`},
		{name: "url", def: `"/upload"`},
		{name: "url", def: `""`},
		{name: "theme", def: `"dark"`},
		{name: "greeting", def: `"Hello there, how are you today"`},
		{name: "greeting", desc: "The greeting to say at boot", def: `"Good morning to you all"`},
		{name: "quality", def: `80`},
		{name: "enabled", desc: "true", def: `true`},
	} {
		got := ProseDefault(tc.name, tc.desc, tc.format, json.RawMessage(tc.def))
		assert.Equal(t, tc.prose, got, "%s %s", tc.name, tc.def)
	}
}

// TestProseDefaultIsNotADefault: the parsed schema neither offers a prose
// default nor uses it as an example, though the published schema is the
// board's own.
func TestProseDefaultIsNotADefault(t *testing.T) {
	s := mustSchema(t, upgradeSchema)
	p := s.Prop("url")
	require.NotNil(t, p)
	assert.Nil(t, p.Default)
	assert.JSONEq(t, `"The URL of the firmware binary file to download and install"`, string(p.IgnoredDefault))
	assert.Equal(t, `"http://example.com/file"`, p.Example())
	assert.Equal(t, `"url" (a URL, optional)`, s.ArgList())
	assert.JSONEq(t, upgradeSchema, string(s.Published()))

	q := mustSchema(t, snapshotSchema).Prop("quality")
	assert.JSONEq(t, `80`, string(q.Default), "a value stays the default")
	assert.Nil(t, q.IgnoredDefault)
}

func TestURLArguments(t *testing.T) {
	p := mustSchema(t, snapshotSchema).Prop("url")
	assert.Equal(t, "a URL", p.Describe)
	pr := p.Check(json.RawMessage(`{}`))
	require.NotNil(t, pr)
	assert.Equal(t, `Send a URL for "url", for example "http://example.com/file".`, pr.Suggestion)
	short := mustSchema(t, `{"type":"object","properties":{"url":{"type":"string","maxLength":5}},"required":["url"]}`).Prop("url")
	assert.Equal(t, `"..."`, short.Example(), "an example must fit the bounds")
}

// TestValuesShownAsText: values quoted in messages show their characters
// as UTF-8, however the board or the caller escaped them (Python's
// json.dumps sends "\u5317\u4eac" for 北京), while quotes, backslashes,
// control characters and bidirectional controls stay escaped.
func TestValuesShownAsText(t *testing.T) {
	s := mustSchema(t, `{"type":"object","properties":{
		"city":{"type":"string","default":"\u5317\u4eac","enum":["\u5317\u4eac","\u4e0a\u6d77","a&b"]},
		"days":{"type":"integer","minimum":1,"maximum":7}},"required":["days"]}`)
	city := s.Prop("city")
	assert.Equal(t, `"北京"`, string(city.Default))
	assert.Equal(t, []string{`"北京"`, `"上海"`, `"a&b"`}, []string{string(city.Enum[0]), string(city.Enum[1]), string(city.Enum[2])})
	assert.Contains(t, s.ArgList(), `default "北京"`)
	_, v := s.Validate(json.RawMessage(`{"days":2,"city":"\u6df1\u5733"}`))
	require.NotNil(t, v)
	msg := v.Problems[0].Msg + " " + v.Problems[0].Suggestion
	assert.Contains(t, msg, `the string "深圳"`)
	assert.Contains(t, msg, `"北京"`)
	assert.NotContains(t, msg, `\u`)

	for in, want := range map[string]string{
		`"\u5317\u4eac"`:            `"北京"`,
		`{"k" : "\u00e9t\u00e9"}`:   `{"k":"été"}`,
		`"\ud83d\ude00"`:            `"😀"`,
		`"say \"hi\"\\\n\t"`:        `"say \"hi\"\\\n\t"`,
		`"\u0007bell\u001b[0m"`:     `"\u0007bell\u001b[0m"`,
		`"\u0085\u2028\u2029"`:      `"\u0085\u2028\u2029"`,
		`"abc\u202egnp.exe"`:        `"abc\u202egnp.exe"`,
		`"\ufeffbom"`:               `"\ufeffbom"`,
		`"a\u003cb\u003e\u0026"`:    `"a<b>&"`,
		`["\u00e9",1.50,true,null]`: `["é",1.50,true,null]`,
		`{"\u00e9":{"x":"\u00e9"}}`: `{"é":{"x":"é"}}`,
		`"plain"`:                   `"plain"`,
		"\"raw \x7f\"":              `"raw \u007f"`,
		`not json`:                  `not json`,
	} {
		assert.Equal(t, want, string(Compact(json.RawMessage(in))), in)
	}
}

// TestCutKeepsCharacters: a long value is cut at a character boundary.
func TestCutKeepsCharacters(t *testing.T) {
	long := strings.Repeat("北", 30) // 90 bytes
	got := cut(long)
	assert.True(t, utf8.ValidString(got), got)
	assert.True(t, strings.HasSuffix(got, "..."))
	assert.LessOrEqual(t, len(got), 60)
}
