package mqtt

// This file is how the bridge's downlink reaches boards on an external
// broker (Config.Downlink), and the probe that proves the Mosquitto plugin
// (deploy/mosquitto) is loaded.

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"go.uber.org/zap"
)

// Downlink modes (mqtt.downlink).
const (
	// DownlinkSubscribe publishes to each board's downlink topic and
	// relies on the board (legacy firmware) or the broker to subscribe it.
	DownlinkSubscribe = "subscribe"
	// DownlinkMosquittoPlugin: the broker is Mosquitto with
	// deploy/mosquitto/devicebridge.so loaded, which delivers each
	// devices/p2p/<mac> publish to that board's connection, whether or not
	// it subscribed. Boards publish to devices/up/<mac>.
	DownlinkMosquittoPlugin = "mosquitto-plugin"
	// DownlinkEMQXAutoSubscribe: EMQX subscribes each board to its
	// downlink topic when it connects (auto_subscribe); on the bridge's
	// side it is DownlinkSubscribe, with boards told to publish to
	// devices/up/<mac>.
	DownlinkEMQXAutoSubscribe = "emqx-autosubscribe"
)

// ProbeTopic is where the bridge publishes its plugin probe; the plugin
// sends it straight back to the bridge's own connection. On a broker
// without the plugin nobody subscribes to it and it never comes back.
const ProbeTopic = "devicebridge/probe"

// DefaultProbeTimeout is how long a probe may go unanswered before the
// plugin is reported missing; probes are repeated at this interval until
// one comes back.
const DefaultProbeTimeout = 5 * time.Second

// DirectDownlink reports whether the broker reaches boards that never
// subscribe (the embedded broker aside): the OTA answer may then send
// current firmware to it.
func (c Config) DirectDownlink() bool {
	return c.Downlink == DownlinkMosquittoPlugin || c.Downlink == DownlinkEMQXAutoSubscribe
}

func (c Config) validateDownlink() error {
	switch c.Downlink {
	case "", DownlinkSubscribe, DownlinkEMQXAutoSubscribe:
		return nil
	case DownlinkMosquittoPlugin:
		t := c.Topics.WithDefaults()
		if t.Uplink != DefaultUplink || t.Downlink != DefaultDownlink {
			return fmt.Errorf("mqtt.downlink %s: the plugin serves the default topics only (uplink %s, downlink %s)",
				DownlinkMosquittoPlugin, DefaultUplink, DefaultDownlink)
		}
		return nil
	}
	return fmt.Errorf("mqtt.downlink %q: want %s, %s or %s", c.Downlink, DownlinkSubscribe, DownlinkMosquittoPlugin, DownlinkEMQXAutoSubscribe)
}

// ErrPluginMissing is what DownlinkProblem wraps while the plugin's probe
// goes unanswered.
var ErrPluginMissing = errors.New("the devicebridge Mosquitto plugin does not answer")

// prober sends the plugin probe and remembers whether it came back. The
// supervisor sends; paho's router goroutine reports answers.
type prober struct {
	timeout time.Duration
	mu      sync.Mutex
	nonce   string
	sentAt  time.Time // first unanswered probe since the last (re)connect
	lastAt  time.Time
	ok      bool
	warned  bool
}

// reset starts over after a (re)connect.
func (p *prober) reset() {
	p.mu.Lock()
	p.nonce, p.sentAt, p.lastAt, p.ok, p.warned = "", time.Time{}, time.Time{}, false, false
	p.mu.Unlock()
}

// due returns the payload of a probe to send now, if one is due.
func (p *prober) due(now time.Time) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ok || (!p.lastAt.IsZero() && now.Sub(p.lastAt) < p.timeout) {
		return "", false
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	p.nonce = hex.EncodeToString(b[:])
	if p.sentAt.IsZero() {
		p.sentAt = now
	}
	p.lastAt = now
	return p.nonce, true
}

// answer records a message on the probe topic; true when it is the answer.
func (p *prober) answer(payload []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.nonce == "" || string(payload) != p.nonce {
		return false
	}
	p.ok, p.sentAt = true, time.Time{}
	return true
}

// overdue reports how long the first unanswered probe has waited, past
// the timeout, and whether that is new (to log it once per connection).
func (p *prober) overdue(now time.Time) (waited time.Duration, over, first bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ok || p.sentAt.IsZero() || now.Sub(p.sentAt) < p.timeout {
		return 0, false, false
	}
	first = !p.warned
	p.warned = true
	return now.Sub(p.sentAt), true, first
}

// late reports, without side effects, whether a probe is overdue.
func (p *prober) late(now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.ok && !p.sentAt.IsZero() && now.Sub(p.sentAt) >= p.timeout
}

func (p *prober) answered() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ok
}

// probePlugin runs on the supervisor while connected and subscribed.
func (g *Gateway) probePlugin() {
	if g.probe == nil || !g.subscribed {
		return
	}
	now := time.Now()
	if waited, over, first := g.probe.overdue(now); over && first {
		g.log.Error("the devicebridge Mosquitto plugin is not loaded on the broker (or not for this bridge's user): "+
			"a probe on "+ProbeTopic+" never came back, so boards that never subscribe (firmware 1.0 and later) "+
			"will connect but never become ready. Build deploy/mosquitto (make -C deploy/mosquitto), load it in mosquitto.conf "+
			"(plugin, plugin_opt_secret_file, plugin_opt_bridge_username) and check Mosquitto's log; see docs/mqtt.md",
			zap.String("broker", redactURL(g.cfg.Broker)), zap.String("username", g.cfg.Username), zap.Duration("waited", waited))
	}
	if nonce, ok := g.probe.due(now); ok {
		g.client.Publish(ProbeTopic, 0, false, nonce) // answered asynchronously; nothing to wait for
	}
}

// onUnrouted receives messages no subscription asked for: with the plugin,
// the probe's answer.
func (g *Gateway) onUnrouted(_ paho.Client, m paho.Message) {
	if g.probe == nil || m.Topic() != ProbeTopic {
		return
	}
	if g.probe.answer(m.Payload()) {
		g.probeOK.Do(func() {
			g.log.Info("the devicebridge Mosquitto plugin answered: boards that never subscribe are reached", zap.String("broker", redactURL(g.cfg.Broker)))
		})
	}
}

// DownlinkProblem says why boards cannot be reached although the broker
// connection is up: in mosquitto-plugin mode, while the plugin's probe has
// not come back. Empty when there is none (or while the first probe is
// still within its timeout).
func (g *Gateway) DownlinkProblem() error {
	if g.probe == nil || !g.Connected() || g.probe.answered() {
		return nil
	}
	if !g.probe.late(time.Now()) {
		return nil
	}
	return fmt.Errorf("%w: a probe on %s never came back from %s, so boards on firmware 1.0+ (which never subscribe) are not reached; "+
		"load deploy/mosquitto/devicebridge.so in mosquitto.conf (docs/mqtt.md)", ErrPluginMissing, ProbeTopic, redactURL(g.cfg.Broker))
}
