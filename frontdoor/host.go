package frontdoor

// The Host step: DNS rebinding. A page on an attacker's name
// (evil.example) whose DNS record is switched to the bridge's address is,
// to the browser, the same origin as the bridge; the only trace of the
// trick is the Host header, which still names evil.example. So a DNS name
// in Host must be one the operator gave the bridge. An IP literal cannot
// be rebound (a page at http://10.0.0.5 is that address's own origin); on
// a loopback listener it must still be a loopback address, as go-sdk's
// localhost protection requires.

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/devicebridge/devicebridge/internal/clip"
)

// Hosts is the set of DNS names a Host header may carry. localhost is
// always in it.
type Hosts struct {
	any   bool
	names map[string]bool
}

// ParseHosts reads an allow-list of host names: DNS names (or addresses)
// without scheme or port, or "*" for any name (which turns the check off:
// only for a proxy in front that checks Host itself).
func ParseHosts(list []string) (Hosts, error) {
	h := Hosts{names: map[string]bool{"localhost": true}}
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == "*" {
			h.any = true
			continue
		}
		_, _, splitErr := net.SplitHostPort(s) // nil: s names a port
		name := canonicalHost(s)
		if name == "" || splitErr == nil || strings.ContainsAny(s, "/@ \t?#") || (strings.Contains(name, ":") && !isIP(name)) {
			return Hosts{}, fmt.Errorf("%q is not a host name: give a DNS name such as bridge.example (no scheme, no port), or *", s)
		}
		h.names[name] = true
	}
	return h, nil
}

// canonicalHost is a Host header's name: port, IPv6 brackets and a
// trailing dot removed, lower case.
func canonicalHost(host string) string {
	if name, _, err := net.SplitHostPort(host); err == nil {
		host = name
	}
	host = strings.TrimPrefix(strings.TrimSuffix(host, "]"), "[")
	return strings.ToLower(strings.TrimSuffix(host, "."))
}

func isIP(s string) bool {
	_, err := netip.ParseAddr(s)
	return err == nil
}

// Allowed reports whether a request to a listener (loopback or not) may
// carry host in its Host header.
func (h Hosts) Allowed(host string, loopback bool) bool {
	name := canonicalHost(host)
	switch {
	case h.any:
		return true
	case name == "":
		// Browsers always send Host; a request without one is a script's.
		return true
	case h.names[name]:
		return true
	}
	if ip, err := netip.ParseAddr(name); err == nil {
		return !loopback || ip.Unmap().IsLoopback()
	}
	return false
}

// onLoopback reports whether r came in on a loopback address. Unknown
// (no local address in the context) counts as loopback: the stricter rule.
func onLoopback(r *http.Request) bool {
	la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok || la == nil {
		return true
	}
	ap, err := netip.ParseAddrPort(la.String())
	if err != nil {
		return true
	}
	return ap.Addr().Unmap().IsLoopback()
}

func (m *Mux) hostStep(refuse Refuser) Step {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if m.hosts.Allowed(r.Host, onLoopback(r)) {
				next.ServeHTTP(w, r)
				return
			}
			m.refused(&m.hostLog, refuse, w, r, http.StatusForbidden, "host_not_allowed",
				fmt.Sprintf("Host %q is not a name this bridge answers to (DNS rebinding protection): use its address or localhost, "+
					"or add the name to control.allowed_hosts (--allowed-host) or auth.public_url", clip.String(r.Host)),
				clip.Field("host", r.Host))
		})
	}
}
