package flow

import (
	"encoding/json"

	"github.com/devicebridge/devicebridge/internal/sealed"
)

// Stateless tokens (spec Appendix B): an internal/sealed token of version
// "flt1", whose JSON is the interaction's whole state: tool name,
// accumulated data, pending properties, prompt count, open prompt,
// history, created and last-activity times, timeout and hard expiry. The
// owner is only in the MAC: a token shown to another owner does not
// verify, exactly like a tampered one, and both get CodeSessionNotFound.
// The payload is signed, not encrypted: it holds nothing the owner did not
// type, but keep tokens out of logs.
const (
	tokenVersion = "flt1"
	tokenPrefix  = tokenVersion + "."
)

// maxTokenBytes bounds what decode accepts.
const maxTokenBytes = 1 << 20

func (s *tokenStore) encode(owner string, rec *record) string {
	tok, err := sealed.Seal(s.secret, tokenVersion, owner, rec)
	if err != nil {
		// A record holds only JSON-safe values; this cannot happen.
		panic("flow: encoding token: " + err.Error())
	}
	return tok
}

// decode verifies a token for owner and returns its record, or
// CodeSessionNotFound (malformed, tampered, another owner's) or
// CodeSessionExpired.
func (s *tokenStore) decode(owner, token string, now int64) (*record, error) {
	var rec record
	if err := sealed.Open(s.secret, tokenVersion, owner, token, maxTokenBytes, &rec); err != nil || rec.ID == "" || rec.Tool == "" {
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
