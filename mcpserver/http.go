package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/devicebridge/devicebridge/authn"
	"github.com/devicebridge/devicebridge/internal/bearer"
	"github.com/devicebridge/devicebridge/internal/keyrate"
	"github.com/devicebridge/devicebridge/internal/logthrottle"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"
)

const (
	headerProtocolVersion = "Mcp-Protocol-Version"
	headerSessionID       = "Mcp-Session-Id"
	// modernVersion is the first protocol version of the stateless era.
	modernVersion = "2026-07-28"
	metaVersion   = "io.modelcontextprotocol/protocolVersion"
)

// frontHandler is /mcp behind the control listener's front door (package
// frontdoor, which checks Host, Origin and, with authn.Guard, credentials;
// Handler must be mounted behind it): rate and size limits, then the route
// to one of two go-sdk handlers over the same server. Requests of the
// modern era (MCP-Protocol-Version ≥ 2026-07-28, or any server/discover) go to a
// stateless handler; everything else (initialize, session requests, GET
// streams, DELETE) to a stateful handler with an event store for
// resumable streams. Answering discover statelessly means a client probing
// for the modern era never sees a list of legacy versions only.
type frontHandler struct {
	s         *Server
	stateful  http.Handler
	stateless http.Handler
	// rates limits requests (mcp.rate_limit): per session id when the
	// session is known, per client key (clientKey) otherwise. Nil when
	// rate limiting is off.
	rates   *requestRates
	tracker *sessionTracker
	limits  *sessionLimits // caps and idle timeout of legacy sessions (sessions.go)
	// refusals throttles the log line of refused sessions, which a
	// client can repeat at will.
	refusals logthrottle.Throttle
	// lines throttles the server's other lines a caller can repeat
	// (logs.go).
	lines callerLines
}

func newFrontHandler(s *Server) *frontHandler {
	h := &frontHandler{s: s, tracker: newSessionTracker()}
	if s.opts.RateLimit > 0 {
		h.rates = newRequestRates(s.opts.RateLimit, s.opts.RateBurst, s.opts.MaxSessions)
	}
	store := mcp.NewMemoryEventStore(nil)
	store.SetMaxBytes(s.opts.EventStoreBytes)
	sdkLog := sdkLogger(s.log.Named("http"))
	getServer := func(*http.Request) *mcp.Server { return s.mcp }
	h.limits = newSessionLimits(s.opts.MaxSessions, s.opts.MaxSessionsPerClient, s.opts.SessionTimeout, s.closeIdleSession)
	h.stateful = mcp.NewStreamableHTTPHandler(getServer, &mcp.StreamableHTTPOptions{
		EventStore: &trackingStore{EventStore: store, h: h},
		// No SessionTimeout: the go-sdk's counts POSTs only, and would
		// close a session whose host listens on a GET stream; h.limits
		// closes idle sessions instead.
		MaxRequestBodyBytes: s.opts.MaxBodyBytes,
		Logger:              sdkLog,

		// The front door checks Host on every route of the listener, with
		// the names the operator allowed (a proxy's public name included);
		// go-sdk's own check knows only loopback names.
		DisableLocalhostProtection: true,
	})
	h.stateless = mcp.NewStreamableHTTPHandler(getServer, &mcp.StreamableHTTPOptions{
		Stateless: true,
		// In the modern era closing the response stream is the
		// cancellation: stop waiting for the board when it happens.
		PropagateRequestCancellation: true,
		MaxRequestBodyBytes:          s.opts.MaxBodyBytes,
		Logger:                       sdkLog,

		DisableLocalhostProtection: true, // as above
	})
	if s.authenticated() {
		// Bind sessions to the identity that opened them, so one caller
		// cannot use another's session id.
		bearer := authn.RequireVerified()
		h.stateful = bearer(h.stateful)
		h.stateless = bearer(h.stateless)
	}
	return h
}

func (h *frontHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	log := h.s.log
	// Who the front door let in (nil when /mcp is open); the token only
	// keys rate limits and stateless callers, it is not checked again.
	ti := authn.TokenInfoFrom(r.Context())
	var token string
	if ti != nil {
		token, _ = bearer.FromHeader(r.Header.Get("Authorization"))
	}

	sid := r.Header.Get(headerSessionID)
	known := sid != "" && h.tracker.known(sid)
	if h.rates != nil {
		set, key := h.rates.sessions, sid
		if !known {
			set, key = h.rates.clients, clientKey(r, token)
		}
		if ok, wait := set.Allow(key, time.Now()); !ok {
			h.lines.rateLimited.Info(log, "mcp request refused: rate limit", zap.String("remote", r.RemoteAddr), zap.Bool("session", known))
			w.Header().Set("Retry-After", strconv.Itoa(int(wait.Seconds()+0.999)))
			http.Error(w, "Too Many Requests: slow down (see mcp.rate_limit)", http.StatusTooManyRequests)
			return
		}
	}

	var info bodyInfo
	var body []byte
	if r.Method == http.MethodPost && r.Body != nil {
		var err error
		body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, h.s.opts.MaxBodyBytes))
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				h.lines.tooBig.Info(log, "mcp request refused: body too large", zap.String("remote", r.RemoteAddr), zap.Int64("limit", tooBig.Limit))
				writeRejection(w, http.StatusRequestEntityTooLarge, leadingID(body), -32600,
					fmt.Sprintf("request body exceeds %d bytes (see mcp.max_body_bytes); send less data", tooBig.Limit))
				return
			}
			http.Error(w, "Bad Request: could not read the body", http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		info = classify(body)
	}

	// Bind the request to the server's lifetime, so that Close ends
	// hanging streams.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(h.s.ctx, cancel)
	defer stop()
	r = r.WithContext(ctx)

	// The caller identity of interactions (flow.go): never what the client
	// sent under that name.
	r.Header.Del(headerCaller)
	if isModern(r, info) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			host = r.RemoteAddr
		}
		// Interactions belong to the verified identity when there is one
		// (it survives token refresh), else to the token or address.
		if ti != nil && ti.UserID != "" {
			token = "identity\x00" + ti.UserID
		}
		r.Header.Set(headerCaller, statelessCaller(host, token))
		h.stateless.ServeHTTP(w, r)
		return
	}
	if known && r.Method == http.MethodPost {
		h.tracker.started(sid, info.calls)
		h.tracker.cancelled(sid, info.cancels)
	}
	lw := &legacyWriter{ResponseWriter: w, h: h, sid: sid}
	switch {
	case sid != "":
		// A request or stream of a session keeps it from idling out.
		if h.limits.begin(sid) {
			defer h.limits.end(sid)
		}
	case r.Method == http.MethodPost:
		// The go-sdk opens a session for any POST without a session id.
		identity := ""
		if ti != nil {
			identity = ti.UserID
		}
		res, full, wait := h.limits.reserve(sessionClient(r, identity))
		if res == nil {
			h.refuseSession(w, r, full, wait, body)
			return
		}
		lw.reservation = res
		defer func() {
			if lw.issued != "" {
				h.limits.end(lw.issued)
			}
			res.release()
		}()
	}
	h.stateful.ServeHTTP(lw, r)
}

// isModern reports whether a request belongs to the stateless era.
func isModern(r *http.Request, info bodyInfo) bool {
	if v := r.Header.Get(headerProtocolVersion); v != "" && v >= modernVersion {
		return true
	}
	return info.discover || (r.Header.Get(headerProtocolVersion) == "" && info.modernMeta)
}

// bodyInfo is what the front handler needs to know about a POST body.
type bodyInfo struct {
	calls      []string // ids of tools/call requests
	cancels    []string // request ids named by notifications/cancelled
	discover   bool
	modernMeta bool
}

type rpcMessage struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
}

// classify reads the JSON-RPC message or batch in a body. A body it cannot
// parse is left to the go-sdk to reject.
func classify(body []byte) bodyInfo {
	var info bodyInfo
	body = bytes.TrimSpace(body)
	var msgs []rpcMessage
	if len(body) > 0 && body[0] == '[' {
		if json.Unmarshal(body, &msgs) != nil {
			return info
		}
	} else {
		var m rpcMessage
		if json.Unmarshal(body, &m) != nil {
			return info
		}
		msgs = []rpcMessage{m}
	}
	for _, m := range msgs {
		switch m.Method {
		case "tools/call":
			if k := idKey(m.ID); k != "" {
				info.calls = append(info.calls, k)
			}
		case "notifications/cancelled":
			var p struct {
				RequestID json.RawMessage `json:"requestId"`
			}
			if json.Unmarshal(m.Params, &p) == nil {
				if k := idKey(p.RequestID); k != "" {
					info.cancels = append(info.cancels, k)
				}
			}
		case "server/discover":
			info.discover = true
		}
		if bytes.Contains(m.Params, []byte(metaVersion)) {
			var p struct {
				Meta map[string]any `json:"_meta"`
			}
			if json.Unmarshal(m.Params, &p) == nil {
				if v, _ := p.Meta[metaVersion].(string); v >= modernVersion {
					info.modernMeta = true
				}
			}
		}
	}
	return info
}

// idKey normalizes a JSON-RPC id so that 7, 7.0 and "7" compare as the
// JSON-RPC layer does (numbers by value, strings as strings).
func idKey(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return ""
		}
		return "s:" + s
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil {
		return ""
	}
	return "n:" + strconv.FormatFloat(f, 'f', -1, 64)
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
		return key + "|" + shortHash(token)
	}
	return key
}

// legacyWriter sits between the stateful go-sdk handler and the client. It
// learns the session ids the handler issues and withholds the result of a
// call the client cancelled (the go-sdk would still send one).
type legacyWriter struct {
	http.ResponseWriter
	h           *frontHandler
	sid         string
	wroteHeader bool
	// reservation holds a session slot for a request without a session
	// id; issued is the id the handler gave the new session, if any.
	reservation *reservation
	issued      string
}

func (w *legacyWriter) WriteHeader(code int) {
	if !w.wroteHeader {
		w.wroteHeader = true
		if issued := w.Header().Get(headerSessionID); issued != "" && w.sid == "" && code < 300 {
			w.h.tracker.add(issued)
			if w.reservation != nil {
				w.reservation.admit(issued)
				w.issued = issued
			}
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *legacyWriter) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.sid != "" && w.h.tracker.dropWritten(w.sid, p) {
		return len(p), nil
	}
	return w.ResponseWriter.Write(p)
}

// Flush keeps SSE events flowing through the wrapper.
func (w *legacyWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

// Unwrap lets http.ResponseController reach the real writer.
func (w *legacyWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// trackingStore is the stateful handler's event store. It stores the
// result of a cancelled call as an empty event (replay skips those, and
// event indices stay aligned), and forgets a session's bookkeeping when
// the session ends.
type trackingStore struct {
	mcp.EventStore
	h *frontHandler
}

func (s *trackingStore) Append(ctx context.Context, sessionID, streamID string, data []byte) error {
	if s.h.tracker.dropStored(sessionID, data) {
		data = nil
	}
	return s.EventStore.Append(ctx, sessionID, streamID, data)
}

func (s *trackingStore) SessionClosed(ctx context.Context, sessionID string) error {
	s.h.tracker.closed(sessionID)
	s.h.limits.closed(sessionID)
	if s.h.rates != nil {
		s.h.rates.sessions.Forget(sessionID)
	}
	return s.EventStore.SessionClosed(ctx, sessionID)
}

// writeRejection refuses a request with an HTTP status and, when the
// request's id is known, a JSON-RPC error for that id: clients then fail
// the one call instead of treating the session as broken.
func writeRejection(w http.ResponseWriter, status int, id json.RawMessage, code int, msg string) {
	if len(id) == 0 {
		http.Error(w, http.StatusText(status)+": "+msg, status)
		return
	}
	body, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}{JSONRPC: "2.0", ID: id, Error: struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{code, msg}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// leadingID finds the id of a (possibly truncated) JSON-RPC request by
// reading its top-level keys until "id" appears.
func leadingID(body []byte) json.RawMessage {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil
		}
		if key, _ := tok.(string); key == "id" {
			if k := idKey(v); k != "" {
				return v
			}
			return nil
		}
	}
	return nil
}
