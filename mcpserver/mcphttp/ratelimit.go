package mcphttp

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/internal/keyrate"
)

// rateLimit is the first step: mcp.rate_limit, per known legacy session,
// else per client (clientKey). A request past its bucket gets 429 with
// Retry-After and goes no further. It is a no-op when rate limiting is off.
func (f *Front) rateLimit(next http.Handler) http.Handler {
	if f.rates == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sid := r.Header.Get(headerSessionID)
		known := sid != "" && f.tracker.known(sid)
		set, key := f.rates.sessions, sid
		if !known {
			set, key = f.rates.clients, clientKey(r, bearerToken(r))
		}
		if ok, wait := set.Allow(key, time.Now()); !ok {
			f.lines.rateLimited.Info(f.log, "mcp request refused: rate limit", zap.String("remote", r.RemoteAddr), zap.Bool("session", known))
			w.Header().Set("Retry-After", strconv.Itoa(int(wait.Seconds()+0.999)))
			http.Error(w, "Too Many Requests: slow down (see mcp.rate_limit)", http.StatusTooManyRequests)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// requestRates are the token buckets of mcp.rate_limit, in two bounded
// sets so that a flood of clients never costs a session its own bucket.
type requestRates struct {
	// sessions holds a bucket per known legacy session; it is sized to
	// mcp.max_sessions, and a session's bucket is forgotten when the
	// session closes.
	sessions *keyrate.Set
	// clients holds a bucket per client key outside a session (clientKey).
	clients *keyrate.Set
}

// maxRateClients bounds the client keys (addresses, /64 networks for
// IPv6, with a token hash where tokens are in use) that have their own
// request bucket at once; a bucket is reclaimed once it has refilled (2 s
// at the default rate and burst). It is far above the hosts that use one
// bridge; past it, during a flood from that many networks, newcomers share
// one overflow bucket until idle buckets are reclaimed, and memory stays
// near 3 MB.
const maxRateClients = 16384

func newRequestRates(perSecond float64, burst, maxSessions int) *requestRates {
	return &requestRates{
		sessions: keyrate.New(perSecond, burst, max(1, maxSessions)),
		clients:  keyrate.New(perSecond, burst, maxRateClients),
	}
}

// clientKey identifies a client outside a session: its address (for IPv6
// its /64, which one host usually holds whole, so rotating addresses
// inside it gains nothing) and, with tokens, which token it holds.
func clientKey(r *http.Request, token string) string {
	key := keyrate.AddrKey(r.RemoteAddr)
	if token != "" {
		return key + "|" + tokenHash(token)
	}
	return key
}

// tokenHash is a short digest of a token, so that keys hold no secret.
// Six hex digits tell apart the few tokens of one address.
func tokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])[:6]
}
