package mcphttp

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestRateLimit: one request per bucket (a rate that never refills); a
// known session has its own bucket, anything else counts against its
// client's (address, and token when there is one).
func TestRateLimit(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	f := &Front{log: zap.New(core), tracker: newSessionTracker(), rates: newRequestRates(0.001, 1, 4)}
	f.tracker.add("known")
	f.lines.rateLimited.SetInterval(time.Hour)
	next := &reached{}
	h := f.rateLimit(next)
	send := func(addr string, header ...string) *http.Response {
		r := request(http.MethodPost, "{}", header...)
		r.RemoteAddr = addr
		if r.Header.Get("Authorization") != "" {
			return serve(behindGuard(h), r).Result()
		}
		return serve(h, r).Result()
	}

	assert.Equal(t, http.StatusNoContent, send("192.0.2.1:1").StatusCode)
	refused := send("192.0.2.1:2")
	assert.Equal(t, http.StatusTooManyRequests, refused.StatusCode, "the client's bucket is empty, whatever its port")
	assert.NotEmpty(t, refused.Header.Get("Retry-After"))
	assert.Equal(t, http.StatusTooManyRequests, send("192.0.2.1:3", "Mcp-Session-Id", "unknown").StatusCode,
		"an unknown session id is the client's bucket")

	assert.Equal(t, http.StatusNoContent, send("192.0.2.2:1").StatusCode, "another address, another bucket")
	assert.Equal(t, http.StatusNoContent, send("192.0.2.1:4", "Authorization", "Bearer k-secret").StatusCode,
		"another token, another bucket")
	assert.Equal(t, http.StatusNoContent, send("192.0.2.1:5", "Mcp-Session-Id", "known").StatusCode, "the session's own bucket")
	assert.Equal(t, http.StatusTooManyRequests, send("192.0.2.3:1", "Mcp-Session-Id", "known").StatusCode,
		"a session's bucket whatever address uses it")
	require.Len(t, next.reqs, 4, "refused requests go no further")
	assert.Equal(t, 1, logs.FilterMessage("mcp request refused: rate limit").Len(), "one line")
	assert.EqualValues(t, 2, f.lines.rateLimited.Suppressed(), "the rest throttled")

	off := &Front{}
	assert.Equal(t, http.Handler(next), off.rateLimit(next), "off: no step at all")
}
