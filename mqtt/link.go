package mqtt

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/envelope"
	"github.com/devicebridge/devicebridge/internal/drainer"
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
// a full inbox drops and counts). A goroutine that runs only while
// messages wait (reader, drain) decodes them, answers hello and goodbye,
// and hands MCP messages to the session through the LinkBase queue.
// Downlink messages are published straight through paho, whose client has
// a single writer of its own.
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
	gone  chan struct{} // closed once the link has finished and left the gateway
	// reader runs drain in a goroutine while inbox holds messages, one at
	// a time; the close path waits for it.
	reader *drainer.Drainer

	audioMu sync.Mutex
	audio   *audioSession

	// voiceOpening is set while a hello waits for the voice upstream;
	// voiceWG counts those waits and voiceCtx ends them when the link
	// closes.
	voiceOpening atomic.Bool
	voiceWG      sync.WaitGroup
	voiceCtx     context.Context
	voiceCancel  context.CancelFunc

	lastHeard atomic.Int64 // unix nanoseconds of the last uplink message

	dropped atomic.Int64
	guard   *PublishGuard // the board limits, applied behind an external broker (flood.go)
	notes   linkNotes
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
		log:      g.log.WithLazy(zap.String("device_id", b.DeviceID), zap.String("transport", TransportName)),
		attached: time.Now(),
		LinkBase: device.NewLinkBase(recvQueue),
		inbox:    make(chan []byte, g.cfg.InboxSize),
		gone:     make(chan struct{}),
		guard:    g.cfg.BoardLimits.NewGuard(),
	}
	l.voiceCtx, l.voiceCancel = context.WithCancel(context.Background())
	empty := ""
	l.sid.Store(&empty)
	l.lastHeard.Store(time.Now().UnixNano())
	l.reader = drainer.New(l.drain, func() bool { return len(l.inbox) > 0 })
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
	if err := l.g.publish(ctx, l.topic, msg); err != nil {
		return err
	}
	l.guard.Credit() // the board may answer beyond its rate
	return nil
}

// Keepalive is the gateway's liveness policy (none with a presence source).
func (l *link) Keepalive() device.KeepalivePolicy { return l.g.keepalive() }

// LastHeard is when the board last published anything, MCP or not.
func (l *link) LastHeard() time.Time { return time.Unix(0, l.lastHeard.Load()) }

// finished is closed once the link has wound everything up.
func (l *link) finished() <-chan struct{} { return l.gone }

func (l *link) setSession(s *device.Session) { l.session.Store(s) }

// ready reports whether the board's session finished initializing.
func (l *link) ready() bool {
	s := l.session.Load()
	return s != nil && s.Info().State == device.StateReady
}

// start arranges the link's end: once it closes, finish runs (after the
// message being handled, if any) and the gateway stops waiting for it.
func (l *link) start() {
	l.AfterClose(func() {
		// Wait for the reader, which handles nothing once the link has
		// closed: from then on no hello can open an audio session, so
		// finish holds no lock but audioMu's, briefly, and its goodbye (up
		// to goodbyeTimeout) holds up nothing.
		l.reader.Close()
		l.voiceCancel()
		l.voiceWG.Wait()
		l.finish()
		l.g.wg.Done()
	})
}

// drain is the only consumer of inbox while it runs (l.reader's worker);
// it stops when inbox is empty or the link has closed.
func (l *link) drain() bool {
	for {
		select {
		case msg := <-l.inbox:
			if l.Closed() {
				return false
			}
			l.handle(msg)
		default:
			return true
		}
	}
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
	endVoice(a)
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
	current := l.audio
	l.audioMu.Unlock()
	open := current != nil
	endVoice(current)
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
