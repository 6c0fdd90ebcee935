package mcphttp

// Session admission, legacy era. Each session holds a go-sdk
// ServerSession, a goroutine and its stream bookkeeping until it closes, so
// an outsider that keeps initializing could otherwise pile them up. The
// front caps them globally (Options.MaxSessions) and per client
// (Options.MaxSessionsPerClient: the verified identity, else the client's
// address), and closes a session once it has been idle for
// Options.SessionTimeout.
//
// Idle means no request of the session in flight and no stream of it open.
// The go-sdk's own SessionTimeout counts POST requests only, so a host that
// keeps a GET stream open to hear list_changed, and rarely posts, would be
// cut off by it; the bridge therefore leaves the go-sdk's timer off and
// keeps this one.

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/authn"
	"github.com/devicebridge/devicebridge/internal/keyrate"
)

// sessionLimits counts the live legacy sessions and the initializations in
// flight (reservations), per client and in all, and closes idle sessions.
// Its mutex is a leaf: nothing else is locked, and the go-sdk is not
// called, while it is held.
type sessionLimits struct {
	max, perClient int
	// idle is how long a session may stay idle; <= 0 never closes one.
	idle time.Duration
	// evict closes an idle session; it must end in closed(sid), or the
	// session stays counted.
	evict func(sid string)

	mu       sync.Mutex
	sessions map[string]*liveSession // by session id
	clients  map[string]int          // client → live sessions + reservations
	total    int                     // live sessions + reservations
	stopped  bool                    // set by stop: no eviction starts
	evicting sync.WaitGroup          // evictions in progress (Add under mu)

	refusedTotal, refusedClient, idleClosed atomic.Int64
}

type liveSession struct {
	client string
	// active counts the session's requests in flight and open streams.
	active int
	// idleSince is when active last dropped to zero.
	idleSince time.Time
	timer     *time.Timer
}

func newSessionLimits(max, perClient int, idle time.Duration, evict func(string)) *sessionLimits {
	return &sessionLimits{max: max, perClient: min(perClient, max), idle: idle, evict: evict,
		sessions: map[string]*liveSession{}, clients: map[string]int{}}
}

// Session refusals.
const (
	refusedTotal  = "max_sessions"
	refusedClient = "max_sessions_per_client"
)

// reservation is one initialization in flight: it holds a slot until the
// handler issues a session id (admit) or the request ends without one
// (release).
type reservation struct {
	l      *sessionLimits
	client string
	done   bool // admitted or released
}

// reserve takes a slot for a new session of client. When none is free it
// returns which cap was reached (refusedTotal or refusedClient) and how
// long until a slot may free up.
func (l *sessionLimits) reserve(client string) (*reservation, string, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.total >= l.max:
		l.refusedTotal.Add(1)
		return nil, refusedTotal, l.retryAfterLocked("")
	case l.clients[client] >= l.perClient:
		l.refusedClient.Add(1)
		return nil, refusedClient, l.retryAfterLocked(client)
	}
	l.total++
	l.clients[client]++
	return &reservation{l: l, client: client}, "", 0
}

// retryAfterLocked estimates when a slot frees up: when the session (of
// client, or any when client is "") that has been idle longest reaches the
// idle timeout; the whole timeout when none is idle.
func (l *sessionLimits) retryAfterLocked(client string) time.Duration {
	if l.idle <= 0 {
		return time.Minute
	}
	wait := l.idle
	now := time.Now()
	for _, s := range l.sessions {
		if s.active == 0 && (client == "" || s.client == client) {
			wait = min(wait, s.idleSince.Add(l.idle).Sub(now))
		}
	}
	return max(wait, time.Second)
}

// admit turns the reservation into the live session sid, active with the
// request that created it.
func (r *reservation) admit(sid string) {
	l := r.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.done {
		return
	}
	r.done = true
	if _, dup := l.sessions[sid]; dup {
		l.dropLocked(r.client) // cannot happen with random ids; keep the counts right anyway
		return
	}
	l.sessions[sid] = &liveSession{client: r.client, active: 1}
}

// release gives the slot back if no session was admitted.
func (r *reservation) release() {
	l := r.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if !r.done {
		r.done = true
		l.dropLocked(r.client)
	}
}

func (l *sessionLimits) dropLocked(client string) {
	l.total--
	if l.clients[client]--; l.clients[client] <= 0 {
		delete(l.clients, client)
	}
}

// begin marks a request or stream of sid as started; false when sid is not
// a live session (the go-sdk will answer 404).
func (l *sessionLimits) begin(sid string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sessions[sid]
	if s == nil {
		return false
	}
	s.active++
	if s.timer != nil {
		s.timer.Stop()
	}
	return true
}

// end marks a request or stream of sid as finished; the idle clock starts
// when none is left.
func (l *sessionLimits) end(sid string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sessions[sid]
	if s == nil || s.active == 0 {
		return
	}
	if s.active--; s.active > 0 {
		return
	}
	s.idleSince = time.Now()
	if l.idle <= 0 {
		return
	}
	if s.timer == nil {
		s.timer = time.AfterFunc(l.idle, func() { l.expire(sid) })
	} else {
		s.timer.Reset(l.idle)
	}
}

// expire runs when sid's idle timer fires. A timer that fired while the
// session was being used again finds it active (or idle for less than the
// timeout) and does nothing.
func (l *sessionLimits) expire(sid string) {
	l.mu.Lock()
	s := l.sessions[sid]
	if l.stopped || s == nil || s.active > 0 || time.Since(s.idleSince) < l.idle {
		l.mu.Unlock()
		return
	}
	l.evicting.Add(1)
	l.mu.Unlock()
	defer l.evicting.Done()
	l.idleClosed.Add(1)
	l.evict(sid)
}

// closed forgets sid (the go-sdk closed it: DELETE, idle, shutdown).
func (l *sessionLimits) closed(sid string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sessions[sid]
	if s == nil {
		return
	}
	if s.timer != nil {
		s.timer.Stop()
	}
	delete(l.sessions, sid)
	l.dropLocked(s.client)
}

// stop lets no further eviction start and waits for those running.
func (l *sessionLimits) stop() {
	l.mu.Lock()
	l.stopped = true
	for _, s := range l.sessions {
		if s.timer != nil {
			s.timer.Stop()
		}
	}
	l.mu.Unlock()
	l.evicting.Wait()
}

// SessionStats describes the legacy MCP sessions (for metrics).
type SessionStats struct {
	// Live sessions now, initializations in flight included.
	Live int
	// Refused initializations: past MaxSessions (RefusedTotal) and past
	// MaxSessionsPerClient (RefusedClient).
	RefusedTotal, RefusedClient int64
	// IdleClosed counts sessions closed after SessionTimeout idle.
	IdleClosed int64
}

func (l *sessionLimits) stats() SessionStats {
	l.mu.Lock()
	live := l.total
	l.mu.Unlock()
	return SessionStats{Live: live, RefusedTotal: l.refusedTotal.Load(), RefusedClient: l.refusedClient.Load(),
		IdleClosed: l.idleClosed.Load()}
}

// sessionClient is who a new session counts against: the verified
// identity when there is one, else the client's address (every client
// behind one proxy or NAT shares it; for IPv6 its /64, as for the rate
// limit).
func sessionClient(r *http.Request, identity string) string {
	if identity != "" {
		return "id:" + identity
	}
	return "addr:" + keyrate.AddrKey(r.RemoteAddr)
}

// admitSession is the legacy route's session admission. A request of a
// session keeps that session from idling out while it runs; a POST
// without a session id, which makes the go-sdk open one, needs a free
// slot under the caps, and is refused (refuseSession) when there is none.
func (f *Front) admitSession(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sid := r.Header.Get(headerSessionID)
		switch {
		case sid != "":
			if f.limits.begin(sid) {
				defer f.limits.end(sid)
			}
		case r.Method == http.MethodPost:
			identity := ""
			if ti := authn.TokenInfoFrom(r.Context()); ti != nil {
				identity = ti.UserID
			}
			res, full, wait := f.limits.reserve(sessionClient(r, identity))
			if res == nil {
				f.refuseSession(w, r, full, wait, messageOf(r).body)
				return
			}
			// The session the handler issues, if any, takes the slot and
			// is active until this request ends.
			var issued string
			w = &hookWriter{ResponseWriter: w, onHeader: func(h http.Header, code int) {
				if id := issuedSession(h, code); id != "" {
					res.admit(id)
					issued = id
				}
			}}
			defer func() {
				if issued != "" {
					f.limits.end(issued)
				}
				res.release()
			}()
		}
		next.ServeHTTP(w, r)
	})
}

// refuseSession answers a request that would open a session past a cap:
// 503 when the bridge is full, 429 when this client is, both with
// Retry-After and a JSON-RPC error (writeOverLimit) whose data names the
// setting and the seconds to wait.
func (f *Front) refuseSession(w http.ResponseWriter, r *http.Request, full string, wait time.Duration, body []byte) {
	status, setting := http.StatusServiceUnavailable, "mcp.max_sessions"
	msg := fmt.Sprintf("the bridge holds its maximum of %d MCP sessions (mcp.max_sessions); retry later", f.limits.max)
	if full == refusedClient {
		status, setting = http.StatusTooManyRequests, "mcp.max_sessions_per_client"
		msg = fmt.Sprintf("this client holds its maximum of %d MCP sessions (mcp.max_sessions_per_client); "+
			"end the sessions it no longer uses (DELETE /mcp with their Mcp-Session-Id) or retry later", f.limits.perClient)
	}
	f.lines.refusals.Warn(f.log, "mcp session refused: "+full, zap.String("remote", r.RemoteAddr),
		zap.Int("max_sessions", f.limits.max), zap.Int("max_sessions_per_client", f.limits.perClient))
	writeOverLimit(w, status, leadingID(body), msg, setting, retrySeconds(wait))
}

// closeIdleSession is sessionLimits.evict: it closes the session, which
// reports back through trackingStore.SessionClosed.
func (f *Front) closeIdleSession(sid string) {
	for ss := range f.srv.Sessions() {
		if ss.ID() == sid {
			f.log.Debug("closing idle MCP session", zap.Duration("idle", f.opts.SessionTimeout))
			_ = ss.Close()
			return
		}
	}
	f.limits.closed(sid) // already gone
}
