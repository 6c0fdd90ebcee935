package mcphttp

import (
	"context"
	"net/http"
)

// bindLifetime binds each request to lifetime (the server's), so that
// closing the server ends hanging streams and calls. Once lifetime has
// ended, a request is refused with 503: handed on, an initialize would get
// a session of the closed server whose response stream ends at once (the
// request's context is already done), before or after the result, by
// chance; a 2025-11-25 client, primed to resume, then fails to reconnect
// to a session the go-sdk dropped for never finishing initialize.
func bindLifetime(lifetime context.Context) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if lifetime.Err() != nil {
				writeRejection(w, http.StatusServiceUnavailable, leadingID(messageOf(r).body), codeServerClosed,
					"the MCP server is closed (the bridge is shutting down); connect again once it is back")
				return
			}
			ctx, cancel := context.WithCancel(r.Context())
			defer cancel()
			stop := context.AfterFunc(lifetime, cancel)
			defer stop()
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}
}

// codeServerClosed is the JSON-RPC error code of a request refused because
// the server has closed: the generic server error.
const codeServerClosed = -32000
