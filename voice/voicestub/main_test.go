package voicestub

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitTimeout bounds every wait; nothing should come close.
const waitTimeout = 5 * time.Second

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(cancel)
	return ctx
}

func startStub(t *testing.T, cfg Config) *Server {
	t.Helper()
	s, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, s.Start("127.0.0.1:0"))
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

// board is a plain gorilla client playing a board.
type board struct {
	t   *testing.T
	ws  *websocket.Conn
	sid string
}

func boardHeader(mac string, version int, token string) http.Header {
	h := http.Header{}
	h.Set("Device-Id", mac)
	h.Set("Client-Id", "11111111-2222-4333-8444-555555555555")
	h.Set("Protocol-Version", fmt.Sprint(version))
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	return h
}

func dial(t *testing.T, s *Server, h http.Header) (*board, *http.Response, error) {
	t.Helper()
	ws, resp, err := websocket.DefaultDialer.Dial(s.URL(), h)
	if err != nil {
		return nil, resp, err
	}
	t.Cleanup(func() { _ = ws.Close() })
	return &board{t: t, ws: ws}, resp, nil
}

func boardHello(version int, mcp bool) string {
	f := `{"glyph_push":false}`
	if mcp {
		f = `{"mcp":true,"glyph_push":false}`
	}
	return fmt.Sprintf(`{"type":"hello","version":%d,"features":%s,"transport":"websocket","audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`, version, f)
}

// connect dials, sends the hello and reads the server hello.
func connect(t *testing.T, s *Server, mac string, version int, mcp bool) *board {
	t.Helper()
	b, _, err := dial(t, s, boardHeader(mac, version, ""))
	require.NoError(t, err)
	b.sendText(boardHello(version, mcp))
	hello := b.readText()
	conns := s.Device(mac)
	require.NotEmpty(t, conns)
	b.sid = conns[len(conns)-1].SessionID
	require.Regexp(t, `^[A-Za-z0-9_-]+$`, b.sid)
	require.Equal(t, `{"type":"hello","transport":"websocket","session_id":"`+b.sid+
		`","audio_params":{"format":"opus","sample_rate":24000,"channels":1,"frame_duration":60}}`, hello)
	return b
}

func (b *board) sendText(s string) {
	b.t.Helper()
	require.NoError(b.t, b.ws.WriteMessage(websocket.TextMessage, []byte(s)))
}

func (b *board) sendBinary(p []byte) {
	b.t.Helper()
	require.NoError(b.t, b.ws.WriteMessage(websocket.BinaryMessage, p))
}

func (b *board) read() (int, []byte, error) {
	_ = b.ws.SetReadDeadline(time.Now().Add(waitTimeout))
	return b.ws.ReadMessage()
}

func (b *board) readText() string {
	b.t.Helper()
	typ, data, err := b.read()
	require.NoError(b.t, err)
	require.Equal(b.t, websocket.TextMessage, typ, "got binary %q", data)
	return string(data)
}

func (b *board) readBinary() []byte {
	b.t.Helper()
	typ, data, err := b.read()
	require.NoError(b.t, err)
	require.Equal(b.t, websocket.BinaryMessage, typ, "got text %s", data)
	return data
}

// msg builds a device message the firmware way: session_id first.
func (b *board) msg(rest string) string {
	return `{"session_id":"` + b.sid + `",` + rest + `}`
}

// expectAnswer reads a whole answer to a turn that heard payloads.
func (b *board) expectAnswer(version, frames int, heard [][]byte) {
	b.t.Helper()
	n := len(heard)
	require.Equal(b.t, b.msg(fmt.Sprintf(`"type":"stt","text":"heard %d frames"`, n)), b.readText())
	require.Equal(b.t, b.msg(`"type":"llm","text":"😀","emotion":"happy"`), b.readText())
	require.Equal(b.t, b.msg(`"type":"tts","state":"start"`), b.readText())
	require.Equal(b.t, b.msg(fmt.Sprintf(`"type":"tts","state":"sentence_start","text":"You said %d frames."`, n)), b.readText())
	for k := range frames {
		require.Equal(b.t, ExpectedFrame(version, heard, k), b.readBinary(), "frame %d", k)
	}
	require.Equal(b.t, b.msg(`"type":"tts","state":"stop"`), b.readText())
}

// expectClosed reads until the stub's TCP close.
func (b *board) expectClosed() {
	b.t.Helper()
	for {
		_, _, err := b.read()
		if err != nil {
			var ne net.Error
			require.False(b.t, errors.As(err, &ne) && ne.Timeout(), "connection still open")
			return
		}
	}
}

func last(t *testing.T, s *Server, mac string) Connection {
	t.Helper()
	cs := s.Device(mac)
	require.NotEmpty(t, cs)
	return cs[len(cs)-1]
}
