package mcpera

import (
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFilter(t *testing.T) {
	out, err := Filter([]byte(`{"b":1,"ttlMs":0,"a":{"ttlMs":2},"z":"\u5317","cacheScope":"public"}`),
		func(k string) bool { return !legacyDrop[k] })
	require.NoError(t, err)
	assert.Equal(t, `{"b":1,"a":{"ttlMs":2},"z":"\u5317"}`, string(out), "top level only, order and values kept")

	out, err = Filter([]byte(`{}`), func(string) bool { return true })
	require.NoError(t, err)
	assert.Equal(t, `{}`, string(out))
	for _, bad := range []string{`[]`, `null`, `{"a":`, ``} {
		_, err := Filter([]byte(bad), func(string) bool { return true })
		assert.Error(t, err, bad)
	}
}

// TestShapedKeepsMeta: a shaped result's metadata is the wrapped one's, so
// go-sdk's own additions after the middleware (the server's identity)
// land in what is written.
func TestShapedKeepsMeta(t *testing.T) {
	inner := &mcp.ListToolsResult{Tools: []*mcp.Tool{}}
	var r mcp.Result = &shaped{Result: inner, keep: func(k string) bool { return !legacyDrop[k] }}
	r.SetMeta(map[string]any{"k": "v"})
	assert.Equal(t, "v", inner.GetMeta()["k"])
	raw, err := json.Marshal(r)
	require.NoError(t, err)
	assert.JSONEq(t, `{"_meta":{"k":"v"},"tools":[]}`, string(raw))
	assert.Same(t, inner, r.(*shaped).Unwrap())
}

func TestIsModern(t *testing.T) {
	assert.True(t, IsModern(nil))
}
