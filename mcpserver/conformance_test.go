package mcpserver_test

import (
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/simulator"
)

// TestConformanceProfile: two boards of the conformance profile, aliased
// test and json, export the official suite's fixture tools under the
// suite's names, and the JSON Schema 2020-12 keywords of a board's schema
// are listed unchanged.
func TestConformanceProfile(t *testing.T) {
	b := startBridge(t, func(c *app.Config) {
		c.MCP.Aliases = map[string]string{macA: "test", macB: "json"}
	})
	b.Board(macA, "conformance", simulator.Config{})
	b.Board(macB, "conformance", simulator.Config{})
	cs := b.Client(legacy, nil)
	tools := map[string]*mcp.Tool{}
	for _, tool := range listTools(t, cs) {
		tools[tool.Name] = tool
	}
	for _, name := range []string{"test_simple_text", "test_image_content", "test_audio_content", "test_embedded_resource",
		"test_multiple_content_types", "test_tool_with_logging", "test_tool_with_progress", "test_error_handling",
		"test_elicitation", "test_elicitation_sep1034_defaults", "test_elicitation_sep1330_enums", "json_schema_2020_12_tool"} {
		assert.Contains(t, tools, name)
	}
	tool := tools["json_schema_2020_12_tool"]
	require.NotNil(t, tool)
	schema, err := json.Marshal(tool.InputSchema)
	require.NoError(t, err)
	var s map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(schema, &s))
	assert.JSONEq(t, `"https://json-schema.org/draft/2020-12/schema"`, string(s["$schema"]))
	assert.JSONEq(t, `false`, string(s["additionalProperties"]))
	assert.JSONEq(t, `{"address":{"$anchor":"addressDef","type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"}}}}`, string(s["$defs"]))
	assert.JSONEq(t, `[{"anyOf":[{"required":["phone"]},{"required":["email"]}]}]`, string(s["allOf"]))
	assert.JSONEq(t, `{"properties":{"contactMethod":{"const":"phone"}},"required":["contactMethod"]}`, string(s["if"]))
	assert.JSONEq(t, `{"required":["phone"]}`, string(s["then"]))
	assert.JSONEq(t, `{"required":["email"]}`, string(s["else"]))

	res := callTool(t, cs, "test_error_handling", nil)
	assert.True(t, res.IsError)
	assert.Equal(t, "This tool intentionally returns an error for testing", text(res))
}
