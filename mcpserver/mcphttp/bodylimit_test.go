package mcphttp

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// TestBodyLimit: a POST body is read once, up to the limit; the next step
// gets it re-buffered and classified. Past the limit the request gets 413,
// as a JSON-RPC error for its id when the id came before the cut.
func TestBodyLimit(t *testing.T) {
	f := &Front{log: zap.NewNop(), opts: Options{MaxBodyBytes: 100}}
	var got []message
	var bodies []string
	h := f.bodyLimit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, messageOf(r))
		b, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		bodies = append(bodies, string(b))
	}))

	call := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x"}}`
	serve(h, request(http.MethodPost, call))
	require.Len(t, got, 1)
	assert.Equal(t, call, bodies[0], "the handler reads the whole body again")
	assert.Equal(t, call, string(got[0].body))
	assert.Equal(t, []string{"n:7"}, got[0].info.calls)

	serve(h, request(http.MethodGet, ""))
	require.Len(t, got, 2)
	assert.Zero(t, got[1], "nothing to read in a GET")

	pad := strings.Repeat("x", 200)
	w := serve(h, request(http.MethodPost, `{"jsonrpc":"2.0","id":"a1","method":"ping","params":{"pad":"`+pad+`"}}`))
	assert.Equal(t, http.StatusRequestEntityTooLarge, w.Code)
	var rejection struct {
		ID    string `json:"id"`
		Error struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &rejection), w.Body.String())
	assert.Equal(t, "a1", rejection.ID)
	assert.Equal(t, -32600, rejection.Error.Code)
	assert.Contains(t, rejection.Error.Message, "exceeds 100 bytes (see mcp.max_body_bytes)")

	w = serve(h, request(http.MethodPost, `{"jsonrpc":"2.0","method":"ping","params":{"pad":"`+pad+`"},"id":1}`))
	assert.Equal(t, http.StatusRequestEntityTooLarge, w.Code)
	assert.Contains(t, w.Body.String(), "Request Entity Too Large: request body exceeds 100 bytes", "no id before the cut: plain text")
	assert.Len(t, got, 2, "refused requests go no further")
}

// TestClassify: what the later steps need of a body, batches included; a
// body that is not JSON-RPC is the go-sdk's to reject.
func TestClassify(t *testing.T) {
	info := classify([]byte(` [{"jsonrpc":"2.0","id":"c","method":"tools/call"},
		{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3.0}},
		{"jsonrpc":"2.0","id":1,"method":"server/discover"}]`))
	assert.Equal(t, bodyInfo{calls: []string{"s:c"}, cancels: []string{"n:3"}, discover: true}, info)

	info = classify([]byte(`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`))
	assert.True(t, info.modernMeta)
	assert.Zero(t, classify([]byte(`not json`)))
}
