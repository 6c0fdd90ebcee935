// Package sealed makes and checks the bridge's signed opaque tokens: a
// value that travels through a client and must come back unchanged, to
// the owner it was given to. flow's stateless sessionIds and the MRTR
// requestStates of mcpserver both use it. A token is
//
//	version "." base64url(JSON) "." base64url(HMAC-SHA256(key, version "." base64url(JSON) 0x00 owner))
//
// The owner is not in the token, only in the MAC, so a token shown to
// another owner fails exactly like a tampered one. The version is signed
// too: callers sharing one key (flow and mcpserver share the flow secret)
// cannot have one's token accepted as the other's. The JSON is signed, not
// encrypted; it must hold nothing its owner may not read.
package sealed

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
)

// The ways Open refuses a token. Callers map them to their own wording;
// all of them mean "this token is not usable here".
var (
	// ErrTooLong: longer than the caller's bound; nothing was decoded.
	ErrTooLong = errors.New("sealed: token too long")
	// ErrMalformed: not shaped like a token, or its JSON does not decode
	// into the caller's value.
	ErrMalformed = errors.New("sealed: malformed token")
	// ErrVersion: a token of another version (another format, or another
	// caller's kind of token).
	ErrVersion = errors.New("sealed: token of another version")
	// ErrSignature: the MAC does not match: tampered, another owner's, or
	// made under another key.
	ErrSignature = errors.New("sealed: bad signature")
)

var b64 = base64.RawURLEncoding

// Seal encodes v as JSON and signs it for owner. version must be non-empty
// and hold neither '.' nor NUL (it frames the token and the MAC input).
func Seal(key []byte, version, owner string, v any) (string, error) {
	if !validVersion(version) {
		return "", errors.New("sealed: version must be non-empty, without '.' or NUL")
	}
	payload, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	signed := version + "." + b64.EncodeToString(payload)
	return signed + "." + b64.EncodeToString(mac(key, signed, owner)), nil
}

// Open checks that token was sealed under key, with version, for owner,
// and decodes its JSON into v. Tokens longer than maxLen bytes are refused
// before any decoding. The MAC is checked (in constant time) before the
// payload is decoded, so v is only ever filled from a genuine token. The
// caller still checks what the value means (expiry, step, tool).
func Open(key []byte, version, owner, token string, maxLen int, v any) error {
	if len(token) > maxLen {
		return ErrTooLong
	}
	head, _, ok := strings.Cut(token, ".")
	if !ok {
		return ErrMalformed
	}
	if head != version {
		return ErrVersion
	}
	dot := strings.LastIndexByte(token, '.')
	if dot <= len(head) {
		return ErrMalformed // a single dot: no MAC
	}
	signed, sig := token[:dot], token[dot+1:]
	got, err := b64.DecodeString(sig)
	if err != nil || !hmac.Equal(got, mac(key, signed, owner)) {
		return ErrSignature
	}
	payload, err := b64.DecodeString(signed[len(version)+1:])
	if err != nil {
		return ErrMalformed
	}
	if err := json.Unmarshal(payload, v); err != nil {
		return ErrMalformed
	}
	return nil
}

// mac frames its input unambiguously: signed holds no NUL (a version
// without one, a dot, base64url), so the first NUL ends it whatever the
// owner contains.
func mac(key []byte, signed, owner string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(signed))
	m.Write([]byte{0})
	m.Write([]byte(owner))
	return m.Sum(nil)
}

func validVersion(v string) bool {
	return v != "" && !strings.ContainsAny(v, ".\x00")
}
