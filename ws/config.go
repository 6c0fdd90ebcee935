package ws

import (
	"cmp"
	"errors"
	"time"

	"github.com/devicebridge/devicebridge/voice"
)

// Defaults for Config.
const (
	DefaultPath         = "/xiaozhi/v1/"
	DefaultHelloTimeout = 10 * time.Second
	// DefaultReadLimit matches the largest frame a board can send (65535).
	DefaultReadLimit    = 64 << 10
	DefaultWriteTimeout = 10 * time.Second
	// DefaultPingInterval keeps NAT state alive and finds dead peers well
	// inside the board's own 120 s inactivity limit.
	DefaultPingInterval = 30 * time.Second
	DefaultPongWait     = 15 * time.Second
	DefaultSendQueue    = 64
	// DefaultMaxConnections bounds open device sockets: above the ten
	// thousand boards one bridge is meant to hold, below what exhausts its
	// file descriptors and memory.
	DefaultMaxConnections = 16384
	// DefaultMaxPendingHellos bounds sockets that have not finished their
	// hello: boards send it at once, so many waiting sockets are a flood,
	// and each of them holds two goroutines for up to HelloTimeout.
	DefaultMaxPendingHellos = 512
)

// Config configures the device WebSocket endpoint.
type Config struct {
	// Path is where boards connect (the websocket.url the OTA hands out).
	Path string `yaml:"path"`
	// Tokens, when non-empty, are the accepted bearer tokens; a board
	// without a valid one gets HTTP 401 before the upgrade.
	Tokens []string `yaml:"tokens"`
	// AllowedOrigins lists browser origins allowed to connect. Boards send
	// no Origin; requests with any other Origin are refused (403).
	AllowedOrigins []string      `yaml:"allowed_origins"`
	HelloTimeout   time.Duration `yaml:"hello_timeout"`
	ReadLimit      int64         `yaml:"read_limit"`
	WriteTimeout   time.Duration `yaml:"write_timeout"`
	PingInterval   time.Duration `yaml:"ping_interval"`
	PongWait       time.Duration `yaml:"pong_wait"`
	// SendQueue bounds the messages waiting for the writer goroutine.
	SendQueue int `yaml:"send_queue"`
	// MaxConnections bounds open device sockets, hello done or not; past
	// it a board gets HTTP 503 before the upgrade. 0 means
	// DefaultMaxConnections (the bridge's configuration refuses 0 and
	// negative values; negative means no limit only to code that builds a
	// Config itself).
	MaxConnections int `yaml:"max_connections"`
	// MaxPendingHellos bounds sockets still waiting for their hello; past
	// it a new socket gets HTTP 503. 0 means DefaultMaxPendingHellos;
	// negative values as for MaxConnections.
	MaxPendingHellos int `yaml:"max_pending_hellos"`
	// AllowAnyDeviceID admits boards whose Device-Id is not a MAC (a
	// plain id: letters, digits, '.', '_', '-', at most 64). Off by
	// default: firmware always sends its MAC, and a board free to choose
	// its id could choose a name meant for another board. A MAC in any
	// spelling is accepted either way and written in canonical form.
	AllowAnyDeviceID bool `yaml:"allow_any_device_id"`
	// Issued verifies per-board tokens (those the OTA endpoint hands out):
	// a board presenting the token issued to its own Device-Id is admitted
	// beside the static Tokens, and one presenting another board's is
	// refused. Wired by the bridge, not a file key.
	Issued TokenVerifier `yaml:"-"`
	// RequireToken refuses boards without a valid token even when Tokens is
	// empty (admission is on). Wired by the bridge, not a file key.
	RequireToken bool `yaml:"-"`
	// Relay, when set, relays each board's conversation to its voice
	// upstream. Wired by the bridge from the voice section.
	Relay *voice.Relay `yaml:"-"`
}

// TokenVerifier checks a token issued to one board. Implementations must
// compare in constant time.
type TokenVerifier interface {
	// CheckWebSocketToken reports whether token is the one issued to the
	// board (its Device-Id and Client-Id headers), and whether it is
	// recognisably one issued to another board: that is refused even when
	// no token is required.
	CheckWebSocketToken(deviceID, clientID, token string) (issued, foreign bool)
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.Path = cmp.Or(c.Path, DefaultPath)
	// max(x, 0): a negative value here has always meant the default too.
	c.HelloTimeout = cmp.Or(max(c.HelloTimeout, 0), DefaultHelloTimeout)
	c.ReadLimit = cmp.Or(max(c.ReadLimit, 0), DefaultReadLimit)
	c.WriteTimeout = cmp.Or(max(c.WriteTimeout, 0), DefaultWriteTimeout)
	c.PingInterval = cmp.Or(max(c.PingInterval, 0), DefaultPingInterval)
	c.PongWait = cmp.Or(max(c.PongWait, 0), DefaultPongWait)
	c.SendQueue = cmp.Or(max(c.SendQueue, 0), DefaultSendQueue)
	// Only zero: a negative limit is kept as given (no limit).
	c.MaxConnections = cmp.Or(c.MaxConnections, DefaultMaxConnections)
	c.MaxPendingHellos = cmp.Or(c.MaxPendingHellos, DefaultMaxPendingHellos)
	return c
}

// Validate reports configuration mistakes.
func (c Config) Validate() error {
	if c.Path != "" && c.Path[0] != '/' {
		return errors.New("websocket.path must start with /")
	}
	for _, t := range c.Tokens {
		if t == "" {
			return errors.New("websocket.tokens must not contain an empty token")
		}
	}
	return nil
}
