package mcphttp

import (
	"net"
	"net/http"

	"github.com/devicebridge/devicebridge/authn"
)

// stripCaller deletes what the client sent under header, the caller
// identity of interactions: only setCaller writes it.
func stripCaller(header string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.Header.Del(header)
			next.ServeHTTP(w, r)
		})
	}
}

// setCaller tells the handlers of a modern (stateless) request who is
// calling, in header: a modern request has no session to key its
// interactions by. Interactions belong to the verified identity when there
// is one (it survives token refresh), else to the token or the address.
func setCaller(header string, caller func(host, token string) string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			host, _, err := net.SplitHostPort(r.RemoteAddr)
			if err != nil {
				host = r.RemoteAddr
			}
			token := bearerToken(r)
			if ti := authn.TokenInfoFrom(r.Context()); ti != nil && ti.UserID != "" {
				token = "identity\x00" + ti.UserID
			}
			r.Header.Set(header, caller(host, token))
			next.ServeHTTP(w, r)
		})
	}
}
