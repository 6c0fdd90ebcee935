package frontdoor

// The Origin step: a browser request from another site. A request whose
// Origin is on the allow-list passes; so does one the browser itself
// marks as same-origin (the console), which net/http's
// CrossOriginProtection decides from Sec-Fetch-Site, or from Origin
// against Host for browsers older than 2023. Everything else from a
// browser is refused, whatever the method: /mcp and /api/events hold a
// stream open for whoever starts one.

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/devicebridge/devicebridge/internal/clip"
)

// DefaultAllowedOrigins admits pages served from this machine (any port),
// such as the MCP Inspector.
var DefaultAllowedOrigins = []string{
	"http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*",
	"https://localhost:*", "https://127.0.0.1:*", "https://[::1]:*",
}

// Origins is a parsed origin allow-list.
type Origins []originRule

// originRule is one entry of the list.
type originRule struct {
	any          bool
	scheme, host string
	port         string // "*" matches any port
}

// ParseOrigins reads an allow-list. Entries: "*" (any origin), "null"
// (sandboxed pages and files), an exact origin ("https://app.example",
// default ports implied) or any port of a host ("http://localhost:*").
func ParseOrigins(list []string) (Origins, error) {
	var out Origins
	for _, s := range list {
		r, err := parseOriginRule(s)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func parseOriginRule(s string) (originRule, error) {
	s = strings.TrimSpace(s)
	if s == "*" {
		return originRule{any: true}, nil
	}
	if s == "null" {
		return originRule{scheme: "null"}, nil
	}
	wildcard := strings.HasSuffix(s, ":*")
	if wildcard {
		s = strings.TrimSuffix(s, ":*")
	}
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return originRule{}, fmt.Errorf("%q is not an origin: use scheme://host[:port], scheme://host:* or *", s)
	}
	r := originRule{scheme: strings.ToLower(u.Scheme), host: strings.ToLower(u.Hostname()), port: u.Port()}
	if wildcard {
		if r.port != "" {
			return originRule{}, fmt.Errorf("%q: give either a port or :*", s)
		}
		r.port = "*"
	} else if r.port == "" {
		r.port = defaultPort(r.scheme)
	}
	return r, nil
}

func defaultPort(scheme string) string {
	switch scheme {
	case "http", "ws":
		return "80"
	case "https", "wss":
		return "443"
	}
	return ""
}

// Allowed reports whether the list admits origin (an Origin header).
func (o Origins) Allowed(origin string) bool {
	var scheme, host, port string
	if origin == "null" {
		scheme = "null"
	} else {
		u, err := url.Parse(origin)
		if err != nil || u.Scheme == "" || u.Host == "" {
			return false
		}
		scheme, host, port = strings.ToLower(u.Scheme), strings.ToLower(u.Hostname()), u.Port()
		if port == "" {
			port = defaultPort(scheme)
		}
	}
	for _, r := range o {
		if r.any {
			return true
		}
		if r.scheme == scheme && r.host == host && (r.port == "*" || r.port == port) {
			return true
		}
	}
	return false
}

// safeMethod reports methods that change nothing (RFC 9110 §9.2.1).
func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

func (m *Mux) originStep(refuse Refuser) Step {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			origin := r.Header.Get("Origin")
			if m.sameOrAllowedOrigin(r, origin) {
				next.ServeHTTP(w, r)
				return
			}
			m.refused(&m.originLog, refuse, w, r, http.StatusForbidden, "origin_not_allowed",
				fmt.Sprintf("Origin %q is not allowed (see control.allowed_origins, --allowed-origin)", clip.String(origin)),
				clip.Field("origin", origin), clip.Field("sec_fetch_site", r.Header.Get("Sec-Fetch-Site")))
		})
	}
}

func (m *Mux) sameOrAllowedOrigin(r *http.Request, origin string) bool {
	if origin != "" && m.origins.Allowed(origin) {
		return true
	}
	if origin == "" && safeMethod(r.Method) {
		// A navigation or an <img>: a cross-site page can neither change
		// anything through it nor read the answer, and following a link
		// to the console must keep working.
		return true
	}
	// CrossOriginProtection lets every safe method through; ask it as if
	// the request were a POST, so that a cross-origin GET carrying Origin
	// (a fetch opening /api/events) is judged like any other.
	probe := r
	if safeMethod(r.Method) {
		probe = r.WithContext(r.Context()) // a shallow copy
		probe.Method = http.MethodPost
	}
	return m.cop.Check(probe) == nil
}
