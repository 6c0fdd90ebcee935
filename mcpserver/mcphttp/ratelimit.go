package mcphttp

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/authn"
	"github.com/devicebridge/devicebridge/internal/keyrate"
)

// rateLimit is the first step: mcp.rate_limit, per known legacy session,
// else per verified identity, else per client address (rateKey). A request
// past its bucket gets 429 with Retry-After and a JSON-RPC error (refuseRate)
// and goes no further. It is a no-op when rate limiting is off.
func (f *Front) rateLimit(next http.Handler) http.Handler {
	if f.rates == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		set, key, by := f.rateKey(r)
		if ok, wait := set.Allow(key, time.Now()); !ok {
			f.refuseRate(w, r, by, wait)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Whose bucket a request spends (rateKey), for the refusal's log line.
const (
	bySession  = "session"
	byIdentity = "identity"
	byAddress  = "address"
)

// rateKey picks the bucket a request spends: its legacy session's when
// the session is known; otherwise its verified identity's (a stateless
// 2026-07-28 client has no session, and one identity is one caller
// whichever address or token it uses); otherwise its client key (address,
// with the token when there is one).
func (f *Front) rateKey(r *http.Request) (set *keyrate.Set, key, by string) {
	if sid := r.Header.Get(headerSessionID); sid != "" && f.tracker.known(sid) {
		return f.rates.sessions, sid, bySession
	}
	if ti := authn.TokenInfoFrom(r.Context()); ti != nil && ti.UserID != "" {
		return f.rates.clients, identityKey(ti.UserID), byIdentity
	}
	return f.rates.clients, clientKey(r, bearerToken(r)), byAddress
}

// refuseRate answers a request over its bucket: 429 with Retry-After and
// a JSON-RPC error whose id is the request's (null when it has none or it
// cannot be read), code codeOverLimit, and data naming the setting and the
// seconds to wait.
func (f *Front) refuseRate(w http.ResponseWriter, r *http.Request, by string, wait time.Duration) {
	f.lines.rateLimited.Info(f.log, "mcp request refused: rate limit", zap.String("remote", r.RemoteAddr), zap.String("by", by))
	secs := retrySeconds(wait)
	msg := fmt.Sprintf("too many requests: this %s is over the bridge's limit of %s requests per second (bursts of %d; mcp.rate_limit); "+
		"retry after %d s", by, strconv.FormatFloat(f.opts.RateLimit, 'f', -1, 64), f.opts.RateBurst, secs)
	writeOverLimit(w, http.StatusTooManyRequests, peekID(r), msg, "mcp.rate_limit", secs)
}

// maxPeek bounds what a refused request's body is read for its id. The
// step runs before bodyLimit, so that a flood is refused without reading
// whole bodies; an id past this much of the body (a client that sends it
// after large params) is answered as null.
const maxPeek = 64 << 10

// peekID reads the id of a refused POST from the start of its body.
func peekID(r *http.Request) json.RawMessage {
	if r.Method != http.MethodPost || r.Body == nil {
		return nil
	}
	head, _ := io.ReadAll(io.LimitReader(r.Body, maxPeek))
	return leadingID(head)
}

// retrySeconds is a Retry-After in whole seconds, rounded up, at least 1.
func retrySeconds(wait time.Duration) int {
	return max(1, int((wait+time.Second-1)/time.Second))
}

// codeOverLimit is the JSON-RPC error code of a request refused for a
// limit the caller can wait out (mcp.rate_limit, the session caps): the
// generic server error, with data {setting, retryAfter}. flow's codes take
// -32001 to -32007, and MCP's own are -32020 and up.
const codeOverLimit = -32000

// writeOverLimit refuses a request for a limit with status, Retry-After
// (secs) and a JSON-RPC error for id (null when unknown): clients then fail
// the one call, with the seconds to wait, instead of taking the reply for
// a broken transport.
func writeOverLimit(w http.ResponseWriter, status int, id json.RawMessage, msg, setting string, secs int) {
	if len(bytes.TrimSpace(id)) == 0 {
		id = json.RawMessage("null")
	}
	type errorData struct {
		Setting    string `json:"setting"`
		RetryAfter int    `json:"retryAfter"`
	}
	type rpcError struct {
		Code    int       `json:"code"`
		Message string    `json:"message"`
		Data    errorData `json:"data"`
	}
	out, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   rpcError        `json:"error"`
	}{"2.0", id, rpcError{codeOverLimit, msg, errorData{setting, secs}}})
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(out)
}

// requestRates are the token buckets of mcp.rate_limit, in two bounded
// sets so that a flood of clients never costs a session its own bucket.
type requestRates struct {
	// sessions holds a bucket per known legacy session; it is sized to
	// mcp.max_sessions, and a session's bucket is forgotten when the
	// session closes.
	sessions *keyrate.Set
	// clients holds a bucket per caller outside a session: its verified
	// identity (identityKey), else its client key (clientKey).
	clients *keyrate.Set
}

// maxRateClients bounds the callers (identities, addresses, /64 networks
// for IPv6, with a token hash where tokens are in use) that have their own
// request bucket at once; a bucket is reclaimed once it has refilled (a
// few seconds at the default rate and burst). It is far above the hosts
// that use one bridge; past it, during a flood from that many networks,
// newcomers share one overflow bucket until idle buckets are reclaimed,
// and memory stays near 3 MB.
const maxRateClients = 16384

func newRequestRates(perSecond float64, burst, maxSessions int) *requestRates {
	return &requestRates{
		sessions: keyrate.New(perSecond, burst, max(1, maxSessions)),
		clients:  keyrate.New(perSecond, burst, maxRateClients),
	}
}

// clientKey identifies a client outside a session and without a verified
// identity: its address (for IPv6 its /64, which one host usually holds
// whole, so rotating addresses inside it gains nothing) and, with tokens,
// which token it holds.
func clientKey(r *http.Request, token string) string {
	key := keyrate.AddrKey(r.RemoteAddr)
	if token != "" {
		return key + "|" + tokenHash(token)
	}
	return key
}

// identityKey is the bucket key of a verified identity: a digest, so that
// a long subject costs no more room than a short one.
func identityKey(id string) string {
	sum := sha256.Sum256([]byte("identity\x00" + id))
	return "id|" + hex.EncodeToString(sum[:12])
}

// tokenHash is a short digest of a token, so that keys hold no secret.
// Six hex digits tell apart the few tokens of one address.
func tokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])[:6]
}
