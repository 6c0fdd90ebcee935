package mqtt

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/devicebridge/devicebridge/envelope"
	"github.com/devicebridge/devicebridge/voice"
)

// Defaults for Config.
const (
	// DefaultKeepAlive is the bridge's own keep-alive towards the broker:
	// short, so a dead broker is noticed (and pending calls failed) quickly.
	DefaultKeepAlive      = 30 * time.Second
	DefaultConnectTimeout = 10 * time.Second
	DefaultWriteTimeout   = 10 * time.Second
	// DefaultMaxReconnectInterval caps paho's reconnect back-off.
	DefaultMaxReconnectInterval = 10 * time.Second
	// DefaultInboxSize bounds each board's unprocessed uplink messages. A
	// board answers one request at a time, so a handful is plenty; beyond
	// it messages are dropped and counted, never buffered without limit.
	DefaultInboxSize = 32
	// DefaultUDPListen is where audio datagrams are accepted (the port the
	// existing gateways advertise).
	DefaultUDPListen = ":8884"
	// DefaultLivenessInterval: probe a board after this long without a
	// message from it. Boards close their audio channel after 120 s of
	// silence; a minute keeps the bridge's view fresher than that.
	DefaultLivenessInterval = 60 * time.Second
	DefaultLivenessTimeout  = 10 * time.Second
	DefaultLivenessMisses   = 3
	// DefaultRecoverWindow is how long, after the broker connection comes
	// back, the gateway keeps trying to reach the boards it lost.
	DefaultRecoverWindow = 5 * time.Minute
	// DefaultRediscoverInterval limits how often a board that failed to
	// initialize is tried again when it speaks.
	DefaultRediscoverInterval = 5 * time.Second
)

// UDPConfig is the audio side of the MQTT transport. Boards open a UDP
// "channel" when a conversation starts; the bridge accepts and counts their
// datagrams but plays none.
type UDPConfig struct {
	// Listen is the local UDP address (":8884"). If the default port is
	// taken the gateway falls back to an ephemeral port and says so.
	Listen string `yaml:"listen"`
	// Advertise is the "host" or "host:port" handed to boards in the server
	// hello. Boards resolve it as IPv4. Empty means: the address the board
	// reached the embedded broker on, else the local address facing the
	// external broker, with the bound port.
	Advertise string `yaml:"advertise"`
}

// LivenessConfig tunes probing of idle boards. It applies only without a
// presence source (external brokers): the embedded broker reports
// disconnects itself.
type LivenessConfig struct {
	// Interval is the idle time after which a board is probed; 0 takes the
	// default, a negative value disables probing.
	Interval time.Duration `yaml:"interval"`
	// Timeout bounds one probe.
	Timeout time.Duration `yaml:"timeout"`
	// Misses is how many probes in a row may go unanswered before the board
	// is marked offline.
	Misses int `yaml:"misses"`
}

// TLSConfig secures the connection to an external broker (ssl://, tls://,
// mqtts:// or wss:// URLs).
type TLSConfig struct {
	// CAFile is a PEM bundle trusted in addition to the system roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are a client certificate, if the broker wants one.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName overrides the name checked in the broker's certificate.
	ServerName string `yaml:"server_name"`
	// InsecureSkipVerify disables certificate checks (testing only).
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// Build returns the tls.Config, or nil when nothing is set.
func (c TLSConfig) Build() (*tls.Config, error) {
	if c == (TLSConfig{}) {
		return nil, nil
	}
	cfg := &tls.Config{ServerName: c.ServerName, InsecureSkipVerify: c.InsecureSkipVerify, MinVersion: tls.VersionTLS12} //nolint:gosec // opt-in, documented as testing only
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("mqtt.tls.ca_file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("mqtt.tls.ca_file %s: no PEM certificates found", c.CAFile)
		}
		cfg.RootCAs = pool
	}
	if c.CertFile != "" || c.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("mqtt.tls client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// Config configures a Gateway. It carries its own yaml keys, so the
// bridge's configuration embeds it (under "mqtt") instead of copying it
// field by field; a new field is a change in this one place.
type Config struct {
	// Broker is the broker URL: tcp://host:port (mqtt://), ssl://, tls://,
	// mqtts://, ws:// or wss://.
	Broker string `yaml:"broker"`
	// ClientID is the bridge's own client id; empty generates
	// "devicebridge-<random>" so two bridges never take over each other.
	ClientID string `yaml:"client_id"`
	Username string `yaml:"username"`
	Password string `yaml:"password"`
	// TLS secures the connection to the broker (ssl://, tls://, mqtts://,
	// wss://); built when the gateway is created.
	TLS TLSConfig `yaml:"tls"`

	Topics Topics `yaml:"topics"`
	// Downlink says how the bridge's messages reach boards on an external
	// broker: subscribe (the board or the broker subscribes it, as
	// legacy firmware does), mosquitto-plugin (Mosquitto with
	// deploy/mosquitto/devicebridge.so, which reaches boards that never
	// subscribe) or emqx-autosubscribe (EMQX's auto_subscribe does).
	Downlink string `yaml:"downlink"`

	// KeepAlive is the bridge's own keep-alive towards the broker.
	KeepAlive time.Duration `yaml:"keepalive"`
	// ConnectTimeout bounds one connection attempt, and how long start-up
	// waits for an external broker before carrying on without it.
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	WriteTimeout   time.Duration `yaml:"write_timeout"`
	// MaxReconnectInterval caps the reconnect back-off.
	MaxReconnectInterval time.Duration `yaml:"max_reconnect_interval"`

	// MaxMessageSize bounds one uplink payload; larger ones are dropped.
	MaxMessageSize int `yaml:"max_message_size"`
	// InboxSize bounds each board's unprocessed uplink messages: its
	// inbox in the gateway and, with the embedded broker, its share of the
	// broker's queue towards the gateway.
	InboxSize int `yaml:"inbox_size"`
	// BoardLimits bounds how fast one board may publish.
	BoardLimits BoardLimits `yaml:"board_limits"`

	UDP      UDPConfig      `yaml:"udp"`
	Liveness LivenessConfig `yaml:"liveness"`
	// RecoverWindow: after the broker connection returns, boards that were
	// online are re-initialized (with back-off) for this long (external
	// broker).
	RecoverWindow time.Duration `yaml:"recover_window"`
	// RediscoverInterval paces re-initialization of a board whose
	// initialization failed: at most this often when it speaks, and, with
	// the embedded broker, while it stays connected without a word (after
	// this interval, doubling with each failure, up to 5 minutes).
	RediscoverInterval time.Duration `yaml:"rediscover_interval"`

	// AllowAnyDeviceID accepts uplink topic keys that are not a MAC as the
	// board's device id (see device.BoardID); otherwise their messages are
	// dropped. The bridge sets it from mqtt.auth.allow_any_client_id, so
	// the embedded broker and the gateway agree; not a key of its own.
	AllowAnyDeviceID bool `yaml:"-"`
	// Relay, when set, relays boards' conversations to their voice
	// upstream (the official gateway's job). Wired by the bridge.
	Relay *voice.Relay `yaml:"-"`
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.Topics = c.Topics.WithDefaults()
	c.BoardLimits = c.BoardLimits.WithDefaults()
	c.Downlink = cmp.Or(c.Downlink, DownlinkSubscribe)
	c.UDP.Listen = cmp.Or(c.UDP.Listen, DefaultUDPListen)
	// Only zero: a negative interval is kept as given (no liveness probes).
	c.Liveness.Interval = cmp.Or(c.Liveness.Interval, DefaultLivenessInterval)
	// max(x, 0): a negative value here has always meant the default too.
	c.KeepAlive = cmp.Or(max(c.KeepAlive, 0), DefaultKeepAlive)
	c.ConnectTimeout = cmp.Or(max(c.ConnectTimeout, 0), DefaultConnectTimeout)
	c.WriteTimeout = cmp.Or(max(c.WriteTimeout, 0), DefaultWriteTimeout)
	c.MaxReconnectInterval = cmp.Or(max(c.MaxReconnectInterval, 0), DefaultMaxReconnectInterval)
	c.MaxMessageSize = cmp.Or(max(c.MaxMessageSize, 0), envelope.DefaultMaxMessageSize)
	c.InboxSize = cmp.Or(max(c.InboxSize, 0), DefaultInboxSize)
	c.Liveness.Timeout = cmp.Or(max(c.Liveness.Timeout, 0), DefaultLivenessTimeout)
	c.Liveness.Misses = cmp.Or(max(c.Liveness.Misses, 0), DefaultLivenessMisses)
	c.RecoverWindow = cmp.Or(max(c.RecoverWindow, 0), DefaultRecoverWindow)
	c.RediscoverInterval = cmp.Or(max(c.RediscoverInterval, 0), DefaultRediscoverInterval)
	return c
}

// ValidateBrokerURL checks that u is a broker URL paho can dial.
func ValidateBrokerURL(u string) error {
	p, err := url.Parse(u)
	if err != nil {
		return fmt.Errorf("broker URL %q: %w", u, err)
	}
	switch p.Scheme {
	case "tcp", "mqtt", "ssl", "tls", "tcps", "mqtts", "ws", "wss":
	default:
		return fmt.Errorf("broker URL %q: scheme must be tcp, mqtt, ssl, tls, mqtts, ws or wss", u)
	}
	if p.Host == "" {
		return fmt.Errorf("broker URL %q: missing host:port", u)
	}
	return nil
}

// Validate reports mistakes in c's addresses and topics.
func (c Config) Validate() error {
	var errs []error
	if c.Broker == "" {
		errs = append(errs, errors.New("mqtt: no broker URL"))
	} else if err := ValidateBrokerURL(c.Broker); err != nil {
		errs = append(errs, fmt.Errorf("mqtt.broker: %w", err))
	}
	if err := c.Topics.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.UDP.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.validateDownlink(); err != nil {
		errs = append(errs, err)
	}
	// Numbers are checked by the bridge's configuration against its table
	// of ranges (app/configcheck.go); WithDefaults keeps this package safe
	// from zero and negative values.
	return errors.Join(errs...)
}

// Validate reports a malformed advertised address.
func (u UDPConfig) Validate() error {
	if u.Advertise == "" {
		return nil
	}
	_, _, err := splitAdvertise(u.Advertise)
	return err
}

// splitAdvertise parses "host" or "host:port" (port 0 = the bound port).
func splitAdvertise(s string) (host string, port int, err error) {
	h, p, splitErr := net.SplitHostPort(s)
	if splitErr != nil {
		// No port: the whole string is the host.
		if s == "" {
			return "", 0, errors.New("mqtt.udp.advertise: empty")
		}
		return s, 0, nil
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 0 || n > 65535 {
		return "", 0, fmt.Errorf("mqtt.udp.advertise %q: bad port", s)
	}
	if h == "" {
		return "", 0, fmt.Errorf("mqtt.udp.advertise %q: missing host", s)
	}
	return h, n, nil
}
