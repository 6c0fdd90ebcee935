package mqtt

// This file relays an MQTT board's conversation to its voice upstream
// (package voice), doing the official MQTT gateway's job: the board's
// hello opens a WebSocket conversation upstream, the board gets a UDP
// channel with a fresh AES-128-CTR key, uplink datagrams become binary
// frames (protocol version 1: one raw Opus packet per frame) and downlink
// frames become datagrams, JSON messages travel over MQTT, and goodbye on
// either side ends both.

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/envelope"
	"github.com/devicebridge/devicebridge/internal/randid"
	"github.com/devicebridge/devicebridge/voice"
)

// upstreamVersion is the framing toward the upstream for MQTT boards: raw
// Opus, which every voice server takes.
const upstreamVersion = 1

// maxDownPayload is the most Opus a board's 1500-byte receive buffer takes
// after the header.
const maxDownPayload = maxDatagram - udpHeaderLen

// conversation is what an audio session needs of its relayed
// conversation (a *voice.Conversation).
type conversation interface {
	Audio(opus []byte)
	Text(msg []byte)
	Close(reason error)
}

// voiceAudio is the relay state of one audio session.
type voiceAudio struct {
	conv   conversation
	block  cipher.Block
	nonce  [16]byte
	remote atomic.Pointer[net.UDPAddr] // learned from the board's first datagram
	// downSeq numbers downlink datagrams from 1 (boards drop 0 and
	// anything not above the last).
	downSeq atomic.Uint32
}

func newVoiceAudio(a *audioSession, conv conversation) (*voiceAudio, error) {
	key, err := hex.DecodeString(a.key)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	v := &voiceAudio{conv: conv, block: block}
	n, err := hex.DecodeString(a.nonce)
	if err != nil || len(n) != 16 {
		return nil, errors.New("mqtt: bad nonce")
	}
	copy(v.nonce[:], n)
	return v, nil
}

// ttsGap is how long downlink audio waits behind a "tts start", and a
// "tts stop" behind the last audio (one frame period): the messages go
// through the broker, the audio straight over UDP, and a board plays audio
// only between the two (firmware 4.3).
const ttsGap = 60 * time.Millisecond

// mqttSide is a conversation's way to its MQTT board: text over MQTT,
// audio over UDP, MCP through the board's session.
type mqttSide struct {
	l     *link
	audio atomic.Pointer[audioSession] // set once the board has its hello
	// holdUntil (unix nanoseconds) holds downlink audio back after a tts
	// start, lastAudio holds a tts stop back after the last audio. The
	// conversation's reader is the only caller of SendText and SendAudio,
	// so waiting here keeps the upstream's order.
	holdUntil, lastAudio atomic.Int64
}

var _ voice.BoardSide = (*mqttSide)(nil)

func (s *mqttSide) SendText(ctx context.Context, msg []byte) error {
	state := ttsState(msg)
	if state == "stop" {
		// The last datagrams must reach the board before it stops
		// speaking: a board drops audio that arrives after tts stop.
		if !s.wait(time.Unix(0, s.lastAudio.Load()).Add(ttsGap)) {
			return s.l.ClosedErr()
		}
	}
	if err := s.l.Send(ctx, msg); err != nil {
		return err
	}
	if state == "start" {
		s.holdUntil.Store(time.Now().Add(ttsGap).UnixNano())
	}
	return nil
}

// ttsState is the state of a tts message ("start", "stop", ...), "" for
// any other message; only messages that mention tts are decoded.
func ttsState(msg []byte) string {
	if !bytes.Contains(msg, []byte(`"tts"`)) {
		return ""
	}
	var m struct{ Type, State string }
	if json.Unmarshal(msg, &m) != nil || m.Type != "tts" {
		return ""
	}
	return m.State
}

// wait waits until t (at most one ttsGap); false when the link closed.
func (s *mqttSide) wait(t time.Time) bool {
	d := min(time.Until(t), ttsGap)
	if d <= 0 {
		return true
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-s.l.Done():
		return false
	}
}

func (s *mqttSide) SendAudio(frame []byte) bool {
	a := s.audio.Load()
	if a == nil {
		return false
	}
	if !s.wait(time.Unix(0, s.holdUntil.Load())) {
		return false
	}
	defer s.lastAudio.Store(time.Now().UnixNano())
	return s.l.g.udp.sendDown(a, frame)
}

func (s *mqttSide) ServeMCP(ctx context.Context, payload json.RawMessage) json.RawMessage {
	sess := s.l.session.Load()
	if sess == nil {
		return nil
	}
	return sess.ServePeer(ctx, payload)
}

// ConversationEnded tells the board when the upstream ended its
// conversation: a goodbye with the session's id closes its channel.
func (s *mqttSide) ConversationEnded(conv *voice.Conversation) {
	if errors.Is(conv.Err(), voice.ErrBoardLeft) || s.l.Closed() {
		return
	}
	s.l.audioMu.Lock()
	current := s.l.audio != nil && s.l.audio.voice.Load() != nil && s.l.audio.voice.Load().conv == conversation(conv)
	s.l.audioMu.Unlock()
	if !current {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), goodbyeTimeout)
	defer cancel()
	if _, err := s.l.goodbye(ctx); err != nil {
		s.l.log.Debug("goodbye after the upstream ended the conversation not sent", zap.Error(err))
	}
}

// upstreamHello is the board's hello as a WebSocket client says it: the
// upstream gets the board's features and audio parameters, over
// WebSocket framing version 1.
func upstreamHello(env envelope.Envelope) []byte {
	var in struct {
		Features    json.RawMessage `json:"features"`
		AudioParams json.RawMessage `json:"audio_params"`
	}
	_ = json.Unmarshal(env.Raw, &in)
	out := struct {
		Type        string          `json:"type"`
		Version     int             `json:"version"`
		Transport   string          `json:"transport"`
		Features    json.RawMessage `json:"features,omitempty"`
		AudioParams json.RawMessage `json:"audio_params,omitempty"`
	}{"hello", upstreamVersion, "websocket", in.Features, in.AudioParams}
	b, _ := json.Marshal(out)
	return b
}

// voiceHello answers a board's hello through its upstream, in the
// background: the link's reader goes on with MCP meanwhile, and the board
// waits up to 10 s for its hello. One attempt at a time; a hello during
// one is dropped (the board sends another when its wait ends).
func (l *link) voiceHello(env envelope.Envelope) {
	if !l.voiceOpening.CompareAndSwap(false, true) {
		return
	}
	l.voiceWG.Add(1)
	go func() {
		defer l.voiceWG.Done()
		defer l.voiceOpening.Store(false)
		r := l.g.cfg.Relay
		side := &mqttSide{l: l}
		b := voice.Board{DeviceID: l.board.DeviceID, ClientID: l.board.UUID, ProtocolVersion: upstreamVersion, Transport: TransportName}
		conv, sh, err := r.Open(l.voiceCtx, b, upstreamHello(env), side)
		if err != nil {
			l.voiceFailed()
			return
		}
		a := l.g.udp.open(sh.SessionID)
		va, err := newVoiceAudio(a, conv)
		if err != nil {
			l.g.udp.close(a)
			conv.Close(err)
			return
		}
		a.voice.Store(va)
		side.audio.Store(a)
		if _, ok := l.adopt(a); !ok {
			conv.Close(voice.ErrBoardLeft)
			return
		}
		audio := envelope.AudioParams{Format: "opus", SampleRate: sh.SampleRate, Channels: 1, FrameDuration: sh.FrameDuration}
		ctx, cancel := context.WithTimeout(l.voiceCtx, l.g.cfg.WriteTimeout)
		defer cancel()
		if err := l.Send(ctx, serverHelloWith(a, l.advHost, l.g.udpAdvertisePort(), audio)); err != nil {
			l.g.warns.helloUnanswered.Warn(l.log, "could not answer hello", zap.Error(err))
			return
		}
		l.g.stats.hellos.Add(1)
		l.notes.audioOpened.Info(l.log, "audio session opened, relayed to the voice upstream", zap.String("session_id", a.id), zap.Uint32("ssrc", a.ssrc))
	}()
}

// adopt makes a the board's audio session, ending the one it replaces
// (and its conversation), which it returns; false when the link has
// closed.
func (l *link) adopt(a *audioSession) (old *audioSession, ok bool) {
	l.audioMu.Lock()
	if l.Closed() {
		l.audioMu.Unlock()
		l.g.udp.close(a)
		return nil, false
	}
	old = l.audio
	l.audio = a
	l.audioMu.Unlock()
	l.g.udp.close(old)
	endVoice(old)
	l.sid.Store(&a.id)
	return old, true
}

// endVoice ends an audio session's conversation, if it has one.
func endVoice(a *audioSession) {
	if a == nil {
		return
	}
	if v := a.voice.Load(); v != nil {
		v.conv.Close(voice.ErrBoardLeft)
	}
}

// voiceFailed answers a hello the upstream could not: the board gets a
// hello (so it does not wait out its 10 s), an alert its user sees, and a
// goodbye that returns it to idle. Its next hello tries the upstream
// again.
func (l *link) voiceFailed() {
	a := l.g.udp.open(randid.Hex16())
	if _, ok := l.adopt(a); !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.g.cfg.WriteTimeout)
	defer cancel()
	if err := l.Send(ctx, serverHello(a, l.advHost, l.g.udpAdvertisePort())); err != nil {
		return
	}
	_ = l.Send(ctx, voice.FailureAlert(a.id))
	if _, err := l.goodbye(ctx); err != nil {
		l.log.Debug("goodbye after a failed conversation not sent", zap.Error(err))
	}
}

// conversation is the board's relayed conversation, nil when none.
func (l *link) conversation() conversation {
	l.audioMu.Lock()
	defer l.audioMu.Unlock()
	if l.audio == nil {
		return nil
	}
	if v := l.audio.voice.Load(); v != nil {
		return v.conv
	}
	return nil
}

// sendDown encrypts one downlink Opus packet for the board the firmware's
// way: the header is the session nonce with the length, timestamp 0 and
// the next sequence written in, and it is also the CTR counter block.
func (u *udpServer) sendDown(a *audioSession, opus []byte) bool {
	v := a.voice.Load()
	if v == nil || len(opus) > maxDownPayload {
		return false
	}
	to := v.remote.Load()
	if to == nil {
		return false // the board has not sent a datagram yet: no address
	}
	pkt := make([]byte, udpHeaderLen+len(opus))
	copy(pkt, v.nonce[:])
	binary.BigEndian.PutUint16(pkt[2:4], uint16(len(opus)))
	binary.BigEndian.PutUint32(pkt[8:12], 0)
	binary.BigEndian.PutUint32(pkt[12:16], v.downSeq.Add(1))
	cipher.NewCTR(v.block, pkt[:udpHeaderLen]).XORKeyStream(pkt[udpHeaderLen:], opus)
	if _, err := u.conn.WriteToUDP(pkt, to); err != nil {
		return false
	}
	u.sent.Add(1)
	return true
}

// relayUp decrypts one uplink datagram of a relayed session and hands its
// Opus packet to the conversation. Datagrams whose sequence is not above
// the last one are dropped, as boards drop them; the first datagram fixes
// the board's address, and later ones from elsewhere are dropped.
func (u *udpServer) relayUp(a *audioSession, v *voiceAudio, d []byte, from *net.UDPAddr) {
	if prev := v.remote.Load(); prev == nil {
		addr := *from
		v.remote.CompareAndSwap(nil, &addr)
	} else if !prev.IP.Equal(from.IP) || prev.Port != from.Port {
		u.foreign.Add(1)
		return
	}
	seq := binary.BigEndian.Uint32(d[12:16])
	for {
		last := a.lastSeq.Load()
		if seq <= last {
			u.stale.Add(1)
			return
		}
		if a.lastSeq.CompareAndSwap(last, seq) {
			break
		}
	}
	if len(d) == udpHeaderLen {
		return // an empty datagram opens the NAT path (firmware 2.5)
	}
	opus := make([]byte, len(d)-udpHeaderLen)
	cipher.NewCTR(v.block, d[:udpHeaderLen]).XORKeyStream(opus, d[udpHeaderLen:])
	v.conv.Audio(opus)
}
