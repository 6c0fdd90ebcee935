package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/devicebridge/devicebridge/device"
)

// TestEventStreamHeartbeatAndClose: an idle stream gets comment
// heartbeats; Close ends it and refuses new streams.
func TestEventStreamHeartbeatAndClose(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	defer goleak.VerifyNone(t, opt)
	hub := device.NewHub(device.HubConfig{}, nil)
	defer hub.Close(context.Background())
	s := New(hub, Options{EventsHeartbeat: 20 * time.Millisecond}, nil)
	mux := newMux(t)
	s.Register(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	defer srv.Client().CloseIdleConnections()

	resp, err := srv.Client().Get(srv.URL + "/api/events")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	next := func() (string, bool) {
		select {
		case l, ok := <-lines:
			return l, ok
		case <-time.After(10 * time.Second):
			t.Fatal("no line")
			return "", false
		}
	}
	assert.Equal(t, ": devicebridge events", first(next))
	require.Eventually(t, func() bool { l, _ := next(); return l == ": heartbeat" }, 10*time.Second, time.Millisecond)

	s.Close()
	for {
		if _, ok := next(); !ok {
			break // the stream ended
		}
	}
	var body ErrorBody
	resp2, err := srv.Client().Get(srv.URL + "/api/events")
	require.NoError(t, err)
	defer resp2.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp2.StatusCode)
	require.NoError(t, decodeJSON(resp2, &body))
	assert.Equal(t, "shutting_down", body.Error.Code)
}

func first(next func() (string, bool)) string { l, _ := next(); return l }

// TestWriteEvent: the frame of each event type.
func TestWriteEvent(t *testing.T) {
	var b bytes.Buffer
	writeEvent(&b, "0badcafe", device.Event{Seq: 7, Type: device.EventResync}, ResyncBehind, nil)
	assert.Equal(t, "id: 0badcafe-7\nevent: resync\ndata: {\"reason\":\"behind\"}\n\n", b.String())
	b.Reset()
	writeEvent(&b, "0badcafe", device.Event{Seq: 8, Type: device.EventCall, DeviceID: "aa:bb:cc:dd:ee:ff", Call: device.CallOutcome{
		Transport: "mqtt", Tool: "self.lamp.turn_on", Code: device.CodeTimeout, Duration: 1500 * time.Microsecond}}, "", nil)
	assert.Equal(t, "id: 0badcafe-8\nevent: call\ndata: "+
		`{"device_id":"aa:bb:cc:dd:ee:ff","transport":"mqtt","tool":"self.lamp.turn_on","code":"timeout","duration_ms":1.5}`+"\n\n",
		b.String())
}

// TestParseEventID: "<epoch>-<seq>" and nothing else.
func TestParseEventID(t *testing.T) {
	epoch, seq, ok := parseEventID("0badcafe-42")
	assert.True(t, ok)
	assert.Equal(t, "0badcafe", epoch)
	assert.Equal(t, uint64(42), seq)
	for _, bad := range []string{"", "42", "-42", "0badcafe-", "0badcafe-x", "0badcafe--1", "0badcafe-1-2"} {
		_, _, ok := parseEventID(bad)
		assert.False(t, ok, bad)
	}
}

func decodeJSON(resp *http.Response, v any) error { return json.NewDecoder(resp.Body).Decode(v) }
