package ws

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/envelope"
	"github.com/devicebridge/devicebridge/internal/bearer"
	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/internal/logthrottle"
	"github.com/devicebridge/devicebridge/internal/randid"
	"github.com/devicebridge/devicebridge/voice"
)

// TransportName is the device.Identity transport of WebSocket boards.
const TransportName = "websocket"

// Stats counts what the endpoint saw since it started.
type Stats struct {
	Accepted, Unauthorized, BadRequests, HelloFailures int64
	// Active counts the sockets that hold a place under MaxConnections,
	// and Pending those of them still waiting for their hello (under
	// MaxPendingHellos): exactly what admission compares with the caps, so
	// a new board is admitted whenever these are below them.
	Active, Pending int64
	// Refused counts sockets turned away by MaxConnections or
	// MaxPendingHellos.
	Refused int64
	// TextIn, BinaryIn and TextOut count messages of every connection,
	// open or closed: Stats adds the live connections' own counters to the
	// totals folded in as connections close. Binary frames are board
	// audio, accepted and not played.
	TextIn, BinaryIn, TextOut int64
}

// Server is the device WebSocket endpoint; it is an http.Handler.
type Server struct {
	cfg      Config
	hub      *device.Hub
	log      *zap.Logger
	upgrader websocket.Upgrader
	tokens   bearer.Tokens

	// badIDs throttles the warning for a refused Device-Id: any client
	// can send one as often as it likes.
	badIDs logthrottle.Throttle
	// The other refusals an outsider can repeat at will, throttled the
	// same way: bad tokens, sockets past the caps, failed upgrades and
	// failed hellos.
	badTokens, refusedWarn, upgradeWarn, helloWarn logthrottle.Throttle

	mu     sync.Mutex
	conns  map[*conn]struct{}
	closed bool
	// open counts admitted sockets from admission until their goroutines
	// end (or the upgrade fails); pending those whose hello is not done.
	// A tracked conn's share of pending is its helloPending flag, so that
	// whichever of helloDone and untrack comes first gives it back.
	open, pending int
	wg            sync.WaitGroup // every conn's reader and close path (which waits for its writer)

	accepted, unauthorized, badRequests, helloFailures, refused atomic.Int64
	// textIn, binaryIn and textOut hold the message counts of closed
	// connections, folded in by untrack under mu; each live connection
	// counts its own, so the hot path shares no cache line.
	textIn, binaryIn, textOut atomic.Int64
}

// readBufferSize is each connection's read buffer.
const readBufferSize = 1024

// writeBufferPool lends write buffers to every connection.
var writeBufferPool = &sync.Pool{}

// NewServer creates the endpoint. cfg is completed with defaults; call
// cfg.Validate first to report mistakes to the user.
func NewServer(cfg Config, hub *device.Hub, logger *zap.Logger) *Server {
	cfg = cfg.WithDefaults()
	if logger == nil {
		logger = zap.NewNop()
	}
	s := &Server{cfg: cfg, hub: hub, log: logger, conns: map[*conn]struct{}{}, tokens: bearer.New(cfg.Tokens)}
	s.upgrader = websocket.Upgrader{
		HandshakeTimeout: 10 * time.Second,
		// Boards send a few small JSON messages a minute: a small read
		// buffer (larger frames still arrive whole, read in pieces), and
		// write buffers taken from a pool only while a message is written,
		// rather than 4 KiB each held for the life of every connection.
		ReadBufferSize:  readBufferSize,
		WriteBufferPool: writeBufferPool,
		CheckOrigin: func(r *http.Request) bool {
			o := r.Header.Get("Origin")
			return o == "" || slices.Contains(cfg.AllowedOrigins, o)
		},
	}
	return s
}

// Path is where the endpoint expects boards.
func (s *Server) Path() string { return s.cfg.Path }

// Stats returns the endpoint counters. It walks the live connections for
// their message counts (one pass under the lock, three atomic loads each),
// so the message counters never drop as a connection closes.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	active, pending := int64(s.open), int64(s.pending)
	// Under mu: untrack folds a closing connection's counts and forgets it
	// in one step, so each message is counted exactly once here.
	textIn, binaryIn, textOut := s.textIn.Load(), s.binaryIn.Load(), s.textOut.Load()
	for c := range s.conns {
		textIn += c.textIn.Load()
		binaryIn += c.binaryIn.Load()
		textOut += c.textOut.Load()
	}
	s.mu.Unlock()
	return Stats{Accepted: s.accepted.Load(), Unauthorized: s.unauthorized.Load(),
		BadRequests: s.badRequests.Load(), HelloFailures: s.helloFailures.Load(), Active: active,
		Pending: pending, Refused: s.refused.Load(),
		TextIn: textIn, BinaryIn: binaryIn, TextOut: textOut}
}

// ServeHTTP checks the handshake, upgrades, and runs the hello exchange.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The one place a WebSocket board's id enters: every spelling of a
	// MAC becomes its canonical form here, so nothing above sees another.
	raw := r.Header.Get("Device-Id")
	deviceID, idErr := device.BoardID(raw, s.cfg.AllowAnyDeviceID)
	logID := deviceID
	if idErr != nil {
		logID = raw
	}
	// A refused id is the client's header, as long as net/http allows.
	log := s.log.WithLazy(clip.Field("device_id", logID), zap.String("remote", r.RemoteAddr), zap.String("transport", TransportName))
	if !s.authorized(logID, r.Header.Get("Client-Id"), r.Header.Get("Authorization")) {
		s.unauthorized.Add(1)
		s.badTokens.Warn(log, "rejected device: missing or invalid token")
		http.Error(w, "missing or invalid token", http.StatusUnauthorized)
		return
	}
	if idErr != nil {
		s.badRequests.Add(1)
		why := "missing Device-Id header"
		if raw != "" {
			why = "invalid Device-Id header: " + idErr.Error()
			if !s.cfg.AllowAnyDeviceID && errors.Is(idErr, device.ErrNotMAC) {
				why += "; boards send their MAC (websocket.allow_any_device_id admits other ids)"
			}
		}
		s.badIDs.Warn(s.log, "rejected device: missing or invalid Device-Id header", zap.String("reason", why),
			zap.String("remote", r.RemoteAddr), zap.String("transport", TransportName))
		http.Error(w, why, http.StatusBadRequest)
		return
	}
	if why := s.admit(); why != "" {
		if why != errShuttingDown {
			n := s.refused.Add(1)
			s.refusedWarn.Warn(log, "refused device connection: "+why, zap.Int64("refused_so_far", n),
				zap.Int("max_connections", s.cfg.MaxConnections), zap.Int("max_pending_hellos", s.cfg.MaxPendingHellos))
		}
		w.Header().Set("Retry-After", "5")
		http.Error(w, why, http.StatusServiceUnavailable)
		return
	}
	wsConn, err := s.upgrader.Upgrade(w, r, nil)
	if err != nil {
		s.release(true)
		s.badRequests.Add(1)
		s.upgradeWarn.Warn(log, "websocket upgrade failed", zap.Error(err))
		return // the upgrader already answered
	}
	c := newConn(wsConn, s.cfg, log)
	if rl := s.cfg.Relay; rl.Enabled(deviceID) {
		pv, _ := strconv.Atoi(r.Header.Get("Protocol-Version"))
		c.voice = newVoiceLink(rl, c, voice.Board{DeviceID: deviceID, ClientID: r.Header.Get("Client-Id"),
			ProtocolVersion: pv, Transport: TransportName})
	}
	if !s.track(c) {
		s.release(true)
		c.Close(device.ErrShutdown)
		_ = wsConn.Close()
		return
	}
	// The writing side: pings from a timer, a writer goroutine only while
	// messages wait (conn.writer), and on close the close frame and the
	// socket's close, which ends readLoop.
	if v := c.voice; v != nil {
		c.AfterClose(func() {
			defer s.wg.Done()
			v.close()
		})
	}
	c.startPings(s.wg.Done)
	go func() {
		defer s.wg.Done()
		c.readLoop()
		<-c.sockClosed
		s.untrack(c) // both sides are done: the counters are final
	}()

	id := device.Identity{
		DeviceID:   deviceID,
		ClientID:   r.Header.Get("Client-Id"),
		Transport:  TransportName,
		RemoteAddr: r.RemoteAddr,
	}
	id.ProtocolVersion, _ = strconv.Atoi(r.Header.Get("Protocol-Version"))
	hello, err := s.awaitHello(c)
	if err != nil {
		s.helloFailures.Add(1)
		s.helloWarn.Warn(log, "closing device connection: hello exchange failed", zap.Error(err))
		c.Close(err)
		return
	}
	id.HasMCP = hello.Features.MCP
	s.accepted.Add(1)
	sess, err := s.hub.Attach(c, id)
	if err != nil {
		// Attach closed the link with the reason; the hub logged flapping.
		log.Debug("device not attached", zap.Error(err))
		return
	}
	if c.voice != nil {
		c.voice.attach(sess)
	}
}

// errNoHello and friends are close reasons of the hello exchange.
var (
	errNoHello       = errors.New("no hello from device in time")
	errNotHelloFirst = errors.New("first message from device was not a hello")
)

// awaitHello waits for the device hello and answers it. The handler
// goroutine runs it, so the reader goroutine never blocks on it.
func (s *Server) awaitHello(c *conn) (envelope.DeviceHello, error) {
	ctx, cancelWait := context.WithTimeout(context.Background(), s.cfg.HelloTimeout)
	defer cancelWait()
	msg, err := c.Receive(ctx)
	// The wait is over, whatever came: give the pending slot back now,
	// before the server hello, so a board that has read the reply never
	// finds its slot still held.
	s.helloDone(c)
	switch {
	case ctx.Err() != nil:
		return envelope.DeviceHello{}, device.Closing(device.CauseProtocol, fmt.Errorf("%w (%v)", errNoHello, s.cfg.HelloTimeout))
	case err != nil:
		return envelope.DeviceHello{}, fmt.Errorf("connection closed before hello: %v", c.Err())
	}
	env, err := envelope.Decode(msg, int(s.cfg.ReadLimit))
	if err != nil {
		return envelope.DeviceHello{}, device.Closing(device.CauseProtocol, fmt.Errorf("%w: %v", errNotHelloFirst, err))
	}
	if env.Type != envelope.TypeHello {
		return envelope.DeviceHello{}, device.Closing(device.CauseProtocol, fmt.Errorf("%w (type %q)", errNotHelloFirst, env.Type))
	}
	hello, err := envelope.ParseDeviceHello(env)
	if err != nil {
		return envelope.DeviceHello{}, device.Closing(device.CauseProtocol, err)
	}
	c.sessionID = randid.Hex16()
	audio := envelope.DownlinkAudio
	reply := envelope.ServerHello{Transport: TransportName, SessionID: c.sessionID, AudioParams: &audio}.Marshal()
	voiceFailed := false
	if v := c.voice; v != nil {
		// The board waits 10 s for this hello; the relay gives the
		// upstream less (voice.hello_timeout) and answers the board
		// itself when the upstream cannot.
		if sh, err := v.open(v.ctx, msg); err == nil {
			reply = v.serverHello(sh)
		} else {
			voiceFailed = true
		}
	}
	sendCtx, cancel := context.WithTimeout(context.Background(), s.cfg.WriteTimeout)
	defer cancel()
	if err := c.Send(sendCtx, reply); err != nil {
		return envelope.DeviceHello{}, fmt.Errorf("sending server hello: %w", err)
	}
	if voiceFailed {
		c.voice.alert()
	}
	return hello, nil
}

// authorized checks the Authorization header against the configured tokens
// and the token issued to deviceID. Boards prefix "Bearer " unless the
// token already contains a space, in which case it is sent as is. With no
// static tokens and no RequireToken, every board is admitted, except one
// presenting a token issued to another board.
func (s *Server) authorized(deviceID, clientID, header string) bool {
	bearerTok, isBearer := bearer.FromHeader(header)
	issued, foreign := false, false
	if v := s.cfg.Issued; v != nil && isBearer && deviceID != "" {
		issued, foreign = v.CheckWebSocketToken(deviceID, clientID, bearerTok)
	}
	if foreign {
		return false
	}
	if s.tokens.Empty() && !s.cfg.RequireToken {
		return true
	}
	// Check both forms, without short-circuiting, so the time taken does
	// not tell them apart.
	asBearer := s.tokens.Index(bearerTok)
	asIs := s.tokens.Index(header)
	return (isBearer && asBearer >= 0) || asIs >= 0 || issued
}

// Reasons admit gives for refusing a socket.
const (
	errShuttingDown   = "bridge shutting down"
	errTooMany        = "too many device connections; retry later"
	errTooManyPending = "too many device connections waiting for their hello; retry later"
)

// admit reserves room for one more socket before the upgrade, or returns
// why there is none. A reserved socket counts as open and pending.
func (s *Server) admit() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return errShuttingDown
	case s.cfg.MaxConnections > 0 && s.open >= s.cfg.MaxConnections:
		return errTooMany
	case s.cfg.MaxPendingHellos > 0 && s.pending >= s.cfg.MaxPendingHellos:
		return errTooManyPending
	}
	s.open++
	s.pending++
	return ""
}

// helloDone ends a tracked socket's hello wait, whatever its outcome. It
// is idempotent: untrack ends the wait too if the socket closes first.
func (s *Server) helloDone(c *conn) {
	s.mu.Lock()
	s.endHelloLocked(c)
	s.mu.Unlock()
}

func (s *Server) endHelloLocked(c *conn) {
	if c.helloPending {
		c.helloPending = false
		s.pending--
	}
}

// release gives back an admitted socket's room; pending too if its hello
// wait never started.
func (s *Server) release(pending bool) {
	s.mu.Lock()
	s.open--
	if pending {
		s.pending--
	}
	s.mu.Unlock()
}

func (s *Server) track(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	// The pending-hello slot admit reserved now belongs to the conn.
	c.helloPending = true
	s.wg.Add(2) // under the lock, so Close never waits on a zero counter being raised
	if c.voice != nil {
		s.wg.Add(1) // the conversation's end (ServeHTTP arranges it)
	}
	return true
}

func (s *Server) untrack(c *conn) {
	// Fold the counters in and forget the connection in one step under mu,
	// so Stats counts its messages once: in the totals or as a live one.
	s.mu.Lock()
	s.textIn.Add(c.textIn.Load())
	s.binaryIn.Add(c.binaryIn.Load())
	s.textOut.Add(c.textOut.Load())
	delete(s.conns, c)
	// The socket's room and, if its hello never came, its pending slot go
	// back in the same step, so Stats never shows one freed without the
	// other.
	s.endHelloLocked(c)
	s.open--
	s.mu.Unlock()
	if ce := c.log.Check(zap.DebugLevel, "websocket closed"); ce != nil {
		ce.Write(zap.NamedError("reason", c.Err()), zap.Int64("text_in", c.textIn.Load()),
			zap.Int64("binary_in", c.binaryIn.Load()), zap.Int64("text_out", c.textOut.Load()))
	}
}

// Close refuses new boards, closes every connection with reason (nil means
// device.ErrShutdown), and waits for their goroutines. http.Server.Shutdown
// does not reach hijacked connections, so this must be called too.
func (s *Server) Close(reason error) {
	if reason == nil {
		reason = device.ErrShutdown
	}
	s.mu.Lock()
	s.closed = true
	list := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		list = append(list, c)
	}
	s.mu.Unlock()
	for _, c := range list {
		c.Close(reason)
	}
	s.wg.Wait()
}
