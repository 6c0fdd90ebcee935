// Command simulator runs one or more simulated xiaozhi-esp32 boards against
// a devicebridge (or any xiaozhi-compatible) server.
//
//	simulator --url ws://127.0.0.1:8000/xiaozhi/v1/ --profile robot --count 50 --token secret
//	simulator --ota http://127.0.0.1:8000/xiaozhi/ota/   # boot like a real board
//	simulator --converse 50 --converse-every 30s          # talk: 3 s of audio, every 30 s
//
// Each board connects over WebSocket like real firmware, answers MCP
// requests from its profile's tools, and reconnects with backoff when the
// connection ends. With --converse it also holds voice conversations (listen
// start, Opus-framed uplink packets, the server's stt/tts and audio), each
// summed up in one info line. SIGINT or SIGTERM closes every board and exits.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/devicebridge/devicebridge/configs"
	"github.com/devicebridge/devicebridge/simulator"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	m := &Main{}
	if err := m.ParseFlags(os.Args[1:], os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "simulator:", err)
		os.Exit(2)
	}
	err := m.Run(ctx)
	_ = m.log.Sync()
	if err != nil {
		fmt.Fprintln(os.Stderr, "simulator:", err)
		os.Exit(1)
	}
}

// Main holds the parsed command line.
type Main struct {
	url           string
	profile       string
	count         int
	token         string
	macPrefix     string
	protoVersion  int
	helloTimeout  time.Duration
	reconnect     bool
	reconnectMin  time.Duration
	reconnectMax  time.Duration
	startInterval time.Duration
	statsInterval time.Duration
	// reconnectSummary is how often the fleet sums up reconnects a busy or
	// vanished server explains, in one warning.
	reconnectSummary time.Duration
	toolDelay        map[string]time.Duration
	disconnectOn     map[string]bool
	omitMCP          bool
	omitSessionID    bool
	// hostile makes every board misbehave on purpose (flags --hostile-*).
	hostile                  simulator.Hostile
	hostileDeep, hostileWide int
	logFormat                string
	logLevel                 string
	log                      *zap.Logger
	// statsLog carries the fleet counters. It logs at info level whatever
	// --log-level says: --stats-interval is an explicit request for them,
	// and load runs typically use --log-level warn to silence per-board
	// chatter, which would otherwise hide the counters too.
	statsLog *zap.Logger
	// mqtt selects the MQTT transport when its Endpoint is set.
	mqtt simulator.MQTTConfig
	// ota, when set, boots every board through this OTA URL: the answer
	// picks the transport and carries the credentials.
	ota string
	// converse is the uplink packets per conversation turn (0: no
	// conversations); conv holds the other --converse-* flags.
	converse      int
	converseEvery time.Duration
	conv          simulator.ConverseOptions
}

// ParseFlags parses args into m and builds the logger.
func (m *Main) ParseFlags(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("simulator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	m.toolDelay = map[string]time.Duration{}
	m.disconnectOn = map[string]bool{}

	m.registerTransportFlags(fs)

	// Boards.
	fs.StringVar(&m.profile, "profile", "breadboard", "board profile: "+strings.Join(configs.ProfileNames(), ", ")+", or a YAML file path")
	fs.IntVar(&m.count, "count", 1, "number of boards")
	fs.StringVar(&m.macPrefix, "mac-prefix", simulator.DefaultMACPrefix, "leading MAC octets; the rest is the board index (board 1 = <prefix>:..:01)")
	fs.BoolVar(&m.reconnect, "reconnect", true, "reconnect boards whose connection ends")
	fs.DurationVar(&m.reconnectMin, "reconnect-min", simulator.DefaultReconnectMin, "first reconnect delay")
	fs.DurationVar(&m.reconnectMax, "reconnect-max", simulator.DefaultReconnectMax, "largest reconnect delay")
	fs.DurationVar(&m.startInterval, "start-interval", 0, "delay between the first connection of successive boards")
	fs.DurationVar(&m.reconnectSummary, "reconnect-summary", simulator.DefaultSummaryInterval, "how often one warning sums up the reconnects a busy or stopped server explains (each board's own line is at info)")

	// Fault injection.
	fs.Func("tool-delay", "make a tool slow, as name=duration (repeatable)", func(v string) error {
		name, d, err := parseToolDelay(v)
		if err != nil {
			return err
		}
		m.toolDelay[name] = d
		return nil
	})
	fs.Func("disconnect-on", "drop the connection when this tool is called (repeatable)", func(v string) error {
		if v == "" {
			return errors.New("empty tool name")
		}
		m.disconnectOn[v] = true
		return nil
	})
	fs.BoolVar(&m.omitMCP, "no-mcp", false, "behave like a board without MCP (no features.mcp, MCP ignored)")
	fs.BoolVar(&m.omitSessionID, "omit-session-id", false, "leave session_id out of device messages (no real firmware does this)")

	// Hostile boards (docs/reliability.md): test a deployment's defences.
	fs.IntVar(&m.hostileDeep, "hostile-deep-schema", 0, "hostile: also list a tool whose inputSchema nests this many objects")
	fs.IntVar(&m.hostileWide, "hostile-wide-schema", 0, "hostile: also list a tool whose inputSchema has this many properties")
	fs.StringVar(&m.hostile.MACSpelling, "hostile-mac-spelling", "", "hostile: send the MAC spelt "+strings.Join(simulator.MACSpellings, ", ")+" (Device-Id, MQTT client id)")
	fs.IntVar(&m.hostile.FloodOnConnect, "hostile-flood", 0, "hostile: publish this many messages as fast as possible after connecting over MQTT")

	// Conversations: talk to the server's voice side.
	fs.IntVar(&m.converse, "converse", 0, "hold a voice conversation after each connect, sending this many uplink audio packets (0 = no conversations)")
	fs.DurationVar(&m.converseEvery, "converse-every", 0, "repeat the conversation this often while connected (0 = once per connection)")
	fs.StringVar(&m.conv.Mode, "converse-mode", simulator.ModeAuto, "listen mode: auto, manual (push to talk: listen stop after the packets) or realtime")
	fs.StringVar(&m.conv.WakeWord, "wake-word", "", "send listen detect with this wake word before listen start")
	fs.DurationVar(&m.conv.Pace, "converse-pace", 60*time.Millisecond, "interval between uplink packets (60ms is real time, 0 as fast as possible)")
	fs.DurationVar(&m.conv.ReplyTimeout, "converse-timeout", simulator.DefaultReplyTimeout, "how long to wait for the server's answer to end (tts stop)")
	fs.BoolVar(&m.conv.Goodbye, "converse-goodbye", false, "MQTT: close the audio channel (goodbye) after each conversation")

	// Output.
	fs.StringVar(&m.logFormat, "log-format", "console", "log format: console or json")
	fs.StringVar(&m.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.DurationVar(&m.statsInterval, "stats-interval", 10*time.Second, "how often to log fleet counters, whatever --log-level says (0 = never)")

	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if m.converse < 0 || m.converseEvery < 0 {
		return errors.New("--converse and --converse-every must not be negative")
	}
	m.conv.Frames = m.converse
	log, statsLog, err := newLoggers(m.logFormat, m.logLevel, stderr)
	if err != nil {
		return err
	}
	m.log, m.statsLog = log, statsLog
	return nil
}

// registerTransportFlags holds the flags that choose and configure the
// transport: WebSocket (--url) by default, MQTT when --mqtt is given.
func (m *Main) registerTransportFlags(fs *flag.FlagSet) {
	fs.StringVar(&m.ota, "ota", "", "boot like a real board through this OTA URL (http://host:8000/xiaozhi/ota/): the answer picks WebSocket or MQTT and gives the credentials; --url and --mqtt are then ignored")
	fs.StringVar(&m.url, "url", "ws://127.0.0.1:8000/xiaozhi/v1/", "server WebSocket URL")
	fs.StringVar(&m.token, "token", "", "WebSocket token (sent as \"Bearer <token>\" unless it contains a space)")
	fs.IntVar(&m.protoVersion, "protocol-version", 1, "binary protocol version announced to the server (1, 2 or 3)")
	fs.DurationVar(&m.helloTimeout, "hello-timeout", simulator.DefaultHelloTimeout, "how long to wait for the server hello")

	// MQTT: the boards connect to a broker instead, as current firmware
	// does (no SUBSCRIBE), or with --mqtt-legacy as pre-1.0 firmware does.
	fs.StringVar(&m.mqtt.Endpoint, "mqtt", "", "connect over MQTT to this broker (tcp://host:1883, or an OTA endpoint host[:port] where 8883 means TLS) instead of --url")
	fs.StringVar(&m.mqtt.Username, "mqtt-username", "", "MQTT username")
	fs.StringVar(&m.mqtt.Password, "mqtt-password", "", "MQTT password")
	fs.StringVar(&m.mqtt.HMACSecret, "mqtt-hmac-secret", "", "derive each board's MQTT password as base64(HMAC-SHA256(secret, client_id|username))")
	fs.StringVar(&m.mqtt.PublishTopic, "mqtt-publish-topic", simulator.DefaultMQTTPublishTopic, "topic boards publish to; {mac} becomes the board's MAC with _ (use devices/up/{mac} with an external broker)")
	fs.BoolVar(&m.mqtt.Legacy, "mqtt-legacy", false, "behave like firmware before v1.0: subscribe to --mqtt-subscribe-topic")
	fs.StringVar(&m.mqtt.SubscribeTopic, "mqtt-subscribe-topic", "devices/p2p/{mac}", "topic legacy boards subscribe to ({mac} as above)")
	fs.BoolVar(&m.mqtt.HelloOnConnect, "mqtt-hello", false, "open the audio channel (send hello) after connecting over MQTT (also with --ota), so a server behind a plain broker learns of the board")
}

// parseToolDelay splits "name=duration".
func parseToolDelay(v string) (string, time.Duration, error) {
	name, dur, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return "", 0, fmt.Errorf("tool delay %q: want name=duration, e.g. self.lamp.turn_on=2s", v)
	}
	d, err := time.ParseDuration(dur)
	if err != nil || d < 0 {
		return "", 0, fmt.Errorf("tool delay %q: bad duration", v)
	}
	return name, d, nil
}

// newLoggers builds the main logger, at the chosen level, and the stats
// logger, at info level; both write to w.
func newLoggers(format, level string, w io.Writer) (log, stats *zap.Logger, err error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, nil, err
	}
	var enc zapcore.Encoder
	switch format {
	case "console":
		enc = zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig())
	case "json":
		enc = zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	default:
		return nil, nil, fmt.Errorf("log format %q: want console or json", format)
	}
	sink := zapcore.Lock(zapcore.AddSync(w))
	opts := []zap.Option{zap.ErrorOutput(sink), zap.AddCaller()}
	log = zap.New(zapcore.NewCore(enc, sink, lvl), opts...)
	stats = zap.New(zapcore.NewCore(enc.Clone(), sink, zapcore.InfoLevel), opts...)
	return log, stats, nil
}

// Run starts the fleet and blocks until ctx ends (or, without reconnect,
// until every board has gone offline).
func (m *Main) Run(ctx context.Context) error {
	profile, err := simulator.LoadProfile(m.profile)
	if err != nil {
		return err
	}
	fleet, err := simulator.NewFleet(simulator.FleetConfig{
		URL:             m.url,
		Profile:         profile,
		Count:           m.count,
		MACPrefix:       m.macPrefix,
		Token:           m.token,
		Reconnect:       m.reconnect,
		ReconnectMin:    m.reconnectMin,
		ReconnectMax:    m.reconnectMax,
		StartInterval:   m.startInterval,
		SummaryInterval: m.reconnectSummary,
		Board: simulator.Config{
			ProtocolVersion: m.protoVersion,
			HelloTimeout:    m.helloTimeout,
			ToolDelay:       m.toolDelay,
			DisconnectOn:    m.disconnectOn,
			OmitMCPFeature:  m.omitMCP,
			OmitSessionID:   m.omitSessionID,
			Hostile:         m.hostileConfig(),
		},
		Converse:      m.converseOptions(),
		ConverseEvery: m.converseEvery,
		Logger:        m.log,
	})
	if err != nil {
		return err
	}
	server := m.url
	switch {
	case m.ota != "":
		server = m.ota
	case m.mqtt.Endpoint != "":
		server = m.mqtt.Endpoint
	}
	m.log.Info("starting boards",
		zap.String("url", server), zap.String("profile", profile.Name),
		zap.String("board", profile.Board), zap.Int("count", m.count))

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	statsDone := make(chan struct{})
	go func() {
		defer close(statsDone)
		m.logStats(ctx, fleet)
	}()
	switch {
	case m.ota != "":
		err = fleet.RunOTA(ctx, simulator.OTAConfig{URL: m.ota, HelloOnConnect: m.mqtt.HelloOnConnect})
	case m.mqtt.Endpoint != "":
		err = fleet.RunMQTT(ctx, m.mqtt)
	default:
		err = fleet.Run(ctx)
	}
	cancel()
	<-statsDone
	s := fleet.Stats()
	m.log.Info("stopped", zap.Uint64("connects", s.Connects), zap.Uint64("calls_run", s.CallsRun))
	return err
}

// logStats logs the fleet's counters every statsInterval until ctx ends.
func (m *Main) logStats(ctx context.Context, f *simulator.Fleet) {
	if m.statsInterval <= 0 {
		<-ctx.Done()
		return
	}
	t := time.NewTicker(m.statsInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s := f.Stats()
			m.statsLog.Info("fleet",
				zap.Int("boards", s.Boards), zap.Int("connected", s.Connected),
				zap.Uint64("connects", s.Connects), zap.Uint64("calls_run", s.CallsRun),
				zap.Uint64("text_received", s.TextReceived), zap.Uint64("messages_sent", s.MessagesSent),
				zap.Uint64("mcp_dropped", s.MCPDropped), zap.Uint64("replies_lost", s.RepliesLost),
				zap.Uint64("reboots", s.Reboots),
				zap.Uint64("conversations", s.Conversations), zap.Uint64("conversation_errors", s.ConversationErrors),
				zap.Uint64("audio_sent", s.AudioSent), zap.Uint64("audio_dropped", s.AudioDropped))
		}
	}
}

// converseOptions is the --converse* flags, or nil without --converse.
func (m *Main) converseOptions() *simulator.ConverseOptions {
	if m.converse == 0 {
		return nil
	}
	o := m.conv
	return &o
}

// hostileConfig is the --hostile-* flags as a simulator.Hostile, or nil
// when none is set.
func (m *Main) hostileConfig() *simulator.Hostile {
	h := m.hostile
	if m.hostileDeep > 0 {
		h.ExtraTools = append(h.ExtraTools, simulator.DeepSchemaTool("self.hostile.deep_schema", m.hostileDeep))
	}
	if m.hostileWide > 0 {
		h.ExtraTools = append(h.ExtraTools, simulator.WideSchemaTool("self.hostile.wide_schema", m.hostileWide, 64))
	}
	if h.MACSpelling == "" && h.FloodOnConnect == 0 && len(h.ExtraTools) == 0 {
		return nil
	}
	return &h
}
