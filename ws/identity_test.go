package ws_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/simulator"
	"github.com/devicebridge/devicebridge/ws"
)

// helloFrom dials as a board with deviceID and completes the hello; the
// socket closes at cleanup.
func helloFrom(t *testing.T, url, deviceID string) *websocket.Conn {
	t.Helper()
	c := rawDevice(t, url, deviceID)
	require.NoError(t, c.WriteMessage(websocket.TextMessage, []byte(`{"type":"hello","version":1,"features":{"mcp":false},"transport":"websocket"}`)))
	_, _, err := c.ReadMessage() // the server hello
	require.NoError(t, err)
	return c
}

// TestMACSpellingsAreOneBoard: with a board connected, a socket naming it
// by another spelling of its MAC (separators, none, upper case) replaces
// it under its canonical id instead of becoming a second board beside it.
func TestMACSpellingsAreOneBoard(t *testing.T) {
	b := newBridge(t, ws.Config{}, device.HubConfig{Flapping: device.FlapPolicy{Limit: 100, Window: time.Minute}})
	const mac = "02:00:00:00:0a:01"
	_, prev := b.connect(t, simulator.Config{MAC: mac})
	for _, v := range []string{"02-00-00-00-0a-01", "020000000a01", "02_00_00_00_0a_01", "02:00:00:00:0A:01",
		"02-00-00-00-0A-01", "0200.0000.0A01", "020000000A01"} {
		c := helloFrom(t, b.url, v)
		var cur *device.Session
		require.Eventually(t, func() bool {
			s, ok := b.hub.Session(mac)
			if ok && s != prev && s.Info().RemoteAddr == c.LocalAddr().String() {
				cur = s
				return true
			}
			return false
		}, 5*time.Second, 5*time.Millisecond, "%s did not replace the board", v)
		select {
		case <-prev.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("%s sits beside the board instead of replacing it", v)
		}
		assert.Equal(t, device.ErrReplaced.Error(), prev.Info().CloseReason, v)
		assert.Equal(t, mac, cur.Info().DeviceID, "%s is kept in canonical form", v)
		require.Len(t, b.hub.Devices(), 1, v)
		prev = cur
	}
}

// TestMACSpellingsAreFlapGuarded: spellings of one MAC count as one device
// id for the flap guard.
func TestMACSpellingsAreFlapGuarded(t *testing.T) {
	b := newBridge(t, ws.Config{}, device.HubConfig{Flapping: device.FlapPolicy{Limit: 1, Window: time.Hour, Backoff: time.Hour}})
	const mac = "02:00:00:00:0a:02"
	_, first := b.connect(t, simulator.Config{MAC: mac})
	helloFrom(t, b.url, "02-00-00-00-0A-02") // replaces: the first replacement is allowed
	select {
	case <-first.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("another spelling of the MAC did not replace the board")
	}
	c := helloFrom(t, b.url, "020000000a02") // the second within the window is refused
	assert.Contains(t, expectClose(t, c), device.ErrFlapping.Error())
	require.Len(t, b.hub.Devices(), 1)
}

// dialStatus dials with deviceID and returns the refusal's status and body
// (0 when the upgrade succeeded).
func dialStatus(t *testing.T, url, deviceID string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, resp, err := websocket.DefaultDialer.DialContext(ctx, url, http.Header{"Device-Id": {deviceID}})
	if err == nil {
		_ = c.Close()
		return 0, ""
	}
	require.NotNil(t, resp, "%s: %v", deviceID, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestDeviceIDMustBeMAC: a board may not name itself with something other
// than a MAC (it could take a name an operator gave another board), unless
// websocket.allow_any_device_id says so.
func TestDeviceIDMustBeMAC(t *testing.T) {
	b := newBridge(t, ws.Config{}, device.HubConfig{})
	for _, id := range []string{"kitchen", "dev_ef0002", "sensor-17", "02:00:00:00:00"} {
		status, body := dialStatus(t, b.url, id)
		assert.Equal(t, http.StatusBadRequest, status, id)
		assert.Contains(t, body, "not a MAC", id)
		assert.Contains(t, body, "allow_any_device_id", id)
	}
	assert.Empty(t, b.hub.Devices())

	open := newBridge(t, ws.Config{AllowAnyDeviceID: true}, device.HubConfig{})
	helloFrom(t, open.url, "kitchen")
	require.Eventually(t, func() bool { _, ok := open.hub.Session("kitchen"); return ok }, 5*time.Second, 5*time.Millisecond)
	for _, id := range []string{"a:b", "a b", strings.Repeat("x", 65)} {
		status, _ := dialStatus(t, open.url, id)
		assert.Equal(t, http.StatusBadRequest, status, id)
	}
	// A MAC stays a MAC: its spellings are still one canonical id.
	helloFrom(t, open.url, "02-00-00-00-0A-03")
	require.Eventually(t, func() bool { _, ok := open.hub.Session("02:00:00:00:0a:03"); return ok }, 5*time.Second, 5*time.Millisecond)
	for _, d := range open.hub.Devices() {
		assert.NotEqual(t, "02-00-00-00-0A-03", d.DeviceID)
	}
}
