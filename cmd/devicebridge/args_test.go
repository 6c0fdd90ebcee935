package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCLIArgs: the bridge's example arguments, as they are typed on the
// command line.
func TestCLIArgs(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"volume":100}`, `volume=100`},
		{`{"theme":"dark","on":true}`, `theme=dark on=true`},
		{`{"text":"hello world"}`, `'text=hello world'`},
		{`{"text":"it's"}`, `'text=it'\''s'`},
		{`{"url":"http://example.com/file"}`, `url=http://example.com/file`},
		{`{"list":[1,2],"o":{"a":"<b>"},"n":null}`, `'list:=[1,2]' 'o:={"a":"<b>"}' n:=null`},
		{`{}`, ``},
	} {
		got, ok := cliArgs(json.RawMessage(tc.in))
		assert.True(t, ok, tc.in)
		assert.Equal(t, tc.want, got, tc.in)
	}
	for _, bad := range []string{``, `[1]`, `"x"`, `{"a":`} {
		_, ok := cliArgs(json.RawMessage(bad))
		assert.False(t, ok, bad)
	}
}

// TestChoose: a choice is given by number, label or value; a multiple
// choice prompt takes them comma-separated.
func TestChoose(t *testing.T) {
	var pr flowPrompt
	require.NoError(t, json.Unmarshal([]byte(`{"type":"choice","multiple":true,"choices":[{"value":"v1","label":"First"},{"value":"v2","label":"Second"}]}`), &pr))
	assert.Equal(t, json.RawMessage(`"v1"`), pr.choose("1"))
	assert.Equal(t, json.RawMessage(`"v2"`), pr.choose("second"))
	assert.Equal(t, json.RawMessage(`"v2"`), pr.choose("v2"))
	assert.Equal(t, "v3", pr.choose("v3"))
	assert.True(t, pr.Multiple)
}
