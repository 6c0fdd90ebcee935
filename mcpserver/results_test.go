package mcpserver

import (
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/argcheck"
)

// TestInvalidArgsResultText pins the wording a model reads when its
// arguments are refused: what is wrong, what the tool takes, a call that
// would pass.
func TestInvalidArgsResultText(t *testing.T) {
	schema, err := argcheck.Parse(json.RawMessage(`{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}`))
	require.NoError(t, err)
	e := &entry{name: "dev_ddeeff_audio_speaker_set_volume", schema: schema}
	e.tool.Name = "self.audio_speaker.set_volume"
	_, v := schema.Validate(json.RawMessage(`{"volume":"max"}`))
	require.NotNil(t, v)
	res, code := callFailure(e, "x", &device.ArgumentsError{Tool: e.tool.Name, Invalid: v, Schema: schema}, 0)
	assert.Equal(t, device.CodeInvalidArguments, code)
	require.True(t, res.IsError)
	data, _ := json.Marshal(res.Content[0])
	var c struct{ Text string }
	require.NoError(t, json.Unmarshal(data, &c))
	assert.Equal(t, "Invalid arguments for self.audio_speaker.set_volume; nothing was sent to the board.\n"+
		"- argument \"volume\" must be an integer from 0 to 100, but got the string \"max\".\n"+
		"This tool takes \"volume\" (an integer from 0 to 100, required).\n"+
		"Call it again with arguments like {\"volume\": 50}.", c.Text)
}

// TestConvertResultMalformedItems: an item the bridge cannot relay as
// it is becomes a text saying so, and the others still arrive; parts of
// an item that do not fit MCP's shape (annotations, _meta) are dropped
// rather than failing the item.
func TestConvertResultMalformedItems(t *testing.T) {
	var res device.CallResult
	require.NoError(t, json.Unmarshal([]byte(`{"content":[
		{"type":"image","mimeType":"image/png","data":"not base64!"},
		{"type":"audio","data":"aGk="},
		{"type":"resource_link","name":"no uri"},
		{"type":"resource","resource":{"uri":"u","text":"t","blob":"aGk="}},
		{"type":"resource","resource":{"uri":"u","blob":"%%%"}},
		{"type":"resource","resource":"u"},
		{"type":"tool_use","id":"x"},
		{"type":"text","text":"kept","annotations":{"priority":"high"},"_meta":[1]},
		{"type":"resource_link","uri":"u","name":"n","size":-1,"title":7}
	],"structuredContent":[1,2]}`), &res))
	out := convertResult(&res)
	var texts []string
	for _, c := range out.Content[:7] {
		tc, ok := c.(*mcp.TextContent)
		require.True(t, ok, "%T", c)
		texts = append(texts, tc.Text)
	}
	assert.Equal(t, []string{
		"[the board returned image content the bridge could not decode]",
		"[the board returned audio content the bridge could not decode]",
		"[the board returned resource_link content the bridge could not decode]",
		"[the board returned resource content the bridge could not decode]",
		"[the board returned resource content the bridge could not decode]",
		"[the board returned resource content the bridge could not decode]",
		`[the board returned content of type "tool_use", which the bridge does not relay]`,
	}, texts)
	assert.Equal(t, &mcp.TextContent{Text: "kept"}, out.Content[7])
	assert.Equal(t, &mcp.ResourceLink{URI: "u", Name: "n"}, out.Content[8])
	assert.Nil(t, out.StructuredContent, "structuredContent that is not an object is not relayed")
}

// TestResultTextNamesEveryKind: the text MCP Flow's interaction results
// carry says what a result held besides text, so that a link or an
// embedded resource is not silently lost there.
func TestResultTextNamesEveryKind(t *testing.T) {
	res := &mcp.CallToolResult{Content: []mcp.Content{
		&mcp.TextContent{Text: "t"},
		&mcp.ImageContent{MIMEType: "image/png", Data: []byte("abc")},
		&mcp.AudioContent{MIMEType: "audio/wav", Data: []byte("ab")},
		&mcp.ResourceLink{URI: "board://a", Name: "a"},
		&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "board://log", Text: "line"}},
		&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "board://bin", Blob: []byte{1, 2}}},
	}}
	assert.Equal(t, "t\n[image/png image, 3 bytes]\n[audio/wav audio, 2 bytes]\n[resource link a: board://a]\nline\n[resource board://bin, 2 bytes]", resultText(res))
}
