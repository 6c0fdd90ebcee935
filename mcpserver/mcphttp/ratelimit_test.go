package mcphttp

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestRateLimit: one request per bucket (a rate that never refills); a
// known session has its own bucket, a verified identity its own whatever
// address it comes from, anything else counts against its client's
// (address, and token when there is one).
func TestRateLimit(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	f := &Front{log: zap.New(core), tracker: newSessionTracker(), rates: newRequestRates(0.001, 1, 4)}
	f.tracker.add("known")
	f.lines.rateLimited.SetInterval(time.Hour)
	next := &reached{}
	h := f.rateLimit(next)
	send := func(addr string, header ...string) *http.Response {
		r := request(http.MethodPost, `{"jsonrpc":"2.0","id":"call-7","method":"ping"}`, header...)
		r.RemoteAddr = addr
		if r.Header.Get("Authorization") != "" {
			return serve(behindGuard(h), r).Result()
		}
		return serve(h, r).Result()
	}

	assert.Equal(t, http.StatusNoContent, send("192.0.2.1:1").StatusCode)
	refused := send("192.0.2.1:2")
	assert.Equal(t, http.StatusTooManyRequests, refused.StatusCode, "the client's bucket is empty, whatever its port")
	assertRateRefusal(t, refused, `"call-7"`)
	assert.Equal(t, http.StatusTooManyRequests, send("192.0.2.1:3", "Mcp-Session-Id", "unknown").StatusCode,
		"an unknown session id is the client's bucket")

	assert.Equal(t, http.StatusNoContent, send("192.0.2.2:1").StatusCode, "another address, another bucket")
	assert.Equal(t, http.StatusNoContent, send("192.0.2.1:4", "Authorization", "Bearer k-secret").StatusCode,
		"a verified identity, its own bucket")
	assert.Equal(t, http.StatusTooManyRequests, send("192.0.2.9:1", "Authorization", "Bearer k-secret").StatusCode,
		"the identity's bucket whatever address it comes from")
	assert.Equal(t, http.StatusNoContent, send("192.0.2.9:2", "Authorization", "Bearer h-secret").StatusCode,
		"another identity, another bucket")
	assert.Equal(t, http.StatusNoContent, send("192.0.2.1:5", "Mcp-Session-Id", "known").StatusCode, "the session's own bucket")
	assert.Equal(t, http.StatusTooManyRequests, send("192.0.2.3:1", "Mcp-Session-Id", "known").StatusCode,
		"a session's bucket whatever address uses it")
	require.Len(t, next.reqs, 5, "refused requests go no further")
	assert.Equal(t, 1, logs.FilterMessage("mcp request refused: rate limit").Len(), "one line")
	assert.EqualValues(t, 3, f.lines.rateLimited.Suppressed(), "the rest throttled")

	off := &Front{}
	assert.Equal(t, http.Handler(next), off.rateLimit(next), "off: no step at all")
}

// TestRateRefusalBody: the refusal is a JSON-RPC error for the request's
// id wherever the id is (null without one, or past what is read of the
// body), with the seconds to wait.
func TestRateRefusalBody(t *testing.T) {
	f := &Front{log: zap.NewNop(), tracker: newSessionTracker(), rates: newRequestRates(0.001, 1, 4)}
	h := f.rateLimit(&reached{})
	pad := strings.Repeat("x", maxPeek)
	for _, c := range []struct{ body, id string }{
		{`{"jsonrpc":"2.0","id":1,"method":"ping"}`, `1`}, // spends the bucket
		{`{"method":"tools/call","params":{"name":"a"},"jsonrpc":"2.0","id":42}`, `42`},
		{`{"jsonrpc":"2.0","method":"notifications/initialized"}`, `null`},
		{`[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, `null`},
		{`{"params":{"pad":"` + pad + `"},"id":5}`, `null`},
		{``, `null`},
	} {
		r := request(http.MethodPost, c.body)
		r.RemoteAddr = "192.0.2.1:1"
		resp := serve(h, r).Result()
		if c.id == "1" {
			require.Equal(t, http.StatusNoContent, resp.StatusCode)
			continue
		}
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
		assertRateRefusal(t, resp, c.id)
	}
	r := request(http.MethodGet, "")
	r.RemoteAddr = "192.0.2.1:1"
	assertRateRefusal(t, serve(h, r).Result(), "null")
}

func assertRateRefusal(t *testing.T, resp *http.Response, id string) {
	t.Helper()
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	var msg struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Data    struct {
				Setting    string `json:"setting"`
				RetryAfter int    `json:"retryAfter"`
			} `json:"data"`
		} `json:"error"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&msg))
	assert.Equal(t, "2.0", msg.JSONRPC)
	assert.Equal(t, id, string(msg.ID))
	assert.Equal(t, codeOverLimit, msg.Error.Code)
	assert.Contains(t, msg.Error.Message, "mcp.rate_limit")
	assert.Equal(t, "mcp.rate_limit", msg.Error.Data.Setting)
	secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	require.NoError(t, err)
	assert.Positive(t, secs)
	assert.Equal(t, secs, msg.Error.Data.RetryAfter)
}
