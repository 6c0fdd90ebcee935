package mcpclient

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestContentKeepsEveryField: a result's items keep every field MCP
// defines for tool result content, and a result survives a JSON round
// trip (as it crosses a fleet, and as /api writes it) unchanged.
func TestContentKeepsEveryField(t *testing.T) {
	const wire = `{"content":[
		{"type":"text","text":"t","annotations":{"priority":1},"_meta":{"k":"v"}},
		{"type":"image","data":"aGk=","mimeType":"image/png"},
		{"type":"resource_link","uri":"u","name":"n","title":"T","description":"d","mimeType":"m","size":3},
		{"type":"resource","resource":{"uri":"u","blob":"aGk="}}
	],"isError":true,"structuredContent":{"a":[1]}}`
	var r CallResult
	require.NoError(t, json.Unmarshal([]byte(wire), &r))
	size := int64(3)
	assert.Equal(t, CallResult{IsError: true, StructuredContent: json.RawMessage(`{"a":[1]}`), Content: []Content{
		{Type: "text", Text: "t", Annotations: json.RawMessage(`{"priority":1}`), Meta: json.RawMessage(`{"k":"v"}`)},
		{Type: "image", Data: "aGk=", MimeType: "image/png"},
		{Type: "resource_link", URI: "u", Name: "n", Title: "T", Description: "d", MimeType: "m", Size: &size},
		{Type: "resource", Resource: json.RawMessage(`{"uri":"u","blob":"aGk="}`)},
	}}, r)
	data, err := json.Marshal(r)
	require.NoError(t, err)
	assert.JSONEq(t, wire, string(data))
	var back CallResult
	require.NoError(t, json.Unmarshal(data, &back))
	assert.Equal(t, r, back)
}

// TestContentLenientFields: the fields added for content beyond text are
// dropped when a board gives them the wrong JSON type, instead of failing
// the reply; the fields boards were always held to stay strict.
func TestContentLenientFields(t *testing.T) {
	var r CallResult
	require.NoError(t, json.Unmarshal([]byte(`{"content":[{"type":"resource_link","uri":1,"name":["n"],"size":-4,
		"resource":"x","annotations":[],"_meta":null}],"structuredContent":"s"}`), &r))
	assert.Equal(t, CallResult{Content: []Content{{Type: "resource_link"}}}, r)
	assert.Error(t, json.Unmarshal([]byte(`{"content":[{"type":"text","text":5}]}`), &r))
}
