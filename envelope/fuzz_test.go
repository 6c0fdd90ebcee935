package envelope

import (
	"encoding/json"
	"testing"
)

// FuzzDecode checks that Decode never panics and that whatever it accepts
// is a JSON object with a type and, if present, an object payload, which
// re-encodes and decodes to the same envelope.
func FuzzDecode(f *testing.F) {
	seeds := []string{
		`{"session_id":"S","type":"mcp","payload":{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}}`,
		`{"session_id":"S","type":"mcp","payload":{"jsonrpc":"2.0","id":3,"error":{"message":"Unknown tool: a"b"}}}`,
		`{"type":"hello","version":3,"transport":"udp","features":{"mcp":true}}`,
		`{"type":"mcp","payload":"x"}`,
		`{"type":1}`, `[]`, `null`, `{"error":{"message":"`, `"}}`, `{}`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
		// Split seeds, as a partial read would deliver them.
		f.Add([]byte(s[:len(s)/2]))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		env, err := Decode(data, 0)
		if err != nil {
			return
		}
		if env.Type == "" {
			t.Fatalf("accepted an envelope without type: %q", data)
		}
		if !json.Valid(env.Raw) {
			t.Fatalf("accepted invalid JSON: %q", data)
		}
		if env.Payload != nil && !isObject(env.Payload) {
			t.Fatalf("accepted a non-object payload: %q", data)
		}
		again, err := Encode(env.SessionID, env.Type, env.Payload)
		if err != nil {
			t.Fatalf("re-encode %q: %v", data, err)
		}
		back, err := Decode(again, len(again)+1)
		if err != nil {
			t.Fatalf("decode of re-encoded %q: %v", again, err)
		}
		if back.Type != env.Type || back.SessionID != env.SessionID || string(back.Payload) != string(env.Payload) {
			t.Fatalf("round trip changed the envelope: %q -> %q", data, again)
		}
	})
}
