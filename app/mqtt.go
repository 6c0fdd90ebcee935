package app

// This file wires the MQTT side: an embedded broker (default) or an
// external one, and the gateway that turns MQTT boards into device
// sessions. docs/mqtt.md explains the three broker setups.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/envelope"
	"github.com/devicebridge/devicebridge/mqtt"
	"github.com/devicebridge/devicebridge/mqtt/broker"
)

// DefaultMQTTListen is where the embedded broker listens unless told
// otherwise: the standard MQTT port, where boards are usually pointed.
const DefaultMQTTListen = broker.DefaultListen

// MQTTConfig configures the MQTT side. With Broker empty the bridge runs
// its own broker on Listen; with Broker set it connects to that broker
// instead and Listen is ignored. With both empty MQTT is off.
type MQTTConfig struct {
	// Listen is the embedded broker's address (":1883"); "" disables it.
	// If the port is already taken (often by a system Mosquitto) the bridge
	// logs what happened and how to fix it, and runs without MQTT instead
	// of failing: the WebSocket side keeps working.
	Listen string `yaml:"listen"`
	// Broker is an external broker URL (tcp://host:1883, ssl://host:8883,
	// ws://, wss://). Boards must then publish to their own uplink topic
	// and the broker must deliver downlink to them (see docs/mqtt.md).
	Broker string `yaml:"broker"`
	// Username and Password are the bridge's credentials on the external
	// broker.
	Username string `yaml:"username"`
	Password string `yaml:"password"`
	// ClientID is the bridge's client id on the external broker; empty
	// generates devicebridge-<random>. Two bridges must not share one.
	ClientID string         `yaml:"client_id"`
	TLS      mqtt.TLSConfig `yaml:"tls"`

	// Topics are shared by broker and gateway: uplink devices/up/{mac},
	// downlink devices/p2p/{mac}, shared [device-server].
	Topics mqtt.Topics `yaml:"topics"`
	// Auth is the embedded broker's board authentication.
	Auth broker.AuthConfig `yaml:"auth"`
	// MaxPacketSize bounds one MQTT packet on the embedded broker.
	MaxPacketSize int `yaml:"max_packet_size"`

	UDP      mqtt.UDPConfig      `yaml:"udp"`
	Liveness mqtt.LivenessConfig `yaml:"liveness"`

	// MaxMessageSize bounds one uplink message (default 64 KiB).
	MaxMessageSize int `yaml:"max_message_size"`
	// KeepAlive is the bridge's keep-alive towards the broker.
	KeepAlive time.Duration `yaml:"keepalive"`
	// MaxReconnectInterval caps the reconnect back-off.
	MaxReconnectInterval time.Duration `yaml:"max_reconnect_interval"`
	// ConnectTimeout bounds one connection attempt, and how long start-up
	// waits for an external broker before carrying on without it.
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	// RecoverWindow is how long boards lost with the broker connection
	// are re-initialized after it returns (external broker).
	RecoverWindow time.Duration `yaml:"recover_window"`
}

func defaultMQTTConfig() MQTTConfig {
	return MQTTConfig{
		Listen:        DefaultMQTTListen,
		Topics:        mqtt.DefaultTopics(),
		MaxPacketSize: broker.DefaultMaxPacketSize,
		UDP:           mqtt.UDPConfig{Listen: mqtt.DefaultUDPListen},
		Liveness: mqtt.LivenessConfig{
			Interval: mqtt.DefaultLivenessInterval,
			Timeout:  mqtt.DefaultLivenessTimeout,
			Misses:   mqtt.DefaultLivenessMisses,
		},
		MaxMessageSize:       envelope.DefaultMaxMessageSize,
		KeepAlive:            mqtt.DefaultKeepAlive,
		MaxReconnectInterval: mqtt.DefaultMaxReconnectInterval,
		ConnectTimeout:       mqtt.DefaultConnectTimeout,
		RecoverWindow:        mqtt.DefaultRecoverWindow,
	}
}

func (c MQTTConfig) enabled() bool { return c.Broker != "" || c.Listen != "" }

func (c MQTTConfig) validate() error {
	if !c.enabled() {
		return nil
	}
	var errs []error
	if c.Broker != "" {
		if err := mqtt.ValidateBrokerURL(c.Broker); err != nil {
			errs = append(errs, fmt.Errorf("mqtt.broker: %w", err))
		}
	} else if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("mqtt.listen %q: want host:port (or \"\" to disable)", c.Listen))
	}
	if err := c.Topics.WithDefaults().Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Broker == "" {
		if err := c.Auth.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.MaxMessageSize < 0 || c.MaxPacketSize < 0 {
		errs = append(errs, errors.New("mqtt.max_message_size and mqtt.max_packet_size must not be negative"))
	}
	if c.Liveness.Misses < 0 {
		errs = append(errs, errors.New("mqtt.liveness.misses must not be negative"))
	}
	if err := c.UDP.Validate(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.TLS.Build(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func registerMQTTFlags(fs *flag.FlagSet, c *MQTTConfig) {
	fs.StringVar(&c.Listen, "mqtt-listen", c.Listen, `address of the embedded MQTT broker ("" disables it)`)
	fs.StringVar(&c.Broker, "mqtt-broker", c.Broker, "use this external MQTT broker instead of the embedded one (tcp://host:1883, ssl://host:8883)")
	fs.StringVar(&c.Username, "mqtt-username", c.Username, "the bridge's username on the external broker")
	fs.StringVar(&c.Password, "mqtt-password", c.Password, "the bridge's password on the external broker")
	fs.StringVar(&c.ClientID, "mqtt-client-id", c.ClientID, "the bridge's client id on the external broker (default devicebridge-<random>)")
	fs.StringVar(&c.TLS.CAFile, "mqtt-ca-file", c.TLS.CAFile, "PEM CA bundle for a TLS external broker")
	fs.StringVar(&c.UDP.Listen, "mqtt-udp-listen", c.UDP.Listen, "UDP address accepting board audio")
	fs.StringVar(&c.UDP.Advertise, "mqtt-udp-advertise", c.UDP.Advertise, "UDP host[:port] handed to boards in the server hello (default: derived)")
	fs.Func("mqtt-user", "embedded broker: accept a board presenting USER:PASSWORD (repeatable)", func(v string) error {
		u, p, ok := strings.Cut(v, ":")
		if !ok || u == "" || p == "" {
			return errors.New("want USER:PASSWORD")
		}
		c.Auth.Users = append(c.Auth.Users, broker.User{Username: u, Password: p})
		return nil
	})
	fs.StringVar(&c.Auth.HMACSecret, "mqtt-hmac-secret", c.Auth.HMACSecret, "embedded broker: accept boards whose password is base64(HMAC-SHA256(secret, client_id|username))")
	fs.Func("mqtt-allow-anonymous", "embedded broker: admit boards without credentials (default: only when no credentials are configured)", func(v string) error {
		b, err := parseBool(v)
		if err != nil {
			return err
		}
		c.Auth.AllowAnonymous = &b
		return nil
	})
	fs.BoolVar(&c.Auth.AllowAnyClientID, "mqtt-allow-any-client-id", c.Auth.AllowAnyClientID, "embedded broker: admit client ids not of the form GID_xxx@@@<mac>@@@<uuid> (the id becomes the device id)")
}

func parseBool(v string) (bool, error) {
	switch strings.ToLower(v) {
	case "1", "t", "true", "yes", "on":
		return true, nil
	case "0", "f", "false", "no", "off":
		return false, nil
	}
	return false, fmt.Errorf("%q is not a boolean", v)
}

// mqttSide is what startMQTT built, for the accessors below.
type mqttSide struct {
	broker  *broker.Broker
	gateway *mqtt.Gateway
}

func (a *App) mqttSide() *mqttSide {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.mqtt == nil {
		return &mqttSide{}
	}
	return a.mqtt
}

// MQTTBroker returns the embedded broker, or nil when none runs.
func (a *App) MQTTBroker() *broker.Broker { return a.mqttSide().broker }

// MQTTGateway returns the MQTT gateway, or nil when MQTT is off.
func (a *App) MQTTGateway() *mqtt.Gateway { return a.mqttSide().gateway }

// MQTTAddr is the embedded broker's bound address (useful with port 0),
// or nil when none runs.
func (a *App) MQTTAddr() net.Addr {
	if b := a.MQTTBroker(); b != nil {
		return b.Addr()
	}
	return nil
}

// portInUseMessage says what happened when the embedded broker's port is
// taken, and the two ways out.
func portInUseMessage(listen string) string {
	port := "1883"
	if _, p, err := net.SplitHostPort(listen); err == nil && p != "" {
		port = p
	}
	return "MQTT port " + port + " is already in use (often by a system Mosquitto), so the bridge runs WITHOUT its embedded MQTT broker; " +
		"WebSocket boards are unaffected. Fix 1, use that broker: --mqtt-broker tcp://127.0.0.1:" + port +
		" (it must deliver downlink to boards that never subscribe; see docs/mqtt.md). " +
		"Fix 2, move the embedded broker: --mqtt-listen :1884 (and give boards that port in their OTA mqtt.endpoint)."
}

// startMQTT starts the embedded broker (unless an external one is
// configured) and the gateway, and registers their shutdown: the gateway
// first (boards get their goodbyes while the broker still runs), then the
// broker.
func (a *App) startMQTT(ctx context.Context) error {
	c := a.cfg.MQTT
	if !c.enabled() {
		return nil
	}
	log := a.Logger().Named("mqtt")
	tlsCfg, err := c.TLS.Build()
	if err != nil {
		return err
	}
	gw := mqtt.Config{
		Broker:               c.Broker,
		ClientID:             c.ClientID,
		Username:             c.Username,
		Password:             c.Password,
		TLS:                  tlsCfg,
		Topics:               c.Topics,
		KeepAlive:            c.KeepAlive,
		ConnectTimeout:       c.ConnectTimeout,
		MaxReconnectInterval: c.MaxReconnectInterval,
		MaxMessageSize:       c.MaxMessageSize,
		UDP:                  c.UDP,
		Liveness:             c.Liveness,
		RecoverWindow:        c.RecoverWindow,
	}
	side := &mqttSide{}
	var presence mqtt.Presence
	if c.Broker == "" {
		b, err := broker.New(broker.Config{
			Listen: c.Listen, Topics: c.Topics, Auth: c.Auth, MaxPacketSize: c.MaxPacketSize,
		}, log.Named("broker"))
		if err != nil {
			return err
		}
		if err := b.Start(); err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				// Common: a system Mosquitto already owns 1883. Dying here
				// would take the WebSocket side down with it.
				log.Warn(portInUseMessage(c.Listen), zap.String("listen", c.Listen), zap.Error(err))
				return nil
			}
			return fmt.Errorf("embedded MQTT broker: %w", err)
		}
		a.onShutdown(func(context.Context) { _ = b.Close() })
		creds := b.GatewayCredentials()
		gw.Broker, gw.ClientID, gw.Username, gw.Password, gw.TLS = creds.URL, creds.ClientID, creds.Username, creds.Password, nil
		side.broker, presence = b, b
	}
	g, err := mqtt.NewGateway(gw, a.Hub, presence, log.Named("gateway"))
	if err != nil {
		return err
	}
	if err := g.Start(); err != nil {
		return err
	}
	side.gateway = g
	a.mu.Lock()
	a.mqtt = side
	a.mu.Unlock()
	a.onShutdown(func(context.Context) {
		g.Close()
		a.mu.Lock()
		a.mqtt = nil
		a.mu.Unlock()
	})

	wctx, cancel := context.WithTimeout(ctx, gw.WithDefaults().ConnectTimeout)
	defer cancel()
	if err := g.WaitReady(wctx); err != nil {
		if side.broker != nil {
			// The broker runs in this process; failing to reach it is a bug
			// or a broken loopback, not a transient condition.
			return fmt.Errorf("gateway could not reach the embedded broker: %w", err)
		}
		log.Warn("external MQTT broker not reachable yet; the bridge keeps retrying in the background", zap.Error(err))
	}
	return nil
}
