package app

// This file wires the OTA endpoint and admission (package ota) and the
// optional TLS of the device and control listeners: the ota: and tls:
// sections of the configuration, their flags, and what the transports are
// told about issued credentials. docs/real-boards.md is the user's guide.

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"

	"github.com/devicebridge/devicebridge/metrics"
	"github.com/devicebridge/devicebridge/mqtt/broker"
	"github.com/devicebridge/devicebridge/ota"
	"go.uber.org/zap"
)

// OTAConfig configures the OTA endpoint on the device listener: whether it
// runs (default true), and the ota package's own options, whose yaml keys
// sit directly under ota:.
type OTAConfig struct {
	Enabled    bool `yaml:"enabled"`
	ota.Config `yaml:",inline"`
}

func defaultOTAConfig() OTAConfig {
	return OTAConfig{Enabled: true, Config: ota.Config{
		Path:                        ota.DefaultPath,
		MQTTKeepAlive:               ota.DefaultMQTTKeepAlive,
		MaxBodyBytes:                ota.DefaultMaxBodyBytes,
		MaxPending:                  ota.DefaultMaxPending,
		PendingTTL:                  ota.DefaultPendingTTL,
		MaxDevices:                  ota.DefaultMaxDevices,
		RequestsPerSecond:           ota.DefaultRequestsPerSecond,
		RequestBurst:                ota.DefaultRequestBurst,
		MaxAddresses:                ota.DefaultMaxAddresses,
		CodeDigits:                  ota.DefaultCodeDigits,
		CodeGuessesPerHour:          ota.DefaultCodeGuessesPerHour,
		CodeGuessesPerCallerPerHour: ota.DefaultCodeGuessesPerCallerPerHour,
	}}
}

func (c OTAConfig) validate() error {
	if !c.Enabled {
		return nil
	}
	return c.Config.Validate()
}

// TLSConfig holds the optional certificates of the two HTTP listeners.
// Boards verify servers against public CAs only: a self-signed device
// certificate is for simulators and tests, or behind a proxy (see
// docs/real-boards.md).
type TLSConfig struct {
	Device  CertConfig `yaml:"device"`
	Control CertConfig `yaml:"control"`
}

// CertConfig is a PEM certificate (chain) and its key; both or neither.
type CertConfig struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

func (c CertConfig) enabled() bool { return c.CertFile != "" || c.KeyFile != "" }

func (c CertConfig) validate(name string) error {
	if c.enabled() && (c.CertFile == "" || c.KeyFile == "") {
		return fmt.Errorf("tls.%s: set both cert_file and key_file", name)
	}
	return nil
}

// load reads the key pair; nil without one.
func (c CertConfig) load(name string) (*tls.Config, error) {
	if !c.enabled() {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("tls.%s: %w", name, err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

func (c TLSConfig) validate() error {
	return errors.Join(c.Device.validate("device"), c.Control.validate("control"))
}

func registerOTAFlags(fs *flag.FlagSet, c *OTAConfig, t *TLSConfig) {
	fs.BoolVar(&c.Enabled, "ota", c.Enabled, "serve the OTA endpoint real boards call at boot (on the device listener)")
	fs.StringVar(&c.Transport, "ota-transport", c.Transport, "transport the OTA answer gives boards: websocket or mqtt (default: mqtt when the embedded broker runs, else websocket)")
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "directory for board approvals and the credential secret, created 0700 (default: $XDG_STATE_HOME/devicebridge or ~/.local/state/devicebridge, plus /NODE-ID with --node-id; '' keeps them in memory, lost on restart)")
	fs.StringVar(&c.WebSocketURL, "ota-websocket-url", c.WebSocketURL, "websocket.url handed to boards (default: from the request's Host and the device port)")
	fs.StringVar(&c.MQTTEndpoint, "ota-mqtt-endpoint", c.MQTTEndpoint, "mqtt.endpoint host:port handed to boards (default: from the request's Host and the broker port)")
	fs.StringVar(&c.Balance, "ota-balance", c.Balance, "with --nats: least_loaded sends each booting board to the live node with the fewest boards (default: the node it asked)")
	fs.Var(stringList{&c.Allow}, "ota-allow", "admit only this board MAC without approval (repeatable)")
	fs.BoolVar(&c.Approval, "ota-approval", c.Approval, "unknown boards show an activation code and wait for POST /api/ota/devices/{id|code}/approve")
	fs.BoolVar(&c.RequireCredentials, "require-device-credentials", c.RequireCredentials, "refuse boards without issued or static credentials on both transports, and bind issued ones to the board's first Client-Id (implied by --ota-allow and --ota-approval)")
	fs.IntVar(&c.MaxPending, "ota-max-pending", c.MaxPending, "most boards waiting for approval at once; past it new ones are answered 503 and retry (ota.max_pending)")
	fs.DurationVar(&c.PendingTTL, "ota-pending-ttl", c.PendingTTL, "forget a board waiting for approval that stopped asking for this long (ota.pending_ttl)")
	fs.Float64Var(&c.RequestsPerSecond, "ota-rate", c.RequestsPerSecond, "OTA requests per second per source address, after --ota-burst; past it 429 (ota.requests_per_second)")
	fs.IntVar(&c.RequestBurst, "ota-burst", c.RequestBurst, "OTA requests one source address may make at once: raise it when many boards share one NAT or proxy (ota.request_burst)")
	fs.StringVar(&t.Device.CertFile, "device-tls-cert", t.Device.CertFile, "PEM certificate: the device listener serves https/wss")
	fs.StringVar(&t.Device.KeyFile, "device-tls-key", t.Device.KeyFile, "PEM key of --device-tls-cert")
	fs.StringVar(&t.Control.CertFile, "control-tls-cert", t.Control.CertFile, "PEM certificate: the control listener serves https")
	fs.StringVar(&t.Control.KeyFile, "control-tls-key", t.Control.KeyFile, "PEM key of --control-tls-cert")
}

// newOTA builds the OTA server and tells the WebSocket side about the
// credentials it issues. It runs in New, before the WebSocket server is
// built; the broker is told in startMQTT.
func (a *App) newOTA() error {
	if !a.cfg.OTA.Enabled {
		return nil
	}
	s, err := ota.New(a.otaConfig(), a.otaNetwork, a.log.Named("ota"))
	if err != nil {
		return err
	}
	a.ota = s
	if dir := a.cfg.OTA.DataDir; dir != "" {
		a.log.Info("board approvals and the credential secret are kept in "+dir+" (--data-dir; '' keeps them in memory)",
			zap.String("data_dir", dir))
	}
	// Once the listeners have drained, write the admission state that
	// is not on disk yet (the store coalesces its writes).
	a.onShutdown(func(context.Context) {
		if err := s.Close(); err != nil {
			a.log.Error("ota: could not write the admission state at shutdown", zap.Error(err))
		}
	})
	a.cfg.WebSocket.Issued = s
	a.cfg.WebSocket.RequireToken = s.RequireCredentials()
	return nil
}

// otaConfig is the ota package's configuration: the ota: section, and
// the voice: section's pass-through to the voice upstream.
func (a *App) otaConfig() ota.Config {
	c := a.cfg.OTA.Config
	c.Upstream = ota.Upstream{URL: a.cfg.Voice.UpstreamOTA, Timeout: a.cfg.Voice.OTATimeout, MaxInFlight: a.cfg.Voice.OTAMaxInFlight}
	return c
}

// validateVoiceOTA checks the pass-through's URL; it needs the OTA
// endpoint, which is what boards call.
func (c Config) validateVoiceOTA() error {
	if c.Voice.UpstreamOTA == "" {
		return nil
	}
	if !c.OTA.Enabled {
		return errors.New("voice.upstream_ota (--voice-upstream-ota) passes the boards' OTA calls through: it needs ota.enabled (--ota)")
	}
	return ota.Upstream{URL: c.Voice.UpstreamOTA}.Validate()
}

func registerVoiceOTAFlags(fs *flag.FlagSet, c *VoiceConfig) {
	fs.StringVar(&c.UpstreamOTA, "voice-upstream-ota", c.UpstreamOTA, "the voice upstream's OTA URL (http://host:8002/xiaozhi/ota/): admitted boards' OTA calls and activation polls are passed on, and its activation code, firmware and server_time merged into the bridge's answer (voice.upstream_ota)")
	fs.DurationVar(&c.OTATimeout, "voice-ota-timeout", c.OTATimeout, "bound on one call to the voice upstream's OTA URL; past it the board gets the bridge's own answer (voice.ota_timeout)")
}

// voiceOTAStats reads the OTA pass-through's counters, when it runs.
func (a *App) voiceOTAStats() (metrics.VoiceOTAStats, bool) {
	if a.ota == nil {
		return metrics.VoiceOTAStats{}, false
	}
	st, ok := a.ota.UpstreamStats()
	return metrics.VoiceOTAStats{Requests: st.Requests, Errors: st.Errors}, ok
}

// OTA returns the OTA server, or nil when it is off.
func (a *App) OTA() *ota.Server { return a.ota }

// otaNetwork tells the OTA answer what listens where, as of now: the
// embedded broker may have failed to bind, and ports may be ephemeral.
func (a *App) otaNetwork() ota.Network {
	n := ota.Network{DeviceTLS: a.deviceTLS, WebSocketPath: a.WS.Path()}
	if a.deviceLn != nil {
		n.DeviceHost, n.DevicePort = boundHostPort(a.deviceLn.Addr())
	}
	gw := a.cfg.MQTT.gateway()
	topics := gw.Topics.WithDefaults()
	n.Uplink, n.Downlink = topics.Uplink, topics.Downlink
	side := a.mqttSide()
	switch {
	case side.broker != nil:
		n.MQTT, n.MQTTEmbedded = true, true
		if addr := side.broker.Addr(); addr != nil {
			n.MQTTBindHost, n.MQTTPort = boundHostPort(addr)
		}
	case side.gateway != nil:
		// An external broker: boards dial it where the bridge does, unless
		// that is loopback (then the host they used to reach the bridge).
		if u, err := url.Parse(gw.Broker); err == nil && u.Port() != "" && (u.Scheme == "tcp" || u.Scheme == "mqtt") {
			n.MQTT, n.MQTTPort = true, u.Port()
			n.MQTTDirect = gw.DirectDownlink()
			if ip := net.ParseIP(u.Hostname()); ip == nil || !ip.IsLoopback() {
				n.MQTTHost = u.Hostname()
			}
		}
	}
	return n
}

// boundHostPort splits a listener's address: the host only when it is one
// IP (a listener on 0.0.0.0 or :: has no address to hand out).
func boundHostPort(addr net.Addr) (host, port string) {
	h, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "", ""
	}
	if ip := net.ParseIP(h); ip != nil && !ip.IsUnspecified() {
		host = h
	}
	return host, port
}

// issuedMQTT is what the embedded broker is told about OTA credentials.
func (a *App) issuedMQTT() (broker.CredentialVerifier, bool) {
	if a.ota == nil {
		return nil, false
	}
	return a.ota, a.ota.RequireCredentials()
}
