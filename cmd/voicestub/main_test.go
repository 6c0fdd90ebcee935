package main

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/devicebridge/devicebridge/voice/voicestub"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestParseFlags(t *testing.T) {
	m := &Main{}
	require.NoError(t, m.ParseFlags([]string{"--listen", "127.0.0.1:0", "--token", "a", "--token", "b",
		"--secret", "s", "--ota-activation-code", "123456", "--frames", "7", "--pace", "60ms", "--stamp", "--log-level", "warn"}, io.Discard))
	assert.Equal(t, "127.0.0.1:0", m.listen)
	assert.Equal(t, []string{"a", "b"}, m.cfg.Tokens)
	assert.Equal(t, "s", m.cfg.Secret)
	assert.Equal(t, "123456", m.cfg.ActivationCode)
	assert.Equal(t, 7, m.cfg.TTSFrames)
	assert.Equal(t, 60*time.Millisecond, m.cfg.Pace)
	assert.True(t, m.cfg.Stamp)

	for _, bad := range [][]string{{"--frames", "0"}, {"--log-level", "loud"}, {"extra"}, {"--nope"}} {
		assert.Error(t, (&Main{}).ParseFlags(bad, io.Discard), "%q", bad)
	}
}

func TestRun(t *testing.T) {
	m := &Main{}
	require.NoError(t, m.ParseFlags([]string{"--listen", "127.0.0.1:0", "--token", "tok", "--log-level", "error"}, io.Discard))
	urls := make(chan string, 1)
	m.started = func(s *voicestub.Server) { urls <- s.URL() }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	var url string
	select {
	case url = <-urls:
	case err := <-done:
		t.Fatal(err)
	}

	h := http.Header{"Device-Id": {"aa:bb:cc:dd:ee:ff"}, "Authorization": {"Bearer tok"}}
	ws, _, err := websocket.DefaultDialer.Dial(url, h)
	require.NoError(t, err)
	defer ws.Close()
	require.NoError(t, ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"hello","version":1,"transport":"websocket"}`)))
	_ = ws.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, hello, err := ws.ReadMessage()
	require.NoError(t, err)
	assert.Contains(t, string(hello), `"transport":"websocket"`)

	cancel()
	require.NoError(t, <-done)
	_, _, err = ws.ReadMessage()
	assert.Error(t, err, "Run closed the connection")
}
