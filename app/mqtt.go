package app

// This file wires the MQTT side: an embedded broker (default) or an
// external one, and the gateway that turns MQTT boards into device
// sessions. docs/mqtt.md explains the three broker setups.

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"strings"
	"syscall"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/mqtt"
	"github.com/devicebridge/devicebridge/mqtt/broker"
)

// DefaultMQTTListen is where the embedded broker listens unless told
// otherwise: the standard MQTT port, where boards are usually pointed.
const DefaultMQTTListen = broker.DefaultListen

// DefaultPluginUsername is the bridge's username on a Mosquitto with the
// devicebridge plugin when mqtt.username is empty (the plugin's
// plugin_opt_bridge_username).
const DefaultPluginUsername = "devicebridge"

// MQTTConfig configures the MQTT side. With Broker empty the bridge runs
// its own broker on Listen; with Broker set it connects to that broker
// instead and Listen is ignored. With both empty MQTT is off.
//
// It is the gateway's and the embedded broker's own configs, embedded with
// their yaml keys inlined under "mqtt" (listen, broker, topics, auth, udp,
// liveness, ...): a field added to either is configurable at once. The
// broker takes its topics from the gateway's, so both always agree.
//
//   - Listen (embedded broker) is where boards connect (":1883"); "" turns
//     it off. If the port is already taken (often by a system Mosquitto)
//     the bridge logs what happened and how to fix it, and runs without
//     MQTT instead of failing: the WebSocket side keeps working.
//   - Broker (gateway) is an external broker URL (tcp://host:1883,
//     ssl://host:8883, ws://, wss://). Boards must then publish to their
//     own uplink topic and the broker must deliver downlink to them (see
//     docs/mqtt.md). Username, Password, ClientID and TLS are the bridge's
//     own on that broker.
//   - SharedBroker says that every node of the fleet (cluster.nats_url)
//     connects to this one external Broker: each board is then held by
//     exactly one node, claimed in the fleet directory when first heard,
//     and adopted by a survivor when its node dies or stops. Without it,
//     each node serves every board it hears (right for the embedded broker
//     or a broker per node).
type MQTTConfig struct {
	GatewayConfig `yaml:",inline"`
	BrokerConfig  `yaml:",inline"`
	SharedBroker  bool `yaml:"shared_broker"`
}

// The component configs MQTTConfig embeds. Aliases give the embedded
// fields distinct names (both types are called Config) while keeping their
// fields promoted: cfg.MQTT.Listen, cfg.MQTT.Broker, cfg.MQTT.Liveness.
type (
	// GatewayConfig is the MQTT gateway's configuration.
	GatewayConfig = mqtt.Config
	// BrokerConfig is the embedded broker's configuration.
	BrokerConfig = broker.Config
)

func defaultMQTTConfig() MQTTConfig {
	return MQTTConfig{
		GatewayConfig: mqtt.Config{}.WithDefaults(),
		BrokerConfig:  broker.Config{Listen: DefaultMQTTListen}.WithDefaults(),
	}
}

// gateway is the gateway's config, as the file and flags left it. It
// takes which board ids to accept from mqtt.auth.allow_any_client_id, so
// that the embedded broker and the gateway (or an external broker's topic
// keys) follow one rule.
func (c MQTTConfig) gateway() mqtt.Config {
	g := c.GatewayConfig
	g.AllowAnyDeviceID = c.Auth.AllowAnyClientID
	return g
}

// embeddedBroker is the embedded broker's config, with the gateway's
// topics, board limits and per-board queue: the broker enforces them where
// boards publish.
func (c MQTTConfig) embeddedBroker() broker.Config {
	b := c.BrokerConfig
	b.Topics = c.GatewayConfig.Topics
	b.BoardLimits = c.GatewayConfig.BoardLimits
	b.BoardQueue = c.GatewayConfig.InboxSize
	return b
}

func (c MQTTConfig) enabled() bool { return c.Broker != "" || c.Listen != "" }

func (c MQTTConfig) validate() error {
	if !c.enabled() {
		return nil
	}
	gw := c.gateway()
	gw.Topics = gw.Topics.WithDefaults() // as the gateway will see them
	var errs []error
	if c.Broker != "" {
		if err := gw.Validate(); err != nil {
			errs = append(errs, err)
		}
	} else {
		if _, _, err := net.SplitHostPort(c.Listen); err != nil {
			errs = append(errs, fmt.Errorf("mqtt.listen %q: want host:port (or \"\" to disable)", c.Listen))
		}
		// The embedded broker's URL is known only once it runs; check the
		// rest of the gateway's settings with a stand-in.
		gw.Broker = "tcp://127.0.0.1:1883"
		if err := gw.Validate(); err != nil {
			errs = append(errs, err)
		}
		// The broker's own keys; topics and board limits are the gateway's,
		// checked above.
		bc := c.embeddedBroker()
		bc.Topics, bc.BoardLimits = mqtt.DefaultTopics(), mqtt.BoardLimits{}
		if err := bc.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Downlink != "" && c.Downlink != mqtt.DownlinkSubscribe && c.Broker == "" {
		errs = append(errs, fmt.Errorf("mqtt.downlink %s needs mqtt.broker: the embedded broker reaches boards itself", c.Downlink))
	}
	if c.SharedBroker && c.Broker == "" {
		errs = append(errs, errors.New("mqtt.shared_broker needs mqtt.broker: the embedded broker is each node's own"))
	}
	if c.MaxPacketSize < 0 {
		errs = append(errs, errors.New("mqtt.max_packet_size must not be negative"))
	}
	if _, err := c.TLS.Build(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func registerMQTTFlags(fs *flag.FlagSet, c *MQTTConfig) {
	fs.StringVar(&c.Listen, "mqtt-listen", c.Listen, `address of the embedded MQTT broker ("" disables it)`)
	fs.StringVar(&c.Broker, "mqtt-broker", c.Broker, "use this external MQTT broker instead of the embedded one (tcp://host:1883, ssl://host:8883)")
	fs.BoolVar(&c.SharedBroker, "mqtt-shared-broker", c.SharedBroker, "every node of the fleet uses this one --mqtt-broker: each board is served by exactly one node, and moves to a survivor when its node goes (needs --nats)")
	fs.StringVar(&c.Downlink, "mqtt-downlink", c.Downlink, "how the bridge reaches boards on --mqtt-broker: subscribe (boards or the broker subscribe them), mosquitto-plugin (Mosquitto with deploy/mosquitto/devicebridge.so: boards that never subscribe, firmware 1.0+), emqx-autosubscribe")
	fs.StringVar(&c.Username, "mqtt-username", c.Username, "the bridge's username on the external broker")
	fs.StringVar(&c.Password, "mqtt-password", c.Password, "the bridge's password on the external broker")
	fs.StringVar(&c.ClientID, "mqtt-client-id", c.ClientID, "the bridge's client id on the external broker (default devicebridge-<random>)")
	fs.StringVar(&c.TLS.CAFile, "mqtt-ca-file", c.TLS.CAFile, "PEM CA bundle for a TLS external broker")
	fs.StringVar(&c.UDP.Listen, "mqtt-udp-listen", c.UDP.Listen, "UDP address accepting board audio")
	fs.StringVar(&c.UDP.Advertise, "mqtt-udp-advertise", c.UDP.Advertise, "UDP host[:port] handed to boards in the server hello (default: derived)")
	fs.Float64Var(&c.GatewayConfig.BoardLimits.Rate, "mqtt-board-rate", c.GatewayConfig.BoardLimits.Rate, "messages per second one board may publish, sustained; the excess is dropped")
	fs.IntVar(&c.GatewayConfig.BoardLimits.Burst, "mqtt-board-burst", c.GatewayConfig.BoardLimits.Burst, "messages one board may publish at once above --mqtt-board-rate")
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
	fs.BoolVar(&c.Auth.AllowAnyClientID, "mqtt-allow-any-client-id", c.Auth.AllowAnyClientID, "admit MQTT boards not named by a MAC: client ids not of the form GID_xxx@@@<mac>@@@<uuid> (embedded broker) and uplink topic keys (any broker); the id becomes the device id")
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
// taken, what it means for /readyz (requested: the user asked for MQTT),
// and the two ways out.
func portInUseMessage(listen string, requested bool) string {
	port := "1883"
	if _, p, err := net.SplitHostPort(listen); err == nil && p != "" {
		port = p
	}
	ready := "/readyz still passes, with mqtt reported as degraded, since MQTT was left at its defaults. "
	if requested {
		ready = "/readyz fails (mqtt) until the bridge runs with MQTT, since mqtt.listen was set. "
	}
	return "MQTT port " + port + " is already in use (often by a system Mosquitto), so the bridge runs WITHOUT its embedded MQTT broker; " +
		"WebSocket boards are unaffected. " + ready +
		"Fix 1, use that broker: --mqtt-broker tcp://127.0.0.1:" + port +
		" (it must deliver downlink to boards that never subscribe; see docs/mqtt.md). " +
		"Fix 2, move the embedded broker: --mqtt-listen :1884 (and give boards that port in their OTA mqtt.endpoint). " +
		"Fix 3, no MQTT: --mqtt-listen \"\"."
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
	gw := c.gateway()
	side := &mqttSide{}
	var presence mqtt.Presence
	if c.Broker == "" {
		bc := c.embeddedBroker()
		if v, required := a.issuedMQTT(); v != nil {
			bc.Issued, bc.RequireCredentials = v, required
		}
		b, err := broker.New(bc, log.Named("broker"))
		if err != nil {
			return err
		}
		if err := b.Start(); err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				// Common: a system Mosquitto already owns 1883. Dying here
				// would take the WebSocket side down with it.
				log.Warn(portInUseMessage(c.Listen, a.cfg.mqttRequested()), zap.String("listen", c.Listen), zap.Error(err))
				a.mu.Lock()
				a.mqttPortTaken = true
				a.mu.Unlock()
				return nil
			}
			return fmt.Errorf("embedded MQTT broker: %w", err)
		}
		a.onShutdown(func(context.Context) { _ = b.Close() })
		creds := b.GatewayCredentials()
		gw.Broker, gw.ClientID, gw.Username, gw.Password, gw.TLS = creds.URL, creds.ClientID, creds.Username, creds.Password, mqtt.TLSConfig{}
		side.broker, presence = b, b
	} else if gw.Downlink == mqtt.DownlinkMosquittoPlugin {
		// The plugin knows the bridge by this username, and derives its
		// password from the credential secret, as the bridge does here.
		gw.Username = cmp.Or(gw.Username, DefaultPluginUsername)
		if gw.Password == "" && a.ota != nil {
			gw.Password = a.ota.BridgeMQTTPassword(gw.Username)
		}
	}
	g, err := mqtt.NewGateway(gw, a.Hub, presence, log.Named("gateway"))
	if err != nil {
		return err
	}
	if c.SharedBroker {
		// The fleet decides which node serves which board; it hands this
		// gateway the boards of nodes that leave.
		if err := g.SetOwner(a.Cluster().ShareBoards(mqtt.TransportName, g.Adopt)); err != nil {
			return err
		}
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
