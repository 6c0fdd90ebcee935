package broker

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/devicebridge/devicebridge/mqtt"
)

// Defaults for Config.
const (
	// DefaultListen is the standard MQTT port on every interface.
	DefaultListen = ":1883"
	// DefaultMaxPacketSize bounds one MQTT packet. A board's largest message
	// is far smaller (a tools/list page stays under 8 KB); a client that
	// sends more is disconnected by the broker before the bytes are read.
	DefaultMaxPacketSize = 1 << 20
	// DefaultClientWritesPending bounds each client's outbound queue. A
	// board is sent one request at a time; past this bound messages to it
	// are dropped and counted rather than buffered.
	DefaultClientWritesPending = 256
	// DefaultConnectPacketTimeout is how long a new connection may take to send
	// CONNECT before it is dropped.
	DefaultConnectPacketTimeout = 10 * time.Second
	// DefaultMaxConnections bounds the board listener's open sockets:
	// above the ten thousand boards one bridge is meant to hold, below what
	// exhausts its file descriptors and memory (the WebSocket side's bound).
	DefaultMaxConnections = 16384
	// DefaultMaxPendingConnects bounds sockets not yet admitted: boards send
	// CONNECT at once, so many waiting sockets are a flood, each holding a
	// goroutine for up to the CONNECT timeout.
	DefaultMaxPendingConnects = 512
)

// User is one static board credential.
type User struct {
	Username string `yaml:"username"`
	Password string `yaml:"password"`
}

// AuthConfig decides which boards may connect. Boards present the username
// and password their OTA response handed them.
type AuthConfig struct {
	// Users are static username/password pairs; any of them admits a board.
	Users []User `yaml:"users"`
	// HMACSecret, when set, admits a board whose password is
	// base64(HMAC-SHA256(secret, client_id + "|" + username)), the scheme
	// existing xiaozhi backends use (see mqtt.HMACPassword).
	HMACSecret string `yaml:"hmac_secret"`
	// AllowAnonymous admits boards that send no username and no password.
	// Unset, it is true only when neither Users nor HMACSecret is
	// configured: a broker with credentials configured refuses boards
	// without any. With no credentials configured and anonymous access
	// allowed, every board is admitted whatever it sends.
	AllowAnonymous *bool `yaml:"allow_anonymous"`
	// AllowAnyClientID admits client ids not in the GID_xxx@@@<mac>@@@<uuid>
	// form: the client id itself (letters, digits, ".", "_", "-") becomes
	// the device id. Off by default: such clients get CONNACK "identifier
	// rejected".
	AllowAnyClientID bool `yaml:"allow_any_client_id"`
}

// anonymous resolves AllowAnonymous.
func (a AuthConfig) anonymous() bool {
	if a.AllowAnonymous != nil {
		return *a.AllowAnonymous
	}
	return len(a.Users) == 0 && a.HMACSecret == ""
}

// Validate reports settings that would refuse every board.
func (a AuthConfig) Validate() error {
	var errs []error
	for i, u := range a.Users {
		if u.Username == "" || u.Password == "" {
			errs = append(errs, fmt.Errorf("mqtt.auth.users[%d]: username and password must both be set", i))
		}
	}
	if !a.anonymous() && len(a.Users) == 0 && a.HMACSecret == "" {
		errs = append(errs, errors.New("mqtt.auth.allow_anonymous is false but no users or hmac_secret are configured: no board could connect"))
	}
	return errors.Join(errs...)
}

// Config configures the embedded broker. It carries its own yaml keys, so
// the bridge's configuration embeds it (under "mqtt", beside the
// gateway's keys) instead of copying it field by field.
type Config struct {
	// Listen is where boards connect (":1883").
	Listen string `yaml:"listen"`
	// Topics must be the same as the gateway's, so they are not a key of
	// their own: whoever embeds both configs hands the gateway's over.
	Topics mqtt.Topics `yaml:"-"`
	// Auth is the board authentication.
	Auth AuthConfig `yaml:"auth"`
	// MaxPacketSize bounds one MQTT packet (0 = DefaultMaxPacketSize).
	MaxPacketSize int `yaml:"max_packet_size"`
	// ClientWritesPending bounds each client's outbound queue.
	ClientWritesPending int `yaml:"client_writes_pending"`
	// ConnectPacketTimeout drops a connection that has not sent CONNECT in time
	// (0 = DefaultConnectPacketTimeout).
	ConnectPacketTimeout time.Duration `yaml:"connect_packet_timeout"`
	// MaxConnections bounds the board listener's open sockets, admitted or
	// not; past it a new socket is closed at once (0 = the default).
	MaxConnections int `yaml:"max_connections"`
	// MaxPendingConnects bounds sockets whose CONNECT has not been accepted
	// yet; past it a new socket is closed at once (0 = the default).
	MaxPendingConnects int `yaml:"max_pending_connects"`
	// Issued verifies per-board credentials (those the OTA endpoint hands
	// out) for the board a client id names, beside Auth's users and HMAC
	// secret. Wired by the bridge, not a file key.
	Issued CredentialVerifier `yaml:"-"`
	// RequireCredentials refuses boards without valid credentials even
	// when Auth configures none and would admit anonymous boards
	// (admission is on). Wired by the bridge, not a file key.
	RequireCredentials bool `yaml:"-"`
	// BoardLimits bounds how fast one board may publish. Like Topics it is
	// the gateway's (mqtt.board_limits), handed over by whoever embeds
	// both configs.
	BoardLimits mqtt.BoardLimits `yaml:"-"`
	// BoardQueue bounds one board's messages waiting in the queue towards
	// the bridge's gateway: the gateway's mqtt.inbox_size, handed over.
	BoardQueue int `yaml:"-"`
}

// CredentialVerifier checks the MQTT username and password issued to one
// board. Implementations must compare in constant time.
type CredentialVerifier interface {
	// CheckMQTT reports whether the login is the one issued to the board
	// the client id names (deviceID, and clientID, its UUID part), and
	// whether it is recognisably one issued to another board: that is
	// refused even where anonymous boards are admitted.
	CheckMQTT(deviceID, clientID, username, password string) (issued, foreign bool)
}

// WithDefaults fills zero fields.
func (c Config) WithDefaults() Config {
	c.Listen = cmp.Or(c.Listen, DefaultListen)
	c.Topics = c.Topics.WithDefaults()
	c.BoardLimits = c.BoardLimits.WithDefaults()
	// max(x, 0): a negative value here has always meant the default too.
	c.MaxPacketSize = cmp.Or(max(c.MaxPacketSize, 0), DefaultMaxPacketSize)
	c.ClientWritesPending = cmp.Or(max(c.ClientWritesPending, 0), DefaultClientWritesPending)
	c.ConnectPacketTimeout = cmp.Or(max(c.ConnectPacketTimeout, 0), DefaultConnectPacketTimeout)
	c.MaxConnections = cmp.Or(max(c.MaxConnections, 0), DefaultMaxConnections)
	c.MaxPendingConnects = cmp.Or(max(c.MaxPendingConnects, 0), DefaultMaxPendingConnects)
	c.BoardQueue = cmp.Or(max(c.BoardQueue, 0), mqtt.DefaultInboxSize)
	return c
}

// Validate reports configuration mistakes in topics and authentication;
// numbers are checked by the bridge's configuration against its table of
// ranges (app/configcheck.go), and WithDefaults replaces zero and negative
// ones.
func (c Config) Validate() error {
	return errors.Join(c.Topics.Validate(), c.Auth.Validate())
}
