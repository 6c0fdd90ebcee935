package mcpserver_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/simulator"
)

// TestFlowWireFormat pins the Flow methods on the wire, as curl sends them:
// in a legacy session (Mcp-Session-Id) and statelessly (2026-07-28
// headers), the advertisement in initialize, and the error objects.
func TestFlowWireFormat(t *testing.T) {
	b := startBridge(t, nil)
	b.Board(macC, "robot", simulator.Config{})
	tool := upstreamName(macC, "self.audio_speaker.set_volume")

	// initialize advertises MCP Flow under capabilities.experimental.
	resp := do(b, rawRequest(b, "POST", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"`+legacy+
		`","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}`, nil))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	init := rawMessage(t, resp)["result"].(map[string]any)
	mcpFlow := init["capabilities"].(map[string]any)["experimental"].(map[string]any)["mcpFlow"].(map[string]any)
	assert.Equal(t, true, mcpFlow["interactive"])
	assert.Equal(t, "0.1.0", mcpFlow["version"])

	sid := rawSession(b, legacy)
	legacyHeaders := map[string]string{"Mcp-Session-Id": sid, "MCP-Protocol-Version": legacy}
	post := func(body string, h map[string]string) (int, map[string]any) {
		resp := do(b, rawRequest(b, "POST", body, h))
		if resp.Header.Get("Content-Type") == "" || strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
			resp.Body.Close()
			return resp.StatusCode, nil
		}
		return resp.StatusCode, rawMessage(t, resp)
	}

	status, msg := post(`{"jsonrpc":"2.0","id":2,"method":"interaction.start","params":{"toolName":"`+tool+`","initialParams":{}}}`, legacyHeaders)
	require.Equal(t, http.StatusOK, status)
	res := msg["result"].(map[string]any)
	id := res["sessionId"].(string)
	assert.Regexp(t, `^flw_[0-9a-f]{32}$`, id)
	assert.Equal(t, "waiting_user", res["state"])
	prompt := res["initialPrompt"].(map[string]any)
	assert.Equal(t, "number", prompt["type"])
	assert.Equal(t, map[string]any{"required": true, "min": 0.0, "max": 100.0, "integer": true}, prompt["validation"])
	assert.Equal(t, map[string]any{"current": 1.0, "total": 1.0, "message": "Step 1 of 1: volume"}, res["progress"])

	status, msg = post(`{"jsonrpc":"2.0","id":3,"method":"interaction.respond","params":{"sessionId":"`+id+`","response":{"value":150}}}`, legacyHeaders)
	require.Equal(t, http.StatusOK, status)
	res = msg["result"].(map[string]any)
	assert.Equal(t, false, res["accepted"])
	assert.Equal(t, false, res["validation"].(map[string]any)["valid"])
	assert.Contains(t, res["nextPrompt"], "error")

	status, msg = post(`{"jsonrpc":"2.0","id":4,"method":"interaction.respond","params":{"sessionId":"`+id+`","response":{"value":40}}}`, legacyHeaders)
	require.Equal(t, http.StatusOK, status)
	res = msg["result"].(map[string]any)
	assert.Equal(t, "completed", res["state"])
	assert.Equal(t, map[string]any{"success": true, "text": "true"}, res["result"])

	// A finished interaction: -32003 on the wire, with the spec's name in data.
	status, msg = post(`{"jsonrpc":"2.0","id":5,"method":"interaction.cancel","params":{"sessionId":"`+id+`"}}`, legacyHeaders)
	require.Equal(t, http.StatusOK, status)
	e := msg["error"].(map[string]any)
	assert.EqualValues(t, -32003, e["code"])
	assert.Equal(t, "INVALID_STATE_TRANSITION", e["data"].(map[string]any)["flowCode"])
	assert.Equal(t, id, e["data"].(map[string]any)["sessionId"])

	// An unknown MCP session is refused before any interaction is looked at.
	status, _ = post(`{"jsonrpc":"2.0","id":6,"method":"interaction.getState","params":{"sessionId":"`+id+`"}}`,
		map[string]string{"Mcp-Session-Id": "not-a-session", "MCP-Protocol-Version": legacy})
	assert.Equal(t, http.StatusNotFound, status)

	// Stateless era: the same methods with the 2026-07-28 headers. The id
	// of the legacy session's interaction is not this caller's.
	var spoof string
	modernPost := func(id int, method, params string) (int, map[string]any) {
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":%q,"params":{"_meta":{"io.modelcontextprotocol/protocolVersion":%q,`+
			`"io.modelcontextprotocol/clientInfo":{"name":"curl","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}},%s}}`,
			id, method, modern, params)
		h := map[string]string{"MCP-Protocol-Version": modern, "Mcp-Method": method}
		if spoof != "" {
			h["X-Devicebridge-Caller"] = spoof
		}
		return post(body, h)
	}
	status, msg = modernPost(7, "interaction.getState", `"sessionId":"`+id+`"`)
	require.Equal(t, http.StatusOK, status)
	e = msg["error"].(map[string]any)
	assert.EqualValues(t, -32001, e["code"])
	assert.Equal(t, "SESSION_NOT_FOUND", e["data"].(map[string]any)["flowCode"])
	assert.Contains(t, e["message"], "interaction.start")

	status, msg = modernPost(8, "interaction.start", `"toolName":"`+tool+`","initialParams":{"volume":41}`)
	require.Equal(t, http.StatusOK, status)
	res = msg["result"].(map[string]any)
	assert.Equal(t, "completed", res["state"], "valid arguments run at once")

	status, msg = modernPost(9, "capabilities", `"x":1`)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, true, msg["result"].(map[string]any)["interactive"])

	// go-sdk answers invalid params with HTTP 400 in the stateless era.
	status, msg = modernPost(10, "interaction.start", `"toolName":"no_such_tool"`)
	require.Equal(t, http.StatusBadRequest, status)
	e = msg["error"].(map[string]any)
	assert.EqualValues(t, -32602, e["code"])
	assert.Contains(t, e["message"], "tools/list")

	// A caller header sent by the client is not believed.
	spoof = "s:" + sid
	status, msg = modernPost(11, "interaction.getState", `"sessionId":"`+id+`"`)
	require.Equal(t, http.StatusOK, status)
	assert.EqualValues(t, -32001, msg["error"].(map[string]any)["code"])
}
