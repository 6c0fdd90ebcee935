package mcphttp

import "net/http"

// hookWriter lets a step see what the go-sdk handler writes: onHeader
// once, before the status line goes out, and skip before each write (true
// withholds it). Either may be nil.
type hookWriter struct {
	http.ResponseWriter
	onHeader    func(h http.Header, code int)
	skip        func(p []byte) bool
	wroteHeader bool
}

func (w *hookWriter) WriteHeader(code int) {
	if !w.wroteHeader {
		w.wroteHeader = true
		if w.onHeader != nil {
			w.onHeader(w.Header(), code)
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *hookWriter) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.skip != nil && w.skip(p) {
		return len(p), nil
	}
	return w.ResponseWriter.Write(p)
}

// Flush keeps SSE events flowing through the wrapper.
func (w *hookWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

// Unwrap lets http.ResponseController reach the real writer.
func (w *hookWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// issuedSession is the session id a response to a request without one
// issues ("" when it issues none).
func issuedSession(h http.Header, code int) string {
	if code >= 300 {
		return ""
	}
	return h.Get(headerSessionID)
}
