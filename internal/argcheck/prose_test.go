package argcheck

import (
	"encoding/json"
	"testing"

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
