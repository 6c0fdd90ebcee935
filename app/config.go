package app

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/devicebridge/devicebridge/api"
	"github.com/devicebridge/devicebridge/cluster"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/frontdoor"
	"github.com/devicebridge/devicebridge/mcpserver"
	"github.com/devicebridge/devicebridge/ota"
	"github.com/devicebridge/devicebridge/simulator"
	"github.com/devicebridge/devicebridge/tracing"
	"github.com/devicebridge/devicebridge/voice"
	"github.com/devicebridge/devicebridge/ws"
)

// Config is the whole bridge configuration. configs/bridge.yaml documents
// every field; flags override the file.
type Config struct {
	// DeviceListen is where boards connect over WebSocket.
	DeviceListen string `yaml:"device_listen"`
	// ControlListen serves the control API and /mcp. Loopback by default:
	// whoever reaches it can drive every board.
	ControlListen string         `yaml:"control_listen"`
	Log           LogConfig      `yaml:"log"`
	WebSocket     ws.Config      `yaml:"websocket"`
	Devices       DevicesConfig  `yaml:"devices"`
	Control       ControlConfig  `yaml:"control"`
	Simulate      SimulateConfig `yaml:"simulate"`
	MQTT          MQTTConfig     `yaml:"mqtt"`
	MCP           MCPConfig      `yaml:"mcp"`
	Flow          FlowConfig     `yaml:"flow"`
	OTA           OTAConfig      `yaml:"ota"`
	Voice         VoiceConfig    `yaml:"voice"`
	TLS           TLSConfig      `yaml:"tls"`
	Auth          AuthConfig     `yaml:"auth"`
	Tracing       tracing.Config `yaml:"tracing"`
	Cluster       ClusterConfig  `yaml:"cluster"`
	// HTTP bounds the HTTP listeners (http.go).
	HTTP HTTPConfig `yaml:"http"`
	// ShutdownTimeout bounds the ordered shutdown.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// DebugListen serves net/http/pprof on a listener of its own; "" (the
	// default) turns it off. Loopback only unless DebugAllowRemote.
	DebugListen      string `yaml:"debug_listen"`
	DebugAllowRemote bool   `yaml:"debug_allow_remote"`

	// mqttAsked records that the command line or the file set mqtt.listen
	// or mqtt.broker (ParseArgs): MQTT was asked for, even at the default
	// address. See mqttRequested.
	mqttAsked bool
}

// LogConfig selects the zap encoder and level, and bounds the log
// (logging.go).
type LogConfig struct {
	Format   string      `yaml:"format"` // console or json
	Level    string      `yaml:"level"`  // debug, info, warn, error
	Sampling LogSampling `yaml:"sampling"`
}

// DevicesConfig tunes how the bridge talks MCP to every board.
type DevicesConfig struct {
	// WithUserTools lists user-only tools too (they are marked as such).
	WithUserTools  bool                     `yaml:"with_user_tools"`
	RequestTimeout time.Duration            `yaml:"request_timeout"`
	CallTimeout    time.Duration            `yaml:"call_timeout"`
	ToolTimeouts   map[string]time.Duration `yaml:"tool_timeouts"`
	InitTimeout    time.Duration            `yaml:"init_timeout"`
	ReadyWait      time.Duration            `yaml:"ready_wait"`
	QueueSize      int                      `yaml:"queue_size"`
	MaxPages       int                      `yaml:"max_pages"`
	MaxTools       int                      `yaml:"max_tools"`
	// MaxCatalogBytes bounds a board's tools/list replies, pages together.
	MaxCatalogBytes int `yaml:"max_catalog_bytes"`
	// PeerMaxPending bounds a voice upstream's MCP requests in a board's
	// queue at once (device.HubConfig.PeerMaxPending).
	PeerMaxPending int `yaml:"peer_max_pending"`
	// ToolLimits bound what a board may declare about each tool; a tool
	// past them is refused (device.ToolLimits).
	ToolLimits device.ToolLimits `yaml:"tool_limits"`
	// MaxProbes bounds liveness probes of idle boards in flight across the
	// bridge (device.HubConfig.MaxProbes); 0 means device.DefaultMaxProbes.
	MaxProbes int `yaml:"max_probes"`
	// Vision is handed to camera boards in initialize.
	Vision *device.Vision `yaml:"vision"`
	// Flapping stops two live connections that keep replacing each other
	// under one device id (a cloned MAC).
	Flapping device.FlapPolicy `yaml:"flapping"`
}

// ControlConfig secures the control listener (the control API, /mcp and
// the console; front.go).
type ControlConfig struct {
	Tokens []string `yaml:"tokens"`
	// AllowedOrigins are the browser origins admitted besides the
	// listener's own (the console): exact origins, scheme://host:* or *.
	AllowedOrigins []string `yaml:"allowed_origins"`
	// AllowedHosts are the DNS names clients reach the listener by,
	// besides localhost and auth.public_url's host; any other name in Host
	// is refused (DNS rebinding).
	AllowedHosts []string `yaml:"allowed_hosts"`
	// EventsReplay is how many recent events the bridge keeps so that an
	// /api/events client that reconnects with Last-Event-ID gets what it
	// missed; 0 keeps none (every resume starts with a resync).
	EventsReplay int `yaml:"events_replay"`
	// MaxBodyBytes bounds the body of a control API request (a call, an
	// interaction step, an approval); past it 413.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
}

// VoiceConfig is the voice relay's section: boards keep the assistant of
// the user's own voice server (the upstream) while the bridge drives their
// tools. voice.go wires the relay (voice.Config), ota.go the OTA
// pass-through.
type VoiceConfig struct {
	voice.Config `yaml:",inline"`
	// UpstreamOTA is the upstream's OTA endpoint (http or https, e.g.
	// http://host:8002/xiaozhi/ota/); "" passes nothing through.
	UpstreamOTA string `yaml:"upstream_ota"`
	// OTATimeout bounds one call to it; past it the board gets the
	// bridge's own answer.
	OTATimeout time.Duration `yaml:"ota_timeout"`
	// OTAMaxInFlight bounds the calls to it at once.
	OTAMaxInFlight int `yaml:"ota_max_in_flight"`
}

// DefaultEventsReplay is control.events_replay's default.
const DefaultEventsReplay = 1024

// SimulateConfig starts simulated boards inside the bridge process.
type SimulateConfig struct {
	Count   int    `yaml:"count"`
	Profile string `yaml:"profile"`
}

// validate loads the profile, so that a bad name or file stops the bridge
// before anything listens.
func (c SimulateConfig) validate() error {
	if c.Count <= 0 {
		return nil
	}
	if _, err := simulator.LoadProfile(c.Profile); err != nil {
		return fmt.Errorf("simulate.profile (--simulate-profile): %s", strings.TrimPrefix(err.Error(), "simulator: "))
	}
	return nil
}

// defaultDevicesConfig spells out every default of the devices: section,
// so that a 0 written in a file is the user's and can be refused.
func defaultDevicesConfig() DevicesConfig {
	return DevicesConfig{
		WithUserTools:   true,
		RequestTimeout:  device.DefaultRequestTimeout,
		CallTimeout:     device.DefaultCallTimeout,
		ToolTimeouts:    device.DefaultToolTimeouts(),
		InitTimeout:     device.DefaultInitTimeout,
		ReadyWait:       device.DefaultReadyWait,
		QueueSize:       device.DefaultQueueSize,
		MaxPages:        device.DefaultMaxPages,
		MaxTools:        device.DefaultMaxTools,
		MaxProbes:       device.DefaultMaxProbes,
		MaxCatalogBytes: device.DefaultMaxCatalogBytes,
		PeerMaxPending:  device.DefaultPeerMaxPending,
		ToolLimits:      device.ToolLimits{}.WithDefaults(),
		Flapping: device.FlapPolicy{Limit: device.DefaultFlapLimit, Window: device.DefaultFlapWindow,
			Backoff: device.DefaultFlapBackoff},
	}
}

// Default returns the configuration used when no file or flag says
// otherwise: it runs with no config file at all. Its state (ota.data_dir)
// is in memory, so that a test or a program embedding the bridge writes
// nowhere; ParseArgs, the command line, keeps it in DefaultDataDir unless
// told otherwise.
func Default() Config {
	return Config{
		DeviceListen:  "0.0.0.0:8000",
		ControlListen: "127.0.0.1:8080",
		Log:           defaultLogConfig(),
		WebSocket:     ws.Config{}.WithDefaults(),
		Devices:       defaultDevicesConfig(),
		Control: ControlConfig{EventsReplay: DefaultEventsReplay, MaxBodyBytes: api.DefaultMaxBodyBytes,
			AllowedOrigins: slices.Clone(frontdoor.DefaultAllowedOrigins)},
		Simulate: SimulateConfig{Profile: "breadboard"},
		MQTT:     defaultMQTTConfig(),
		MCP:      defaultMCPConfig(),
		Flow:     defaultFlowConfig(),
		OTA:      defaultOTAConfig(),
		Voice: VoiceConfig{Config: voice.Config{}.WithDefaults(),
			OTATimeout: ota.DefaultUpstreamTimeout, OTAMaxInFlight: ota.DefaultUpstreamMaxInFlight},
		Auth:            defaultAuthConfig(),
		Tracing:         tracing.Config{SampleRatio: 1, FlushInterval: tracing.DefaultFlushInterval},
		Cluster:         ClusterConfig{OfflineAfter: cluster.DefaultOfflineAfter},
		ShutdownTimeout: 10 * time.Second,
		HTTP:            defaultHTTPConfig(),
	}
}

// LoadFile merges a YAML file into cfg. Unknown keys are errors, so a typo
// does not silently fall back to a default.
func LoadFile(path string, cfg *Config) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	// An empty file decodes as io.EOF: nothing to change.
	if err := dec.Decode(cfg); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("config %s: %w", path, err)
	}
	return nil
}

// Validate reports configuration mistakes in words a user can act on.
func (c Config) Validate() error {
	var errs []error
	for _, l := range []struct{ key, addr string }{{"device_listen", c.DeviceListen}, {"control_listen", c.ControlListen}} {
		if _, port, err := net.SplitHostPort(l.addr); err != nil || port == "" {
			errs = append(errs, fmt.Errorf("%s %q: use host:port, e.g. 127.0.0.1:8080 or :8000", l.key, l.addr))
		}
	}
	switch c.Log.Format {
	case "console", "json":
	default:
		errs = append(errs, fmt.Errorf("log.format %q: use console or json", c.Log.Format))
	}
	if err := c.WebSocket.Validate(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.checkNumbers()...)
	if err := c.Simulate.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.MQTT.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Voice.Config.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.MQTT.SharedBroker && c.Cluster.NATSURL == "" {
		errs = append(errs, errors.New("mqtt.shared_broker needs a fleet (cluster.nats_url, --nats): the nodes decide through it who serves which board"))
	}
	if err := c.MCP.validate(); err != nil {
		errs = append(errs, err)
	}
	if !c.MCP.Enabled {
		// The console, the control API and the policy use the aliases
		// even without /mcp (whose validate checks them otherwise).
		if _, err := mcpserver.ParseAliases(c.MCP.Aliases); err != nil {
			errs = append(errs, err)
		}
	}
	if c.MCP.Enabled {
		if err := c.Flow.validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := c.HTTP.validate(c.WebSocket.WithDefaults().MaxConnections); err != nil {
		errs = append(errs, err)
	}
	if err := c.validateDebug(); err != nil {
		errs = append(errs, err)
	}
	if c.OTA.Enabled && c.OTA.Balance != "" && c.Cluster.NATSURL == "" {
		errs = append(errs, fmt.Errorf("ota.balance %q spreads boards over a fleet: set cluster.nats_url (--nats) too, or leave ota.balance empty", c.OTA.Balance))
	}
	errs = append(errs, c.validateFront(), c.OTA.validate(), c.validateVoiceOTA(), c.TLS.validate(), c.Auth.validate(), c.Tracing.Validate(), c.Cluster.validate())
	return errors.Join(errs...)
}

// hubConfig derives the device Hub configuration.
func (c Config) hubConfig(version string) device.HubConfig {
	d := c.Devices
	return device.HubConfig{
		Client: device.ClientOptions{
			ClientName:     "devicebridge",
			ClientVersion:  version,
			Vision:         d.Vision,
			WithUserTools:  d.WithUserTools,
			MaxPages:       d.MaxPages,
			MaxTools:       d.MaxTools,
			MaxListBytes:   d.MaxCatalogBytes,
			RequestTimeout: d.RequestTimeout,
			CallTimeout:    d.CallTimeout,
			ToolTimeouts:   d.ToolTimeouts,
			QueueSize:      d.QueueSize,
		},
		ToolLimits:  d.ToolLimits,
		InitTimeout: d.InitTimeout,
		ReadyWait:   d.ReadyWait,
		Flapping:    d.Flapping,
		MaxProbes:   d.MaxProbes,
		// The voice upstream's requests at once per board (device/peer.go).
		PeerMaxPending: d.PeerMaxPending,
		// The Hub keeps the history: its events carry the seqs /api/events
		// resumes from.
		EventHistory: c.Control.EventsReplay,
	}
}

// RegisterFlags binds the command-line flags to cfg. Parse the flags after
// loading the file (see ParseArgs) so that flags override it.
func RegisterFlags(fs *flag.FlagSet, cfg *Config) {
	fs.StringVar(&cfg.DeviceListen, "device-listen", cfg.DeviceListen, "address boards connect to over WebSocket")
	fs.StringVar(&cfg.ControlListen, "control-listen", cfg.ControlListen, "address of the control API and /mcp (keep it private)")
	fs.StringVar(&cfg.Log.Format, "log-format", cfg.Log.Format, "log format: console or json")
	fs.StringVar(&cfg.Log.Level, "log-level", cfg.Log.Level, "log level: debug, info, warn, error")
	fs.Var(stringList{&cfg.WebSocket.Tokens}, "device-token", "accepted device token (repeatable); none means no device auth")
	fs.BoolVar(&cfg.WebSocket.AllowAnyDeviceID, "allow-any-device-id", cfg.WebSocket.AllowAnyDeviceID, "admit WebSocket boards whose Device-Id is not a MAC (test rigs; firmware always sends its MAC)")
	fs.Var(stringList{&cfg.Control.Tokens}, "control-token", "bearer token required on /api (repeatable)")
	registerFrontFlags(fs, &cfg.Control)
	fs.IntVar(&cfg.Simulate.Count, "simulate", cfg.Simulate.Count, "also start N simulated boards in-process")
	fs.StringVar(&cfg.Simulate.Profile, "simulate-profile", cfg.Simulate.Profile, "profile of the simulated boards (breadboard, catalog, conformance, conformance-tasks, robot or a file)")
	fs.BoolVar(&cfg.Devices.WithUserTools, "with-user-tools", cfg.Devices.WithUserTools, "list boards' user-only tools too")
	fs.DurationVar(&cfg.Devices.CallTimeout, "call-timeout", cfg.Devices.CallTimeout, "default tools/call timeout (0 = 30s)")
	fs.Var(toolTimeoutFlag{&cfg.Devices.ToolTimeouts}, "tool-timeout",
		"TOOL=DURATION: the timeout of one board tool, up to 5m, e.g. self.upgrade_firmware=300s (repeatable); longer than --call-timeout makes it a task tool")
	registerMQTTFlags(fs, &cfg.MQTT)
	registerMCPFlags(fs, &cfg.MCP)
	registerVoiceFlags(fs, &cfg.Voice)
	registerFlowFlags(fs, &cfg.Flow)
	registerDebugFlags(fs, cfg)
	registerHTTPFlags(fs, &cfg.HTTP)
	registerOTAFlags(fs, &cfg.OTA, &cfg.TLS)
	registerVoiceOTAFlags(fs, &cfg.Voice)
	registerAuthFlags(fs, &cfg.Auth)
	registerClusterFlags(fs, &cfg.Cluster)
	fs.StringVar(&cfg.Tracing.OTLPEndpoint, "otlp-endpoint", cfg.Tracing.OTLPEndpoint, "export OpenTelemetry traces of /mcp calls to this OTLP/HTTP collector (http://host:4318); default off")
}

// ParseArgs builds the configuration from defaults, an optional --config
// file and flags, in that order of precedence (flags win).
func ParseArgs(name string, args []string) (Config, error) {
	// The flag package reads the command line, twice when there is a
	// file: first over the defaults, to find --config (and to report a bad
	// command line), then over the file's values, so that flags win.
	// Replaying only the flags that were set would not do: a repeatable
	// flag (--device-token, --mqtt-user) keeps no record of its uses.
	cfg := Default()
	fs, version := newFlagSet(name, &cfg)
	if err := parseFlags(fs, args); err != nil {
		return cfg, err
	}
	var fileKeys map[string]bool
	if path := fs.Lookup("config").Value.String(); path != "" {
		cfg = Default()
		if err := LoadFile(path, &cfg); err != nil {
			return cfg, err
		}
		fileKeys = keysInFile(path)
		fs, version = newFlagSet(name, &cfg)
		if err := parseFlags(fs, args); err != nil {
			return cfg, err
		}
	}
	if *version {
		return cfg, ErrVersion
	}
	set := explicitSettings(fs, fileKeys)
	cfg.mqttAsked = set("mqtt-listen", "mqtt.listen") || set("mqtt-broker", "mqtt.broker")
	if cfg.OTA.Enabled && !set("data-dir", "ota.data_dir") {
		// State survives a restart unless the user asks otherwise
		// (--data-dir ''). Without a home directory it stays in memory,
		// and the OTA server warns.
		if dir, err := DefaultDataDir(cfg.Cluster.NodeID); err == nil {
			cfg.OTA.DataDir = dir
		}
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	return cfg, cfg.Validate()
}

// explicitSettings says whether the user set a setting, by its flag or its
// key in the file (fileKeys, from keysInFile), as opposed to leaving the
// default.
func explicitSettings(fs *flag.FlagSet, fileKeys map[string]bool) func(flagName, key string) bool {
	flags := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { flags[f.Name] = true })
	return func(flagName, key string) bool { return flags[flagName] || fileKeys[key] }
}

// keysInFile lists the keys a YAML config file sets, as dotted paths
// (mqtt.listen); an unreadable file has none (LoadFile reports it).
func keysInFile(path string) map[string]bool {
	keys := map[string]bool{}
	data, err := os.ReadFile(path)
	if err != nil {
		return keys
	}
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil {
		return keys
	}
	var walk func(n *yaml.Node, prefix string)
	walk = func(n *yaml.Node, prefix string) {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, prefix)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				key := join(prefix, n.Content[i].Value)
				keys[key] = true
				walk(n.Content[i+1], key)
			}
		}
	}
	walk(&doc, "")
	return keys
}

// mqttRequested says whether the user asked for MQTT: an external broker,
// an embedded broker on another address than the default, or mqtt.listen
// or mqtt.broker set explicitly (mqttAsked). Only MQTT nobody asked for
// (the default embedded broker) may be off without failing /readyz.
func (c Config) mqttRequested() bool {
	return c.mqttAsked || c.MQTT.Broker != "" || c.MQTT.Listen != DefaultMQTTListen
}

// newFlagSet is the bridge's command line bound to cfg: --config,
// --version and RegisterFlags.
func newFlagSet(name string, cfg *Config) (*flag.FlagSet, *bool) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.String("config", "", "YAML config file (see configs/bridge.yaml)")
	version := fs.Bool("version", false, "print the version and exit")
	RegisterFlags(fs, cfg)
	return fs, version
}

// ErrVersion is returned by ParseArgs for --version.
var ErrVersion = errors.New("version requested")

// stringList is a repeatable string flag; each use adds to the list the
// file set.
// toolTimeoutFlag parses repeatable TOOL=DURATION pairs into
// devices.tool_timeouts (the range is checked with the rest of the
// config).
type toolTimeoutFlag struct{ m *map[string]time.Duration }

func (f toolTimeoutFlag) String() string {
	if f.m == nil || *f.m == nil {
		return ""
	}
	parts := make([]string, 0, len(*f.m))
	for k, v := range *f.m {
		parts = append(parts, k+"="+v.String())
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func (f toolTimeoutFlag) Set(v string) error {
	tool, d, ok := strings.Cut(v, "=")
	tool = strings.TrimSpace(tool)
	if !ok || tool == "" {
		return fmt.Errorf("want TOOL=DURATION (e.g. self.upgrade_firmware=300s), got %q", v)
	}
	dur, err := time.ParseDuration(strings.TrimSpace(d))
	if err != nil {
		return fmt.Errorf("want TOOL=DURATION (e.g. self.upgrade_firmware=300s), got %q: %v", v, err)
	}
	if *f.m == nil {
		*f.m = map[string]time.Duration{}
	}
	(*f.m)[tool] = dur
	return nil
}

type stringList struct{ p *[]string }

func (s stringList) String() string {
	if s.p == nil {
		return ""
	}
	return strings.Join(*s.p, ",")
}

func (s stringList) Set(v string) error {
	*s.p = append(*s.p, v)
	return nil
}
