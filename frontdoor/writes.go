package frontdoor

// The Writes step: no state change from a CORS-simple request. Any page
// can make a browser send a "simple" request (GET, HEAD or POST with a
// form or text/plain body and no custom header) to any address without
// asking first; anything else needs a CORS preflight, which the bridge
// never grants. A state-changing request from a browser must therefore be
// one a page could not have sent on its own: JSON, or a header of ours.
// It narrows what an allowed origin (a local dev server on localhost:*)
// can do, and covers a browser that failed the Origin step's checks in a
// way nobody foresaw. Requests with neither Origin nor Sec-Fetch-Site are
// not a browser's: `curl -d` sends a form content type and still works.

import (
	"mime"
	"net/http"
	"strings"

	"github.com/devicebridge/devicebridge/internal/bearer"
	"github.com/devicebridge/devicebridge/internal/clip"
)

// fromBrowser reports whether r carries a header only browsers add.
func fromBrowser(r *http.Request) bool {
	return r.Header.Get("Origin") != "" || r.Header.Get("Sec-Fetch-Site") != ""
}

// preflighted reports whether a browser would have had to ask (CORS
// preflight) before sending r. It errs towards "no": only what is surely
// not CORS-simple counts.
func preflighted(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodPost:
	default:
		return true // PUT, DELETE, PATCH… are never simple
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err == nil &&
		(mt == "application/json" || strings.HasSuffix(mt, "+json")) {
		return true
	}
	// A browser adds a Basic or Digest Authorization on its own, never a
	// Bearer one.
	if tok, ok := bearer.FromHeader(r.Header.Get("Authorization")); ok && tok != "" {
		return true
	}
	for name := range r.Header { // canonical names: "Mcp-Session-Id", "X-…"
		if strings.HasPrefix(name, "X-") || strings.HasPrefix(name, "Mcp-") {
			return true
		}
	}
	return false
}

func (m *Mux) writesStep(refuse Refuser) Step {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if safeMethod(r.Method) || !fromBrowser(r) || preflighted(r) {
				next.ServeHTTP(w, r)
				return
			}
			m.refused(&m.writeLog, refuse, w, r, http.StatusUnsupportedMediaType, "simple_request_refused",
				"a browser request that changes something must be JSON (Content-Type: application/json) or carry "+
					"an X- header, so that no other web page can forge it; this one is a form or text/plain",
				clip.Field("content_type", r.Header.Get("Content-Type")))
		})
	}
}
