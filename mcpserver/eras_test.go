package mcpserver_test

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/simulator"
)

// TestEraShapes: each protocol era sees only its own result shapes, on the
// wire. A legacy session (each session-based version) never sees a field
// of the 2026-07-28 era (ttlMs, cacheScope, resultType, inputRequests,
// requestState, the server's identity in _meta), in the list results as
// in tool results; a stateless request gets them, and its input_required
// result has only InputRequiredResult's fields (no "content": null).
func TestEraShapes(t *testing.T) {
	b := startBridge(t, nil)
	b.Board(macC, "robot", simulator.Config{})
	b.WaitPublished(macC)
	status := upstreamName(macC, "self.get_device_status")
	volume := upstreamName(macC, "self.audio_speaker.set_volume")
	modernOnly := []string{"ttlMs", "cacheScope", "resultType", "inputRequests", "requestState"}
	lists := []string{"tools/list", "prompts/list", "resources/list", "resources/templates/list"}

	for _, version := range []string{"2025-03-26", "2025-06-18", "2025-11-25"} {
		t.Run(version, func(t *testing.T) {
			sid := rawSession(b, version)
			hdr := map[string]string{"Mcp-Session-Id": sid, "MCP-Protocol-Version": version}
			send := func(id int, method, params string) map[string]any {
				return rawMessage(t, do(b, rawRequest(b, "POST",
					fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":%q,"params":%s}`, id, method, params), hdr)))
			}
			for i, method := range lists {
				msg := send(10+i, method, `{}`)
				if _, ok := msg["error"]; ok {
					continue // not served: nothing to shape
				}
				keys := slices.Collect(maps.Keys(result(t, msg)))
				for _, k := range modernOnly {
					assert.NotContains(t, keys, k, method)
				}
			}
			res := result(t, send(20, "tools/call", `{"name":"`+status+`","arguments":{}}`))
			assert.Contains(t, res, "content")
			keys := slices.Collect(maps.Keys(res))
			for _, k := range modernOnly {
				assert.NotContains(t, keys, k, "tools/call")
			}
			if meta, ok := res["_meta"].(map[string]any); ok {
				assert.NotContains(t, meta, "io.modelcontextprotocol/serverInfo")
			}
		})
	}

	t.Run(modern, func(t *testing.T) {
		send := func(id int, method, name, params string) map[string]any {
			hdr := map[string]string{"MCP-Protocol-Version": modern, "Mcp-Method": method}
			if name != "" {
				hdr["Mcp-Name"] = name
			}
			return rawMessage(t, do(b, rawRequest(b, "POST", fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":%q,"params":%s}`, id, method, params), hdr)))
		}
		meta := `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{}}}`
		keys := slices.Collect(maps.Keys(result(t, send(1, "tools/list", "", `{`+meta+`}`))))
		for _, k := range []string{"ttlMs", "cacheScope", "resultType", "tools"} {
			assert.Contains(t, keys, k)
		}
		res := result(t, send(2, "tools/call", status, `{"name":"`+status+`","arguments":{},`+meta+`}`))
		assert.Equal(t, "complete", res["resultType"])
		assert.Contains(t, res, "content")
		res = result(t, send(3, "tools/call", volume, `{"name":"`+volume+`","arguments":{},`+meta+`}`))
		assert.Equal(t, "input_required", res["resultType"])
		assert.Equal(t, []string{"_meta", "inputRequests", "requestState", "resultType"}, slices.Sorted(maps.Keys(res)),
			"InputRequiredResult's fields only")
	})
}

// result is the result object of a JSON-RPC response.
func result(t *testing.T, msg map[string]any) map[string]any {
	t.Helper()
	res, ok := msg["result"].(map[string]any)
	require.True(t, ok, "a result: %v", msg)
	return res
}
