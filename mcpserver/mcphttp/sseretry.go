package mcphttp

import (
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// SSERetry is the reconnection delay the legacy SSE streams announce in
// their first event (the SSE retry field): how long a client waits before
// it resumes a stream that ended early, with Last-Event-ID. go-sdk writes
// the priming event of 2025-11-25 (SEP-1699) without one, so clients fall
// back to their own guess.
const SSERetry = time.Second

// retryVersion is the first protocol version with priming events and
// server-closed streams (SEP-1699), from which streams carry retry.
const retryVersion = "2025-11-25"

// sseRetry is the first step of the legacy route: an SSE stream of a
// session at 2025-11-25 or later (a POST's response stream, the GET stream
// and a resumed one) announces SSERetry in its first event. Other
// answers pass untouched.
func sseRetry(next http.Handler) http.Handler {
	field := "retry: " + strconv.FormatInt(SSERetry.Milliseconds(), 10) + "\n"
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if streamVersion(r) < retryVersion {
			next.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(&retryWriter{ResponseWriter: w, field: field}, r)
	})
}

// streamVersion is the protocol version a legacy request's stream speaks:
// an initialize's own, else the header's ("" when neither says).
func streamVersion(r *http.Request) string {
	if v := messageOf(r).info.initVersion; v != "" {
		return v
	}
	return r.Header.Get(headerProtocolVersion)
}

// retryWriter puts the retry field at the start of the first write of a
// successful text/event-stream answer. go-sdk writes whole events (or the
// GET stream's opening comment), one per write, so the field joins the
// first event. Writes may come from several goroutines; whichever is
// first carries it.
type retryWriter struct {
	http.ResponseWriter
	field   string
	status  atomic.Int32
	started atomic.Bool
}

func (w *retryWriter) WriteHeader(code int) {
	w.status.CompareAndSwap(0, int32(code))
	w.ResponseWriter.WriteHeader(code)
}

func (w *retryWriter) Write(p []byte) (int, error) {
	if w.started.CompareAndSwap(false, true) && w.isStream() {
		buf := make([]byte, 0, len(w.field)+len(p))
		buf = append(append(buf, w.field...), p...)
		if _, err := w.ResponseWriter.Write(buf); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return w.ResponseWriter.Write(p)
}

// isStream reports whether the answer is a successful SSE stream.
func (w *retryWriter) isStream() bool {
	code := w.status.Load()
	return (code == 0 || code == http.StatusOK) && strings.HasPrefix(w.Header().Get("Content-Type"), "text/event-stream")
}

// Flush keeps SSE events flowing through the wrapper.
func (w *retryWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

// Unwrap lets http.ResponseController reach the real writer.
func (w *retryWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
