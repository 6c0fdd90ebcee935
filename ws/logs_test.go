package ws_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/ws"
)

// TestRefusedDeviceIDIsCut: the Device-Id of a socket refused for its
// token is the client's header, as long as net/http allows; the line
// quotes it cut.
func TestRefusedDeviceIDIsCut(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	hub := device.NewHub(device.HubConfig{}, nil)
	srv := ws.NewServer(ws.Config{Tokens: []string{"s3cret"}}, hub, zap.New(core))
	hs := httptest.NewServer(srv)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, hub.Close(ctx))
		srv.Close(nil)
		hs.Close()
	})
	long := strings.Repeat("i", 64<<10)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, resp, err := websocket.DefaultDialer.DialContext(ctx, "ws"+strings.TrimPrefix(hs.URL, "http")+srv.Path(),
		http.Header{"Device-Id": {long}, "Authorization": {"Bearer wrong"}})
	require.Error(t, err)
	require.NotNil(t, resp)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	lines := logs.FilterMessage("rejected device: missing or invalid token").All()
	require.Len(t, lines, 1)
	assert.Equal(t, clip.String(long), lines[0].ContextMap()["device_id"])
}
