package mcphttp

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestMarkTask: a legacy tools/call whose params ask for a task reaches the
// handlers with the header set to its ttl; anything else arrives without
// it, whatever the client sent under that name.
func TestMarkTask(t *testing.T) {
	const header = "X-Task"
	for body, want := range map[string]string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","task":{"ttl":60000}}}`:    "60000",
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","task":{}}}`:               "0",
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","task":{"ttl":0.5}}}`:      "0",
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","task":{"ttl":-5}}}`:       "0",
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","task":{"ttl":1e300}}}`:    "0",
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","task":"soon"}}`:           "",
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","task":null}}`:             "",
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"task":{}}}}`: "",
		`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"task":{}}}`:                          "",
		`[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","task":{}}}]`:             "",
		`not json`: "",
	} {
		var got string
		h := markTask(header)(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { got = r.Header.Get(header) }))
		r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
		r.Header.Set(header, "forged")
		r = r.WithContext(context.WithValue(r.Context(), messageKey{}, message{body: []byte(body), info: classify([]byte(body))}))
		h.ServeHTTP(httptest.NewRecorder(), r)
		assert.Equal(t, want, got, body)
	}
}
