package simulator

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const serverHello = `{"type":"hello","transport":"websocket","session_id":"sess-1","audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":20}}`

const breadboardHello = `{"type":"hello","version":1,"features":{"mcp":true,"glyph_push":true},"text_font":{"bundle":"noto-v1","charset":"basic","size":14,"bpp":1},"transport":"websocket","audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`

// serverConn is the server side of one accepted board connection.
type serverConn struct {
	c      *websocket.Conn
	header http.Header
	host   string
}

// testServer is a small gorilla WebSocket server on 127.0.0.1:0. By
// default each accepted connection is handed to the test over conns; in
// auto mode the server answers the hello itself and reads until the board
// goes away (for fleet tests).
type testServer struct {
	t      *testing.T
	srv    *httptest.Server
	url    string
	conns  chan *serverConn
	reject int
	auto   bool
	// voice (with auto) answers each listen start, at the first audio
	// frame after it, as a voice server would: stt, tts start, one audio
	// frame, tts stop.
	voice bool

	mu     sync.Mutex
	all    []*serverConn
	seen   []string // Device-Id of every accepted connection, in order
	closed bool
	wg     sync.WaitGroup // auto-mode handlers
}

func newTestServer(t *testing.T, configure func(*testServer)) *testServer {
	ts := &testServer{t: t, conns: make(chan *serverConn, 16)}
	if configure != nil {
		configure(ts)
	}
	up := websocket.Upgrader{}
	ts.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ts.reject != 0 {
			http.Error(w, "go away", ts.reject)
			return
		}
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		sc := &serverConn{c: c, header: r.Header.Clone(), host: r.Host}
		ts.mu.Lock()
		if ts.closed {
			ts.mu.Unlock()
			_ = c.Close()
			return
		}
		ts.all = append(ts.all, sc)
		ts.seen = append(ts.seen, r.Header.Get("Device-Id"))
		if ts.auto {
			ts.wg.Add(1)
		}
		ts.mu.Unlock()
		if ts.auto {
			defer ts.wg.Done()
			if _, _, err := c.ReadMessage(); err != nil {
				return
			}
			if c.WriteMessage(websocket.TextMessage, []byte(serverHello)) != nil {
				return
			}
			listening := false
			for {
				typ, data, err := c.ReadMessage()
				if err != nil {
					return
				}
				switch {
				case typ == websocket.TextMessage && strings.Contains(string(data), `"type":"listen","state":"start"`):
					listening = true
				case typ == websocket.BinaryMessage && listening && ts.voice:
					listening = false
					for _, m := range []string{`{"type":"stt","text":"hello"}`, `{"type":"tts","state":"start"}`,
						`{"type":"tts","state":"sentence_start","text":"hi there"}`} {
						if c.WriteMessage(websocket.TextMessage, []byte(m)) != nil {
							return
						}
					}
					if c.WriteMessage(websocket.BinaryMessage, []byte("answer")) != nil ||
						c.WriteMessage(websocket.TextMessage, []byte(`{"type":"tts","state":"stop"}`)) != nil {
						return
					}
				}
			}
		}
		ts.conns <- sc
	}))
	ts.url = "ws" + strings.TrimPrefix(ts.srv.URL, "http") + "/xiaozhi/v1/"
	t.Cleanup(ts.close)
	return ts
}

func (ts *testServer) close() {
	ts.mu.Lock()
	ts.closed = true
	all := ts.all
	ts.mu.Unlock()
	for _, sc := range all {
		_ = sc.c.Close()
	}
	ts.wg.Wait()
	ts.srv.Close()
}

func (ts *testServer) seenIDs() []string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return append([]string(nil), ts.seen...)
}

func (ts *testServer) accept() *serverConn {
	ts.t.Helper()
	select {
	case sc := <-ts.conns:
		return sc
	case <-time.After(waitTimeout):
		ts.t.Fatal("no connection from the board")
		return nil
	}
}

func (sc *serverConn) read(t *testing.T) (int, string) {
	t.Helper()
	require.NoError(t, sc.c.SetReadDeadline(time.Now().Add(waitTimeout)))
	typ, data, err := sc.c.ReadMessage()
	require.NoError(t, err)
	return typ, string(data)
}

func (sc *serverConn) readText(t *testing.T) string {
	t.Helper()
	typ, data := sc.read(t)
	require.Equal(t, websocket.TextMessage, typ)
	return data
}

func (sc *serverConn) write(t *testing.T, text string) {
	t.Helper()
	require.NoError(t, sc.c.SetWriteDeadline(time.Now().Add(waitTimeout)))
	require.NoError(t, sc.c.WriteMessage(websocket.TextMessage, []byte(text)))
}

// readErr waits for the board's side to go away and returns the read
// error the server saw.
func (sc *serverConn) readErr(t *testing.T) error {
	t.Helper()
	require.NoError(t, sc.c.SetReadDeadline(time.Now().Add(waitTimeout)))
	for {
		if _, _, err := sc.c.ReadMessage(); err != nil {
			return err
		}
	}
}

// requireTCPCloseOnly checks that the board went away without a close
// frame, which gorilla reports as an abnormal closure (1006).
func requireTCPCloseOnly(t *testing.T, err error) {
	t.Helper()
	assert.True(t, websocket.IsCloseError(err, websocket.CloseAbnormalClosure), "want a TCP close without a close frame, got %v", err)
}

// connect runs ConnectWebSocket while the test plays the server: it
// accepts the connection, reads the device hello and, if hello is not
// empty, answers with it.
func connect(t *testing.T, b *Board, ts *testServer, hello string) (*serverConn, string, error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- b.ConnectWebSocket(context.Background(), ts.url) }()
	sc := ts.accept()
	deviceHello := sc.readText(t)
	if hello != "" {
		sc.write(t, hello)
	}
	select {
	case err := <-errc:
		return sc, deviceHello, err
	case <-time.After(waitTimeout):
		t.Fatal("ConnectWebSocket did not return")
		return nil, "", nil
	}
}

func newTestBoard(t *testing.T, cfg Config) *Board {
	t.Helper()
	if cfg.Profile == nil {
		cfg.Profile = mustProfile(t, "breadboard")
	}
	b, err := NewBoard(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// serve runs b.Serve in the background and returns its result channel.
func serve(b *Board) <-chan error {
	errc := make(chan error, 1)
	go func() { errc <- b.Serve(context.Background()) }()
	return errc
}

func waitErr(t *testing.T, errc <-chan error) error {
	t.Helper()
	select {
	case err := <-errc:
		return err
	case <-time.After(waitTimeout):
		t.Fatal("timed out waiting for the board")
		return nil
	}
}

func TestWSHandshakeAndHello(t *testing.T) {
	ts := newTestServer(t, nil)
	b := newTestBoard(t, Config{MAC: "AA:BB:CC:DD:EE:01", ClientID: "1f0a2b3c-0000-4000-8000-00000000abcd", Token: "test-token"})
	sc, hello, err := connect(t, b, ts, serverHello)
	require.NoError(t, err)

	assert.Equal(t, breadboardHello, hello)
	assert.Equal(t, "Bearer test-token", sc.header.Get("Authorization"))
	assert.Equal(t, "aa:bb:cc:dd:ee:01", sc.header.Get("Device-Id"))
	assert.Equal(t, "1f0a2b3c-0000-4000-8000-00000000abcd", sc.header.Get("Client-Id"))
	assert.Equal(t, "1", sc.header.Get("Protocol-Version"))
	assert.Equal(t, "127.0.0.1", sc.host, "Host carries no port")
	for _, h := range []string{"Origin", "User-Agent", "Sec-Websocket-Protocol", "Sec-Websocket-Extensions"} {
		assert.NotContains(t, sc.header, h)
	}

	assert.Equal(t, "sess-1", b.SessionID())
	rate, frame := b.ServerAudioParams()
	assert.Equal(t, 16000, rate)
	assert.Equal(t, 20, frame)
	assert.True(t, b.Connected())
	require.NoError(t, b.Close())
	require.NoError(t, b.Close(), "Close is idempotent")
	assert.False(t, b.Connected())
	requireTCPCloseOnly(t, sc.readErr(t))
}

func TestWSAuthorizationRule(t *testing.T) {
	for token, want := range map[string]string{"": "", "Basic xyz": "Basic xyz", "abc": "Bearer abc"} {
		ts := newTestServer(t, nil)
		b := newTestBoard(t, Config{Token: token})
		sc, _, err := connect(t, b, ts, serverHello)
		require.NoError(t, err)
		assert.Equal(t, want, sc.header.Get("Authorization"), "token %q", token)
		_, present := sc.header["Authorization"]
		assert.Equal(t, token != "", present)
		require.NoError(t, b.Close())
	}
}

func TestWSHelloVariants(t *testing.T) {
	ts := newTestServer(t, nil)
	p := mustParseProfile(t, "board: b\nglyph_push: false\n")
	b := newTestBoard(t, Config{Profile: p, ProtocolVersion: 3, OmitMCPFeature: true})
	sc, hello, err := connect(t, b, ts, serverHello)
	require.NoError(t, err)
	assert.Equal(t, `{"type":"hello","version":3,"features":{"glyph_push":false},"transport":"websocket","audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`, hello)
	assert.Equal(t, "3", sc.header.Get("Protocol-Version"))
}

// TestWSRawHandshake checks the request bytes themselves (header order,
// Host without port) and that a 401 fails the connection with the status.
func TestWSRawHandshake(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	reqc := make(chan []string, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := ln.Accept()
		if err != nil {
			reqc <- nil
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(waitTimeout))
		var lines []string
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil || line == "\r\n" {
				break
			}
			lines = append(lines, strings.TrimRight(line, "\r\n"))
		}
		_, _ = c.Write([]byte("HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
		reqc <- lines
	}()
	defer wg.Wait()

	b := newTestBoard(t, Config{MAC: "aa:bb:cc:dd:ee:ff", ClientID: "1f0a2b3c-0000-4000-8000-000000000001", Token: "test-token"})
	err = b.ConnectWebSocket(context.Background(), "ws://"+ln.Addr().String()+"/xiaozhi/v1/?x=1")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "401")
	var he *HandshakeError
	require.ErrorAs(t, err, &he)
	assert.Equal(t, http.StatusUnauthorized, he.StatusCode)

	lines := <-reqc
	require.Len(t, lines, 10, "%q", lines)
	assert.Equal(t, "GET /xiaozhi/v1/?x=1 HTTP/1.1", lines[0])
	assert.Equal(t, "Host: 127.0.0.1", lines[1])
	var names []string
	for _, l := range lines[2:] {
		names = append(names, l[:strings.Index(l, ":")])
	}
	assert.Equal(t, []string{"Authorization", "Client-Id", "Connection", "Device-Id", "Protocol-Version", "Sec-WebSocket-Key", "Sec-WebSocket-Version", "Upgrade"}, names)
	assert.Contains(t, lines, "Authorization: Bearer test-token")
	assert.Contains(t, lines, "Device-Id: aa:bb:cc:dd:ee:ff")
	assert.Contains(t, lines, "Client-Id: 1f0a2b3c-0000-4000-8000-000000000001")
	assert.Contains(t, lines, "Protocol-Version: 1")
}

func TestWSRejected401(t *testing.T) {
	ts := newTestServer(t, func(ts *testServer) { ts.reject = http.StatusUnauthorized })
	b := newTestBoard(t, Config{Token: "wrong"})
	err := b.ConnectWebSocket(context.Background(), ts.url)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "401")
	assert.False(t, b.Connected())
}

func TestWSServerHelloWithoutTransportCrashes(t *testing.T) {
	for _, hello := range []string{
		`{"type":"hello","session_id":"x"}`,
		`{"type":"hello","transport":1}`,
		`{"type":"hello","transport":null}`,
	} {
		ts := newTestServer(t, nil)
		b := newTestBoard(t, Config{})
		sc, _, err := connect(t, b, ts, hello)
		require.ErrorIs(t, err, ErrCrashed, hello)
		assert.Contains(t, err.Error(), "crash")
		requireTCPCloseOnly(t, sc.readErr(t))
		assert.EqualValues(t, 1, b.Stats().Reboots)
		assert.Empty(t, b.SessionID(), "a crash forgets the session")
		assert.False(t, b.Connected())
	}
}

func TestWSForeignTransportTimesOut(t *testing.T) {
	ts := newTestServer(t, nil)
	b := newTestBoard(t, Config{HelloTimeout: 150 * time.Millisecond})
	start := time.Now()
	sc, _, err := connect(t, b, ts, `{"type":"hello","transport":"udp","session_id":"nope"}`)
	require.ErrorIs(t, err, ErrHelloTimeout)
	assert.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond)
	assert.Empty(t, b.SessionID(), "an ignored hello changes nothing")
	requireTCPCloseOnly(t, sc.readErr(t))
}

func TestWSNoHelloTimesOut(t *testing.T) {
	ts := newTestServer(t, nil)
	b := newTestBoard(t, Config{HelloTimeout: 100 * time.Millisecond})
	_, _, err := connect(t, b, ts, "")
	require.ErrorIs(t, err, ErrHelloTimeout)
}

func TestWSCaseInsensitiveHelloKeys(t *testing.T) {
	ts := newTestServer(t, nil)
	b := newTestBoard(t, Config{})
	_, _, err := connect(t, b, ts, `{"TYPE":"hello","Transport":"websocket","Session_Id":"abc"} and more`)
	require.NoError(t, err)
	assert.Equal(t, "abc", b.SessionID())
}

func TestWSMCPRoundTrip(t *testing.T) {
	ts := newTestServer(t, nil)
	b := newTestBoard(t, Config{})
	sc, _, err := connect(t, b, ts, serverHello)
	require.NoError(t, err)

	// Pings are answered with the same payload; downlink audio is counted.
	pongs := make(chan string, 1)
	sc.c.SetPongHandler(func(data string) error { pongs <- data; return nil })
	require.NoError(t, sc.c.WriteControl(websocket.PingMessage, []byte("hb"), time.Now().Add(waitTimeout)))
	require.NoError(t, sc.c.WriteMessage(websocket.BinaryMessage, []byte{1, 2, 3}))

	sc.write(t, `{"session_id":"sess-1","type":"mcp","payload":{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":35}}}}`)
	assert.Equal(t, `{"session_id":"sess-1","type":"mcp","payload":{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"true"}],"isError":false}}}`, sc.readText(t))
	select {
	case p := <-pongs:
		assert.Equal(t, "hb", p)
	default:
		t.Fatal("the ping sent before the request was not answered before its reply")
	}

	// A later hello replaces the session id used by every later message.
	sc.write(t, `{"type":"hello","transport":"websocket","session_id":"sess-2"}`)
	sc.write(t, `{"type":"mcp","payload":{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"self.get_device_status"}}}`)
	assert.Equal(t, `{"session_id":"sess-2","type":"mcp","payload":{"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"{\"audio_speaker\":{\"volume\":35},\"screen\":{},\"network\":{\"type\":\"wifi\",\"ssid\":\"devicebridge-lab\",\"signal\":\"strong\"}}"}],"isError":false}}}`, sc.readText(t))

	// The writer counts a message after the write returns, which may be
	// after the server has read it.
	require.Eventually(t, func() bool { return b.Stats().MessagesSent == 3 }, waitTimeout, time.Millisecond, "hello and two replies")
	st := b.Stats()
	assert.EqualValues(t, 1, st.BinaryReceived)
	assert.EqualValues(t, 4, st.TextReceived, "two hellos and two requests")
	assert.EqualValues(t, 2, st.CallsRun)
	assert.EqualValues(t, 1, st.Connects)
}

func TestWSServerCloseFrameNotEchoed(t *testing.T) {
	ts := newTestServer(t, nil)
	b := newTestBoard(t, Config{})
	sc, _, err := connect(t, b, ts, serverHello)
	require.NoError(t, err)
	errc := serve(b)
	require.NoError(t, sc.c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "bye"), time.Now().Add(waitTimeout)))
	require.ErrorIs(t, waitErr(t, errc), ErrServerClosed)
	requireTCPCloseOnly(t, sc.readErr(t))
	assert.False(t, b.Connected())
}

func TestWSServerTCPClose(t *testing.T) {
	ts := newTestServer(t, nil)
	b := newTestBoard(t, Config{})
	sc, _, err := connect(t, b, ts, serverHello)
	require.NoError(t, err)
	errc := serve(b)
	require.NoError(t, sc.c.Close())
	require.ErrorIs(t, waitErr(t, errc), ErrConnectionLost)
}

func TestWSToolDelayHoldsReplies(t *testing.T) {
	const delay = 200 * time.Millisecond
	ts := newTestServer(t, nil)
	b := newTestBoard(t, Config{ToolDelay: map[string]time.Duration{"self.lamp.turn_on": delay}})
	sc, _, err := connect(t, b, ts, serverHello)
	require.NoError(t, err)
	start := time.Now()
	sc.write(t, `{"type":"mcp","payload":{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"self.lamp.turn_on"}}}`)
	sc.write(t, `{"type":"mcp","payload":{"jsonrpc":"2.0","id":2,"method":"ping"}}`)
	assert.Equal(t, `{"session_id":"sess-1","type":"mcp","payload":{"jsonrpc":"2.0","id":2,"error":{"message":"Method not implemented: ping"}}}`, sc.readText(t))
	assert.GreaterOrEqual(t, time.Since(start), delay, "even an error reply waits for the running tool")
	assert.Equal(t, `{"session_id":"sess-1","type":"mcp","payload":{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"true"}],"isError":false}}}`, sc.readText(t))
}

func TestWSDisconnectMidCall(t *testing.T) {
	ts := newTestServer(t, nil)
	b := newTestBoard(t, Config{
		ToolDelay:    map[string]time.Duration{"self.lamp.turn_on": 50 * time.Millisecond},
		DisconnectOn: map[string]bool{"self.lamp.turn_on": true},
	})
	sc, _, err := connect(t, b, ts, serverHello)
	require.NoError(t, err)
	errc := serve(b)
	sc.write(t, `{"type":"mcp","payload":{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"self.lamp.turn_on"}}}`)
	requireTCPCloseOnly(t, sc.readErr(t))
	require.ErrorIs(t, waitErr(t, errc), ErrInjectedDisconnect)
}

func TestWSRebootDropsConnection(t *testing.T) {
	ts := newTestServer(t, nil)
	b := newTestBoard(t, Config{RebootDelay: 20 * time.Millisecond})
	sc, _, err := connect(t, b, ts, serverHello)
	require.NoError(t, err)
	errc := serve(b)
	sc.write(t, `{"type":"mcp","payload":{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"self.reboot"}}}`)
	requireTCPCloseOnly(t, sc.readErr(t))
	require.ErrorIs(t, waitErr(t, errc), ErrRebooted)
	assert.Empty(t, b.SessionID(), "the session id lives in RAM")
	assert.EqualValues(t, 1, b.Stats().TasksDiscarded, "the queued reply never went out")
}

// A hello that arrives when nobody waits still counts for the next wait,
// as the firmware's event bit does.
func TestWSStrayHelloSatisfiesNextConnection(t *testing.T) {
	ts := newTestServer(t, nil)
	b := newTestBoard(t, Config{HelloTimeout: time.Second})
	sc, _, err := connect(t, b, ts, serverHello)
	require.NoError(t, err)
	sc.write(t, `{"type":"hello","transport":"websocket","session_id":"late"}`)
	sc.write(t, `{"type":"mcp","payload":{"jsonrpc":"2.0","id":1,"method":"ping"}}`)
	sc.readText(t) // the hello before it has been processed
	require.NoError(t, b.Close())

	_, _, err = connect(t, b, ts, "")
	require.NoError(t, err)
	assert.Equal(t, "late", b.SessionID(), "the session id survives reconnects")
	assert.EqualValues(t, 2, b.Stats().Connects)
}

func TestWSServeAndCloseLifecycle(t *testing.T) {
	b := newTestBoard(t, Config{})
	require.ErrorIs(t, b.Serve(context.Background()), ErrNotConnected)

	ts := newTestServer(t, nil)
	_, _, err := connect(t, b, ts, serverHello)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- b.Serve(ctx) }()
	cancel()
	require.NoError(t, waitErr(t, errc), "Serve returns nil when its context ends")
	assert.False(t, b.Connected())

	// Close during the hello wait aborts the attempt.
	connErr := make(chan error, 1)
	go func() { connErr <- b.ConnectWebSocket(context.Background(), ts.url) }()
	sc := ts.accept()
	sc.readText(t)
	// The socket is up but the hello is not done: Connected stays false
	// until then, so wait for the link itself.
	require.Eventually(t, func() bool { return b.currentLink() != nil }, waitTimeout, time.Millisecond)
	assert.False(t, b.Connected(), "not connected before the server hello")
	require.NoError(t, b.Close())
	err = waitErr(t, connErr)
	require.ErrorIs(t, err, ErrClosed)
	assert.False(t, errors.Is(err, ErrHelloTimeout))
}
