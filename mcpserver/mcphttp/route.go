package mcphttp

import "net/http"

const (
	headerProtocolVersion = "Mcp-Protocol-Version"
	headerSessionID       = "Mcp-Session-Id"
	// ModernVersion is the first protocol version of the stateless era.
	ModernVersion = "2026-07-28"
	metaVersion   = "io.modelcontextprotocol/protocolVersion"
)

// route is the last step: it sends a request of the modern era
// (MCP-Protocol-Version ≥ 2026-07-28, the same in the body's _meta, or
// any server/discover) to modern, the stateless go-sdk handler, and
// everything else (initialize, session requests, GET streams, DELETE) to
// legacy, the stateful one with an event store for resumable streams.
// Answering discover statelessly means a client probing for the modern era
// never sees a list of legacy versions only.
func route(modern, legacy http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if isModern(r, messageOf(r).info) {
			modern.ServeHTTP(w, r)
			return
		}
		legacy.ServeHTTP(w, r)
	})
}

// isModern reports whether a request belongs to the stateless era.
func isModern(r *http.Request, info bodyInfo) bool {
	if v := r.Header.Get(headerProtocolVersion); v != "" && v >= ModernVersion {
		return true
	}
	return info.discover || (r.Header.Get(headerProtocolVersion) == "" && info.modernMeta)
}
