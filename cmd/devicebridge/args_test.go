package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
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
