// Package bearer checks shared-secret tokens for the bridge's three
// listeners (device WebSocket, control API, /mcp) in one way: constant-time
// comparison against every configured token.
package bearer

import (
	"crypto/subtle"
	"strings"
)

// Tokens is a set of accepted tokens. The zero value accepts nothing and
// reports Empty.
type Tokens struct{ list [][]byte }

// New builds the set from configured tokens.
func New(tokens []string) Tokens {
	t := Tokens{}
	for _, s := range tokens {
		t.list = append(t.list, []byte(s))
	}
	return t
}

// Empty reports whether no tokens are configured (auth is off).
func (t Tokens) Empty() bool { return len(t.list) == 0 }

// Index returns which token equals got, or -1. It compares against every
// token without stopping early, so the time taken does not reveal which
// one nearly matched.
func (t Tokens) Index(got string) int {
	found := -1
	for i, want := range t.list {
		if subtle.ConstantTimeCompare(want, []byte(got)) == 1 {
			found = i
		}
	}
	return found
}

// FromHeader extracts the token of an "Authorization: Bearer <token>"
// header; the scheme is case-insensitive, as HTTP auth schemes are.
func FromHeader(header string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimSpace(token), true
}
