package mcphttp

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/authn"
	"github.com/devicebridge/devicebridge/internal/bearer"
	"github.com/devicebridge/devicebridge/internal/logthrottle"
)

// Options configure the front. The numbers are the mcp: settings of the
// same names, already defaulted by the server (mcpserver.Options).
type Options struct {
	// MaxBodyBytes bounds a request body (413 beyond it).
	MaxBodyBytes int64
	// RateLimit and RateBurst are mcp.rate_limit; RateLimit <= 0 turns
	// rate limiting off.
	RateLimit float64
	RateBurst int
	// MaxSessions and MaxSessionsPerClient cap legacy sessions;
	// SessionTimeout closes idle ones (<= 0: never).
	MaxSessions, MaxSessionsPerClient int
	SessionTimeout                    time.Duration
	// EventStoreBytes bounds the memory kept for resuming legacy streams.
	EventStoreBytes int

	// Authenticated binds sessions to the identity that opened them
	// (authn.RequireVerified); set it when the front door checks
	// credentials.
	Authenticated bool
	// Lifetime ends when the server closes; every request is bound to it.
	// Nil never ends.
	Lifetime context.Context

	// CallerHeader is the request header that carries the caller identity
	// of a modern request to the method handlers (required). The front
	// deletes what a client sent under it from every request, and sets it
	// on modern ones to Caller(host, token): host is the client's address,
	// token its bearer token or "identity\x00"+ the verified identity, ""
	// when /mcp is open.
	CallerHeader string
	Caller       func(host, token string) string
	// TaskHeader, when set, carries to the handlers that a legacy
	// tools/call asked for a task (params.task, which go-sdk does not
	// decode): its ttl in milliseconds, "0" when none was given. The front
	// deletes what a client sent under it from every request (task.go).
	TaskHeader string

	// Logger receives the front's own lines (refusals, idle closes);
	// SDKLogger is given to the go-sdk handlers. Nil discards.
	Logger    *zap.Logger
	SDKLogger *slog.Logger
}

// Front serves /mcp for one go-sdk server. Build it with New; Stop it when
// the server closes.
type Front struct {
	opts Options
	log  *zap.Logger
	srv  *mcp.Server // closeIdleSession closes its sessions

	// rates limits requests (mcp.rate_limit): per session id when the
	// session is known, per client key (clientKey) otherwise. Nil when
	// rate limiting is off.
	rates   *requestRates
	tracker *sessionTracker // legacy sessions and their cancelled calls (tracker.go)
	limits  *sessionLimits  // caps and idle timeout of legacy sessions (sessions.go)
	lines   lines

	serve http.Handler // the chain (New)
}

// lines throttle the front's log lines that a client can repeat at will,
// one request each: the first line at once, then one per interval with the
// count of those left out.
type lines struct {
	rateLimited, tooBig, refusals logthrottle.Throttle
}

// New builds the front of srv: the two go-sdk handlers and the steps
// before them (see the package doc for their order).
func New(srv *mcp.Server, opts Options) *Front {
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Lifetime == nil {
		opts.Lifetime = context.Background()
	}
	f := &Front{opts: opts, log: opts.Logger, srv: srv, tracker: newSessionTracker()}
	if opts.RateLimit > 0 {
		f.rates = newRequestRates(opts.RateLimit, opts.RateBurst, opts.MaxSessions)
	}
	f.limits = newSessionLimits(opts.MaxSessions, opts.MaxSessionsPerClient, opts.SessionTimeout, f.closeIdleSession)

	store := mcp.NewMemoryEventStore(nil)
	store.SetMaxBytes(opts.EventStoreBytes)
	stateful, stateless := sdkHandlers(srv, opts, &trackingStore{EventStore: store, f: f})

	f.serve = chain(
		f.rateLimit,                    // ratelimit.go
		f.bodyLimit,                    // bodylimit.go
		bindLifetime(opts.Lifetime),    // lifetime.go
		stripCaller(opts.CallerHeader), // caller.go
		markTask(opts.TaskHeader),      // task.go
	)(route( // route.go
		setCaller(opts.CallerHeader, opts.Caller)(stateless), // modern
		sseRetry(f.admitSession(f.trackCalls(stateful))),     // legacy: sseretry.go, sessions.go, tracker.go
	))
	return f
}

// sdkHandlers builds the go-sdk's two Streamable HTTP handlers over srv:
// stateful (legacy era, with store for resumable streams) and stateless
// (modern era).
func sdkHandlers(srv *mcp.Server, opts Options, store mcp.EventStore) (stateful, stateless http.Handler) {
	getServer := func(*http.Request) *mcp.Server { return srv }
	stateful = mcp.NewStreamableHTTPHandler(getServer, &mcp.StreamableHTTPOptions{
		EventStore: store,
		// No SessionTimeout: the go-sdk's counts POSTs only, and would
		// close a session whose host listens on a GET stream; the
		// front's session limits close idle sessions instead.
		MaxRequestBodyBytes: opts.MaxBodyBytes,
		Logger:              opts.SDKLogger,

		// The front door checks Host on every route of the listener, with
		// the names the operator allowed (a proxy's public name included);
		// go-sdk's own check knows only loopback names.
		DisableLocalhostProtection: true,
	})
	stateless = mcp.NewStreamableHTTPHandler(getServer, &mcp.StreamableHTTPOptions{
		Stateless: true,
		// In the modern era closing the response stream is the
		// cancellation: stop waiting for the board when it happens.
		PropagateRequestCancellation: true,
		MaxRequestBodyBytes:          opts.MaxBodyBytes,
		Logger:                       opts.SDKLogger,

		DisableLocalhostProtection: true, // as above
	})
	if opts.Authenticated {
		// Bind sessions to the identity that opened them, so one caller
		// cannot use another's session id.
		verified := authn.RequireVerified()
		stateful = verified(stateful)
		stateless = verified(stateless)
	}
	return stateful, stateless
}

// chain applies steps so that the first is the outermost: a request meets
// them in the order written.
func chain(steps ...func(http.Handler) http.Handler) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		for i := len(steps) - 1; i >= 0; i-- {
			h = steps[i](h)
		}
		return h
	}
}

func (f *Front) ServeHTTP(w http.ResponseWriter, r *http.Request) { f.serve.ServeHTTP(w, r) }

// Stop lets no idle session close any more and waits for those closing;
// the server then closes every session itself.
func (f *Front) Stop() { f.limits.stop() }

// Stats reports the legacy sessions' bounds at work.
func (f *Front) Stats() SessionStats { return f.limits.stats() }

// Throttles are the front's throttled log lines a client can repeat, by
// kind ("rate_limited", "too_big"), for the tests that flood them.
func (f *Front) Throttles() map[string]*logthrottle.Throttle {
	return map[string]*logthrottle.Throttle{"rate_limited": &f.lines.rateLimited, "too_big": &f.lines.tooBig}
}

// bearerToken is the token the front door let r in with ("" when /mcp is
// open). It only keys rate limits and stateless callers; it is not checked
// again.
func bearerToken(r *http.Request) string {
	if authn.TokenInfoFrom(r.Context()) == nil {
		return ""
	}
	token, _ := bearer.FromHeader(r.Header.Get("Authorization"))
	return token
}
