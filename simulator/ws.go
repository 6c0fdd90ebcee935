package simulator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"go.uber.org/zap"
)

const (
	// wsHandshakeTimeout is the firmware's bound on TCP connect plus the
	// upgrade handshake.
	wsHandshakeTimeout = 10 * time.Second
	// wsMaxDeviceFrame is the largest text frame the firmware's WebSocket
	// client can send (it only knows the 7- and 16-bit length forms).
	wsMaxDeviceFrame = 65535
	// wsReadLimit bounds one incoming message. The firmware has no explicit
	// limit but a few hundred KiB of heap; 1 MiB keeps a runaway server
	// from eating the simulator's memory.
	wsReadLimit = 1 << 20
	// wsOutboundQueue is the writer's queue length. Only the main task
	// enqueues, one message at a time, so a short queue is plenty; a full
	// queue makes the main task wait, as a board blocks in its send.
	wsOutboundQueue = 16
)

// HandshakeError reports a WebSocket upgrade the server did not accept.
type HandshakeError struct {
	StatusCode int    // HTTP status of the answer, e.g. 401
	Status     string // status line text, e.g. "401 Unauthorized"
}

func (e *HandshakeError) Error() string {
	if e.StatusCode == http.StatusSwitchingProtocols {
		return "simulator: websocket handshake answered HTTP " + e.Status + " with invalid upgrade headers"
	}
	return "simulator: websocket handshake rejected with HTTP " + e.Status
}

// ConnectWebSocket opens the board's WebSocket channel the way the firmware
// does: it dials with the firmware's headers, sends the device hello and
// waits up to Config.HelloTimeout for an acceptable server hello.
//
// On success the connection keeps running in goroutines owned by the
// board (one reader, one writer, one main task) until the server closes
// it, the board drops it (reboot, injected fault) or Close is called; use
// Serve to wait for that. An existing connection is discarded first, as a
// board opening a new channel does.
//
// Failures: a *HandshakeError for a non-101 answer; an error wrapping
// ErrHelloTimeout, ErrCrashed or the reason the link ended while waiting.
func (b *Board) ConnectWebSocket(ctx context.Context, rawURL string) error {
	b.connectMu.Lock()
	defer b.connectMu.Unlock()
	_ = b.Close()

	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("simulator: websocket url: %w", err)
	}
	dialer := websocket.Dialer{
		// No Proxy: boards dial directly.
		HandshakeTimeout: wsHandshakeTimeout,
		TLSClientConfig:  b.cfg.TLS,
	}
	conn, resp, err := dialer.DialContext(ctx, rawURL, b.wsHeaders(u))
	if err != nil {
		if resp != nil {
			return &HandshakeError{StatusCode: resp.StatusCode, Status: resp.Status}
		}
		return fmt.Errorf("simulator: dial %s: %w", rawURL, err)
	}

	l := newWSLink(b, conn)
	b.linkMu.Lock()
	b.cur = l
	b.linkMu.Unlock()
	// The hello is queued before the goroutines start so that it is the
	// first frame on the wire, ahead of any reply.
	l.out <- wsOut{text: b.helloJSON()}
	l.start()
	l.log.Debug("connected; waiting for server hello")

	timer := time.NewTimer(b.cfg.HelloTimeout)
	defer timer.Stop()
	select {
	case <-b.helloEvent:
		// Counted before the link reads as connected, so a reader of
		// Connected then Stats never sees more connected than connects.
		b.stats.connects.Add(1)
		l.helloDone.Store(true)
		l.log.Info("connected", zap.String("session_id", b.SessionID()))
		return nil
	case <-l.done:
		// The link ended first; its cause says why (crash, server close).
	case <-timer.C:
		l.shutdown(ErrHelloTimeout)
	case <-ctx.Done():
		l.shutdown(ErrClosed)
	}
	b.dropLink(l)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("simulator: websocket hello: %w", l.err())
}

// wsHeaders builds the upgrade request headers of §3.2: Host without the
// port, Authorization only with a token (Bearer added unless the token has
// a space), Client-Id, Device-Id, Protocol-Version. No Origin and no
// User-Agent, which the firmware does not send.
func (b *Board) wsHeaders(u *url.URL) http.Header {
	h := http.Header{}
	host := u.Hostname()
	if strings.Contains(host, ":") {
		host = "[" + host + "]" // an IPv6 literal needs its brackets
	}
	h["Host"] = []string{host}
	if tok := b.wsToken(); tok != "" {
		if !strings.Contains(tok, " ") {
			tok = "Bearer " + tok
		}
		h["Authorization"] = []string{tok}
	}
	h["Client-Id"] = []string{b.clientID}
	h["Device-Id"] = []string{b.deviceID()}
	h["Protocol-Version"] = []string{strconv.Itoa(b.cfg.ProtocolVersion)}
	// An empty value keeps net/http from adding its default User-Agent.
	h["User-Agent"] = []string{""}
	return h
}

// helloJSON is the v2.4 device hello of §3.4, byte for byte.
func (b *Board) helloJSON() string {
	p := b.profile
	var sb strings.Builder
	sb.WriteString(`{"type":"hello","version":` + strconv.Itoa(b.cfg.ProtocolVersion) + `,"features":{`)
	if !b.cfg.OmitMCPFeature {
		sb.WriteString(`"mcp":true,`)
	}
	sb.WriteString(`"glyph_push":` + strconv.FormatBool(p.GlyphPush) + `}`)
	if p.GlyphPush {
		sb.WriteString(`,"text_font":{"bundle":"noto-v1","charset":"` + p.Font.Charset + `","size":` +
			strconv.Itoa(p.Font.Size) + `,"bpp":` + strconv.Itoa(p.Font.BPP) + `}`)
	}
	sb.WriteString(`,"transport":"websocket","audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`)
	return sb.String()
}

// Serve waits until the current connection ends and returns why (see the
// Err variables), or until ctx ends, in which case it closes the
// connection and returns nil. It returns ErrNotConnected if there is no
// connection.
func (b *Board) Serve(ctx context.Context) error {
	l := b.currentLink()
	if l == nil {
		return ErrNotConnected
	}
	select {
	case <-ctx.Done():
		b.dropLink(l)
		return nil
	case <-l.done:
		b.dropLink(l)
		return l.err()
	}
}

// Connected reports whether the board has a live connection that
// completed its hello exchange (WebSocket) or its CONNECT (MQTT): one that
// Stats().Connects has already counted.
func (b *Board) Connected() bool {
	b.linkMu.Lock()
	l, mc := b.cur, b.mqtt
	b.linkMu.Unlock()
	if l != nil && l.helloDone.Load() {
		select {
		case <-l.done:
		default:
			return true
		}
	}
	// onConnect counts the connect before the connection's own counter,
	// so a connection it has counted is one Stats().Connects includes.
	return mc != nil && mc.connects.Load() > 0 && mc.Connected()
}

// Close drops the current connection, if any, the way a board does: a
// plain TCP close without a close frame. It waits for the connection's
// goroutines and may be called any number of times. The board can connect
// again afterwards.
func (b *Board) Close() error {
	b.linkMu.Lock()
	l := b.cur
	b.cur = nil
	b.linkMu.Unlock()
	if l != nil {
		l.shutdown(ErrClosed)
		l.wait()
	}
	return nil
}

func (b *Board) currentLink() *wsLink {
	b.linkMu.Lock()
	defer b.linkMu.Unlock()
	return b.cur
}

// dropLink shuts l down, waits for it and forgets it if it is still the
// current link.
func (b *Board) dropLink(l *wsLink) {
	l.shutdown(ErrClosed)
	l.wait()
	b.linkMu.Lock()
	if b.cur == l {
		b.cur = nil
	}
	b.linkMu.Unlock()
}

// wsLink is one WebSocket connection: a reader goroutine (which also runs
// the receive-path logic, as the firmware's network task does), a writer
// goroutine that alone writes data frames, and the session's main task.
type wsLink struct {
	b    *Board
	conn *websocket.Conn
	sess *session
	log  *zap.Logger

	ctx    context.Context // ends when the link shuts down
	cancel context.CancelFunc
	// out carries text messages and uplink audio to the writer, in one
	// queue so that a listen start is on the wire before the audio after it.
	out  chan wsOut
	done chan struct{} // closed by shutdown
	// helloDone is set once the hello exchange completed (and Connects
	// counted it).
	helloDone atomic.Bool

	once  sync.Once
	cause error // set once, before done is closed
	wg    sync.WaitGroup
}

var _ link = (*wsLink)(nil)

func newWSLink(b *Board, conn *websocket.Conn) *wsLink {
	ctx, cancel := context.WithCancel(context.Background())
	l := &wsLink{
		b:      b,
		conn:   conn,
		ctx:    ctx,
		cancel: cancel,
		out:    make(chan wsOut, wsOutboundQueue),
		done:   make(chan struct{}),
		log:    b.log.Named("ws").With(zap.String("remote", conn.RemoteAddr().String())),
	}
	l.sess = newSession(b, l, l.log)
	conn.SetReadLimit(wsReadLimit)
	// The board never answers a close frame; it just marks the socket
	// disconnected. Returning nil keeps gorilla from echoing the frame.
	conn.SetCloseHandler(func(int, string) error { return nil })
	// gorilla's default ping handler already answers with a pong carrying
	// the same payload, which is what the board does.
	return l
}

func (l *wsLink) start() {
	l.wg.Add(3)
	go l.readLoop()
	go l.writeLoop()
	go func() {
		defer l.wg.Done()
		l.sess.runMainTask(l.ctx)
	}()
}

// shutdown ends the link with cause: it stops the writer and the main task
// and closes the TCP connection without a close frame, which also unblocks
// the reader. Only the first cause is kept. It does not wait, so the link's
// own goroutines may call it.
func (l *wsLink) shutdown(cause error) {
	l.once.Do(func() {
		l.cause = cause
		l.cancel()
		_ = l.conn.Close()
		close(l.done)
		l.log.Info("connection closed", zap.NamedError("reason", cause))
	})
}

// wait blocks until the link's goroutines have returned.
func (l *wsLink) wait() { l.wg.Wait() }

// err returns the cause the link ended with; call after done is closed.
func (l *wsLink) err() error { return l.cause }

// wsOut is one message for the writer: text, or a binary audio frame
// already framed for the connection's protocol version.
type wsOut struct {
	text   string
	frame  []byte
	binary bool
}

func (l *wsLink) send(msg string) error { return l.enqueue(wsOut{text: msg}) }

func (l *wsLink) enqueue(m wsOut) error {
	select {
	case l.out <- m:
		return nil
	case <-l.ctx.Done():
		return errLinkClosed
	}
}

func (l *wsLink) closeChannel(cause error) { l.shutdown(cause) }

func (l *wsLink) handleTransportMessage(typ string, root *jsonValue) bool {
	if typ != "hello" {
		return false
	}
	l.parseServerHello(root)
	return true
}

// parseServerHello is WebsocketProtocol::ParseServerHello: transport must be
// the string "websocket"; missing or non-string crashes a real board;
// another string is ignored. session_id and audio_params are optional and
// kept across connections.
func (l *wsLink) parseServerHello(root *jsonValue) {
	tr := root.get("transport")
	if !tr.isString() {
		l.log.Error("server hello without a string transport; a real board crashes here")
		l.b.stats.reboots.Add(1)
		l.b.resetVolatile()
		l.shutdown(ErrCrashed)
		return
	}
	if tr.str != "websocket" {
		l.b.stats.ignored.Add(1)
		l.log.Warn("server hello with a foreign transport ignored", zap.String("transport", tr.str))
		return
	}
	b := l.b
	b.mu.Lock()
	if sid := root.get("session_id"); sid.isString() {
		b.sessionID = sid.str
	}
	if ap := root.get("audio_params"); ap.isObject() {
		if v := ap.get("sample_rate"); v.isNumber() {
			b.sampleRate = v.valueInt()
		}
		if v := ap.get("frame_duration"); v.isNumber() {
			b.frameDuration = v.valueInt()
		}
	}
	b.mu.Unlock()
	b.signalHello()
}

func (l *wsLink) readLoop() {
	defer l.wg.Done()
	for {
		if d := l.b.cfg.IdleTimeout; d > 0 {
			_ = l.conn.SetReadDeadline(time.Now().Add(d))
		}
		typ, data, err := l.conn.ReadMessage()
		if err != nil {
			l.shutdown(readCause(err))
			return
		}
		switch typ {
		case websocket.TextMessage:
			l.sess.handleText(data)
		case websocket.BinaryMessage:
			// Downlink audio: unframed per the protocol version, then
			// played only while speaking (conversation.go).
			l.b.stats.binaryReceived.Add(1)
			l.handleBinary(data)
		}
	}
}

// readCause classifies a read error. A close frame from the server is an
// orderly end; anything else means the socket went away.
func readCause(err error) error {
	var ce *websocket.CloseError
	if errors.As(err, &ce) && ce.Code != websocket.CloseAbnormalClosure {
		return fmt.Errorf("%w (code %d)", ErrServerClosed, ce.Code)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return ErrIdleTimeout
	}
	return fmt.Errorf("%w: %v", ErrConnectionLost, err)
}

func (l *wsLink) writeLoop() {
	defer l.wg.Done()
	for {
		select {
		case <-l.ctx.Done():
			return
		case m := <-l.out:
			if m.binary {
				_ = l.conn.SetWriteDeadline(time.Now().Add(l.b.cfg.WriteTimeout))
				if err := l.conn.WriteMessage(websocket.BinaryMessage, m.frame); err != nil {
					l.shutdown(fmt.Errorf("%w: write: %v", ErrConnectionLost, err))
					return
				}
				l.b.stats.audioSent.Add(1)
				continue
			}
			if len(m.text) > wsMaxDeviceFrame {
				// The firmware's send fails for frames this big and the
				// message is simply lost.
				l.b.stats.repliesLost.Add(1)
				l.log.Warn("message too large for a device frame, dropped", zap.Int("bytes", len(m.text)))
				continue
			}
			_ = l.conn.SetWriteDeadline(time.Now().Add(l.b.cfg.WriteTimeout))
			if err := l.conn.WriteMessage(websocket.TextMessage, []byte(m.text)); err != nil {
				l.shutdown(fmt.Errorf("%w: write: %v", ErrConnectionLost, err))
				return
			}
			l.b.stats.messagesSent.Add(1)
		}
	}
}
