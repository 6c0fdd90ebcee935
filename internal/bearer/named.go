package bearer

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"strings"
)

// A configured token may carry a name, "kitchen=SECRET": the name is the
// identity its holder acts as (policy, audit log). A token without one
// gets a stable name derived from a hash of the secret, never the secret.
//
// The split is at the first '='. So that base64 tokens keep working
// unnamed, the part before it must be a plain name (letters, digits, '-',
// '_', '.', '@') and the secret must not start with '=' (padding). A
// client holding the whole configured string (a token configured before
// names existed, such as "abc=def") is still accepted, as the same
// identity.

// Split separates "name=secret" into its parts; an unnamed token returns
// "" and the token as it is.
func Split(configured string) (name, secret string) {
	n, s, ok := strings.Cut(configured, "=")
	if !ok || n == "" || s == "" || s[0] == '=' || !isName(n) {
		return "", configured
	}
	return n, s
}

func isName(s string) bool {
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.', r == '@':
		default:
			return false
		}
	}
	return true
}

// UnnamedIdentity is the identity of a token configured without a name:
// "token-" and 8 bytes of its SHA-256, enough to tell tokens apart in a
// log without revealing them.
func UnnamedIdentity(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return "token-" + hex.EncodeToString(sum[:8])
}

// Named is a set of accepted tokens with the identity each grants.
type Named struct {
	names   []string
	secrets [][]byte
	whole   [][]byte // the configured strings, for tokens that predate names
}

// NewNamed builds the set from configured tokens ("name=secret" or
// "secret").
func NewNamed(tokens []string) Named {
	var n Named
	for _, t := range tokens {
		name, secret := Split(t)
		if name == "" {
			name = UnnamedIdentity(secret)
		}
		n.names = append(n.names, name)
		n.secrets = append(n.secrets, []byte(secret))
		n.whole = append(n.whole, []byte(t))
	}
	return n
}

// Empty reports whether no tokens are configured.
func (n Named) Empty() bool { return len(n.secrets) == 0 }

// Lookup returns the identity of the token got, comparing against every
// token in constant time without stopping early.
func (n Named) Lookup(got string) (string, bool) {
	found := -1
	for i, want := range n.secrets {
		if subtle.ConstantTimeCompare(want, []byte(got))|subtle.ConstantTimeCompare(n.whole[i], []byte(got)) == 1 {
			found = i
		}
	}
	if found < 0 {
		return "", false
	}
	return n.names[found], true
}
