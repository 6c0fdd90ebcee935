package voicestub

import (
	"cmp"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
)

// Defaults and fixed bounds.
const (
	DefaultTTSFrames      = 3
	DefaultAutoFrames     = 5
	DefaultMCPTimeout     = 30 * time.Second
	DefaultMaxConns       = 10000
	DefaultMaxHistory     = 10000
	DefaultMaxRecords     = 10000
	DefaultMaxRecordBytes = 16 << 20
	DefaultMaxToolPages   = 64
	DefaultIdleTimeout    = 10 * time.Minute
	DefaultWriteTimeout   = 10 * time.Second

	// ReadLimit bounds one message from a board: the firmware cannot send
	// more than 65535 bytes in one frame.
	ReadLimit = 64 << 10
	// MaxOTABody bounds an OTA or activate request body.
	MaxOTABody = 64 << 10
	// maxPendingCalls bounds CallTool requests waiting on one connection.
	maxPendingCalls = 64
	// outQueue is the writer's queue; producers wait when it is full
	// (the reader never writes, so a slow board only slows its answers).
	outQueue = 64
	// jobQueue holds answers and aborts waiting for the speaker; past it a
	// turn goes unanswered (Conversation.Skipped) rather than piling up.
	jobQueue = 8
	// maxTTSFrames keeps one answer from being made endless by a typo.
	maxTTSFrames = 100000
)

// Config configures a stand-in voice server. Zero values pick the defaults
// above; New copies it.
type Config struct {
	// Tokens are static tokens accepted as "Authorization: Bearer <token>".
	Tokens []string
	// Secret enables HMAC gateway tokens (see Token). With neither Tokens
	// nor Secret every upgrade is accepted.
	Secret string
	// ActivationCode, when set (digits only), makes OTA answers carry an
	// activation block for each device until it has called /activate
	// twice (202, then 200), as a board's activation loop does.
	ActivationCode string
	// WebSocketURL is what OTA answers give as websocket.url; empty means
	// ws://<the request's Host>/xiaozhi/v1/.
	WebSocketURL string

	// TTSFrames is the number of binary frames in each answer (default 3).
	TTSFrames int
	// AutoFrames ends an auto or realtime turn after this many frames,
	// standing in for voice-activity detection (default 5).
	AutoFrames int
	// Pace is the gap between TTS frames; 0 sends them back to back.
	// Real servers pace at the frame duration (60 ms). Frame k is due
	// k*Pace after the first, so a late frame is followed by the next at
	// once rather than pushing every later one back, as a real-time
	// stream does.
	Pace time.Duration
	// Stamp puts the time each TTS frame is written, 8 bytes big-endian
	// Unix nanoseconds, in front of its payload (StampedReply), so a
	// board on the same clock can time the downlink (ReadStamp). Without
	// it payloads are exactly ExpectedReply.
	Stamp bool
	// MCPTimeout bounds each wait for the board's answer to initialize or
	// a tools/list page (default 30 s). CallTool is bounded by its ctx.
	MCPTimeout time.Duration

	// MaxConns caps live WebSocket connections; past it upgrades get 503.
	MaxConns int
	// MaxHistory caps the connection records kept (refused attempts
	// included; at least MaxConns), the OTA requests kept and the devices
	// whose activation is tracked; the oldest finished records go.
	MaxHistory int
	// MaxRecords caps each list a connection records (frames, texts,
	// sent texts, conversations, MCP replies, tools, wake words).
	MaxRecords int
	// MaxRecordBytes caps the bytes a connection's records keep. Past
	// either cap messages are still handled and counted, not kept, and
	// Connection.Truncated is set.
	MaxRecordBytes int
	// MaxToolPages caps the tools/list pages fetched per connection.
	MaxToolPages int
	// IdleTimeout closes a connection that sends nothing for this long
	// (default 10 min; a real board gives up after 120 s).
	IdleTimeout time.Duration
	// WriteTimeout bounds each socket write (default 10 s).
	WriteTimeout time.Duration

	// Faults are the failures connections simulate; SetFaults changes
	// them later.
	Faults Faults

	// Now is the clock for token checks and server_time; nil is time.Now.
	Now func() time.Time
	// Logger receives the stub's logs; nil discards them.
	Logger *zap.Logger
}

// Faults make the stub misbehave for failure tests. A connection takes the
// faults in force when it is accepted and keeps them.
type Faults struct {
	// RefuseUpgrade answers every upgrade with 503.
	RefuseUpgrade bool
	// HelloDelay delays the server hello.
	HelloDelay time.Duration
	// NoHello accepts and reads but never sends the server hello (nor
	// starts MCP); conversations are still answered.
	NoHello bool
	// CloseOnHello closes the socket as soon as the board's hello arrives.
	CloseOnHello bool
	// CloseAfterFrames closes the socket once this many binary frames
	// have arrived (0: never).
	CloseAfterFrames int
	// StallAfter and StallFor make a slow reader: after reading
	// StallAfter messages the connection stops reading for StallFor.
	StallAfter int
	StallFor   time.Duration
}

func (c *Config) fill() error {
	c.Tokens = slices.Clone(c.Tokens)
	for _, t := range c.Tokens {
		if t == "" || strings.ContainsAny(t, " \r\n") {
			return fmt.Errorf("voicestub: static token %q: want a non-empty token without spaces", t)
		}
	}
	if c.ActivationCode != "" {
		if len(c.ActivationCode) > 16 || strings.Trim(c.ActivationCode, "0123456789") != "" {
			return errors.New("voicestub: activation code must be 1 to 16 digits (boards read it aloud)")
		}
	}
	if c.WebSocketURL != "" {
		u, err := url.Parse(c.WebSocketURL)
		if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
			return fmt.Errorf("voicestub: websocket url %q: want ws:// or wss://", c.WebSocketURL)
		}
	}
	if c.TTSFrames < 0 || c.TTSFrames > maxTTSFrames {
		return fmt.Errorf("voicestub: tts frames %d: want 0 (default) to %d", c.TTSFrames, maxTTSFrames)
	}
	for name, v := range map[string]int{
		"auto frames": c.AutoFrames, "max conns": c.MaxConns, "max history": c.MaxHistory,
		"max records": c.MaxRecords, "max record bytes": c.MaxRecordBytes, "max tool pages": c.MaxToolPages,
	} {
		if v < 0 {
			return fmt.Errorf("voicestub: %s %d is negative", name, v)
		}
	}
	if c.Pace < 0 || c.MCPTimeout < 0 || c.IdleTimeout < 0 || c.WriteTimeout < 0 {
		return errors.New("voicestub: negative duration")
	}
	c.TTSFrames = cmp.Or(c.TTSFrames, DefaultTTSFrames)
	c.AutoFrames = cmp.Or(c.AutoFrames, DefaultAutoFrames)
	c.MCPTimeout = cmp.Or(c.MCPTimeout, DefaultMCPTimeout)
	c.MaxConns = cmp.Or(c.MaxConns, DefaultMaxConns)
	c.MaxHistory = max(cmp.Or(c.MaxHistory, DefaultMaxHistory), c.MaxConns)
	c.MaxRecords = cmp.Or(c.MaxRecords, DefaultMaxRecords)
	c.MaxRecordBytes = cmp.Or(c.MaxRecordBytes, DefaultMaxRecordBytes)
	c.MaxToolPages = cmp.Or(c.MaxToolPages, DefaultMaxToolPages)
	c.IdleTimeout = cmp.Or(c.IdleTimeout, DefaultIdleTimeout)
	c.WriteTimeout = cmp.Or(c.WriteTimeout, DefaultWriteTimeout)
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return nil
}
