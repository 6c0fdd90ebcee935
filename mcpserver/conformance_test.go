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

// TestEnumFormsElicited: the conformance profile's SEP-1330 fixture, a
// board tool whose required arguments are written in each of MCP's enum
// forms, is elicited in those forms (untitled enum, titled oneOf, legacy
// enumNames, untitled and titled multi-select) in both eras, and the
// user's choices reach the board.
func TestEnumFormsElicited(t *testing.T) {
	b := startBridge(t, func(c *app.Config) { c.MCP.Aliases = map[string]string{macA: "test"} })
	b.Board(macA, "conformance", simulator.Config{})
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			answer := map[string]any{"untitledSingle": "option1", "titledSingle": "value2", "legacyEnum": "opt3",
				"untitledMulti": []any{"option1", "option3"}, "titledMulti": []any{"value2"}}
			user := &elicitor{answers: []*mcp.ElicitResult{{Action: "accept", Content: answer}}}
			cs := b.Client(era, &mcp.ClientOptions{ElicitationHandler: user.handle})
			res := callTool(t, cs, "test_elicitation_sep1330_enums", map[string]any{})
			require.False(t, res.IsError, text(res))
			got, err := json.Marshal(res.StructuredContent)
			require.NoError(t, err)
			want, _ := json.Marshal(answer)
			assert.JSONEq(t, string(want), string(got), "the board received the choices")

			asked := user.questions()
			require.Len(t, asked, 1)
			props := schemaOf(t, asked[0])["properties"].(map[string]any)
			field := func(name string) string {
				f := props[name].(map[string]any)
				delete(f, "title")
				delete(f, "description")
				data, err := json.Marshal(f)
				require.NoError(t, err)
				return string(data)
			}
			assert.JSONEq(t, `{"type":"string","enum":["option1","option2","option3"]}`, field("untitledSingle"))
			assert.JSONEq(t, `{"type":"string","oneOf":[{"const":"value1","title":"First Option"},{"const":"value2","title":"Second Option"},{"const":"value3","title":"Third Option"}]}`, field("titledSingle"))
			assert.JSONEq(t, `{"type":"string","enum":["opt1","opt2","opt3"],"enumNames":["Option One","Option Two","Option Three"]}`, field("legacyEnum"))
			assert.JSONEq(t, `{"type":"array","items":{"type":"string","enum":["option1","option2","option3"]}}`, field("untitledMulti"))
			assert.JSONEq(t, `{"type":"array","items":{"anyOf":[{"const":"value1","title":"First Choice"},{"const":"value2","title":"Second Choice"},{"const":"value3","title":"Third Choice"}]}}`, field("titledMulti"))
		})
	}
}
