package mqtt

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/envelope"
	"github.com/devicebridge/devicebridge/internal/randid"
)

// recvQueue bounds MCP messages handed to the session but not yet read. The
// session's reader drains it continuously, so it only absorbs bursts.
const recvQueue = 16

// goodbyeTimeout bounds the goodbye the bridge publishes when it ends a
// board's audio session on close.
const goodbyeTimeout = 2 * time.Second

// link is one board as the MQTT gateway sees it; it implements device.Link.
//
// Uplink messages arrive from paho's callback into inbox (never blocking:
// a full inbox drops and counts). The link's own goroutine (run) decodes
// them, answers hello and goodbye, and hands MCP messages to the session
// through the LinkBase queue. Downlink messages are published straight
// through paho, whose client has a single writer of its own.
type link struct {
	// LinkBase gives Receive, Close, Done and Err; run feeds it.
	*device.LinkBase

	g        *Gateway
	board    Board
	topic    string // downlink topic
	log      *zap.Logger
	advHost  string // UDP host to advertise to this board
	session  atomic.Pointer[device.Session]
	attached time.Time

	sid atomic.Pointer[string] // session id stamped on outgoing messages

	inbox chan []byte
	gone  chan struct{} // closed once run has finished and left the gateway

	audioMu sync.Mutex
	audio   *audioSession

	lastHeard atomic.Int64 // unix nanoseconds of the last uplink message

	dropped atomic.Int64
}

// MQTT links opt in to the Session's keepalive: through an external broker
// nothing tells the bridge that a board went away.
var _ device.KeepaliveLink = (*link)(nil)

func newLink(g *Gateway, b Board, advHost string) *link {
	l := &link{
		g:        g,
		board:    b,
		topic:    g.down.Topic(b.Key),
		advHost:  advHost,
		log:      g.log.With(zap.String("device_id", b.DeviceID), zap.String("transport", TransportName)),
		attached: time.Now(),
		LinkBase: device.NewLinkBase(recvQueue),
		inbox:    make(chan []byte, g.cfg.InboxSize),
		gone:     make(chan struct{}),
	}
	empty := ""
	l.sid.Store(&empty)
	l.lastHeard.Store(time.Now().UnixNano())
	return l
}

// SessionID is the id of the board's current audio session: "" until its
// first hello (boards stamp "" too), then whatever the last hello got.
func (l *link) SessionID() string { return *l.sid.Load() }

// Send publishes one message on the board's downlink topic.
func (l *link) Send(ctx context.Context, msg []byte) error {
	if l.Closed() {
		return l.ClosedErr()
	}
	return l.g.publish(ctx, l.topic, msg)
}

// Keepalive is the gateway's liveness policy (none with a presence source).
func (l *link) Keepalive() device.KeepalivePolicy { return l.g.keepalive() }

// LastHeard is when the board last published anything, MCP or not.
func (l *link) LastHeard() time.Time { return time.Unix(0, l.lastHeard.Load()) }

// finished is closed once the link's goroutine has wound everything up.
func (l *link) finished() <-chan struct{} { return l.gone }

func (l *link) setSession(s *device.Session) { l.session.Store(s) }

// ready reports whether the board's session finished initializing.
func (l *link) ready() bool {
	s := l.session.Load()
	return s != nil && s.Info().State == device.StateReady
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
	default:
		l.dropped.Add(1)
		l.g.stats.inboxFull.Add(1)
		if ce := l.log.Check(zap.WarnLevel, "board inbox full; dropped an uplink message"); ce != nil {
			ce.Write(zap.Int("bytes", len(p)), zap.Int("inbox", cap(l.inbox)))
		}
	}
	return true
}

// run is the link's only consumer of inbox. The gateway waits for it.
func (l *link) run() {
	defer l.g.wg.Done()
	defer l.finish()
	for {
		select {
		case msg := <-l.inbox:
			l.handle(msg)
		case <-l.Done():
			return
		}
	}
}

func (l *link) handle(msg []byte) {
	env, err := envelope.Decode(msg, l.g.cfg.MaxMessageSize)
	if err != nil {
		l.g.stats.malformed.Add(1)
		// The payload itself is never logged: it may be anything.
		l.log.Warn("dropped undecodable uplink message", zap.Int("bytes", len(msg)), zap.Error(err))
		return
	}
	switch env.Type {
	case envelope.TypeHello:
		l.handleHello(env)
	case envelope.TypeGoodbye:
		l.handleGoodbye(env)
	case envelope.TypeMCP:
		// Waits while the session is behind: inbox, not this queue, is
		// where a flooding board's messages are dropped.
		l.Deliver(msg)
	default:
		// listen, abort, ...: conversation messages the bridge does not
		// serve. Counted, not an error.
		l.g.stats.other.Add(1)
		if ce := l.log.Check(zap.DebugLevel, "ignored board message"); ce != nil {
			ce.Write(zap.String("type", env.Type))
		}
	}
}

// handleHello opens a new audio session. A hello while one is open
// replaces it: boards send a fresh hello after their channel timed out,
// without a goodbye for the old one.
func (l *link) handleHello(env envelope.Envelope) {
	h, err := envelope.ParseDeviceHello(env)
	if err != nil {
		l.g.stats.malformed.Add(1)
		l.log.Warn("dropped malformed hello", zap.Error(err))
		return
	}
	if h.Version != 3 || h.Transport != "udp" {
		// Every MQTT firmware sends version 3 over udp; anything else would
		// not understand the reply either.
		l.g.stats.badHellos.Add(1)
		l.log.Warn("ignored hello: MQTT boards must send version 3 with transport udp",
			zap.Int("version", h.Version), zap.String("hello_transport", h.Transport))
		return
	}
	a := l.g.udp.open(randid.Hex16())
	l.audioMu.Lock()
	old := l.audio
	l.audio = a
	l.audioMu.Unlock()
	l.g.udp.close(old)
	l.sid.Store(&a.id)

	ctx, cancel := context.WithTimeout(context.Background(), l.g.cfg.WriteTimeout)
	defer cancel()
	if err := l.Send(ctx, serverHello(a, l.advHost, l.g.udpAdvertisePort())); err != nil {
		l.log.Warn("could not answer hello", zap.Error(err))
		return
	}
	l.g.stats.hellos.Add(1)
	fields := []zap.Field{zap.String("session_id", a.id), zap.Uint32("ssrc", a.ssrc),
		zap.String("udp", fmt.Sprintf("%s:%d", l.advHost, l.g.udpAdvertisePort())), zap.Bool("mcp", h.Features.MCP)}
	if old != nil {
		fields = append(fields, zap.String("replaced_session_id", old.id))
	}
	l.log.Info("audio session opened", fields...)
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
		l.log.Info("ignored goodbye for a session that is not the current one", zap.String("session_id", env.SessionID))
		return
	}
	l.g.udp.close(a)
	l.g.stats.goodbyesIn.Add(1)
	l.log.Info("board closed its audio session", zap.String("session_id", a.id), zap.Int64("audio_packets", a.packets.Load()))
}

// goodbye ends the current audio session from the bridge's side. The
// board closes its channel only if the id matches its own, so the message
// carries exactly the id the last hello handed out.
func (l *link) goodbye(ctx context.Context) (string, error) {
	l.audioMu.Lock()
	a := l.audio
	l.audio = nil
	l.audioMu.Unlock()
	if a == nil {
		return "", ErrNoAudioSession
	}
	l.g.udp.close(a)
	msg, err := envelope.Encode(a.id, envelope.TypeGoodbye, nil)
	if err != nil {
		return "", err
	}
	if err := l.g.publish(ctx, l.topic, msg); err != nil {
		return a.id, err
	}
	l.g.stats.goodbyesOut.Add(1)
	return a.id, nil
}

// finish runs once the link is closed: end the audio session (telling the
// board, when the broker can still reach it), then leave the gateway.
func (l *link) finish() {
	l.audioMu.Lock()
	open := l.audio != nil
	l.audioMu.Unlock()
	if open && sayGoodbyeOnClose(l.Err()) {
		ctx, cancel := context.WithTimeout(context.Background(), goodbyeTimeout)
		if _, err := l.goodbye(ctx); err != nil {
			l.log.Debug("goodbye on close not sent", zap.Error(err))
		}
		cancel()
	} else {
		l.audioMu.Lock()
		a := l.audio
		l.audio = nil
		l.audioMu.Unlock()
		l.g.udp.close(a)
	}
	l.g.forget(l)
}

// sayGoodbyeOnClose: a goodbye is pointless when the board has left the
// broker or the broker is gone.
func sayGoodbyeOnClose(reason error) bool {
	switch device.CauseOf(reason) {
	case device.CauseDisconnected, device.CauseBrokerLost:
		return false
	}
	return true
}

// audioInfo reports the current audio session, if any.
func (l *link) audioInfo() (AudioSession, bool) {
	l.audioMu.Lock()
	defer l.audioMu.Unlock()
	if l.audio == nil {
		return AudioSession{}, false
	}
	return AudioSession{ID: l.audio.id, SSRC: l.audio.ssrc, Packets: l.audio.packets.Load(), Bytes: l.audio.bytes.Load()}, true
}
