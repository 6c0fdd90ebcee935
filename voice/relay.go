package voice

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/internal/logthrottle"
	"github.com/devicebridge/devicebridge/internal/randid"
)

// Errors Open returns; the transport tells the board the conversation
// failed and serves its tools anyway.
var (
	ErrOff       = errors.New("voice: no upstream for this board")
	ErrTooMany   = errors.New("voice: too many conversations open (voice.max_conversations)")
	ErrRetryWait = errors.New("voice: upstream failed recently; waiting before the next try (voice.retry_after)")
	ErrClosed    = errors.New("voice: relay closed")
	ErrNoHello   = errors.New("voice: upstream sent no hello in time")
	ErrBadHello  = errors.New("voice: upstream hello unusable")
)

// Board is what the upstream learns about a board: the identity headers a
// board sends itself.
type Board struct {
	DeviceID string // canonical MAC
	ClientID string
	// ProtocolVersion is the binary framing version toward the upstream
	// (1, 2 or 3); frames pass unchanged, so it is the board's own for
	// WebSocket boards.
	ProtocolVersion int
	// Transport is the board's transport, for logs and events.
	Transport string
}

// BoardSide is how a conversation reaches its board. Implementations must
// be safe for concurrent use and never block past their own bounds.
type BoardSide interface {
	// SendText queues one JSON message for the board, waiting at most
	// until ctx ends.
	SendText(ctx context.Context, msg []byte) error
	// SendAudio queues one binary audio frame, as the upstream framed it
	// for Board.ProtocolVersion; false when it was dropped (queue full).
	SendAudio(frame []byte) bool
	// ServeMCP runs one JSON-RPC message from the upstream against the
	// board and returns the reply payload, or nil when none is due.
	ServeMCP(ctx context.Context, payload json.RawMessage) json.RawMessage
}

// ServerHello is what the transport needs of the upstream's hello to
// answer its board.
type ServerHello struct {
	// SessionID is the upstream's session id when it is safe to hand a
	// board (else one the relay made).
	SessionID string
	// SampleRate and FrameDuration describe the upstream's downlink audio.
	SampleRate, FrameDuration int
}

// Event is a conversation's start or end, for the events feed.
type Event struct {
	Kind      string // "opened", "closed", "failed"
	DeviceID  string
	Transport string
	SessionID string
	Upstream  string // URL without credentials
	Reason    string // why it closed or failed
}

// Relay opens and tracks conversations.
type Relay struct {
	cfg     Config
	log     *zap.Logger
	boards  map[string]string // canonical MAC → URL or Off
	dialer  websocket.Dialer
	onEvent func(Event)

	mu       sync.Mutex
	open     map[*Conversation]struct{}
	failures map[string]time.Time
	closed   bool
	wg       sync.WaitGroup

	stats    counters
	lastErr  atomic.Pointer[upstreamState]
	failWarn logthrottle.Throttle
}

type upstreamState struct {
	at  time.Time
	err string
}

// NewRelay makes a relay; onEvent (may be nil) must not block.
func NewRelay(cfg Config, log *zap.Logger, onEvent func(Event)) (*Relay, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	boards := make(map[string]string, len(cfg.Boards))
	for mac, u := range cfg.Boards {
		id, ok := device.CanonicalMAC(mac)
		if !ok {
			return nil, fmt.Errorf("voice.boards: %q is not a MAC", mac)
		}
		boards[id] = u
	}
	if onEvent == nil {
		onEvent = func(Event) {}
	}
	return &Relay{
		cfg: cfg, log: log, boards: boards, onEvent: onEvent,
		dialer: websocket.Dialer{
			HandshakeTimeout: cfg.HelloTimeout,
			ReadBufferSize:   4096, WriteBufferSize: 4096,
			Proxy: http.ProxyFromEnvironment,
		},
		open:     map[*Conversation]struct{}{},
		failures: map[string]time.Time{},
	}, nil
}

// Upstream returns the URL a board's conversations go to, "" for none.
func (r *Relay) Upstream(deviceID string) string {
	if r == nil {
		return ""
	}
	if u, ok := r.boards[deviceID]; ok {
		if u == Off {
			return ""
		}
		return u
	}
	return r.cfg.Upstream
}

// Enabled reports whether a board's conversations are relayed.
func (r *Relay) Enabled(deviceID string) bool { return r.Upstream(deviceID) != "" }

// MayRetry reports whether a board's next conversation may try the
// upstream now (its last attempt did not fail within RetryAfter).
func (r *Relay) MayRetry(deviceID string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.failures[deviceID]
	return !ok || time.Since(at) >= r.cfg.RetryAfter
}

// Open starts a conversation: it dials the board's upstream with the
// board's identity, sends hello (the board's hello as the upstream should
// see it) and waits for the upstream's hello, all within
// Config.HelloTimeout and ctx.
func (r *Relay) Open(ctx context.Context, b Board, hello []byte, side BoardSide) (*Conversation, ServerHello, error) {
	up := r.Upstream(b.DeviceID)
	if up == "" {
		return nil, ServerHello{}, ErrOff
	}
	if !r.MayRetry(b.DeviceID) {
		return nil, ServerHello{}, ErrRetryWait
	}
	r.mu.Lock()
	switch {
	case r.closed:
		r.mu.Unlock()
		return nil, ServerHello{}, ErrClosed
	case len(r.open) >= r.cfg.MaxConversations:
		r.mu.Unlock()
		r.stats.refused.Add(1)
		return nil, ServerHello{}, ErrTooMany
	}
	c := newConversation(r, b, up, side)
	r.open[c] = struct{}{}
	r.wg.Add(1)
	r.mu.Unlock()

	sh, err := c.start(ctx, hello)
	if err != nil {
		c.abandon()
		r.failed(b, up, err)
		return nil, ServerHello{}, err
	}
	r.mu.Lock()
	delete(r.failures, b.DeviceID)
	r.mu.Unlock()
	r.lastErr.Store(&upstreamState{at: time.Now()})
	r.stats.opened.Add(1)
	r.onEvent(Event{Kind: "opened", DeviceID: b.DeviceID, Transport: b.Transport, SessionID: sh.SessionID, Upstream: Redact(up)})
	return c, sh, nil
}

func (r *Relay) failed(b Board, up string, err error) {
	r.stats.upstreamErrors.Add(1)
	now := time.Now()
	r.mu.Lock()
	if len(r.failures) >= maxFailures {
		for id, at := range r.failures {
			if now.Sub(at) >= r.cfg.RetryAfter || len(r.failures) >= maxFailures {
				delete(r.failures, id)
			}
		}
	}
	r.failures[b.DeviceID] = now
	r.mu.Unlock()
	r.lastErr.Store(&upstreamState{at: now, err: err.Error()})
	r.failWarn.Warn(r.log, "voice upstream failed; the board keeps its tools and is told the conversation failed",
		zap.String("device_id", b.DeviceID), zap.String("upstream", Redact(up)), clip.Error(err))
	r.onEvent(Event{Kind: "failed", DeviceID: b.DeviceID, Transport: b.Transport, Upstream: Redact(up), Reason: err.Error()})
}

// forget removes an ended conversation.
func (r *Relay) forget(c *Conversation) {
	r.mu.Lock()
	delete(r.open, c)
	r.mu.Unlock()
	r.wg.Done()
}

// Close ends every conversation and waits for them; Open fails afterwards.
func (r *Relay) Close() {
	r.mu.Lock()
	r.closed = true
	open := make([]*Conversation, 0, len(r.open))
	for c := range r.open {
		open = append(open, c)
	}
	r.mu.Unlock()
	for _, c := range open {
		c.Close(ErrClosed)
	}
	r.wg.Wait()
}

// Health is the upstream's last known state, for /readyz.
type Health struct {
	// Known is false until a first attempt.
	Known bool
	OK    bool
	Since time.Time
	Error string
}

// Health reports how the last attempt went.
func (r *Relay) Health() Health {
	s := r.lastErr.Load()
	if s == nil {
		return Health{}
	}
	return Health{Known: true, OK: s.err == "", Since: s.at, Error: s.err}
}

// dial opens the upstream socket with the board's identity headers.
func (r *Relay) dial(ctx context.Context, up string, b Board) (*websocket.Conn, error) {
	h := http.Header{}
	h.Set("Device-Id", b.DeviceID)
	if b.ClientID != "" {
		h.Set("Client-Id", b.ClientID)
	}
	h.Set("Protocol-Version", strconv.Itoa(max(b.ProtocolVersion, 1)))
	if tok := r.token(b); tok != "" {
		if !strings.Contains(tok, " ") {
			tok = "Bearer " + tok
		}
		h.Set("Authorization", tok)
	}
	conn, resp, err := r.dialer.DialContext(ctx, up, h)
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("voice: upstream refused the connection: %s", resp.Status)
		}
		return nil, fmt.Errorf("voice: dialing upstream: %w", err)
	}
	conn.SetReadLimit(r.cfg.MaxMessage)
	return conn, nil
}

// token is the credential toward the upstream: the HMAC form when a secret
// is set, else the static token.
func (r *Relay) token(b Board) string {
	if r.cfg.Secret == "" {
		return r.cfg.Token
	}
	return HMACToken(r.cfg.Secret, b.ClientID, b.DeviceID, time.Now())
}

// HMACToken is the token xiaozhi-esp32-server's AuthManager accepts: the
// unpadded URL-safe base64 of HMAC-SHA256(secret, "client|device|ts"),
// a dot, and ts in Unix seconds.
func HMACToken(secret, clientID, deviceID string, now time.Time) string {
	ts := strconv.FormatInt(now.Unix(), 10)
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(clientID + "|" + deviceID + "|" + ts))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil)) + "." + ts
}

// Redact drops credentials from a URL for logs and events.
func Redact(u string) string {
	if i := strings.Index(u, "?"); i >= 0 {
		u = u[:i]
	}
	if i := strings.Index(u, "@"); i >= 0 {
		if j := strings.Index(u, "://"); j >= 0 && j < i {
			u = u[:j+3] + u[i+1:]
		}
	}
	return u
}

// safeSessionID is what a board, and the esp_xiaozhi component in
// particular, accepts as a session id.
var safeSessionID = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// parseServerHello reads the upstream's hello. transport must be
// websocket; the session id and audio parameters are taken only when a
// board can use them.
func parseServerHello(raw []byte) (ServerHello, error) {
	var h struct {
		Transport   *string         `json:"transport"`
		SessionID   json.RawMessage `json:"session_id"`
		AudioParams *struct {
			SampleRate    json.Number `json:"sample_rate"`
			FrameDuration json.Number `json:"frame_duration"`
		} `json:"audio_params"`
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		return ServerHello{}, fmt.Errorf("%w: %v", ErrBadHello, err)
	}
	if h.Transport == nil || *h.Transport != "websocket" {
		return ServerHello{}, fmt.Errorf("%w: transport is not websocket", ErrBadHello)
	}
	sh := ServerHello{SampleRate: 24000, FrameDuration: 60}
	var sid string
	if json.Unmarshal(h.SessionID, &sid) == nil && safeSessionID.MatchString(sid) {
		sh.SessionID = sid
	} else {
		sh.SessionID = randid.Hex16()
	}
	if a := h.AudioParams; a != nil {
		if n, err := a.SampleRate.Int64(); err == nil && n >= 8000 && n <= 48000 {
			sh.SampleRate = int(n)
		}
		if n, err := a.FrameDuration.Int64(); err == nil && n >= 10 && n <= 120 {
			sh.FrameDuration = int(n)
		}
	}
	return sh, nil
}

// FailureAlert is the message that tells a board's user the conversation
// failed: boards show an alert (all three fields must be strings) and play
// their alert sound.
func FailureAlert(sessionID string) []byte {
	b, _ := json.Marshal(struct {
		SessionID string `json:"session_id"`
		Type      string `json:"type"`
		Status    string `json:"status"`
		Message   string `json:"message"`
		Emotion   string `json:"emotion"`
	}{sessionID, "alert", "Error", "The voice assistant is unavailable. Try again in a moment.", "sad"})
	return b
}
