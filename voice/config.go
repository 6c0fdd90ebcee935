package voice

import (
	"cmp"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// Defaults for Config.
const (
	// DefaultHelloTimeout leaves a board (which waits 10 s for its server
	// hello) time to be answered by the bridge itself when the upstream
	// does not answer.
	DefaultHelloTimeout = 5 * time.Second
	DefaultWriteTimeout = 5 * time.Second
	// DefaultQueueFrames is about 4 s of 60 ms audio per direction: more
	// than a board buffers itself (40 packets).
	DefaultQueueFrames      = 64
	DefaultMaxMessage       = 64 << 10
	DefaultMaxConversations = 10000
	DefaultRetryAfter       = 5 * time.Second
	// DefaultMCPQueue bounds the upstream's MCP requests waiting for the
	// board; the board runs one at a time anyway.
	DefaultMCPQueue = 8
	// maxFailures bounds the memory of boards whose last attempt failed.
	maxFailures = 65536
)

// Off, as a per-board upstream, keeps that board's conversations off the
// relay.
const Off = "off"

// Config is the voice relay's configuration. The zero value relays nothing.
type Config struct {
	// Upstream is the voice server's WebSocket URL (ws:// or wss://), for
	// example ws://host:8000/xiaozhi/v1/. Empty turns the relay off except
	// for boards named in Boards.
	Upstream string `yaml:"upstream"`
	// Token is sent as "Authorization: Bearer <token>" (a token with a
	// space is sent as written, as boards do).
	Token string `yaml:"upstream_token"`
	// Secret, when set, replaces Token with the HMAC token
	// xiaozhi-esp32-server verifies for gateways, made per connection.
	Secret string `yaml:"upstream_secret"`
	// Boards overrides Upstream per board: MAC → URL, or "off".
	Boards map[string]string `yaml:"boards"`
	// HelloTimeout bounds dialing the upstream and its hello.
	HelloTimeout time.Duration `yaml:"hello_timeout"`
	// WriteTimeout bounds one write toward the upstream, and how long a
	// text message may wait for room in a full queue.
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// QueueFrames bounds the messages waiting in each direction.
	QueueFrames int `yaml:"queue_frames"`
	// MaxMessage bounds one message from the upstream.
	MaxMessage int64 `yaml:"max_message"`
	// MaxConversations bounds the conversations open at once.
	MaxConversations int `yaml:"max_conversations"`
	// RetryAfter is how long after a failed attempt a board's next
	// conversation waits before the upstream is tried again.
	RetryAfter time.Duration `yaml:"retry_after"`
	// MCPQueue bounds the upstream's MCP requests waiting for the board.
	MCPQueue int `yaml:"mcp_queue"`
}

// WithDefaults fills unset fields.
func (c Config) WithDefaults() Config {
	c.HelloTimeout = cmp.Or(max(c.HelloTimeout, 0), DefaultHelloTimeout)
	c.WriteTimeout = cmp.Or(max(c.WriteTimeout, 0), DefaultWriteTimeout)
	c.QueueFrames = cmp.Or(max(c.QueueFrames, 0), DefaultQueueFrames)
	c.MaxMessage = cmp.Or(max(c.MaxMessage, 0), DefaultMaxMessage)
	c.MaxConversations = cmp.Or(max(c.MaxConversations, 0), DefaultMaxConversations)
	c.RetryAfter = cmp.Or(max(c.RetryAfter, 0), DefaultRetryAfter)
	c.MCPQueue = cmp.Or(max(c.MCPQueue, 0), DefaultMCPQueue)
	return c
}

// Enabled reports whether any board's conversations are relayed.
func (c Config) Enabled() bool {
	if c.Upstream != "" {
		return true
	}
	for _, u := range c.Boards {
		if u != Off && u != "" {
			return true
		}
	}
	return false
}

// Validate checks URLs and bounds; the error names the key.
func (c Config) Validate() error {
	var errs []error
	if c.Upstream != "" {
		if err := checkURL(c.Upstream); err != nil {
			errs = append(errs, fmt.Errorf("voice.upstream: %w", err))
		}
	}
	for mac, u := range c.Boards {
		if u == Off || u == "" {
			continue
		}
		if err := checkURL(u); err != nil {
			errs = append(errs, fmt.Errorf("voice.boards[%s]: %w", mac, err))
		}
	}
	if c.HelloTimeout > 9*time.Second {
		errs = append(errs, fmt.Errorf("voice.hello_timeout %v: boards give up on their hello after 10 s; keep it under 9 s", c.HelloTimeout))
	}
	if c.Token != "" && c.Secret != "" {
		errs = append(errs, errors.New("voice.upstream_token and voice.upstream_secret: set one, not both"))
	}
	return errors.Join(errs...)
}

func checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	switch strings.ToLower(u.Scheme) {
	case "ws", "wss":
	default:
		return fmt.Errorf("%q: want a ws:// or wss:// URL", raw)
	}
	if u.Host == "" {
		return fmt.Errorf("%q: no host", raw)
	}
	return nil
}
