package mcphttp

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTrackCalls: the step learns the sessions the handler issues, the
// calls their POSTs start and cancel, and withholds from the stream the
// result of a cancelled call, and only that.
func TestTrackCalls(t *testing.T) {
	f := &Front{tracker: newSessionTracker()}
	var respond func(w http.ResponseWriter)
	h := f.trackCalls(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { respond(w) }))
	post := func(sid, body string) *http.Request {
		r := request(http.MethodPost, body)
		if sid != "" {
			r.Header.Set(headerSessionID, sid)
		}
		return classified(r)
	}

	respond = func(w http.ResponseWriter) {
		w.Header().Set(headerSessionID, "refused")
		w.WriteHeader(http.StatusBadRequest)
	}
	serve(h, post("", `{"jsonrpc":"2.0","id":1,"method":"initialize"}`))
	assert.False(t, f.tracker.known("refused"), "an error issues no session")
	respond = func(w http.ResponseWriter) {
		w.Header().Set(headerSessionID, "s1")
		_, _ = w.Write([]byte("{}"))
	}
	serve(h, post("", `{"jsonrpc":"2.0","id":1,"method":"initialize"}`))
	require.True(t, f.tracker.known("s1"))

	respond = func(w http.ResponseWriter) { w.WriteHeader(http.StatusAccepted) }
	serve(h, post("s1", `[{"jsonrpc":"2.0","id":7,"method":"tools/call"},{"jsonrpc":"2.0","id":8,"method":"tools/call"}]`))
	serve(h, post("s1", `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}`))

	event := func(id string) []byte {
		return []byte("event: message\nid: 1_" + id + "\ndata: {\"jsonrpc\":\"2.0\",\"id\":" + id + ",\"result\":{}}\n\n")
	}
	respond = func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, id := range []string{"7", "8"} {
			_, _ = w.Write(event(id))
			http.NewResponseController(w).Flush()
		}
	}
	stream := serve(h, request(http.MethodGet, "", headerSessionID, "s1"))
	assert.Equal(t, string(event("8")), stream.Body.String(), "the cancelled call's result is withheld")
	assert.True(t, stream.Flushed, "events are flushed through the step")
}
