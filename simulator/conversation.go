package simulator

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// Conversation mode: a board holds a voice conversation the way the
// firmware does (§4.4), over whichever transport it is connected with, so
// that a server relaying voice can be tested end to end. The board has no
// microphone and no speaker: it sends payloads it is given as Opus
// packets, and records the downlink audio it would have played.
//
// The receive side runs for every connection, conversation or not: tts
// start and stop move the board between idle, listening and speaking, and
// downlink audio is played (counted, and recorded during a conversation)
// only while speaking, as on the firmware. One deviation: the firmware
// applies tts start on its main task, so an audio packet right behind it
// may be dropped; the simulator applies it on arrival, so a server that
// sends tts start and then audio on one WebSocket gets all of it played.
// Over MQTT the two still race (MQTT and UDP are separate paths), as on a
// real board.

// Listening modes of listen start (§4.1).
const (
	ModeAuto     = "auto"     // the server decides when the user stopped speaking
	ModeManual   = "manual"   // push to talk: listen stop on release
	ModeRealtime = "realtime" // with AEC: the microphone stays on while speaking
)

// Conversation limits and defaults.
const (
	// DefaultReplyTimeout is ConverseOptions.ReplyTimeout's default.
	DefaultReplyTimeout = 30 * time.Second
	// DecodeQueuePackets is the firmware's decode queue: 2400 ms of 60 ms
	// packets. Packets past it are dropped, not blocked.
	DecodeQueuePackets = 40
	// MaxAudioPayload is the largest Opus packet: the board's 1500-byte UDP
	// receive buffer less the 16-byte header. Uplink payloads are held to
	// it on every transport.
	MaxAudioPayload = 1484
	// maxRecorded and maxRecordedBytes bound what one Conversation keeps,
	// so that a server streaming without end cannot exhaust the
	// simulator's memory; what is left out is counted in Unrecorded.
	maxRecorded      = 1 << 16
	maxRecordedBytes = 64 << 20
)

// Conversation errors.
var (
	// ErrConversationBusy: Converse was called while another conversation
	// runs on the same board.
	ErrConversationBusy = errors.New("simulator: a conversation is already running on this board")
	// ErrServerGoodbye: the server closed the audio channel (MQTT goodbye
	// with the board's session id) before the answer ended.
	ErrServerGoodbye = errors.New("simulator: the server said goodbye, which ended the conversation")
	// ErrReplyTimeout: the server's answer did not end (tts stop) in time.
	ErrReplyTimeout = errors.New("simulator: no tts stop from the server before the reply timeout")
)

// ConverseOptions configures one conversation. The zero value is a valid
// conversation in auto mode that sends no audio and waits up to 30 s for
// the server's answer.
type ConverseOptions struct {
	// Frames is the number of uplink Opus packets sent per turn, after
	// listen start. In auto and manual mode the board stops early if the
	// server starts speaking (the firmware only sends while listening).
	Frames int
	// FrameBytes is the size of the default payloads (DefaultPayload): 0
	// keeps the pattern's own length; at most MaxAudioPayload.
	FrameBytes int
	// Payload, when set, gives uplink packet k (0-based, counted over the
	// whole conversation). It must return at most MaxAudioPayload bytes.
	// The default is DefaultPayload(board MAC, k, FrameBytes).
	Payload func(k int) []byte
	// Mode is the listen start mode: ModeAuto (default), ModeManual (the
	// board sends listen stop after its packets) or ModeRealtime.
	Mode string
	// WakeWord, when set, sends listen detect with this text before the
	// first listen start, as a board woken by its wake word does. It is
	// sent unescaped, as the firmware builds its messages.
	WakeWord string
	// Pace is the interval between uplink packets: 0 sends them as fast as
	// the transport takes them, 60 ms is real time.
	Pace time.Duration
	// ReplyTimeout bounds each turn's wait for the server's tts stop after
	// the uplink (default 30 s).
	ReplyTimeout time.Duration
	// Turns is the number of question-and-answer turns (default 1). After
	// each tts stop but the last the board sends listen start again (in
	// auto mode the firmware does this by itself; in manual mode it is the
	// next press of the button) and speaks the next turn's Frames.
	Turns int
	// ListenAfter makes the board, in auto mode, send listen start again
	// after the last tts stop, as the firmware does, and stay listening.
	// By default the conversation ends at tts stop and the board goes idle.
	ListenAfter bool
	// Goodbye makes an MQTT board close its audio channel when the
	// conversation ended with tts stop: UDP closes and the firmware's
	// goodbye is published. No effect on WebSocket, where the firmware
	// keeps the socket. Not with ListenAfter.
	Goodbye bool
	// DecodeQueue is how many downlink packets may wait to be played
	// before more are dropped: 0 means the firmware's 40, a negative value
	// no limit. The board plays one packet per frame_duration of the
	// server hello.
	DecodeQueue int
}

// Conversation is what a board sent and heard during one Converse.
type Conversation struct {
	Transport string // "websocket" or "mqtt"
	Mode      string
	SessionID string // the session id the board's messages carried

	Started    time.Time // when the first message (detect or listen start) was sent
	UplinkDone time.Time // when the last turn's uplink ended (after listen stop in manual mode)
	TTSStart   time.Time // first tts start
	TTSStop    time.Time // last tts stop
	UplinkSent int       // uplink audio packets sent
	Turns      int       // tts stops received

	STT       []string // stt texts, in order
	Emotions  []string // llm emotions
	Sentences []string // tts sentence_start texts
	Alerts    []Alert  // alerts with the three string fields the firmware requires
	// Audio is every downlink packet the board played, in arrival order:
	// the Opus payload after the v2/v3 header or after UDP decryption.
	Audio []AudioFrame
	// Dropped counts downlink packets that arrived while the board was not
	// speaking (before tts start, after tts stop, while listening).
	Dropped int
	// QueueDropped counts packets dropped because the decode queue was
	// full (see ConverseOptions.DecodeQueue).
	QueueDropped int
	// Rejected counts downlink packets that never reached the player: UDP
	// datagrams failing the board's checks (type, length, sequence), and
	// WebSocket frames shorter than their v2/v3 header.
	Rejected int
	// Malformed counts v2/v3 frames whose payload_size disagrees with the
	// frame's length. The firmware trusts the field; the simulator played
	// min(payload_size, bytes present).
	Malformed int
	// Messages holds every text message received during the conversation,
	// raw, in order.
	Messages []string
	// Unrecorded counts entries (messages, audio, texts) left out past the
	// recording bounds (65536 entries per list, 64 MiB in all).
	Unrecorded int

	recordedBytes int
}

// AudioFrame is one downlink audio packet.
type AudioFrame struct {
	At        time.Time // arrival
	Payload   []byte    // Opus payload
	Timestamp uint32    // the v2 or UDP header's timestamp; 0 on v1 and v3
	Sequence  uint32    // the UDP sequence; 0 on WebSocket
}

// LastAlert is the last alert the board showed, conversation or not.
func (b *Board) LastAlert() (Alert, bool) {
	if a := b.lastAlert.Load(); a != nil {
		return *a, true
	}
	return Alert{}, false
}

// Alert is a server alert (type alert) the board showed.
type Alert struct {
	Status, Message, Emotion string
}

// Payloads returns the played downlink payloads in order.
func (c *Conversation) Payloads() [][]byte {
	out := make([][]byte, len(c.Audio))
	for i, f := range c.Audio {
		out[i] = f.Payload
	}
	return out
}

// DefaultPayload is the default uplink packet k of the board with this
// MAC: "opus <mac> #<k> " followed by filler letters up to size bytes (cut
// to size when shorter; size 0 keeps the pattern). A server or a test can
// recompute it to check what arrived, byte for byte.
func DefaultPayload(mac string, k, size int) []byte {
	p := []byte("opus " + mac + " #" + strconv.Itoa(k) + " ")
	for i := 0; len(p) < size; i++ {
		p = append(p, byte('a'+(k+i)%26))
	}
	if size > 0 && len(p) > size {
		p = p[:size]
	}
	return p
}

func (o ConverseOptions) normalize(mac string) (ConverseOptions, error) {
	switch {
	case o.Frames < 0:
		return o, errors.New("simulator: converse: negative frame count")
	case o.FrameBytes < 0 || o.FrameBytes > MaxAudioPayload:
		return o, fmt.Errorf("simulator: converse: frame bytes %d: want 0 to %d", o.FrameBytes, MaxAudioPayload)
	case o.Pace < 0, o.ReplyTimeout < 0:
		return o, errors.New("simulator: converse: negative pace or reply timeout")
	case o.Turns < 0:
		return o, errors.New("simulator: converse: negative turn count")
	case o.ListenAfter && o.Goodbye:
		return o, errors.New("simulator: converse: ListenAfter and Goodbye exclude each other")
	}
	o.Mode = cmp.Or(o.Mode, ModeAuto)
	switch o.Mode {
	case ModeAuto, ModeManual, ModeRealtime:
	default:
		return o, fmt.Errorf("simulator: converse: mode %q: want auto, manual or realtime", o.Mode)
	}
	o.ReplyTimeout = cmp.Or(o.ReplyTimeout, DefaultReplyTimeout)
	o.Turns = max(o.Turns, 1)
	if o.Payload == nil {
		size := o.FrameBytes
		o.Payload = func(k int) []byte { return DefaultPayload(mac, k, size) }
	}
	return o, nil
}

// ---- the board's audio state (receive side) ----

type deviceState int

const (
	stateIdle deviceState = iota
	stateListening
	stateSpeaking
)

func (s deviceState) String() string {
	switch s {
	case stateListening:
		return "listening"
	case stateSpeaking:
		return "speaking"
	}
	return "idle"
}

// audioState is the part of the firmware's device state machine that
// conversations touch, the decode queue's model, and the recorder of the
// conversation in progress. mu is a leaf: nothing else is locked under it.
type audioState struct {
	mu    sync.Mutex
	state deviceState
	// manual: the last listen start was in manual mode, so tts stop goes
	// back to idle rather than listening.
	manual bool
	// playEnd is when the packets accepted so far finish playing; how far
	// it lies ahead is the decode queue's fill.
	playEnd time.Time
	// queueLimit is the decode queue's length (negative: unbounded).
	queueLimit int
	// run is the conversation in progress, if any.
	run *convRun
}

// convRun is a conversation's shared state; guarded by audioState.mu.
type convRun struct {
	rec     *Conversation
	goodbye bool
	// notify (buffered, 1) wakes Converse after a tts stop or a goodbye.
	notify chan struct{}
}

func (r *convRun) signal() {
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

// record appends v to list unless a bound is reached, counting size bytes
// against the conversation's total.
func record[T any](c *Conversation, list *[]T, v T, size int) {
	if len(*list) >= maxRecorded || c.recordedBytes+size > maxRecordedBytes {
		c.Unrecorded++
		return
	}
	c.recordedBytes += size
	*list = append(*list, v)
}

// recordText keeps a raw text message for the conversation in progress.
func (s *session) recordText(data []byte) {
	a := &s.audio
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.run != nil {
		record(a.run.rec, &a.run.rec.Messages, string(data), len(data))
	}
}

// handleConversationMessage is the firmware's handling of tts, stt, llm
// and alert (§4.2): state changes for tts start and stop, the texts
// recorded for the conversation in progress.
func (s *session) handleConversationMessage(typ string, root *jsonValue) {
	now := time.Now()
	a := &s.audio
	a.mu.Lock()
	defer a.mu.Unlock()
	var rec *Conversation
	if a.run != nil {
		rec = a.run.rec
	}
	text := func(key string, list *[]string) {
		if v := root.get(key); v.isString() && rec != nil {
			record(rec, list, v.str, len(v.str))
		}
	}
	switch typ {
	case "tts":
		st := root.get("state")
		if !st.isString() {
			s.ignore("tts without a string state")
			return
		}
		switch st.str {
		case "start":
			// Allowed from idle and listening; speaking stays speaking.
			a.state = stateSpeaking
			if rec != nil && rec.TTSStart.IsZero() {
				rec.TTSStart = now
			}
		case "stop":
			if a.state == stateSpeaking {
				a.state = stateListening
				if a.manual {
					a.state = stateIdle
				}
				a.playEnd = time.Time{}
			}
			if rec != nil {
				rec.Turns++
				rec.TTSStop = now
				a.run.signal()
			}
		case "sentence_start":
			if rec != nil {
				text("text", &rec.Sentences)
			}
		default:
			s.ignore("unknown tts state")
		}
	case "stt":
		if rec != nil {
			text("text", &rec.STT)
		}
	case "llm":
		if rec != nil {
			text("emotion", &rec.Emotions)
		}
	case "alert":
		st, msg, emo := root.get("status"), root.get("message"), root.get("emotion")
		if !st.isString() || !msg.isString() || !emo.isString() {
			s.ignore("alert without string status, message and emotion")
			return
		}
		al := Alert{Status: st.str, Message: msg.str, Emotion: emo.str}
		s.b.lastAlert.Store(&al)
		if rec != nil {
			record(rec, &rec.Alerts, al, len(st.str)+len(msg.str)+len(emo.str))
		}
	}
}

// handleAudio plays one downlink packet: only while speaking, and only if
// the decode queue has room, which drains one packet per frame_duration of
// the server hello.
func (s *session) handleAudio(f AudioFrame, malformed bool) {
	_, frameMS := s.b.ServerAudioParams() // b.mu before audio.mu, never under it
	frame := time.Duration(frameMS) * time.Millisecond
	if frame <= 0 {
		frame = defaultServerFrameDuration * time.Millisecond
	}
	f.At = time.Now()
	a := &s.audio
	a.mu.Lock()
	defer a.mu.Unlock()
	var rec *Conversation
	if a.run != nil {
		rec = a.run.rec
		if malformed {
			rec.Malformed++
		}
	}
	if a.state != stateSpeaking {
		s.b.stats.audioDropped.Add(1)
		if rec != nil {
			rec.Dropped++
		}
		return
	}
	if a.playEnd.Before(f.At) {
		a.playEnd = f.At
	}
	// Packets not yet played out, the one playing included: the queue
	// holds limit of them besides the one playing.
	limit := cmp.Or(a.queueLimit, DecodeQueuePackets)
	if pending := int((a.playEnd.Sub(f.At) + frame - 1) / frame); limit >= 0 && pending > limit {
		s.b.stats.audioDropped.Add(1)
		if rec != nil {
			rec.QueueDropped++
		}
		return
	}
	a.playEnd = a.playEnd.Add(frame)
	if rec != nil {
		record(rec, &rec.Audio, f, len(f.Payload))
	}
}

// rejectAudio counts a downlink packet that failed the transport's checks.
func (s *session) rejectAudio() {
	s.b.stats.audioDropped.Add(1)
	a := &s.audio
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.run != nil {
		a.run.rec.Rejected++
	}
}

// serverGoodbye is an honoured MQTT goodbye: the board goes idle and a
// conversation in progress ends.
func (s *session) serverGoodbye() {
	a := &s.audio
	a.mu.Lock()
	defer a.mu.Unlock()
	a.state = stateIdle
	a.playEnd = time.Time{}
	if a.run != nil {
		a.run.goodbye = true
		a.run.signal()
	}
}

func (s *session) startListening(mode string) {
	a := &s.audio
	a.mu.Lock()
	defer a.mu.Unlock()
	a.state = stateListening
	a.manual = mode == ModeManual
}

// stopListening goes from listening to idle (button release) and reports
// whether the board was listening, which is when the firmware sends
// listen stop.
func (s *session) stopListening() bool {
	a := &s.audio
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.state != stateListening {
		return false
	}
	a.state = stateIdle
	return true
}

// mayUplink: the firmware sends microphone audio only while listening,
// and in realtime mode while speaking too.
func (s *session) mayUplink(mode string) bool {
	a := &s.audio
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.state == stateListening || (mode == ModeRealtime && a.state == stateSpeaking)
}

func (s *session) stateName() string {
	a := &s.audio
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.state.String()
}

// ---- transports ----

// voiceLink is what a conversation needs from a transport.
type voiceLink interface {
	voiceSession() *session
	// sendOrdered sends a text message so that it leaves before any audio
	// sent after it.
	sendOrdered(ctx context.Context, msg string) error
	sendAudio(payload []byte) error
	linkDone() <-chan struct{}
	// linkCause is why the link ended; call after linkDone is closed.
	linkCause() error
	transportName() string
}

var (
	_ voiceLink = (*wsLink)(nil)
	_ voiceLink = (*MQTTConn)(nil)
)

func (l *wsLink) voiceSession() *session { return l.sess }

// sendOrdered: text and audio share the writer's queue, so queueing is
// enough.
func (l *wsLink) sendOrdered(_ context.Context, msg string) error { return l.send(msg) }

func (l *wsLink) sendAudio(payload []byte) error {
	return l.enqueue(wsOut{frame: frameAudio(l.b.cfg.ProtocolVersion, payload), binary: true})
}

func (l *wsLink) linkDone() <-chan struct{} { return l.done }
func (l *wsLink) linkCause() error          { return l.cause }
func (l *wsLink) transportName() string     { return "websocket" }

// frameAudio frames one Opus packet for binary protocol version v (§3.7):
// v1 raw, v2 a 16-byte header (version 2, type 0, reserved 0, timestamp
// 0, payload size), v3 a 4-byte header (type 0, reserved 0, payload size).
func frameAudio(v int, payload []byte) []byte {
	switch v {
	case 2:
		f := make([]byte, 16+len(payload))
		binary.BigEndian.PutUint16(f[0:2], 2)
		binary.BigEndian.PutUint32(f[12:16], uint32(len(payload)))
		copy(f[16:], payload)
		return f
	case 3:
		f := make([]byte, 4+len(payload))
		binary.BigEndian.PutUint16(f[2:4], uint16(len(payload)))
		copy(f[4:], payload)
		return f
	}
	return append([]byte{}, payload...)
}

// handleBinary takes the payload out of a downlink frame. Like the
// firmware it ignores the version and type fields and believes
// payload_size; a frame too short for its header, which the firmware
// would read past, is rejected.
func (l *wsLink) handleBinary(data []byte) {
	var f AudioFrame
	var size uint64
	switch l.b.cfg.ProtocolVersion {
	case 2:
		if len(data) < 16 {
			l.sess.rejectAudio()
			return
		}
		f.Timestamp = binary.BigEndian.Uint32(data[8:12])
		size, data = uint64(binary.BigEndian.Uint32(data[12:16])), data[16:]
	case 3:
		if len(data) < 4 {
			l.sess.rejectAudio()
			return
		}
		size, data = uint64(binary.BigEndian.Uint16(data[2:4])), data[4:]
	default:
		size = uint64(len(data))
	}
	malformed := size != uint64(len(data))
	if size < uint64(len(data)) {
		data = data[:size]
	}
	f.Payload = data
	l.sess.handleAudio(f, malformed)
}

func (c *MQTTConn) voiceSession() *session { return c.sess }

// sendOrdered waits for the publish: UDP audio does not queue behind it.
func (c *MQTTConn) sendOrdered(ctx context.Context, msg string) error { return c.sendWait(ctx, msg) }
func (c *MQTTConn) sendAudio(payload []byte) error                    { return c.SendAudio(payload) }
func (c *MQTTConn) linkDone() <-chan struct{}                         { return c.done }
func (c *MQTTConn) linkCause() error                                  { return c.cause }
func (c *MQTTConn) transportName() string                             { return "mqtt" }

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// liveVoiceLink is the board's live connection: its WebSocket once the
// hello exchange is done, else its MQTT connection.
func (b *Board) liveVoiceLink() voiceLink {
	b.linkMu.Lock()
	l, mc := b.cur, b.mqtt
	b.linkMu.Unlock()
	if l != nil && l.helloDone.Load() && !isClosed(l.done) {
		return l
	}
	if mc != nil && !isClosed(mc.done) {
		return mc
	}
	return nil
}

// AudioState is the board's device state as far as audio goes: "idle",
// "listening" or "speaking". A test can wait for "speaking" before sending
// UDP audio, which races the MQTT tts start that allows it.
func (b *Board) AudioState() string {
	if v := b.liveVoiceLink(); v != nil {
		return v.voiceSession().stateName()
	}
	return stateIdle.String()
}

// Abort sends the firmware's abort, as a button press while speaking does
// ({"session_id":"S","type":"abort"}), or with wakeWord the one a wake
// word during speech sends (reason wake_word_detected). The board keeps
// speaking until the server's tts stop.
func (b *Board) Abort(wakeWord bool) error {
	v := b.liveVoiceLink()
	if v == nil {
		return ErrNotConnected
	}
	fields := `"type":"abort"`
	if wakeWord {
		fields += `,"reason":"wake_word_detected"`
	}
	return v.sendOrdered(context.Background(), b.deviceMessage(fields))
}

// deviceMessage is a device message built the firmware's way: session id
// first, then fields, by concatenation.
func (b *Board) deviceMessage(fields string) string {
	if b.cfg.OmitSessionID {
		return "{" + fields + "}"
	}
	return `{"session_id":"` + b.SessionID() + `",` + fields + "}"
}

// ---- Converse ----

// Converse holds one conversation on the board's live connection, the
// firmware's way (§4.4):
//
//   - MQTT: if the audio channel is not open, the hello is published and
//     the server hello awaited (OpenAudioChannel). WebSocket: the
//     connection's hello exchange is the channel; the board must be
//     connected (ConnectWebSocket), or ErrNotConnected.
//   - listen detect with the wake word, when set; listen start with the
//     mode; Frames uplink packets (WebSocket binary frames in the
//     connection's v1/v2/v3 framing; UDP datagrams with the nonce's header,
//     sequence from 1 per server hello, AES-128-CTR); listen stop in
//     manual mode.
//   - then the server's answer: stt, llm, tts start, tts sentence_start,
//     downlink audio, tts stop. The turn ends at tts stop.
//
// Once the conversation has started (after the MQTT hello), it returns
// the Conversation even with an error, holding what was recorded until
// then. Errors: ErrServerGoodbye, ErrReplyTimeout, the
// connection's end (wrapping its cause: ErrConnectionLost,
// ErrServerClosed, ...), ctx's error, ErrConversationBusy, ErrNotConnected,
// or an options error. One conversation runs at a time per board.
func (b *Board) Converse(ctx context.Context, opts ConverseOptions) (*Conversation, error) {
	o, err := opts.normalize(b.mac)
	if err != nil {
		return nil, err
	}
	if !b.conversing.CompareAndSwap(false, true) {
		return nil, ErrConversationBusy
	}
	defer b.conversing.Store(false)

	v := b.liveVoiceLink()
	if v == nil {
		return nil, ErrNotConnected
	}
	if mc, ok := v.(*MQTTConn); ok && !mc.AudioChannelOpen() {
		if err := mc.OpenAudioChannel(ctx); err != nil {
			b.stats.conversationErrors.Add(1)
			return nil, fmt.Errorf("simulator: conversation: %w", err)
		}
	}
	cv := &conversation{b: b, v: v, s: v.voiceSession(), o: o, run: &convRun{
		rec:    &Conversation{Transport: v.transportName(), Mode: o.Mode, SessionID: b.SessionID()},
		notify: make(chan struct{}, 1),
	}}
	rec, err := cv.converse(ctx)
	if err != nil {
		b.stats.conversationErrors.Add(1)
	} else {
		b.stats.conversations.Add(1)
	}
	return rec, err
}

// conversation is one Converse in progress.
type conversation struct {
	b   *Board
	v   voiceLink
	s   *session
	o   ConverseOptions
	run *convRun
	// sent is the next uplink packet's index.
	sent int
}

func (cv *conversation) converse(ctx context.Context) (*Conversation, error) {
	a := &cv.s.audio
	a.mu.Lock()
	if a.run != nil {
		// A conversation whose Converse returned always detaches; this is
		// another board sharing the session, which cannot happen.
		a.mu.Unlock()
		return nil, ErrConversationBusy
	}
	a.run = cv.run
	a.queueLimit = cv.o.DecodeQueue
	a.mu.Unlock()

	listening, err := cv.turns(ctx)

	a.mu.Lock()
	a.run = nil
	a.queueLimit = 0
	if !listening && a.state == stateListening {
		// The board sends no listen start after the last tts stop, so it
		// is idle as far as the server can tell.
		a.state = stateIdle
	}
	a.mu.Unlock()

	if err == nil && cv.o.Goodbye {
		if mc, ok := cv.v.(*MQTTConn); ok {
			_ = mc.CloseAudioChannel() // the channel may be gone already
			cv.s.serverGoodbye()       // idle, as after any channel close
		}
	}
	return cv.run.rec, err
}

// turns runs the turns and reports whether the board was left listening.
func (cv *conversation) turns(ctx context.Context) (bool, error) {
	o := cv.o
	for turn := 1; turn <= o.Turns; turn++ {
		if turn == 1 && o.WakeWord != "" {
			if err := cv.send(ctx, `"type":"listen","state":"detect","text":"`+o.WakeWord+`"`); err != nil {
				return false, err
			}
		}
		if err := cv.listenStart(ctx); err != nil {
			return false, err
		}
		if err := cv.uplink(ctx, turn); err != nil {
			return false, err
		}
		if o.Mode == ModeManual && cv.s.stopListening() {
			if err := cv.send(ctx, `"type":"listen","state":"stop"`); err != nil {
				return false, err
			}
		}
		cv.setTime(&cv.run.rec.UplinkDone)
		if err := cv.waitTurn(ctx, turn); err != nil {
			return false, err
		}
	}
	if o.ListenAfter && o.Mode == ModeAuto {
		return true, cv.listenStart(ctx)
	}
	return false, nil
}

func (cv *conversation) listenStart(ctx context.Context) error {
	cv.s.startListening(cv.o.Mode)
	return cv.send(ctx, `"type":"listen","state":"start","mode":"`+cv.o.Mode+`"`)
}

// send sends one device message.
func (cv *conversation) send(ctx context.Context, fields string) error {
	a := &cv.s.audio
	a.mu.Lock()
	if cv.run.rec.Started.IsZero() {
		cv.run.rec.Started = time.Now()
	}
	a.mu.Unlock()
	if err := cv.v.sendOrdered(ctx, cv.b.deviceMessage(fields)); err != nil {
		return cv.failed(ctx, err)
	}
	return nil
}

// uplink sends the turn's packets, paced, while the board may send and
// the server has not already answered the turn.
func (cv *conversation) uplink(ctx context.Context, turn int) error {
	o := cv.o
	start := time.Now()
	for i := range o.Frames {
		if o.Pace > 0 && i > 0 {
			if err := cv.waitUntil(ctx, start.Add(time.Duration(i)*o.Pace)); err != nil {
				return err
			}
		}
		if err := cv.interrupted(ctx); err != nil {
			return err
		}
		if !cv.s.mayUplink(o.Mode) || cv.answered(turn) {
			return nil // the server started answering
		}
		p := o.Payload(cv.sent)
		if len(p) > MaxAudioPayload {
			return fmt.Errorf("simulator: conversation: uplink packet %d is %d bytes; a board sends at most %d", cv.sent, len(p), MaxAudioPayload)
		}
		if err := cv.v.sendAudio(p); err != nil {
			return cv.failed(ctx, err)
		}
		cv.sent++
		a := &cv.s.audio
		a.mu.Lock()
		cv.run.rec.UplinkSent++
		a.mu.Unlock()
	}
	return nil
}

func (cv *conversation) waitUntil(ctx context.Context, t time.Time) error {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-cv.v.linkDone():
		return cv.linkEnded()
	}
}

// interrupted reports a goodbye, the link's end or ctx's end.
func (cv *conversation) interrupted(ctx context.Context) error {
	if cv.goodbye() {
		return ErrServerGoodbye
	}
	if isClosed(cv.v.linkDone()) {
		return cv.linkEnded()
	}
	return ctx.Err()
}

// failed turns a send error into the reason the conversation ended.
func (cv *conversation) failed(ctx context.Context, err error) error {
	if ierr := cv.interrupted(ctx); ierr != nil {
		return ierr
	}
	return fmt.Errorf("simulator: conversation: %w", err)
}

func (cv *conversation) linkEnded() error {
	return fmt.Errorf("simulator: conversation ended with the connection: %w", cv.v.linkCause())
}

// answered reports whether the turn's tts stop has come.
func (cv *conversation) answered(turn int) bool {
	a := &cv.s.audio
	a.mu.Lock()
	defer a.mu.Unlock()
	return cv.run.rec.Turns >= turn
}

func (cv *conversation) goodbye() bool {
	a := &cv.s.audio
	a.mu.Lock()
	defer a.mu.Unlock()
	return cv.run.goodbye
}

func (cv *conversation) setTime(t *time.Time) {
	a := &cv.s.audio
	a.mu.Lock()
	*t = time.Now()
	a.mu.Unlock()
}

// waitTurn waits for the turn's tts stop.
func (cv *conversation) waitTurn(ctx context.Context, turn int) error {
	timer := time.NewTimer(cv.o.ReplyTimeout)
	defer timer.Stop()
	done := func() (bool, error) {
		a := &cv.s.audio
		a.mu.Lock()
		defer a.mu.Unlock()
		if cv.run.goodbye {
			return true, ErrServerGoodbye
		}
		return cv.run.rec.Turns >= turn, nil
	}
	for {
		if ok, err := done(); ok {
			return err
		}
		select {
		case <-cv.run.notify:
		case <-cv.v.linkDone():
			// A tts stop read just before the link ended still counts.
			if ok, err := done(); ok {
				return err
			}
			return cv.linkEnded()
		case <-timer.C:
			return fmt.Errorf("%w (%v)", ErrReplyTimeout, cv.o.ReplyTimeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
