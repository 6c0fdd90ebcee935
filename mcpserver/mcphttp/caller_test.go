package mcphttp

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const callerHeader = "X-Test-Caller"

// TestStripCaller: what a client sends as its caller identity never
// reaches the handlers.
func TestStripCaller(t *testing.T) {
	next := &reached{}
	serve(stripCaller(callerHeader)(next), request(http.MethodPost, "{}", callerHeader, "t:someone-else"))
	require.Len(t, next.reqs, 1)
	assert.Empty(t, next.reqs[0].Header.Values(callerHeader))
}

// TestSetCaller: a modern request's caller is computed from its address
// when /mcp is open, from the verified identity behind the front door.
func TestSetCaller(t *testing.T) {
	caller := func(host, token string) string { return host + "|" + token }
	next := &reached{}
	h := setCaller(callerHeader, caller)(next)

	r := request(http.MethodPost, "{}")
	r.RemoteAddr = "192.0.2.7:4242"
	serve(h, r)
	require.Len(t, next.reqs, 1)
	assert.Equal(t, "192.0.2.7|", next.reqs[0].Header.Get(callerHeader), "open: the address, without its port")

	serve(behindGuard(h), request(http.MethodPost, "{}", "Authorization", "Bearer k-secret"))
	require.Len(t, next.reqs, 2)
	assert.Equal(t, "192.0.2.1|identity\x00kitchen", next.reqs[1].Header.Get(callerHeader),
		"behind the door: the identity, which outlives the token")
}
