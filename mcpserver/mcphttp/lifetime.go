package mcphttp

import (
	"context"
	"net/http"
)

// bindLifetime binds each request to lifetime (the server's), so that
// closing the server ends hanging streams and calls.
func bindLifetime(lifetime context.Context) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx, cancel := context.WithCancel(r.Context())
			defer cancel()
			stop := context.AfterFunc(lifetime, cancel)
			defer stop()
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}
}
