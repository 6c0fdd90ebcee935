package app

// This file wires the voice relay (package voice): the voice section of
// the configuration, the relay handed to both transports, its metrics, its
// line in /readyz and its events.

import (
	"flag"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/api"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/metrics"
	"github.com/devicebridge/devicebridge/voice"
)

// newVoice makes the relay when a voice upstream is configured and hands
// it to the transports; nil otherwise.
func (a *App) newVoice() error {
	vc := a.cfg.Voice.Config
	if !vc.Enabled() {
		return nil
	}
	r, err := voice.NewRelay(vc, a.log.Named("voice"), func(ev voice.Event) {
		a.Hub.PublishVoice(ev.DeviceID, device.VoiceNote{Kind: ev.Kind, Transport: ev.Transport,
			SessionID: ev.SessionID, Upstream: ev.Upstream, Reason: ev.Reason})
	})
	if err != nil {
		return err
	}
	a.voice = r
	a.cfg.WebSocket.Relay = r
	a.cfg.MQTT.GatewayConfig.Relay = r
	a.Metrics.WatchVoice(func() metrics.VoiceStats {
		st := r.Stats()
		up := -1
		if h := r.Health(); h.Known && h.OK {
			up = 1
		} else if h.Known {
			up = 0
		}
		return metrics.VoiceStats{Opened: st.Opened, Closed: st.Closed, Active: st.Active, Refused: st.Refused,
			UpstreamErrors: st.UpstreamErrors, FramesUp: st.FramesUp, FramesDown: st.FramesDown,
			BytesUp: st.BytesUp, BytesDown: st.BytesDown, DroppedUp: st.DroppedUp, DroppedDown: st.DroppedDown,
			TextUp: st.TextUp, TextDown: st.TextDown, MCPRequests: st.MCPRequests, MCPRefused: st.MCPRefused, UpstreamUp: up}
	})
	a.log.Named("voice").Info("relaying conversations to the voice upstream",
		zap.String("upstream", voice.Redact(vc.Upstream)), zap.Int("per_board_overrides", len(vc.Boards)))
	return nil
}

// voiceCheck is /readyz's line for the relay. A failing upstream degrades
// the bridge but does not take it out of service: boards keep their tools.
func (a *App) voiceCheck() (api.Check, bool) {
	if a.voice == nil {
		return api.Check{}, false
	}
	c := api.Check{Name: "voice", OK: true}
	if h := a.voice.Health(); h.Known && !h.OK {
		c.Degraded = fmt.Sprintf("the voice upstream failed %s ago: %s; boards keep their tools, and their next conversation tries again",
			time.Since(h.Since).Round(time.Second), h.Error)
	}
	return c, true
}

func registerVoiceFlags(fs *flag.FlagSet, c *VoiceConfig) {
	fs.StringVar(&c.Upstream, "voice-upstream", c.Upstream,
		"relay every board's conversation to this voice server (ws://host:8000/xiaozhi/v1/), so boards keep their voice assistant")
	fs.StringVar(&c.Token, "voice-upstream-token", c.Token, "static token sent to the voice upstream as Authorization: Bearer (never logged)")
	fs.StringVar(&c.Secret, "voice-upstream-secret", c.Secret,
		"secret for the HMAC token xiaozhi-esp32-server checks for gateways, made per connection (never logged)")
	fs.Var(aliasFlag{&c.Boards}, "voice-board", "MAC=URL: this board's voice upstream; MAC=off relays none of its conversations (repeatable)")
}
