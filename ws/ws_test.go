package ws_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/simulator"
	"github.com/devicebridge/devicebridge/ws"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// bridge is a Hub behind a real WebSocket endpoint on loopback.
type bridge struct {
	hub *device.Hub
	srv *ws.Server
	url string
}

func newBridge(t *testing.T, cfg ws.Config, hubCfg device.HubConfig) *bridge {
	t.Helper()
	hub := device.NewHub(hubCfg, nil)
	srv := ws.NewServer(cfg, hub, nil)
	mux := http.NewServeMux()
	mux.Handle(srv.Path(), srv)
	hs := httptest.NewServer(mux)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, hub.Close(ctx))
		srv.Close(nil)
		hs.Close()
	})
	return &bridge{hub: hub, srv: srv, url: "ws" + strings.TrimPrefix(hs.URL, "http") + srv.Path()}
}

// connect starts a simulated board and waits until its session is ready.
func (b *bridge) connect(t *testing.T, cfg simulator.Config) (*simulator.Board, *device.Session) {
	t.Helper()
	if cfg.Profile == nil {
		p, err := simulator.LoadProfile("breadboard")
		require.NoError(t, err)
		cfg.Profile = p
	}
	board, err := simulator.NewBoard(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = board.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, board.ConnectWebSocket(ctx, b.url))
	var sess *device.Session
	require.Eventually(t, func() bool {
		// This board's own session: with a MAC already connected, the
		// older session may still be the one the Hub holds for a moment.
		s, ok := b.hub.Session(board.MAC())
		if ok && s.Info().ClientID == board.ClientID() && s.Info().State == device.StateReady {
			sess = s
			return true
		}
		return false
	}, 10*time.Second, 5*time.Millisecond)
	return board, sess
}

func call(t *testing.T, b *bridge, mac, tool, args string) (*device.CallResult, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var raw json.RawMessage
	if args != "" {
		raw = json.RawMessage(args)
	}
	return b.hub.CallTool(ctx, mac, tool, raw)
}

func TestBoardRoundTrip(t *testing.T) {
	b := newBridge(t, ws.Config{}, device.HubConfig{Client: device.ClientOptions{WithUserTools: true}})
	board, sess := b.connect(t, simulator.Config{MAC: "aa:bb:cc:dd:ee:01"})

	info := sess.Info()
	assert.Equal(t, "websocket", info.Transport)
	assert.Equal(t, board.ClientID(), info.ClientID)
	assert.Equal(t, "bread-compact-wifi", info.Board)
	assert.Equal(t, "2.4.2", info.FirmwareVersion)
	assert.Equal(t, 1, info.ProtocolVersion)
	assert.NotEmpty(t, board.SessionID(), "the board accepted the server hello and stored its session id")

	var names []string
	userOnly := map[string]bool{}
	for _, ti := range info.ToolInfos() {
		names = append(names, ti.Name)
		userOnly[ti.Name] = ti.UserOnly
	}
	require.GreaterOrEqual(t, len(names), 7)
	assert.Equal(t, []string{"self.get_device_status", "self.audio_speaker.set_volume", "self.screen.set_theme",
		"self.lamp.get_state", "self.lamp.turn_on", "self.lamp.turn_off"}, names[:6], "device order")
	assert.True(t, userOnly["self.reboot"])
	assert.False(t, userOnly["self.get_device_status"])

	res, err := call(t, b, board.MAC(), "self.audio_speaker.set_volume", `{"volume":35}`)
	require.NoError(t, err)
	assert.Equal(t, "true", res.Text())
	res, err = call(t, b, board.MAC(), "self.get_device_status", "")
	require.NoError(t, err)
	assert.Contains(t, res.Text(), `"audio_speaker":{"volume":35}`)
}

// TestDeviceErrors: the board's own error replies (no code, sometimes
// invalid JSON) reach the caller as a DeviceError. They are sent raw: the
// Hub's CallTool would refuse these calls before the board sees them.
func TestDeviceErrors(t *testing.T) {
	b := newBridge(t, ws.Config{}, device.HubConfig{})
	board, sess := b.connect(t, simulator.Config{MAC: "aa:bb:cc:dd:ee:02"})
	tests := []struct {
		name, tool, args, want string
	}{
		{"range error", "self.audio_speaker.set_volume", `{"volume":101}`, "Value exceeds maximum allowed: 100"},
		{"below range", "self.audio_speaker.set_volume", `{"volume":-1}`, "Value is below minimum allowed: 0"},
		{"missing argument", "self.audio_speaker.set_volume", `{}`, "Missing valid argument: volume"},
		{"wrong type counts as missing", "self.audio_speaker.set_volume", `{"volume":"loud"}`, "Missing valid argument: volume"},
		{"unknown tool", "self.nope", `{}`, "Unknown tool: self.nope"},
		{"unknown tool with a quote (invalid JSON from the board)", `self.no"pe`, `{}`, `Unknown tool: self.no"pe`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := sess.Call(ctx, "tools/call", map[string]any{"name": tt.tool, "arguments": json.RawMessage(tt.args)}, 0)
			var de *device.DeviceError
			require.ErrorAs(t, err, &de)
			assert.Equal(t, tt.want, de.Message)

			_, err = call(t, b, board.MAC(), tt.tool, tt.args)
			assert.Contains(t, []device.Code{device.CodeInvalidArguments, device.CodeUnknownTool}, device.CodeOf(err),
				"CallTool refuses before the board: %v", err)
		})
	}
	// The session survives all of that.
	res, err := call(t, b, board.MAC(), "self.lamp.turn_on", "")
	require.NoError(t, err)
	assert.Equal(t, "true", res.Text())
}

func TestMultiPageCatalog(t *testing.T) {
	b := newBridge(t, ws.Config{}, device.HubConfig{Client: device.ClientOptions{WithUserTools: true}})
	catalog, err := simulator.LoadProfile("catalog")
	require.NoError(t, err)
	board, sess := b.connect(t, simulator.Config{MAC: "aa:bb:cc:dd:ee:03", Profile: catalog})
	var want []string
	for _, tl := range catalog.Tools {
		want = append(want, tl.Name)
	}
	var got []string
	for _, tl := range sess.Info().Tools {
		got = append(got, tl.Name)
	}
	assert.Equal(t, want, got, "every page assembled, in device order")
	// The board sent its hello, the initialize reply, and one reply per page.
	pages := board.Stats().MessagesSent - 2
	assert.GreaterOrEqual(t, pages, uint64(3), "the catalog needs at least three pages")
}

func TestSlowToolTimesOut(t *testing.T) {
	b := newBridge(t, ws.Config{}, device.HubConfig{Client: device.ClientOptions{CallTimeout: 300 * time.Millisecond}})
	board, _ := b.connect(t, simulator.Config{MAC: "aa:bb:cc:dd:ee:04",
		ToolDelay: map[string]time.Duration{"self.lamp.turn_on": 2 * time.Second}})
	_, err := call(t, b, board.MAC(), "self.lamp.turn_on", "")
	require.ErrorIs(t, err, device.ErrTimeout)
	assert.Contains(t, err.Error(), "outcome unknown")
}

func TestDisconnectMidCall(t *testing.T) {
	b := newBridge(t, ws.Config{}, device.HubConfig{Client: device.ClientOptions{CallTimeout: time.Minute}})
	board, sess := b.connect(t, simulator.Config{MAC: "aa:bb:cc:dd:ee:05",
		ToolDelay:    map[string]time.Duration{"self.lamp.turn_off": 200 * time.Millisecond},
		DisconnectOn: map[string]bool{"self.lamp.turn_off": true}})
	_, err := call(t, b, board.MAC(), "self.lamp.turn_off", "")
	require.ErrorIs(t, err, device.ErrOffline)
	require.ErrorIs(t, err, device.ErrDisconnected, "fails at the disconnect, not at the one-minute timeout")
	<-sess.Done()
	assert.Contains(t, sess.Info().CloseReason, "connection")
}

func TestSecondConnectionReplacesFirst(t *testing.T) {
	b := newBridge(t, ws.Config{}, device.HubConfig{})
	first, s1 := b.connect(t, simulator.Config{MAC: "aa:bb:cc:dd:ee:06"})
	second, s2 := b.connect(t, simulator.Config{MAC: "aa:bb:cc:dd:ee:06"})
	require.NotSame(t, s1, s2)
	<-s1.Done()
	assert.Equal(t, device.ErrReplaced.Error(), s1.Info().CloseReason)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := first.Serve(ctx)
	assert.True(t, errors.Is(err, simulator.ErrServerClosed) || errors.Is(err, simulator.ErrConnectionLost), "old board saw its socket closed: %v", err)
	_, err = call(t, b, second.MAC(), "self.get_device_status", "")
	require.NoError(t, err)
	require.Len(t, b.hub.Devices(), 1)
}

func TestHandshakeRejections(t *testing.T) {
	b := newBridge(t, ws.Config{Tokens: []string{"s3cret", "Basic abc"}}, device.HubConfig{})
	profile, err := simulator.LoadProfile("breadboard")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	for _, tok := range []string{"", "wrong"} {
		board, err := simulator.NewBoard(simulator.Config{MAC: "aa:bb:cc:dd:ee:07", Profile: profile, Token: tok})
		require.NoError(t, err)
		err = board.ConnectWebSocket(ctx, b.url)
		var he *simulator.HandshakeError
		require.ErrorAs(t, err, &he, "token %q", tok)
		assert.Equal(t, http.StatusUnauthorized, he.StatusCode)
	}
	// Both token forms boards use: "Bearer <t>" and a token with a space sent as is.
	b.connect(t, simulator.Config{MAC: "aa:bb:cc:dd:ee:08", Token: "s3cret"})
	b.connect(t, simulator.Config{MAC: "aa:bb:cc:dd:ee:09", Token: "Basic abc"})

	// Missing Device-Id: 400 before any upgrade.
	h := http.Header{"Authorization": {"Bearer s3cret"}}
	_, resp, err := websocket.DefaultDialer.DialContext(ctx, b.url, h)
	require.Error(t, err)
	require.NotNil(t, resp)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	// A browser page from another origin is refused.
	h = http.Header{"Authorization": {"Bearer s3cret"}, "Device-Id": {"aa:bb:cc:dd:ee:10"}, "Origin": {"http://evil.example"}}
	_, resp, err = websocket.DefaultDialer.DialContext(ctx, b.url, h)
	require.Error(t, err)
	require.NotNil(t, resp)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	st := b.srv.Stats()
	assert.EqualValues(t, 2, st.Unauthorized)
}

// rawDevice dials like a board but lets the test choose what to send.
func rawDevice(t *testing.T, url, mac string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.DefaultDialer.DialContext(ctx, url, http.Header{"Device-Id": {mac}, "Protocol-Version": {"1"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// expectClose reads until the server closes the socket and returns the close text.
func expectClose(t *testing.T, c *websocket.Conn) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		_, _, err := c.ReadMessage()
		if err == nil {
			continue
		}
		var ce *websocket.CloseError
		if errors.As(err, &ce) {
			return ce.Text
		}
		t.Fatalf("connection ended without a close frame: %v", err)
	}
}

func TestHelloRules(t *testing.T) {
	b := newBridge(t, ws.Config{HelloTimeout: 200 * time.Millisecond}, device.HubConfig{})

	t.Run("no hello in time", func(t *testing.T) {
		c := rawDevice(t, b.url, "aa:bb:cc:dd:ee:11")
		assert.Contains(t, expectClose(t, c), "no hello")
	})
	t.Run("first message not a hello", func(t *testing.T) {
		c := rawDevice(t, b.url, "aa:bb:cc:dd:ee:12")
		require.NoError(t, c.WriteMessage(websocket.TextMessage, []byte(`{"session_id":"","type":"listen","state":"start","mode":"auto"}`)))
		assert.Contains(t, expectClose(t, c), "not a hello")
	})
	t.Run("garbage first", func(t *testing.T) {
		c := rawDevice(t, b.url, "aa:bb:cc:dd:ee:13")
		require.NoError(t, c.WriteMessage(websocket.TextMessage, []byte(`{{{`)))
		assert.Contains(t, expectClose(t, c), "not a hello")
	})
	t.Run("server hello always carries transport", func(t *testing.T) {
		c := rawDevice(t, b.url, "aa:bb:cc:dd:ee:14")
		require.NoError(t, c.WriteMessage(websocket.TextMessage, []byte(`{"type":"hello","version":1,"features":{"mcp":true},"transport":"websocket","audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`)))
		_, msg, err := c.ReadMessage()
		require.NoError(t, err)
		var m map[string]any
		require.NoError(t, json.Unmarshal(msg, &m))
		assert.Equal(t, "hello", m["type"])
		assert.Equal(t, "websocket", m["transport"])
		assert.Len(t, m["session_id"], 32)
		ap := m["audio_params"].(map[string]any)
		assert.EqualValues(t, 24000, ap["sample_rate"])
		assert.EqualValues(t, 60, ap["frame_duration"])
	})
	t.Run("board without mcp stays connected", func(t *testing.T) {
		profile, err := simulator.LoadProfile("breadboard")
		require.NoError(t, err)
		board, err := simulator.NewBoard(simulator.Config{MAC: "aa:bb:cc:dd:ee:15", Profile: profile, OmitMCPFeature: true})
		require.NoError(t, err)
		defer board.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, board.ConnectWebSocket(ctx, b.url))
		var s *device.Session
		require.Eventually(t, func() bool { var ok bool; s, ok = b.hub.Session(board.MAC()); return ok }, 5*time.Second, 5*time.Millisecond)
		assert.False(t, s.Info().HasMCP)
		assert.Equal(t, device.StateConnected, s.Info().State)
		_, err = call(t, b, board.MAC(), "self.get_device_status", "")
		require.ErrorIs(t, err, device.ErrNoMCP)
	})
}

func TestBadFramesAreNotFatal(t *testing.T) {
	b := newBridge(t, ws.Config{}, device.HubConfig{})
	c := rawDevice(t, b.url, "aa:bb:cc:dd:ee:16")
	require.NoError(t, c.WriteMessage(websocket.TextMessage, []byte(`{"type":"hello","version":1,"features":{"mcp":false},"transport":"websocket"}`)))
	_, _, err := c.ReadMessage() // server hello
	require.NoError(t, err)
	var s *device.Session
	require.Eventually(t, func() bool { var ok bool; s, ok = b.hub.Session("aa:bb:cc:dd:ee:16"); return ok }, 5*time.Second, 5*time.Millisecond)
	for _, m := range []string{`{"session_id":"x","type":"listen","state":"detect","text":"hi"}`, `{"type":"abort"}`, `not json`} {
		require.NoError(t, c.WriteMessage(websocket.TextMessage, []byte(m)))
	}
	require.NoError(t, c.WriteMessage(websocket.BinaryMessage, []byte{1, 2, 3}))
	// The message counters include live connections.
	require.Eventually(t, func() bool {
		st := b.srv.Stats()
		return st.Active == 1 && st.TextIn == 4 && st.BinaryIn == 1 && st.TextOut >= 1
	}, 5*time.Second, 5*time.Millisecond, "live connection's messages counted")
	// Oversized: past the 64 KiB read limit, the bridge closes with a reason.
	// The bridge may drop the socket before the client finishes writing the
	// frame, so the client's own write error says nothing; the close reason does.
	_ = c.WriteMessage(websocket.TextMessage, []byte(`{"type":"mcp","payload":{"x":"`+strings.Repeat("a", 70<<10)+`"}}`))
	<-s.Done()
	assert.Contains(t, s.Info().CloseReason, "size limit")
	require.Eventually(t, func() bool { return b.srv.Stats().Active == 0 }, 5*time.Second, 5*time.Millisecond)
	st := b.srv.Stats()
	assert.EqualValues(t, 1, st.BinaryIn, "audio frames are counted")
	assert.EqualValues(t, 4, st.TextIn, "hello plus three other messages")
}

// TestBoardWithoutMCPKeepsAnsweringPings: a board whose hello lacks
// features.mcp may send any number of text messages; the bridge keeps
// reading them, so its pings are still answered and the socket stays up.
func TestBoardWithoutMCPKeepsAnsweringPings(t *testing.T) {
	b := newBridge(t, ws.Config{}, device.HubConfig{})
	c := rawDevice(t, b.url, "aa:bb:cc:dd:ee:31")
	require.NoError(t, c.WriteMessage(websocket.TextMessage, []byte(`{"type":"hello","version":1,"transport":"websocket","audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`)))
	_, _, err := c.ReadMessage() // the server hello
	require.NoError(t, err)

	for range 200 {
		require.NoError(t, c.WriteMessage(websocket.TextMessage, []byte(`{"session_id":"","type":"listen","state":"detect","text":"hi"}`)))
	}
	// The bridge's reader answers a ping with a pong only while it runs.
	pong := make(chan struct{}, 1)
	c.SetPongHandler(func(string) error { pong <- struct{}{}; return nil })
	require.NoError(t, c.WriteControl(websocket.PingMessage, []byte("p"), time.Now().Add(5*time.Second)))
	readErr := make(chan error, 1)
	go func() {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, _, err := c.ReadMessage() // runs the pong handler; ends when the test closes c
		readErr <- err
	}()
	select {
	case <-pong:
	case err := <-readErr:
		t.Fatalf("no pong: the bridge stopped reading a board without MCP (%v)", err)
	}
	s, ok := b.hub.Session("aa:bb:cc:dd:ee:31")
	require.True(t, ok)
	assert.Equal(t, device.StateConnected, s.Info().State)
	_ = c.Close()
	<-readErr
}

// TestConnectionCaps: sockets that never send their hello, and sockets in
// general, are bounded. Past either cap a newcomer gets 503 before the
// upgrade, with a reason and Retry-After, and room comes back as sockets
// finish their hello or close.
func TestConnectionCaps(t *testing.T) {
	b := newBridge(t, ws.Config{MaxPendingHellos: 2, MaxConnections: 3, HelloTimeout: time.Minute}, device.HubConfig{})
	refused := func(mac, want string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, resp, err := websocket.DefaultDialer.DialContext(ctx, b.url, http.Header{"Device-Id": {mac}})
		require.Error(t, err)
		require.NotNil(t, resp)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		assert.Contains(t, string(body), want)
		assert.NotEmpty(t, resp.Header.Get("Retry-After"))
	}
	first := rawDevice(t, b.url, "aa:bb:cc:dd:ee:31")
	second := rawDevice(t, b.url, "aa:bb:cc:dd:ee:32")
	refused("aa:bb:cc:dd:ee:33", "waiting for their hello")

	// A finished hello frees a pending slot; the socket still counts.
	require.NoError(t, first.WriteMessage(websocket.TextMessage, []byte(`{"type":"hello","version":1,"features":{"mcp":false},"transport":"websocket"}`)))
	_, _, err := first.ReadMessage()
	require.NoError(t, err)
	// The slot is free by the time the board reads the server hello.
	assert.EqualValues(t, 1, b.srv.Stats().Pending)
	rawDevice(t, b.url, "aa:bb:cc:dd:ee:33")
	refused("aa:bb:cc:dd:ee:34", "too many device connections")
	assert.EqualValues(t, 2, b.srv.Stats().Refused)

	// A closed socket gives its room back, and its pending slot with it
	// (it never sent a hello): Stats shows both freed at once, so once
	// Active is down the next board is admitted.
	require.NoError(t, second.Close())
	require.Eventually(t, func() bool { return b.srv.Stats().Active == 2 }, 5*time.Second, 5*time.Millisecond)
	assert.EqualValues(t, 1, b.srv.Stats().Pending, "33 still waits for its hello")
	rawDevice(t, b.url, "aa:bb:cc:dd:ee:34")
}
