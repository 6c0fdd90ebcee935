package simulator

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/internal/ctxtime"
)

// Errors that end a connection or a connection attempt. Serve and
// ConnectWebSocket return them (possibly wrapped) so callers and tests can
// tell why a board went away.
var (
	// ErrClosed: the board closed the link itself (Close, or ctx ended).
	ErrClosed = errors.New("simulator: board closed the connection")
	// ErrServerClosed: the server sent a close frame.
	ErrServerClosed = errors.New("simulator: server closed the connection")
	// ErrConnectionLost: the socket failed (TCP close without a close frame,
	// reset, write error).
	ErrConnectionLost = errors.New("simulator: connection lost")
	// ErrIdleTimeout: nothing arrived within Config.IdleTimeout.
	ErrIdleTimeout = errors.New("simulator: idle timeout")
	// ErrHelloTimeout: no acceptable server hello arrived in time.
	ErrHelloTimeout = errors.New("simulator: no acceptable server hello before the timeout")
	// ErrCrashed: the server sent a hello whose transport is missing or not
	// a string. Real boards dereference a null pointer there and reboot, so
	// the simulator drops the link.
	ErrCrashed = errors.New("simulator: server hello has no string transport; a real board would crash and reboot")
	// ErrRebooted: the board rebooted (self.reboot or a system reboot
	// command) and dropped the link.
	ErrRebooted = errors.New("simulator: board rebooted")
	// ErrFirmwareUpgrade: self.upgrade_firmware closed the channel before
	// downloading, as the firmware does.
	ErrFirmwareUpgrade = errors.New("simulator: board closed the channel for a firmware upgrade")
	// ErrInjectedDisconnect: a tool listed in Config.DisconnectOn was called.
	ErrInjectedDisconnect = errors.New("simulator: injected disconnect mid-call")
	// ErrNotConnected: Serve was called without a live connection.
	ErrNotConnected = errors.New("simulator: board is not connected")
	// errLinkClosed is returned to senders once a link is gone.
	errLinkClosed = errors.New("simulator: link closed")
)

// Defaults for Config fields left at zero.
const (
	// DefaultHelloTimeout is how long the firmware waits for a server hello.
	DefaultHelloTimeout = 10 * time.Second
	// DefaultRebootDelay is the firmware's pause before restarting.
	DefaultRebootDelay = time.Second
	// DefaultWriteTimeout bounds every socket write.
	DefaultWriteTimeout = 10 * time.Second
	// maxMainTasks caps the main task's queue. The firmware's queue is
	// unbounded (it would run out of heap instead); a cap keeps a flood from
	// exhausting the simulator's memory. Overflow is dropped and counted.
	maxMainTasks = 4096
)

// Config configures one simulated board. Zero values select firmware-like
// defaults.
type Config struct {
	// MAC is the board's Device-Id, e.g. "02:00:00:00:00:01". Upper case is
	// accepted and lowered. Empty picks a random locally administered MAC.
	MAC string
	// ClientID is the board's UUID (Client-Id). Empty generates a random
	// UUIDv4.
	ClientID string
	// Profile is required.
	Profile *Profile
	// Token is the WebSocket token; empty sends no Authorization header.
	Token string
	// ProtocolVersion is the binary protocol version (1, 2 or 3) sent in
	// the Protocol-Version header and the hello. Default 1.
	ProtocolVersion int
	// HelloTimeout bounds the wait for the server hello. Default 10s.
	HelloTimeout time.Duration
	// ToolDelay makes the named tools take this long on the main task,
	// which also holds back every reply queued behind them.
	ToolDelay map[string]time.Duration
	// Hold makes each call of the named tools wait on the main task, after
	// its ToolDelay, until it receives a value from the channel (one per
	// call) or the channel is closed, or the link ends: a test decides when
	// the board finishes instead of guessing a delay.
	Hold map[string]<-chan struct{}
	// DisconnectOn drops the connection (TCP close, no reply) when the
	// named tool runs, after its ToolDelay.
	DisconnectOn map[string]bool
	// OmitMCPFeature sends a hello without features.mcp and makes the board
	// ignore MCP messages, like a board without an MCP server.
	OmitMCPFeature bool
	// OmitSessionID leaves session_id out of device messages. No firmware
	// does this; it exists to test how a server copes.
	OmitSessionID bool
	// RebootDelay is the pause between a reboot request and the link
	// dropping. Default 1s.
	RebootDelay time.Duration
	// IdleTimeout drops the link when nothing arrives for this long. Zero,
	// the default, waits forever: a real board keeps an idle socket open
	// until it starts its next conversation.
	IdleTimeout time.Duration
	// WriteTimeout bounds each socket write. Default 10s.
	WriteTimeout time.Duration
	// Logger receives the board's logs; nil means no logging.
	Logger *zap.Logger
	// TLS configures https OTA requests and wss connections; nil verifies
	// against the system roots, as boards do against their CA bundle.
	TLS *tls.Config
	// Hostile, when set, makes the board misbehave on purpose (see
	// Hostile); nil keeps it firmware-faithful.
	Hostile *Hostile
}

// Stats are a board's counters since it was created.
type Stats struct {
	Connects       uint64 // connections that completed the hello exchange
	TextReceived   uint64 // text messages received
	BinaryReceived uint64 // binary (audio) messages received
	MessagesSent   uint64 // text messages written, hellos included
	CallsRun       uint64 // tool callbacks executed
	MCPDropped     uint64 // MCP messages dropped without a reply, notifications included
	Ignored        uint64 // other messages ignored: unparsable, no string type, unknown type, bad payload, foreign hello
	RepliesLost    uint64 // messages that could not be sent: link gone or frame too large
	TasksDiscarded uint64 // main-task work dropped because its link ended or the queue was full
	Reboots        uint64 // reboots, crashes included
	AudioSent      uint64 // uplink audio packets sent (WebSocket binary frames or UDP datagrams)
	// AudioDropped counts downlink audio the board did not play: it came
	// while not speaking, the decode queue was full, or (UDP) the datagram
	// failed the board's checks.
	AudioDropped       uint64
	Conversations      uint64 // conversations (Converse) that ended with the server's tts stop
	ConversationErrors uint64 // conversations that ended any other way
}

type boardStats struct {
	connects, textReceived, binaryReceived, messagesSent, callsRun atomic.Uint64
	mcpDropped, ignored, repliesLost, tasksDiscarded, reboots      atomic.Uint64
	audioSent, audioDropped, conversations, conversationErrors     atomic.Uint64
}

// Board is one simulated xiaozhi-esp32 board. Its identity, tool state and
// the protocol values a real board keeps across connections (session id,
// server audio parameters, the "server hello received" flag) live here;
// each connection gets its own link and main task.
//
// A Board is safe for concurrent use. It holds at most one connection.
type Board struct {
	// lastAlert is the last alert shown (LastAlert).
	lastAlert atomic.Pointer[Alert]

	cfg      Config
	profile  *Profile
	mac      string
	clientID string
	log      *zap.Logger

	// tools caches each listed tool with its rendering for tools/list.
	tools []listedTool
	// initializeResult is the constant result of initialize.
	initializeResult string

	mu            sync.Mutex // guards the fields below
	state         map[string]any
	sessionID     string
	sampleRate    int
	frameDuration int
	visionURL     string
	visionToken   string
	// nvs holds what OTA answers stored (namespace → key → value); it
	// survives reboots, as NVS does.
	nvs map[string]map[string]string

	// helloEvent is the firmware's "server hello received" event bit. It is
	// set by any acceptable hello and consumed by the next wait, even on a
	// later connection, which is how real boards behave.
	helloEvent chan struct{}

	stats boardStats
	// mcpSilent drops every MCP request without a reply (SilenceMCP).
	mcpSilent atomic.Bool
	// conversing is set while Converse runs: one conversation at a time.
	conversing atomic.Bool

	connectMu sync.Mutex // serialises connection attempts
	linkMu    sync.Mutex // guards cur and mqtt
	cur       *wsLink
	// mqtt is the board's latest MQTT connection, kept so that Connected
	// (and with it the fleet's counters) sees MQTT boards too.
	mqtt *MQTTConn
}

var macRE = regexp.MustCompile(`^([0-9a-f]{2}:){5}[0-9a-f]{2}$`)

// Downlink audio defaults the firmware assumes until a server hello says
// otherwise.
const (
	defaultServerSampleRate    = 24000
	defaultServerFrameDuration = 60
)

// NewBoard validates cfg and builds a board. It starts no goroutines.
func NewBoard(cfg Config) (*Board, error) {
	if cfg.Profile == nil {
		return nil, errors.New("simulator: config has no profile")
	}
	if cfg.MAC == "" {
		cfg.MAC = randomMAC()
	}
	cfg.MAC = strings.ToLower(cfg.MAC)
	if !macRE.MatchString(cfg.MAC) {
		return nil, fmt.Errorf("simulator: MAC %q: want six colon-separated hex octets", cfg.MAC)
	}
	if cfg.ClientID == "" {
		cfg.ClientID = randomUUID()
	}
	if strings.ContainsAny(cfg.ClientID, "\"\\\r\n") {
		return nil, fmt.Errorf("simulator: client id %q contains characters a header cannot carry", cfg.ClientID)
	}
	if cfg.ProtocolVersion == 0 {
		cfg.ProtocolVersion = 1
	}
	if cfg.ProtocolVersion < 1 || cfg.ProtocolVersion > 3 {
		return nil, fmt.Errorf("simulator: protocol version %d: want 1, 2 or 3", cfg.ProtocolVersion)
	}
	if strings.ContainsAny(cfg.Token, "\r\n") {
		return nil, errors.New("simulator: token contains a line break")
	}
	cfg.HelloTimeout = cmp.Or(cfg.HelloTimeout, DefaultHelloTimeout)
	cfg.RebootDelay = cmp.Or(cfg.RebootDelay, DefaultRebootDelay)
	cfg.WriteTimeout = cmp.Or(cfg.WriteTimeout, DefaultWriteTimeout)
	// Private copies, so the caller can reuse its maps without racing us.
	cfg.ToolDelay = maps.Clone(cfg.ToolDelay)
	cfg.DisconnectOn = maps.Clone(cfg.DisconnectOn)
	cfg.Hold = maps.Clone(cfg.Hold)
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Hostile != nil {
		h := *cfg.Hostile
		h.ExtraTools = slices.Clone(h.ExtraTools)
		if err := h.validate(); err != nil {
			return nil, err
		}
		cfg.Hostile = &h
	}

	p := cfg.Profile
	b := &Board{
		cfg:      cfg,
		profile:  p,
		mac:      cfg.MAC,
		clientID: cfg.ClientID,
		log: cfg.Logger.Named("simulator").With(
			zap.String("device_id", cfg.MAC),
			zap.String("client_id", cfg.ClientID),
			zap.String("board", p.Board),
		),
		initializeResult: `{"protocolVersion":"` + mcpProtocolVersion + `","capabilities":{"tools":{}},"serverInfo":{"name":"` +
			p.Board + `","version":"` + p.Firmware + `"}}`,
		state:         maps.Clone(p.State),
		sampleRate:    defaultServerSampleRate,
		frameDuration: defaultServerFrameDuration,
		helloEvent:    make(chan struct{}, 1),
	}
	if b.state == nil {
		b.state = map[string]any{}
	}
	b.tools = b.listing()
	return b, nil
}

// MAC returns the board's MAC address (its Device-Id).
func (b *Board) MAC() string { return b.mac }

// ClientID returns the board's UUID (its Client-Id).
func (b *Board) ClientID() string { return b.clientID }

// Profile returns the board's profile.
func (b *Board) Profile() *Profile { return b.profile }

// SessionID returns the session id from the last accepted server hello, or
// "" if none was ever accepted since the board (re)booted.
func (b *Board) SessionID() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sessionID
}

// ServerAudioParams returns the downlink sample rate and frame duration
// from the last server hello (24000 and 60 until one sets them).
func (b *Board) ServerAudioParams() (sampleRate, frameDuration int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sampleRate, b.frameDuration
}

// Vision returns the explain URL and token from the last initialize that
// carried capabilities.vision.url.
func (b *Board) Vision() (url, token string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.visionURL, b.visionToken
}

// State returns a copy of the board's tool state, keyed by dotted names
// such as "audio_speaker.volume".
func (b *Board) State() map[string]any {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.state)
}

// SetState sets one state value, e.g. to drain the battery in a test. The
// value should be a bool, int, float64 or string.
func (b *Board) SetState(key string, value any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.state[key] = value
}

// Stats returns a snapshot of the board's counters.
func (b *Board) Stats() Stats {
	s := &b.stats
	return Stats{
		Connects:       s.connects.Load(),
		TextReceived:   s.textReceived.Load(),
		BinaryReceived: s.binaryReceived.Load(),
		MessagesSent:   s.messagesSent.Load(),
		CallsRun:       s.callsRun.Load(),
		MCPDropped:     s.mcpDropped.Load(),
		Ignored:        s.ignored.Load(),
		RepliesLost:    s.repliesLost.Load(),
		TasksDiscarded: s.tasksDiscarded.Load(),
		Reboots:        s.reboots.Load(),

		AudioSent:          s.audioSent.Load(),
		AudioDropped:       s.audioDropped.Load(),
		Conversations:      s.conversations.Load(),
		ConversationErrors: s.conversationErrors.Load(),
	}
}

// parseCapabilities stores the vision endpoint from initialize. Only a
// string url changes it; the token is optional and resets when absent.
func (b *Board) parseCapabilities(caps *jsonValue) {
	vision := caps.get("vision")
	url := vision.get("url")
	if !url.isString() {
		return
	}
	token := ""
	if t := vision.get("token"); t.isString() {
		token = t.str
	}
	b.mu.Lock()
	b.visionURL, b.visionToken = url.str, token
	b.mu.Unlock()
}

// envelope wraps a payload in a device message the way the firmware does:
// by concatenation, session id first and unescaped.
func (b *Board) envelope(typ, payload string) string {
	if b.cfg.OmitSessionID {
		return `{"type":"` + typ + `","payload":` + payload + `}`
	}
	return `{"session_id":"` + b.SessionID() + `","type":"` + typ + `","payload":` + payload + `}`
}

// signalHello sets the hello event bit; setting it twice is the same as
// once.
func (b *Board) signalHello() {
	select {
	case b.helloEvent <- struct{}{}:
	default:
	}
}

// resetVolatile forgets what a real board keeps only in RAM, for reboots
// and crashes. Tool state is kept: most of it (volume, theme, brightness)
// lives in NVS on real boards.
func (b *Board) resetVolatile() {
	b.mu.Lock()
	b.sessionID = ""
	b.sampleRate, b.frameDuration = defaultServerSampleRate, defaultServerFrameDuration
	b.visionURL, b.visionToken = "", ""
	b.mu.Unlock()
	select {
	case <-b.helloEvent:
	default:
	}
}

// link is what the transport-neutral core needs from a transport. One
// link is one live connection (a WebSocket today, an MQTT session later).
type link interface {
	// send queues one text message for the writer. It fails once the link
	// is gone; it never blocks past the link's end.
	send(msg string) error
	// closeChannel is the device closing its audio channel (reboot,
	// upgrade, injected fault). On WebSocket that ends the link.
	closeChannel(cause error)
	// handleTransportMessage gives the transport the first look at an
	// incoming message of the given type and reports whether it consumed it
	// (hello on every transport, goodbye on MQTT).
	handleTransportMessage(typ string, root *jsonValue) bool
}

// session ties a link to the board's application logic and owns the
// link's main task.
type session struct {
	b     *Board
	link  link
	tasks *mainTask
	log   *zap.Logger

	// timersMu guards timers (work to do later, off the main task: later)
	// and ended (leaf).
	timersMu sync.Mutex
	timers   map[*time.Timer]struct{}
	ended    bool

	// audio is the application's audio state (conversation.go).
	audio audioState
}

func newSession(b *Board, l link, log *zap.Logger) *session {
	return &session{b: b, link: l, tasks: newMainTask(maxMainTasks), log: log}
}

// schedule queues work on the main task.
func (s *session) schedule(t task) {
	if !s.tasks.schedule(t) {
		s.b.stats.tasksDiscarded.Add(1)
		s.log.Warn("main task queue full, dropping work")
	}
}

// runMainTask runs the main task until ctx ends, then counts what was
// left in the queue.
func (s *session) runMainTask(ctx context.Context) {
	if n := s.tasks.run(ctx); n > 0 {
		s.b.stats.tasksDiscarded.Add(uint64(n))
		s.log.Debug("discarded queued work at link end", zap.Int("tasks", n))
	}
	s.timersMu.Lock()
	s.ended = true
	for t := range s.timers {
		t.Stop()
	}
	s.timers = nil
	s.timersMu.Unlock()
}

// later runs f after d, unless the link has ended by then. f runs on the
// timer's goroutine and must only queue work (schedule).
func (s *session) later(d time.Duration, f func()) {
	s.timersMu.Lock()
	defer s.timersMu.Unlock()
	if s.ended {
		return
	}
	if s.timers == nil {
		s.timers = map[*time.Timer]struct{}{}
	}
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		s.timersMu.Lock()
		_, live := s.timers[t]
		delete(s.timers, t)
		s.timersMu.Unlock()
		if live {
			f()
		}
	})
	s.timers[t] = struct{}{}
}

// sendText sends one message from the main task; a failure means the
// message is lost, as on a board whose socket has gone.
func (s *session) sendText(msg string) {
	if err := s.link.send(msg); err != nil {
		s.b.stats.repliesLost.Add(1)
		s.log.Debug("message lost", zap.Error(err))
	}
}

// handleText is Application::OnIncomingJson plus the transport's type
// check. It runs on the link's reader goroutine.
func (s *session) handleText(data []byte) {
	s.b.stats.textReceived.Add(1)
	s.recordText(data)
	root, ok := parseCJSON(data)
	if !ok {
		s.ignore("unparsable json")
		return
	}
	typ := root.get("type")
	if !typ.isString() {
		s.ignore("message without a string type")
		return
	}
	if s.link.handleTransportMessage(typ.str, root) {
		return
	}
	switch typ.str {
	case "mcp":
		if s.b.cfg.OmitMCPFeature {
			s.ignore("mcp message on a board without mcp")
			return
		}
		if s.b.mcpSilent.Load() {
			s.ignore("mcp message while silenced")
			return
		}
		payload := root.get("payload")
		if !payload.isObject() {
			// A string payload is a common server mistake; the board
			// ignores it without a word.
			s.ignore("mcp payload is not an object")
			return
		}
		s.handleMCP(payload)
	case "tts", "stt", "llm", "alert":
		s.handleConversationMessage(typ.str, root)
	case "system":
		cmd := root.get("command")
		if cmd.isString() && cmd.str == "reboot" {
			s.schedule(s.rebootTask())
			return
		}
		s.ignore("unknown system command")
	default:
		s.ignore("unknown message type " + strconv.Quote(typ.str))
	}
}

func (s *session) ignore(reason string) {
	s.b.stats.ignored.Add(1)
	s.log.Debug("message ignored", zap.String("reason", reason))
}

// rebootTask waits like the firmware does and then restarts the board,
// which on WebSocket means the link drops without a close frame.
func (s *session) rebootTask() task {
	return func(ctx context.Context) {
		if !ctxtime.Sleep(ctx, s.b.cfg.RebootDelay) {
			return
		}
		s.log.Info("rebooting")
		s.b.stats.reboots.Add(1)
		s.b.resetVolatile()
		s.link.closeChannel(ErrRebooted)
	}
}

// task is one unit of main-task work. ctx ends when the link ends.
type task func(ctx context.Context)

// mainTask models the firmware's main application task: one goroutine that
// runs scheduled work strictly in order. Tool calls, reboots and every send
// go through it, so a slow tool holds back all replies behind it.
type mainTask struct {
	mu    sync.Mutex
	queue []task
	wake  chan struct{}
	limit int
}

func newMainTask(limit int) *mainTask {
	return &mainTask{wake: make(chan struct{}, 1), limit: limit}
}

// schedule appends t and reports false if the queue is full.
func (m *mainTask) schedule(t task) bool {
	m.mu.Lock()
	if len(m.queue) >= m.limit {
		m.mu.Unlock()
		return false
	}
	m.queue = append(m.queue, t)
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
	return true
}

// run executes tasks until ctx ends and returns how many were left
// unexecuted. Work queued when a link ends is discarded: its replies could
// not be delivered anyway.
func (m *mainTask) run(ctx context.Context) int {
	for {
		if ctx.Err() != nil {
			m.mu.Lock()
			n := len(m.queue)
			m.queue = nil
			m.mu.Unlock()
			return n
		}
		m.mu.Lock()
		var t task
		if len(m.queue) > 0 {
			t = m.queue[0]
			m.queue[0] = nil
			m.queue = m.queue[1:]
		}
		m.mu.Unlock()
		if t == nil {
			select {
			case <-m.wake:
			case <-ctx.Done():
			}
			continue
		}
		t(ctx)
	}
}

// randomMAC returns a locally administered unicast MAC.
func randomMAC() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	b[0] = b[0]&0xfc | 0x02
	return formatMAC(b)
}

func formatMAC(b [6]byte) string {
	return fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3], b[4], b[5])
}

// randomUUID returns a random lower-case UUIDv4, the format the firmware
// generates on first boot.
func randomUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return formatUUIDv4(b)
}

// uuidFromMAC derives a stable UUIDv4-shaped id from a MAC, so a fleet
// restarted with the same MACs presents the same identities, as boards
// with their UUID in NVS would.
func uuidFromMAC(mac string) string {
	sum := sha256.Sum256([]byte("devicebridge-simulator/" + mac))
	var b [16]byte
	copy(b[:], sum[:16])
	return formatUUIDv4(b)
}

func formatUUIDv4(b [16]byte) string {
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
