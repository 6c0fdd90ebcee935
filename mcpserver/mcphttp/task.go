package mcphttp

import "net/http"

// markTask tells the handlers, in header, that a legacy tools/call asked
// for a task (bodyInfo.task): the go-sdk decodes tools/call params into a
// type without the 2025-11-25 "task" field, so the handlers would not see
// it. What a client sent under header is deleted first, so it cannot be
// forged; with header "" the step does nothing.
func markTask(header string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		if header == "" {
			return next
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.Header.Del(header)
			if ttl := messageOf(r).info.task; ttl != "" {
				r.Header.Set(header, ttl)
			}
			next.ServeHTTP(w, r)
		})
	}
}
