package mqtt

// This file routes uplink traffic: paho's callback finds the board a
// publish belongs to, and the board's link decodes it and answers hello
// and goodbye or hands MCP to the session.

import (
	"context"
	"errors"
	"fmt"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/envelope"
	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/internal/randid"
)

// onMessage receives every uplink publish. It runs on paho's router
// goroutine, so it does bounded work and hands the payload on.
func (g *Gateway) onMessage(_ paho.Client, m paho.Message) {
	key, ok := g.up.Key(m.Topic())
	if !ok {
		g.stats.unknownTopic.Add(1)
		return
	}
	// Where an MQTT board's id enters from a topic: a MAC in any spelling
	// becomes its canonical form, so no spelling is a second board.
	id, ok := DeviceIDFromKey(key, g.cfg.AllowAnyDeviceID)
	if !ok {
		g.stats.unknownTopic.Add(1)
		g.warns.unknownTopic.Warn(g.log, "dropped uplink message on a topic that names no board (boards are named by their MAC; "+
			"mqtt.auth.allow_any_client_id admits other ids)", clip.Field("topic", m.Topic()))
		return
	}
	payload := m.Payload()
	if len(payload) > g.cfg.MaxMessageSize {
		g.stats.oversized.Add(1)
		g.warns.oversized.Warn(g.log, "dropped oversized uplink message", zap.String("device_id", id), zap.String("transport", TransportName),
			zap.Int("bytes", len(payload)), zap.Int("limit", g.cfg.MaxMessageSize))
		return
	}
	l := g.lookup(id)
	if !g.admit(id, l) {
		return
	}
	g.stats.in.Add(1)
	if l != nil && l.deliver(payload) {
		return
	}
	if g.owner != nil && g.owner.HeldElsewhere(id) {
		g.stats.notOwned.Add(1) // another bridge on the shared broker serves it
		return
	}
	if !g.discover.add(discovery{deviceID: id, key: TopicKey(id), payload: payload}) {
		g.stats.unattrib.Add(1)
		g.warns.discoveryFull.Warn(g.log, "too many messages from boards not yet discovered; dropped one", zap.String("device_id", id),
			zap.Int("max_boards", DefaultDiscoveryBoards), zap.Int("max_bytes", DefaultDiscoveryBytes))
	}
}

// deliver hands one uplink payload to the link without blocking. It
// reports false when the link is already closed, so the caller can find the
// board a new one.
func (l *link) deliver(p []byte) bool {
	if l.Closed() {
		return false
	}
	l.lastHeard.Store(time.Now().UnixNano())
	select {
	case l.inbox <- p:
		l.reader.Kick()
	default:
		l.dropped.Add(1)
		l.g.stats.inboxFull.Add(1)
		l.g.warns.inboxFull.Warn(l.log, "board inbox full; dropped an uplink message", zap.Int("bytes", len(p)), zap.Int("inbox", cap(l.inbox)))
	}
	return true
}

func (l *link) handle(msg []byte) {
	env, err := envelope.Decode(msg, l.g.cfg.MaxMessageSize)
	if err != nil {
		l.g.stats.malformed.Add(1)
		// The payload itself is never logged: it may be anything.
		l.g.warns.malformed.Warn(l.log, "dropped undecodable uplink message", zap.Int("bytes", len(msg)), clip.Error(err))
		return
	}
	switch env.Type {
	case envelope.TypeHello:
		if l.g.cfg.Relay.Enabled(l.board.DeviceID) {
			if _, err := parseHello(env); err == nil {
				l.voiceHello(env)
				return
			}
		}
		l.handleHello(env)
	case envelope.TypeGoodbye:
		l.handleGoodbye(env)
	case envelope.TypeMCP:
		// Waits while the session is behind: inbox, not this queue, is
		// where a flooding board's messages are dropped.
		l.Deliver(msg)
	default:
		if conv := l.conversation(); conv != nil {
			conv.Text(msg) // relayed unchanged
			return
		}
		// listen, abort, ...: conversation messages the bridge does not
		// serve. Counted, not an error.
		l.g.stats.other.Add(1)
		if ce := l.log.Check(zap.DebugLevel, "ignored board message"); ce != nil {
			ce.Write(clip.Field("type", env.Type))
		}
	}
}

// errNotMQTTHello: a well-formed hello the MQTT path cannot answer.
var errNotMQTTHello = errors.New("mqtt: hello is not version 3 over udp")

// parseHello reads a board's hello on the MQTT path. Every MQTT firmware
// sends version 3 over udp; a hello claiming anything else would not
// understand the reply either, so it fails with errNotMQTTHello (and the
// parsed hello, for the log).
func parseHello(env envelope.Envelope) (envelope.DeviceHello, error) {
	h, err := envelope.ParseDeviceHello(env)
	if err != nil {
		return envelope.DeviceHello{}, err
	}
	if h.Version != 3 || h.Transport != "udp" {
		return h, errNotMQTTHello
	}
	return h, nil
}

// handleHello opens a new audio session. A hello while one is open
// replaces it: boards send a fresh hello after their channel timed out,
// without a goodbye for the old one.
func (l *link) handleHello(env envelope.Envelope) {
	h, err := parseHello(env)
	switch {
	case errors.Is(err, errNotMQTTHello):
		l.g.stats.badHellos.Add(1)
		l.g.warns.badHello.Warn(l.log, "ignored hello: MQTT boards must send version 3 with transport udp",
			zap.Int("version", h.Version), clip.Field("hello_transport", h.Transport))
		return
	case err != nil:
		l.g.stats.malformed.Add(1)
		l.g.warns.malformed.Warn(l.log, "dropped malformed hello", clip.Error(err))
		return
	}
	a := l.g.udp.open(randid.Hex16())
	old, ok := l.adopt(a)
	if !ok {
		return
	}

	ctx, cancel := context.WithTimeout(context.Background(), l.g.cfg.WriteTimeout)
	defer cancel()
	if err := l.Send(ctx, serverHello(a, l.advHost, l.g.udpAdvertisePort())); err != nil {
		l.g.warns.helloUnanswered.Warn(l.log, "could not answer hello", zap.Error(err))
		return
	}
	l.g.stats.hellos.Add(1)
	fields := []zap.Field{zap.String("session_id", a.id), zap.Uint32("ssrc", a.ssrc),
		zap.String("udp", fmt.Sprintf("%s:%d", l.advHost, l.g.udpAdvertisePort())), zap.Bool("mcp", h.Features.MCP)}
	if old != nil {
		fields = append(fields, zap.String("replaced_session_id", old.id))
	}
	l.notes.audioOpened.Info(l.log, "audio session opened", fields...)
}

// handleGoodbye honours a board's goodbye only for the current session,
// the same rule boards apply to the bridge's goodbye.
func (l *link) handleGoodbye(env envelope.Envelope) {
	l.audioMu.Lock()
	a := l.audio
	match := a != nil && env.SessionID == a.id
	if match {
		l.audio = nil
	}
	l.audioMu.Unlock()
	if !match {
		l.g.warns.staleGoodbye.Info(l.log, "ignored goodbye for a session that is not the current one", clip.Field("session_id", env.SessionID))
		return
	}
	l.g.udp.close(a)
	endVoice(a)
	l.g.stats.goodbyesIn.Add(1)
	l.notes.audioClosed.Info(l.log, "board closed its audio session", zap.String("session_id", a.id), zap.Int64("audio_packets", a.packets.Load()))
}
