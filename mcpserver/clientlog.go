//lint:file-ignore SA1019 logging is deprecated in 2026-07-28 (SEP-2577) but still defined there, per request, and served in both eras

package mcpserver

// Log messages to MCP clients (notifications/message): what happens to a
// caller's own calls (notes.go) and, on legacy sessions, boards coming and
// going (boardnews.go).
//
// Who gets them, per era:
//
//   - Legacy sessions (2025-11-25 and before) choose a level with
//     logging/setLevel; until they do, they get none. The level is kept
//     here per session, with the caller's identity (the policy decides
//     which boards' news it may see) and its rate bucket.
//   - Modern requests (2026-07-28, where logging is deprecated and
//     logging/setLevel removed) carry the level in their own
//     _meta["io.modelcontextprotocol/logLevel"]; a request without one
//     gets none. They get only the messages about that request (there is
//     no session to send board news to; a listen stream never carries
//     log messages).
//
// What they say: steps, durations, counts, board names and tool names.
// Never arguments, results, board error texts or credentials, at any
// level. Every session's messages are bounded by a token bucket
// (clientLogRate, clientLogBurst); what it drops is counted and said in
// the next message that passes.

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"
	"golang.org/x/time/rate"

	"github.com/devicebridge/devicebridge/policy"
)

const (
	// clientLogRate and clientLogBurst bound the log messages one session
	// (one request in the modern era) receives.
	clientLogRate  = 50 // per second
	clientLogBurst = 100
	// clientLoggerName is the "logger" of every message.
	clientLoggerName = "devicebridge"
	// metaLogLevel is where a modern request carries its log level.
	metaLogLevel = "io.modelcontextprotocol/logLevel"
)

// logSeverity orders the MCP log levels (RFC 5424 severities, least
// severe first). A level not in it is not a level.
var logSeverity = map[mcp.LoggingLevel]int{
	"debug": 0, "info": 1, "notice": 2, "warning": 3, "error": 4, "critical": 5, "alert": 6, "emergency": 7,
}

// passes reports whether a message at level reaches a client that asked
// for min ("" asks for nothing).
func passes(level, min mcp.LoggingLevel) bool {
	m, ok := logSeverity[min]
	return ok && logSeverity[level] >= m
}

// clientLog sends log messages to one client at its level, within its
// rate bucket.
type clientLog struct {
	// out sends a message: the session's Log, which filters by the same
	// level once more (the session's setLevel, or the request's _meta in
	// the modern era).
	out     func(context.Context, *mcp.LoggingMessageParams) error
	level   mcp.LoggingLevel
	bucket  *rate.Limiter
	dropped *atomic.Int64
}

// wants reports whether a message at level would be sent.
func (c *clientLog) wants(level mcp.LoggingLevel) bool { return c != nil && passes(level, c.level) }

// send sends one message if the client wants its level and the bucket
// allows it; ctx is the request's (its stream) or, for news, one bounding
// the write. Data is an object: "message" and the structured fields.
func (c *clientLog) send(ctx context.Context, log *zap.Logger, level mcp.LoggingLevel, data map[string]any) {
	if !c.wants(level) {
		return
	}
	if !c.bucket.Allow() {
		c.dropped.Add(1)
		return
	}
	if n := c.dropped.Swap(0); n > 0 {
		c.write(ctx, log, "warning", map[string]any{"event": "dropped", "dropped": n,
			"message": "some log messages to this client were left out: more than the bridge sends a client a second"})
	}
	c.write(ctx, log, level, data)
}

func (c *clientLog) write(ctx context.Context, log *zap.Logger, level mcp.LoggingLevel, data map[string]any) {
	err := c.out(ctx, &mcp.LoggingMessageParams{Level: level, Logger: clientLoggerName, Data: data})
	if err != nil {
		log.Debug("log message to the client not delivered", zap.Error(err))
	}
}

// logSession is what the bridge keeps of a legacy session that set a log
// level.
type logSession struct {
	level   mcp.LoggingLevel // guarded by logSessions.mu
	id      policy.Identity
	bucket  *rate.Limiter
	dropped atomic.Int64
}

// logSessions are the legacy sessions that set a log level. Entries of
// ended sessions are pruned when the map has doubled since the last
// pruning, and by every round of board news (boardnews.go): the map
// stays within about twice the open sessions (themselves bounded by
// mcp.max_sessions). mu is a leaf.
type logSessions struct {
	mu      sync.Mutex
	m       map[*mcp.ServerSession]*logSession
	pruneAt int
}

const minPruneAt = 64

// set records a session's level, and its identity at the time (sessions
// are bound to the identity that opened them).
func (l *logSessions) set(srv *mcp.Server, ss *mcp.ServerSession, level mcp.LoggingLevel, id policy.Identity) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[*mcp.ServerSession]*logSession{}
	}
	if e, ok := l.m[ss]; ok {
		e.level = level
		return
	}
	if len(l.m) >= max(l.pruneAt, minPruneAt) {
		l.pruneLocked(srv)
	}
	l.m[ss] = &logSession{level: level, id: id, bucket: rate.NewLimiter(clientLogRate, clientLogBurst)}
}

// pruneLocked forgets the sessions the server no longer has.
func (l *logSessions) pruneLocked(srv *mcp.Server) {
	open := make(map[*mcp.ServerSession]bool, len(l.m))
	for ss := range srv.Sessions() {
		open[ss] = true
	}
	for ss := range l.m {
		if !open[ss] {
			delete(l.m, ss)
		}
	}
	l.pruneAt = 2 * len(l.m)
}

// of is the clientLog of a legacy session (nil if it set no level).
func (l *logSessions) of(ss *mcp.ServerSession) *clientLog {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.m[ss]
	if !ok {
		return nil
	}
	return &clientLog{out: ss.Log, level: e.level, bucket: e.bucket, dropped: &e.dropped}
}

// listener is a legacy session that set a level, as board news sees it.
type listener struct {
	log *clientLog
	id  policy.Identity
}

// listeners prunes the map and returns the sessions that want news at
// level.
func (l *logSessions) listeners(srv *mcp.Server, level mcp.LoggingLevel) []listener {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.m) == 0 {
		return nil
	}
	l.pruneLocked(srv)
	var out []listener
	for ss, e := range l.m {
		if passes(level, e.level) {
			out = append(out, listener{log: &clientLog{out: ss.Log, level: e.level, bucket: e.bucket, dropped: &e.dropped}, id: e.id})
		}
	}
	return out
}

// any reports whether some session set a level.
func (l *logSessions) any() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m) > 0
}

// callerLog is the clientLog of the caller of req: its session's (legacy)
// or its own _meta's (modern); nil when it asked for no log messages.
func (s *Server) callerLog(ss *mcp.ServerSession, meta mcp.Meta) *clientLog {
	if ss == nil {
		return nil
	}
	if !modernSession(ss) {
		return s.logSessions.of(ss)
	}
	level, _ := meta[metaLogLevel].(string)
	if _, ok := logSeverity[mcp.LoggingLevel(level)]; !ok {
		return nil
	}
	return &clientLog{out: ss.Log, level: mcp.LoggingLevel(level), bucket: rate.NewLimiter(clientLogRate, clientLogBurst),
		dropped: new(atomic.Int64)}
}

// modernSession reports whether ss serves one stateless request (the
// era test of go-sdk: a session without initialize parameters is the
// newest protocol; see askable).
func modernSession(ss *mcp.ServerSession) bool {
	ip := ss.InitializeParams()
	return ip == nil || ip.ProtocolVersion >= modernVersion
}

// setLevelMiddleware checks the level of logging/setLevel (an unknown
// level is invalid params, not silently "debug") and records it, with
// the caller's identity, for the session's log messages.
func (s *Server) setLevelMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method != "logging/setLevel" {
			return next(ctx, method, req)
		}
		p, ok := req.GetParams().(*mcp.SetLoggingLevelParams)
		if !ok || p == nil {
			return next(ctx, method, req)
		}
		if _, known := logSeverity[p.Level]; !known {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams,
				Message: "unknown log level; use one of debug, info, notice, warning, error, critical, alert, emergency"}
		}
		res, err := next(ctx, method, req)
		if ss, ok := req.GetSession().(*mcp.ServerSession); ok && err == nil {
			s.logSessions.set(s.mcp, ss, p.Level, policy.IdentityFrom(ctx))
		}
		return res, err
	}
}
