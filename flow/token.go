package flow

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"strings"
)

// Stateless tokens (spec Appendix B). A token is
//
//	"flt1." + base64url(JSON record) + "." + base64url(HMAC-SHA256(secret, "flt1." + payload + 0x00 + owner))
//
// The record is the interaction's whole state: tool name, accumulated
// data, pending properties, prompt count, open prompt, history, created and
// last-activity times, timeout and hard expiry. The owner is not in the
// token, only in the MAC: a token shown to another owner does not verify,
// exactly like a tampered one, and both get CodeSessionNotFound. The
// payload is signed, not encrypted: it holds nothing the owner did not
// type, but keep tokens out of logs.
const tokenPrefix = "flt1."

// maxTokenBytes bounds what decode accepts.
const maxTokenBytes = 1 << 20

var b64 = base64.RawURLEncoding

func (e *Engine) mac(owner, signed string) []byte {
	m := hmac.New(sha256.New, e.secret)
	m.Write([]byte(signed))
	m.Write([]byte{0})
	m.Write([]byte(owner))
	return m.Sum(nil)
}

func (e *Engine) encode(owner string, rec *record) string {
	payload, err := json.Marshal(rec)
	if err != nil {
		// A record holds only JSON-safe values; this cannot happen.
		panic("flow: encoding token: " + err.Error())
	}
	signed := tokenPrefix + b64.EncodeToString(payload)
	return signed + "." + b64.EncodeToString(e.mac(owner, signed))
}

// decode verifies a token for owner and returns its record, or
// CodeSessionNotFound (malformed, tampered, another owner's) or
// CodeSessionExpired.
func (e *Engine) decode(owner, token string, now int64) (*record, error) {
	if len(token) > maxTokenBytes || !strings.HasPrefix(token, tokenPrefix) {
		return nil, errNotFound(token)
	}
	dot := strings.LastIndexByte(token, '.')
	if dot <= len(tokenPrefix) {
		return nil, errNotFound(token)
	}
	signed, sig := token[:dot], token[dot+1:]
	got, err := b64.DecodeString(sig)
	if err != nil || !hmac.Equal(got, e.mac(owner, signed)) {
		return nil, errNotFound(token)
	}
	payload, err := b64.DecodeString(signed[len(tokenPrefix):])
	if err != nil {
		return nil, errNotFound(token)
	}
	var rec record
	if err := json.Unmarshal(payload, &rec); err != nil || rec.ID == "" || rec.Tool == "" {
		return nil, errNotFound(token)
	}
	if rec.Args == nil {
		rec.Args = map[string]json.RawMessage{}
	}
	if d, why := rec.deadline(); now > d {
		limit := fmtDur(rec.Timeout)
		if why == reasonMaxDuration {
			limit = fmtDur(rec.Hard - rec.Created)
		}
		return nil, errExpired(token, why, limit)
	}
	return &rec, nil
}
