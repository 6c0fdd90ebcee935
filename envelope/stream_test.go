package envelope

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/sourcegraph/jsonrpc2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/devicebridge/devicebridge/internal/testlink"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestStreamSkipsBadMessages feeds a jsonrpc2 connection a mix of garbage
// and one good reply: the call must succeed and the connection stay open.
func TestStreamSkipsBadMessages(t *testing.T) {
	bridge, board := testlink.Pair(16)
	defer bridge.Close(nil)
	s := NewStream(bridge, StreamOptions{})
	conn := jsonrpc2.NewConn(context.Background(), s, nil)
	defer conn.Close()

	go func() {
		ctx := context.Background()
		req, err := board.Receive(ctx)
		if err != nil {
			return
		}
		env, err := Decode(req, 0)
		if err != nil || env.Type != TypeMCP {
			return
		}
		var r struct {
			ID uint64 `json:"id"`
		}
		_ = json.Unmarshal(env.Payload, &r)
		for _, junk := range []string{
			`not json`,
			`{"type":"listen","state":"start"}`,
			`{"type":"mcp","payload":"string"}`,
			`{"type":"mcp"}`,
			`{"type":"mcp","payload":{"jsonrpc":"2.0"}}`,
			`{"type":"mcp","payload":{"jsonrpc":"2.0","id":999,"result":{}}}`, // an id never issued
		} {
			_ = board.Send(ctx, []byte(junk))
		}
		// The firmware pastes the tool name into the message unescaped.
		reply := `{"session_id":"S","type":"mcp","payload":{"jsonrpc":"2.0","id":` + itoa(r.ID) + `,"error":{"message":"Unknown tool: a"b"}}}`
		_ = board.Send(ctx, []byte(reply))
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := conn.Call(ctx, "tools/call", map[string]any{"name": `a"b`}, nil)
	var rpcErr *jsonrpc2.Error
	require.ErrorAs(t, err, &rpcErr)
	assert.Equal(t, `Unknown tool: a"b`, rpcErr.Message)
	assert.EqualValues(t, 0, rpcErr.Code, "the firmware sends no code")

	st := s.Stats()
	assert.EqualValues(t, 1, st.Other)
	assert.EqualValues(t, 4, st.Dropped)
	assert.EqualValues(t, 1, st.Repaired)
	select {
	case <-conn.DisconnectNotify():
		t.Fatal("bad messages must not close the connection")
	default:
	}
}

func TestStreamStampsSessionID(t *testing.T) {
	bridge, board := testlink.Pair(4)
	defer bridge.Close(nil)
	bridge.Session = "abc123"
	s := NewStream(bridge, StreamOptions{})
	require.NoError(t, s.WriteObject(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "initialize"}))
	msg, err := board.Receive(context.Background())
	require.NoError(t, err)
	assert.Equal(t, `{"session_id":"abc123","type":"mcp","payload":{"id":1,"jsonrpc":"2.0","method":"initialize"}}`, string(msg))
	require.NoError(t, s.Close())
	require.ErrorIs(t, s.WriteObject(map[string]any{}), ErrStreamClosed)
	var v any
	require.ErrorIs(t, s.ReadObject(&v), ErrStreamClosed)
}

func itoa(n uint64) string { b, _ := json.Marshal(n); return string(b) }
