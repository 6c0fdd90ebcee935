package mcphttp

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// TestAdmitSession: a POST without a session id takes a slot, which the
// session the handler issues keeps and a failed initialize gives back;
// past a cap the request is refused before the handler. A request of a
// session keeps it active while it runs.
func TestAdmitSession(t *testing.T) {
	f := &Front{log: zap.NewNop()}
	f.limits = newSessionLimits(2, 1, time.Hour, func(string) {})
	defer f.limits.stop()
	active := func(sid string) int {
		f.limits.mu.Lock()
		defer f.limits.mu.Unlock()
		if s := f.limits.sessions[sid]; s != nil {
			return s.active
		}
		return -1
	}
	var issue string // the session id the handler issues; "" fails
	var seen []int   // active(sid) inside the handler, for a session's requests
	h := f.admitSession(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if sid := r.Header.Get(headerSessionID); sid != "" {
			seen = append(seen, active(sid))
		}
		if issue == "" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.Header().Set(headerSessionID, issue)
		_, _ = w.Write([]byte("{}"))
	}))
	initialize := func(addr, body string) *http.Response {
		r := request(http.MethodPost, body)
		r.RemoteAddr = addr
		return serve(h, classified(r)).Result()
	}
	const init1 = `{"jsonrpc":"2.0","id":1,"method":"initialize"}`

	issue = "s1"
	require.Equal(t, http.StatusOK, initialize("192.0.2.1:1", init1).StatusCode)
	assert.Equal(t, 1, f.limits.stats().Live)
	assert.Equal(t, 0, active("s1"), "admitted, idle once its initialize is over")

	serve(h, request(http.MethodGet, "", headerSessionID, "s1"))
	assert.Equal(t, []int{1}, seen, "a request of the session keeps it active")
	assert.Equal(t, 0, active("s1"))

	resp := initialize("192.0.2.1:2", init1)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "one session per client")
	assert.NotEmpty(t, resp.Header.Get("Retry-After"))
	var refusal struct {
		ID    int `json:"id"`
		Error struct {
			Code int `json:"code"`
			Data struct {
				Setting string `json:"setting"`
			} `json:"data"`
		} `json:"error"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&refusal))
	assert.Equal(t, 1, refusal.ID)
	assert.Equal(t, codeOverLimit, refusal.Error.Code)
	assert.Equal(t, "mcp.max_sessions_per_client", refusal.Error.Data.Setting)

	issue = ""
	assert.Equal(t, http.StatusBadRequest, initialize("192.0.2.2:1", init1).StatusCode)
	assert.Equal(t, 1, f.limits.stats().Live, "a failed initialize gives its slot back")

	issue = "s2"
	require.Equal(t, http.StatusOK, initialize("192.0.2.2:1", init1).StatusCode)
	resp = initialize("192.0.2.3:1", `{"jsonrpc":"2.0","method":"initialize"}`)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "the bridge is full")
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"), "no id to answer: still a JSON-RPC error")
	var noID struct {
		ID    json.RawMessage `json:"id"`
		Error struct {
			Data struct {
				Setting string `json:"setting"`
			} `json:"data"`
		} `json:"error"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&noID))
	assert.Equal(t, "null", string(noID.ID))
	assert.Equal(t, "mcp.max_sessions", noID.Error.Data.Setting)
	st := f.limits.stats()
	assert.Equal(t, 2, st.Live)
	assert.EqualValues(t, 1, st.RefusedClient)
	assert.EqualValues(t, 1, st.RefusedTotal)
}
