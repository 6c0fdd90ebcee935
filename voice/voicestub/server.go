package voicestub

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/internal/bearer"
	"github.com/devicebridge/devicebridge/internal/randid"
)

// Paths, as xiaozhi-esp32-server serves them.
const (
	WebSocketPath = "/xiaozhi/v1/"
	OTAPath       = "/xiaozhi/ota/"
	ActivatePath  = "/xiaozhi/ota/activate"
)

// Errors.
var (
	// ErrClosed: the Server is closed.
	ErrClosed = errors.New("voicestub: server closed")
	// ErrNoDevice: no live connection of that device has completed its
	// hello with MCP.
	ErrNoDevice = errors.New("voicestub: device not connected with MCP")
	// ErrConnectionClosed: the board's connection ended before it answered.
	ErrConnectionClosed = errors.New("voicestub: connection closed")
	// ErrTooManyCalls: too many CallTool requests wait on one connection.
	ErrTooManyCalls = errors.New("voicestub: too many pending tool calls")
)

// Server is a stand-in voice server. It is safe for concurrent use.
type Server struct {
	cfg      Config
	log      *zap.Logger
	tokens   bearer.Tokens
	upgrader websocket.Upgrader
	mux      *http.ServeMux

	// mu guards everything below and every record (connRec fields). It
	// is a leaf: nothing else is locked while it is held.
	mu      sync.Mutex
	closed  bool
	faults  Faults
	nextID  uint64
	history []*connRec
	live    map[*conn]struct{}
	ota     []OTARequest
	devices map[string]*activation
	// changed is closed and replaced on every change, waking Wait.
	changed chan struct{}
	httpSrv *http.Server
	ln      net.Listener

	// wg counts the serve goroutine and every handler running inside the
	// Server (each connection's goroutines finish before its handler).
	wg sync.WaitGroup
}

// New validates cfg and builds a Server. It starts nothing: call Start, or
// mount Handler on a server of your own.
func New(cfg Config) (*Server, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:     cfg,
		log:     cfg.Logger.Named("voicestub"),
		tokens:  bearer.New(cfg.Tokens),
		faults:  cfg.Faults,
		live:    map[*conn]struct{}{},
		devices: map[string]*activation{},
		changed: make(chan struct{}),
		upgrader: websocket.Upgrader{
			HandshakeTimeout: 10 * time.Second,
			// Boards send no Origin; gorilla's default check refuses
			// only cross-origin browsers.
		},
	}
	s.mux = http.NewServeMux()
	s.mux.HandleFunc(WebSocketPath, s.serveWS)
	s.mux.HandleFunc(strings.TrimSuffix(WebSocketPath, "/"), s.serveWS)
	s.mux.HandleFunc(OTAPath+"{$}", s.serveOTA)
	s.mux.HandleFunc(strings.TrimSuffix(OTAPath, "/"), s.serveOTA)
	s.mux.HandleFunc(ActivatePath, s.serveActivate)
	return s, nil
}

// Handler serves the WebSocket, OTA and activate paths. Close still ends
// the connections it accepted and waits for them.
func (s *Server) Handler() http.Handler { return s.mux }

// Start listens on addr (host:port; port 0 picks one) and serves in a
// goroutine the Server owns until Close.
func (s *Server) Start(addr string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.ln != nil {
		return errors.New("voicestub: already started")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("voicestub: listen: %w", err)
	}
	s.ln = ln
	s.httpSrv = &http.Server{
		Handler:           s.mux,
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          zap.NewStdLog(s.log.Named("http")),
		ConnState:         s.connState,
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Warn("serve ended", zap.Error(err))
		}
	}()
	s.log.Info("listening", zap.String("addr", ln.Addr().String()))
	return nil
}

// connState counts net/http's connection goroutines in wg, so Close also
// waits for those Close itself does not (one lingering to avoid a reset
// after a refused body, say). StateNew runs on the serve goroutine, which
// wg already counts, so the Add never races Close's Wait.
func (s *Server) connState(nc net.Conn, st http.ConnState) {
	switch st {
	case http.StateNew:
		s.wg.Add(1)
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		if closed { // accepted as Close ran: http.Server.Close may have missed it
			_ = nc.Close()
		}
	case http.StateHijacked, http.StateClosed:
		s.wg.Done()
	}
}

// Addr is the listening address, or nil before Start.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// URL is the WebSocket URL boards connect to, e.g.
// ws://127.0.0.1:8000/xiaozhi/v1/ ("" before Start).
func (s *Server) URL() string { return s.url("ws", WebSocketPath) }

// OTAURL is the OTA URL, e.g. http://127.0.0.1:8000/xiaozhi/ota/.
func (s *Server) OTAURL() string { return s.url("http", OTAPath) }

func (s *Server) url(scheme, path string) string {
	a := s.Addr()
	if a == nil {
		return ""
	}
	return scheme + "://" + a.String() + path
}

// SetFaults changes the faults that connections accepted from now on
// simulate.
func (s *Server) SetFaults(f Faults) {
	s.mu.Lock()
	s.faults = f
	s.mu.Unlock()
}

// Disconnect closes every live connection of deviceID (TCP close, no
// close frame) and returns how many it closed.
func (s *Server) Disconnect(deviceID string) int {
	s.mu.Lock()
	var cs []*conn
	for c := range s.live {
		if strings.EqualFold(c.rec.DeviceID, deviceID) {
			cs = append(cs, c)
		}
	}
	s.mu.Unlock()
	for _, c := range cs {
		c.shutdown("disconnected by test")
	}
	return len(cs)
}

// Close stops listening, closes every connection and waits for all the
// Server's goroutines. It may be called more than once.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	srv := s.httpSrv
	cs := make([]*conn, 0, len(s.live))
	for c := range s.live {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	var err error
	if srv != nil {
		// Close, not Shutdown: upgraded connections are ours to close,
		// and OTA handlers end when their sockets do.
		err = srv.Close()
	}
	for _, c := range cs {
		c.shutdown("server closed")
	}
	s.wg.Wait()
	return err
}

// enter admits a handler, counting it in wg; false once closed.
func (s *Server) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

// addRecordLocked appends r to the history, numbering it and dropping the
// oldest finished record past MaxHistory.
func (s *Server) addRecordLocked(r *connRec) {
	s.nextID++
	r.ID = s.nextID
	if len(s.history) >= s.cfg.MaxHistory {
		drop := 0 // all live (cannot happen with MaxHistory >= MaxConns): drop the oldest
		for i, h := range s.history {
			if h.Closed {
				drop = i
				break
			}
		}
		s.history = append(s.history[:drop], s.history[drop+1:]...)
	}
	s.history = append(s.history, r)
	s.changedLocked()
}

// serveWS admits, upgrades and runs one board connection.
func (s *Server) serveWS(w http.ResponseWriter, r *http.Request) {
	if !s.enter() {
		http.Error(w, "server closing", http.StatusServiceUnavailable)
		return
	}
	defer s.wg.Done()

	h := r.Header.Clone()
	h.Del("Authorization")
	rec := &connRec{Connection: Connection{
		RemoteAddr:            r.RemoteAddr,
		Header:                h,
		DeviceID:              r.Header.Get("Device-Id"),
		ClientID:              r.Header.Get("Client-Id"),
		ProtocolVersionHeader: r.Header.Get("Protocol-Version"),
		HasAuthorization:      r.Header.Get("Authorization") != "",
		SessionID:             sessionID(),
	}}
	log := s.log.With(zap.String("device_id", rec.DeviceID), zap.String("remote", r.RemoteAddr))

	s.mu.Lock()
	faults := s.faults
	status, reason := s.admitLocked(r, rec, faults)
	var c *conn
	if status == http.StatusSwitchingProtocols {
		c = newConn(s, rec, faults, log)
		s.live[c] = struct{}{}
	} else {
		rec.Status, rec.Closed, rec.CloseReason = status, true, reason
	}
	s.addRecordLocked(rec)
	s.mu.Unlock()

	if c == nil {
		log.Info("upgrade refused", zap.Int("status", status), zap.String("reason", reason))
		http.Error(w, reason, status)
		return
	}
	ws, err := s.upgrader.Upgrade(w, r, nil)
	if err != nil {
		// gorilla has already answered with an error status.
		s.mu.Lock()
		delete(s.live, c)
		rec.Status, rec.Closed, rec.CloseReason = http.StatusBadRequest, true, "upgrade failed: "+err.Error()
		s.changedLocked()
		s.mu.Unlock()
		return
	}
	s.update(rec, func(r *connRec) { r.Status = http.StatusSwitchingProtocols })
	log.Info("board connected", zap.Int("protocol_version", rec.ProtocolVersion), zap.String("session_id", rec.SessionID))
	c.run(ws)
}

// admitLocked decides an upgrade: 101 or a refusal status and reason.
// Called with s.mu held; it sets rec.ProtocolVersion and rec.AuthBy.
func (s *Server) admitLocked(r *http.Request, rec *connRec, f Faults) (int, string) {
	if f.RefuseUpgrade {
		return http.StatusServiceUnavailable, "refusing upgrades (fault)"
	}
	if s.closed {
		return http.StatusServiceUnavailable, "server closing"
	}
	switch rec.ProtocolVersionHeader {
	case "", "1":
		rec.ProtocolVersion = 1
	case "2":
		rec.ProtocolVersion = 2
	case "3":
		rec.ProtocolVersion = 3
	default:
		return http.StatusBadRequest, "Protocol-Version must be 1, 2 or 3"
	}
	if !s.tokens.Empty() || s.cfg.Secret != "" {
		by := s.authenticate(r.Header.Get("Authorization"), rec.ClientID, rec.DeviceID)
		if by == "" {
			return http.StatusUnauthorized, "invalid or missing token"
		}
		rec.AuthBy = by
	}
	if len(s.live) >= s.cfg.MaxConns {
		return http.StatusServiceUnavailable, "too many connections"
	}
	return http.StatusSwitchingProtocols, ""
}

// authenticate returns "static" or "hmac" for an accepted Authorization
// header, "" otherwise.
func (s *Server) authenticate(header, clientID, deviceID string) string {
	tok, ok := strings.CutPrefix(header, "Bearer ")
	if !ok || tok == "" {
		return ""
	}
	if s.tokens.Index(tok) >= 0 {
		return "static"
	}
	if s.cfg.Secret != "" && checkToken(s.cfg.Secret, tok, clientID, deviceID, s.cfg.Now()) {
		return "hmac"
	}
	return ""
}

// sessionID is a random UUIDv4-shaped id: only [0-9a-f-], which every
// board family accepts.
func sessionID() string {
	h := randid.Hex16()
	return h[0:8] + "-" + h[8:12] + "-4" + h[13:16] + "-a" + h[17:20] + "-" + h[20:32]
}
