package voicestub

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"go.uber.org/zap"
)

// conn is one accepted board connection. Goroutines: the reader (the HTTP
// handler's own goroutine, in run), the writer (the only code writing the
// socket), the session (server hello, then the MCP client's listing) and
// the speaker (answers and aborts, one at a time). run waits for the other
// three before it returns.
type conn struct {
	s       *Server
	rec     *connRec // fields guarded by s.mu
	faults  Faults
	log     *zap.Logger
	version int
	sid     string

	wsMu sync.Mutex // guards ws until run has set it
	ws   *websocket.Conn

	out       chan outItem
	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup

	// hello carries the board hello's features.mcp to the session.
	hello chan bool
	// jobs feeds the speaker; abortGen counts aborts, and an answer made
	// before the latest abort is cut. abortSig wakes a pacing speaker.
	jobs     chan job
	abortGen atomic.Uint64
	abortSig chan struct{}

	// Reader-owned state.
	helloSeen bool
	msgsIn    int
	framesIn  int
	turn      *turn
	preroll   [][2][]byte

	// mcpMu guards pending and nextID; a leaf like s.mu, never held with it.
	mcpMu   sync.Mutex
	pending map[int64]chan mcpReply
	nextID  int64
}

// turn is the open listening turn, owned by the reader; preroll (also the
// reader's) holds the audio heard while no turn was open.
type turn struct {
	mode  string
	idx   int // index in rec.Conversations, -1 if not recorded
	heard int
	first []byte
}

// job is an answer to a finished turn, or (abort) a lone tts stop.
type job struct {
	abort bool
	gen   uint64 // abortGen when the turn ended
	idx   int
	heard int
	first []byte
}

// outItem is one message for the writer; after runs under s.mu once the
// message is written. With stamp, the writer puts the time of the write in
// the StampSize bytes of data at stampAt.
type outItem struct {
	binary  bool
	data    []byte
	stamp   bool
	stampAt int
	after   func(r *connRec)
}

func newConn(s *Server, rec *connRec, f Faults, log *zap.Logger) *conn {
	return &conn{
		s:        s,
		rec:      rec,
		faults:   f,
		log:      log,
		version:  rec.ProtocolVersion,
		sid:      rec.SessionID,
		out:      make(chan outItem, outQueue),
		done:     make(chan struct{}),
		hello:    make(chan bool, 1),
		jobs:     make(chan job, jobQueue),
		abortSig: make(chan struct{}, 1),
		pending:  map[int64]chan mcpReply{},
		nextID:   firstCallID,
	}
}

// run owns the connection from the upgrade to the end.
func (c *conn) run(ws *websocket.Conn) {
	c.wsMu.Lock()
	c.ws = ws
	c.wsMu.Unlock()
	select {
	case <-c.done: // Close or Disconnect came first
		_ = ws.Close()
	default:
	}
	ws.SetReadLimit(ReadLimit)
	c.wg.Add(3)
	go c.writeLoop()
	go c.session()
	go c.speaker()
	reason := c.readLoop()
	c.shutdown(reason)
	c.wg.Wait()
	var st Connection
	c.s.mu.Lock()
	if c.turn != nil {
		c.endTurnLocked(c.rec, "close")
	}
	c.rec.Closed = true
	delete(c.s.live, c)
	c.s.changedLocked()
	st = c.rec.Connection
	c.s.mu.Unlock()
	c.log.Info("board disconnected", zap.String("reason", st.CloseReason),
		zap.Int("texts", len(st.Texts)), zap.Int("frames", st.FramesHeard),
		zap.Int("conversations", len(st.Conversations)), zap.Int("answers", st.Answers))
}

// shutdown ends the connection once, recording why: a plain TCP close,
// which unblocks the reader and the writer.
func (c *conn) shutdown(reason string) {
	c.closeOnce.Do(func() {
		c.s.update(c.rec, func(r *connRec) { r.CloseReason = reason })
		close(c.done)
		c.wsMu.Lock()
		ws := c.ws
		c.wsMu.Unlock()
		if ws != nil {
			_ = ws.Close()
		}
	})
}

// send queues m for the writer; false once the connection is closing.
func (c *conn) send(m outItem) bool {
	select {
	case c.out <- m:
		return true
	case <-c.done:
		return false
	}
}

func (c *conn) sendText(data []byte, after func(r *connRec)) bool {
	return c.send(outItem{data: data, after: after})
}

func (c *conn) writeLoop() {
	defer c.wg.Done()
	for {
		select {
		case <-c.done:
			return
		case m := <-c.out:
			typ := websocket.TextMessage
			if m.binary {
				typ = websocket.BinaryMessage
			}
			now := time.Now()
			if m.stamp {
				// As late as possible: the stamp times everything after the
				// stub's own queue.
				binary.BigEndian.PutUint64(m.data[m.stampAt:], uint64(now.UnixNano()))
			}
			_ = c.ws.SetWriteDeadline(now.Add(c.s.cfg.WriteTimeout))
			if err := c.ws.WriteMessage(typ, m.data); err != nil {
				c.shutdown("write: " + err.Error())
				return
			}
			c.s.update(c.rec, func(r *connRec) {
				if m.binary {
					r.FramesSent++
				} else if c.s.keep(r, len(r.Sent), len(m.data)) {
					r.Sent = append(r.Sent, m.data)
				}
				if m.after != nil {
					m.after(r)
				}
			})
		}
	}
}

// readLoop reads until the connection ends and returns why.
func (c *conn) readLoop() string {
	for {
		_ = c.ws.SetReadDeadline(time.Now().Add(c.s.cfg.IdleTimeout))
		typ, data, err := c.ws.ReadMessage()
		if err != nil {
			select {
			case <-c.done:
				return "" // shutdown already recorded the reason
			default:
			}
			return "read: " + err.Error()
		}
		c.msgsIn++
		var ok bool
		switch typ {
		case websocket.TextMessage:
			ok = c.handleText(data)
		case websocket.BinaryMessage:
			ok = c.handleBinary(data)
		}
		if !ok {
			return ""
		}
		if f := c.faults; f.StallAfter > 0 && c.msgsIn == f.StallAfter && f.StallFor > 0 {
			// Simulated slow reader: the board's writes back up in TCP.
			t := time.NewTimer(f.StallFor)
			select {
			case <-t.C:
			case <-c.done:
				t.Stop()
				return ""
			}
		}
	}
}

// inMsg is what the stub reads of a board's text message.
type inMsg struct {
	Type     string          `json:"type"`
	State    string          `json:"state"`
	Mode     string          `json:"mode"`
	Text     string          `json:"text"`
	Features json.RawMessage `json:"features"`
	Payload  json.RawMessage `json:"payload"`
}

// handleText records and acts on one text message; false ends the
// connection.
func (c *conn) handleText(data []byte) bool {
	var m inMsg
	err := json.Unmarshal(data, &m)
	c.s.update(c.rec, func(r *connRec) {
		if c.s.keep(r, len(r.Texts), len(data)) {
			r.Texts = append(r.Texts, data)
		}
		if err != nil || m.Type == "" {
			r.Ignored++
		}
	})
	if err != nil {
		// Boards paste error text into MCP replies unescaped; a broken
		// reply must still end the call waiting for it.
		if bytes.Contains(data, []byte(`"type":"mcp"`)) {
			c.handleBrokenMCP(data)
		}
		return true
	}
	switch m.Type {
	case "hello":
		return c.handleHello(data, m.Features)
	case "listen":
		c.handleListen(m)
	case "abort":
		c.handleAbort()
	case "mcp":
		c.handleMCP(m.Payload)
	default:
		c.s.update(c.rec, func(r *connRec) { r.Ignored++ })
	}
	return true
}

func (c *conn) handleHello(data []byte, features json.RawMessage) bool {
	if c.helloSeen {
		c.s.update(c.rec, func(r *connRec) { r.Ignored++ })
		return true
	}
	c.helloSeen = true
	var f struct {
		MCP bool `json:"mcp"`
	}
	_ = json.Unmarshal(features, &f) // absent or odd features: no MCP
	c.s.update(c.rec, func(r *connRec) { r.Hello, r.HelloMCP = data, f.MCP })
	if c.faults.CloseOnHello {
		c.shutdown("closed on hello (fault)")
		return false
	}
	c.hello <- f.MCP // buffered, sent once
	return true
}

func (c *conn) handleListen(m inMsg) {
	switch m.State {
	case "start":
		c.s.mu.Lock()
		if c.turn != nil {
			c.endTurnLocked(c.rec, "restart")
		}
		t := &turn{mode: m.Mode, idx: -1}
		if c.s.keep(c.rec, len(c.rec.Conversations), 0) {
			t.idx = len(c.rec.Conversations)
			c.rec.Conversations = append(c.rec.Conversations, Conversation{Mode: m.Mode})
		}
		c.turn = t
		for _, f := range c.preroll {
			c.countLocked(t, f[0], f[1])
		}
		c.preroll = nil
		c.s.changedLocked()
		c.s.mu.Unlock()
		if t.mode != "manual" && t.heard >= c.s.cfg.AutoFrames {
			c.finishTurn("frames")
		}
	case "stop":
		if c.turn != nil {
			c.finishTurn("stop")
		}
	case "detect":
		c.s.update(c.rec, func(r *connRec) {
			if c.s.keep(r, len(r.WakeWords), len(m.Text)) {
				r.WakeWords = append(r.WakeWords, m.Text)
			}
		})
	default:
		c.s.update(c.rec, func(r *connRec) { r.Ignored++ })
	}
}

// endTurnLocked closes the open turn without answering. Caller holds s.mu.
func (c *conn) endTurnLocked(r *connRec, why string) {
	if c.turn.idx >= 0 {
		r.Conversations[c.turn.idx].EndedBy = why
	}
	c.turn = nil
	c.s.changedLocked()
}

// finishTurn closes the open turn and queues its answer. The turn is
// marked ended before the speaker can see it, so a finished answer always
// belongs to an ended turn.
func (c *conn) finishTurn(why string) {
	t := c.turn
	c.s.mu.Lock()
	c.endTurnLocked(c.rec, why)
	c.s.mu.Unlock()
	select {
	case c.jobs <- job{gen: c.abortGen.Load(), idx: t.idx, heard: t.heard, first: t.first}:
	default:
		c.s.update(c.rec, func(r *connRec) { conv(r, t.idx, func(cv *Conversation) { cv.Skipped = true }) })
	}
}

func (c *conn) handleAbort() {
	c.abortGen.Add(1)
	select {
	case c.abortSig <- struct{}{}:
	default:
	}
	c.s.update(c.rec, func(r *connRec) { r.Aborts++ })
	select {
	case c.jobs <- job{abort: true}:
	default:
		c.log.Debug("abort answer dropped: speaker queue full")
	}
}

// handleBinary records one audio frame and counts it into the open turn;
// false ends the connection.
func (c *conn) handleBinary(data []byte) bool {
	c.framesIn++
	payload, err := Deframe(c.version, data)
	t := c.turn
	c.s.mu.Lock()
	r := c.rec
	r.FramesHeard++
	if err != nil {
		r.BadFrames++
	}
	if c.s.keep(r, len(r.Frames), len(data)) {
		r.Frames = append(r.Frames, data)
		r.Payloads = append(r.Payloads, payload)
	}
	if t != nil {
		c.countLocked(t, data, payload)
	} else if err == nil {
		// Audio before listen start is kept for the next turn, as a real
		// server's voice detection hears it: a board sends its wake-word
		// audio first, and over MQTT+UDP audio may overtake the listen
		// message it follows.
		if len(c.preroll) == maxPreroll {
			c.preroll = c.preroll[1:]
		}
		c.preroll = append(c.preroll, [2][]byte{data, payload})
	}
	c.s.changedLocked()
	c.s.mu.Unlock()
	if t != nil && t.mode != "manual" && t.heard >= c.s.cfg.AutoFrames {
		c.finishTurn("frames")
	}
	if k := c.faults.CloseAfterFrames; k > 0 && c.framesIn >= k {
		c.shutdown("closed after " + strconv.Itoa(k) + " frames (fault)")
		return false
	}
	return true
}

// maxPreroll bounds the audio kept from before a turn.
const maxPreroll = 8

// countLocked counts one frame into the open turn. Caller holds s.mu.
func (c *conn) countLocked(t *turn, data, payload []byte) {
	r := c.rec
	t.heard++
	if t.heard == 1 {
		t.first = payload
	}
	if t.idx >= 0 {
		cv := &r.Conversations[t.idx]
		cv.Heard = t.heard
		if c.s.keep(r, len(cv.Frames), 0) { // bytes already charged when recorded
			cv.Frames = append(cv.Frames, data)
			cv.Payloads = append(cv.Payloads, payload)
		}
	}
}

// Downlink text messages. Every one carries the session id first.
type (
	sttMsg struct {
		SessionID string `json:"session_id"`
		Type      string `json:"type"`
		Text      string `json:"text"`
	}
	llmMsg struct {
		SessionID string `json:"session_id"`
		Type      string `json:"type"`
		Text      string `json:"text"`
		Emotion   string `json:"emotion"`
	}
	ttsMsg struct {
		SessionID string `json:"session_id"`
		Type      string `json:"type"`
		State     string `json:"state"`
		Text      string `json:"text,omitempty"`
	}
	envelopeMsg struct {
		SessionID string          `json:"session_id"`
		Type      string          `json:"type"`
		Payload   json.RawMessage `json:"payload"`
	}
	helloMsg struct {
		Type        string      `json:"type"`
		Transport   string      `json:"transport"`
		SessionID   string      `json:"session_id"`
		AudioParams audioParams `json:"audio_params"`
	}
	audioParams struct {
		Format        string `json:"format"`
		SampleRate    int    `json:"sample_rate"`
		Channels      int    `json:"channels"`
		FrameDuration int    `json:"frame_duration"`
	}
)

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only fixed struct types with valid raw payloads reach here
	}
	return b
}

// session sends the server hello once the board's arrives, then lists the
// board's tools if it announced MCP.
func (c *conn) session() {
	defer c.wg.Done()
	var mcp bool
	select {
	case mcp = <-c.hello:
	case <-c.done:
		return
	}
	if c.faults.NoHello {
		return
	}
	if d := c.faults.HelloDelay; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-c.done:
			t.Stop()
			return
		}
	}
	hello := mustJSON(helloMsg{
		Type: "hello", Transport: "websocket", SessionID: c.sid,
		AudioParams: audioParams{Format: "opus", SampleRate: 24000, Channels: 1, FrameDuration: 60},
	})
	if !c.sendText(hello, func(r *connRec) { r.HelloSent = true }) || !mcp {
		return
	}
	c.listTools()
}

// speaker runs answers and aborts in order.
func (c *conn) speaker() {
	defer c.wg.Done()
	for {
		select {
		case <-c.done:
			return
		case j := <-c.jobs:
			if j.abort {
				c.sendText(c.tts("stop", ""), nil)
			} else {
				c.answer(j)
			}
		}
	}
}

func (c *conn) tts(state, text string) []byte {
	return mustJSON(ttsMsg{SessionID: c.sid, Type: "tts", State: state, Text: text})
}

// conv runs f on the turn's record, if it was recorded. Called under s.mu.
func conv(r *connRec, idx int, f func(cv *Conversation)) {
	if idx >= 0 && idx < len(r.Conversations) {
		f(&r.Conversations[idx])
	}
}

// answer speaks the deterministic reply to a finished turn: stt, llm, tts
// start, sentence_start, TTSFrames frames (ExpectedFrame), tts stop. An
// abort after the turn ended cuts it before the next frame, without its
// own tts stop (the abort's job sends that).
func (c *conn) answer(j job) {
	aborted := func() bool {
		if c.abortGen.Load() == j.gen {
			return false
		}
		c.s.update(c.rec, func(r *connRec) { conv(r, j.idx, func(cv *Conversation) { cv.Aborted = true }) })
		return true
	}
	if aborted() {
		return
	}
	n := strconv.Itoa(j.heard)
	for _, m := range [][]byte{
		mustJSON(sttMsg{SessionID: c.sid, Type: "stt", Text: "heard " + n + " frames"}),
		mustJSON(llmMsg{SessionID: c.sid, Type: "llm", Text: "😀", Emotion: "happy"}),
		c.tts("start", ""),
		c.tts("sentence_start", "You said "+n+" frames."),
	} {
		if !c.sendText(m, nil) {
			return
		}
	}
	var heard [][]byte
	if j.heard > 0 {
		heard = [][]byte{j.first}
	}
	first := time.Now()
	for k := range c.s.cfg.TTSFrames {
		if k > 0 && c.s.cfg.Pace > 0 && !c.pause(j.gen, first.Add(time.Duration(k)*c.s.cfg.Pace)) {
			aborted()
			return
		}
		if aborted() {
			return
		}
		m := outItem{binary: true, data: ExpectedFrame(c.version, heard, k), after: func(r *connRec) {
			conv(r, j.idx, func(cv *Conversation) { cv.FramesSent++ })
		}}
		if c.s.cfg.Stamp {
			// The writer stamps it again with the time of the write.
			m.data, _ = Frame(c.version, uint32(k*ReplyFrameDuration), StampedReply(heard, k, time.Now()))
			m.stamp, m.stampAt = true, headerSize(c.version)
		}
		ok := c.send(m)
		if !ok {
			return
		}
	}
	c.sendText(c.tts("stop", ""), func(r *connRec) {
		r.Answers++
		conv(r, j.idx, func(cv *Conversation) { cv.Answered = true })
	})
}

// pause waits until the next frame is due; false if an abort (newer than
// gen) or the end of the connection interrupts it.
func (c *conn) pause(gen uint64, due time.Time) bool {
	t := time.NewTimer(time.Until(due))
	defer t.Stop()
	for {
		select {
		case <-t.C:
			return true
		case <-c.done:
			return false
		case <-c.abortSig:
			if c.abortGen.Load() != gen {
				return false
			}
			// A stale signal from an abort before this turn: keep waiting.
		}
	}
}
