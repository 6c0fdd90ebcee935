package envelope

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDecode(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		wantErr   error
		wantType  string
		wantSID   string
		payload   string
		repaired  bool
		payloadOK func(t *testing.T, p json.RawMessage)
	}{
		{name: "mcp reply", in: `{"session_id":"S1","type":"mcp","payload":{"jsonrpc":"2.0","id":1,"result":{}}}`,
			wantType: "mcp", wantSID: "S1", payload: `{"jsonrpc":"2.0","id":1,"result":{}}`},
		{name: "device hello without session", in: `{"type":"hello","version":1,"features":{"mcp":true},"transport":"websocket"}`,
			wantType: "hello"},
		{name: "listen", in: `{"session_id":"","type":"listen","state":"start","mode":"auto"}`, wantType: "listen"},
		{name: "null payload is absent", in: `{"type":"mcp","payload":null}`, wantType: "mcp"},
		{name: "error without code", in: `{"session_id":"S","type":"mcp","payload":{"jsonrpc":"2.0","id":7,"error":{"message":"Unknown tool: x"}}}`,
			wantType: "mcp", wantSID: "S", payload: `{"jsonrpc":"2.0","id":7,"error":{"message":"Unknown tool: x"}}`},
		{name: "unescaped quote in error message", in: `{"session_id":"S","type":"mcp","payload":{"jsonrpc":"2.0","id":3,"error":{"message":"Unknown tool: self.nope"x"}}}`,
			wantType: "mcp", wantSID: "S", repaired: true,
			payloadOK: func(t *testing.T, p json.RawMessage) {
				var m struct {
					Error struct{ Message string } `json:"error"`
				}
				require.NoError(t, json.Unmarshal(p, &m))
				assert.Equal(t, `Unknown tool: self.nope"x`, m.Error.Message)
			}},
		{name: "unescaped backslash and braces in error message", in: `{"type":"mcp","payload":{"jsonrpc":"2.0","id":4,"error":{"message":"bad \q "}} here"}}}`,
			wantType: "mcp", repaired: true,
			payloadOK: func(t *testing.T, p json.RawMessage) {
				var m struct {
					Error struct{ Message string } `json:"error"`
				}
				require.NoError(t, json.Unmarshal(p, &m))
				assert.Equal(t, `bad \q "}} here`, m.Error.Message)
			}},
		{name: "non-string session id is ignored", in: `{"session_id":5,"type":"abort"}`, wantType: "abort"},
		{name: "not json", in: `hello`, wantErr: ErrMalformed},
		{name: "truncated", in: `{"type":"mcp","payload":{"id":1`, wantErr: ErrMalformed},
		{name: "array", in: `[{"type":"mcp"}]`, wantErr: ErrMalformed},
		{name: "string", in: `"mcp"`, wantErr: ErrMalformed},
		{name: "no type", in: `{"session_id":"S","payload":{}}`, wantErr: ErrMissingType},
		{name: "numeric type", in: `{"type":3}`, wantErr: ErrMissingType},
		{name: "empty type", in: `{"type":""}`, wantErr: ErrMissingType},
		{name: "string payload", in: `{"type":"mcp","payload":"{\"id\":1}"}`, wantErr: ErrPayloadNotObject},
		{name: "array payload", in: `{"type":"mcp","payload":[1]}`, wantErr: ErrPayloadNotObject},
		{name: "garbage that merely looks like an error", in: `{"type":"mcp","payload":{"error":{"message":"a"b"}}`, wantErr: ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, err := Decode([]byte(tt.in), 0)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantType, env.Type)
			assert.Equal(t, tt.wantSID, env.SessionID)
			assert.Equal(t, tt.repaired, env.Repaired)
			assert.True(t, json.Valid(env.Raw))
			if tt.payload != "" {
				assert.JSONEq(t, tt.payload, string(env.Payload))
			}
			if tt.payloadOK != nil {
				tt.payloadOK(t, env.Payload)
			}
		})
	}
}

func TestDecodeSizeLimit(t *testing.T) {
	big := `{"type":"mcp","payload":{"x":"` + strings.Repeat("a", 100) + `"}}`
	_, err := Decode([]byte(big), 64)
	require.ErrorIs(t, err, ErrTooLarge)
	_, err = Decode([]byte(big), 0)
	require.NoError(t, err)
	_, err = Decode(make([]byte, DefaultMaxMessageSize+1), 0)
	require.ErrorIs(t, err, ErrTooLarge)
}

func TestEncode(t *testing.T) {
	got, err := Encode("S", "mcp", json.RawMessage(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	require.NoError(t, err)
	assert.Equal(t, `{"session_id":"S","type":"mcp","payload":{"jsonrpc":"2.0","id":1,"method":"tools/list"}}`, string(got))

	got, err = Encode(`we"ird`, "goodbye", nil)
	require.NoError(t, err)
	assert.Equal(t, `{"session_id":"we\"ird","type":"goodbye"}`, string(got))

	_, err = Encode("S", "mcp", json.RawMessage(`"string"`))
	require.ErrorIs(t, err, ErrPayloadNotObject)
	_, err = Encode("S", "", nil)
	require.ErrorIs(t, err, ErrMissingType)

	// Round trip.
	env, err := Decode(got, 0)
	require.NoError(t, err)
	assert.Equal(t, `we"ird`, env.SessionID)
	assert.Equal(t, "goodbye", env.Type)
}

func TestServerHello(t *testing.T) {
	audio := DownlinkAudio
	b := ServerHello{Transport: "websocket", SessionID: "abc", AudioParams: &audio}.Marshal()
	assert.JSONEq(t, `{"type":"hello","transport":"websocket","session_id":"abc","audio_params":{"format":"opus","sample_rate":24000,"channels":1,"frame_duration":60}}`, string(b))
	assert.Panics(t, func() { ServerHello{}.Marshal() }, "a hello without transport must never be built")
}

func TestParseDeviceHello(t *testing.T) {
	env, err := Decode([]byte(`{"type":"hello","version":1,"features":{"mcp":true,"glyph_push":true},"text_font":{"bundle":"noto-v1","charset":"basic","size":14,"bpp":1},"transport":"websocket","audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`), 0)
	require.NoError(t, err)
	h, err := ParseDeviceHello(env)
	require.NoError(t, err)
	assert.True(t, h.Features.MCP)
	assert.Equal(t, 1, h.Version)
	assert.Equal(t, 16000, h.AudioParams.SampleRate)

	env, err = Decode([]byte(`{"type":"hello","version":1,"features":{},"transport":"websocket"}`), 0)
	require.NoError(t, err)
	h, err = ParseDeviceHello(env)
	require.NoError(t, err)
	assert.False(t, h.Features.MCP)

	env, err = Decode([]byte(`{"type":"hello","features":"nope"}`), 0)
	require.NoError(t, err)
	_, err = ParseDeviceHello(env)
	require.ErrorIs(t, err, ErrMalformed)
}
