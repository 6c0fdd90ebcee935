package api

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/frontdoor"
	"github.com/devicebridge/devicebridge/metrics"
)

// recentServer serves the API over a Hub that keeps 16 events and feeds
// a metrics registry, behind a door that wants "Bearer ok".
func recentServer(t *testing.T) (*device.Hub, *httptest.Server) {
	t.Helper()
	m := metrics.New(metrics.Options{})
	hub := device.NewHub(device.HubConfig{EventHistory: 16, Observer: m}, nil)
	t.Cleanup(func() { _ = hub.Close(context.Background()) })
	s := New(hub, Options{RecentStats: m.Recent().Snapshot}, nil)
	t.Cleanup(s.Close)
	mux, err := frontdoor.NewMux(frontdoor.Config{AllowedOrigins: frontdoor.DefaultAllowedOrigins, Refuse: Refuse,
		Auth: func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Authorization") != "Bearer ok" {
					writeError(w, http.StatusUnauthorized, "unauthorized", "no")
					return
				}
				h.ServeHTTP(w, r)
			})
		}})
	require.NoError(t, err)
	s.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Cleanup(srv.Client().CloseIdleConnections)
	return hub, srv
}

func authGet(t *testing.T, srv *httptest.Server, path string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer ok")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	return resp
}

// TestEventsHistory: a new stream with ?history=N starts with the newest N
// events held, each with the time it happened, then goes live; the header
// names the last event of the history. Without the parameter a new stream
// starts empty, as before; a bad value is refused.
func TestEventsHistory(t *testing.T) {
	hub, srv := recentServer(t)
	_, err := hub.CallTool(context.Background(), "aa:bb:cc:dd:ee:ff", "self.x", nil) // seq 1: a failed call
	require.Error(t, err)
	for _, id := range []string{"aa:00:00:00:00:01", "aa:00:00:00:00:02"} { // seq 2, 3
		hub.PublishRemote(device.Event{Type: device.EventOnline, DeviceID: id,
			Info: device.Info{Identity: device.Identity{DeviceID: id}, State: device.StateReady, Node: "n2"}})
	}

	resp := authGet(t, srv, "/api/events?history=2")
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	epoch := hub.Epoch()
	assert.Equal(t, epoch+"-3", resp.Header.Get(HistoryHeader))
	frames := make(chan map[string]string, 16)
	go func() {
		defer close(frames)
		sc := bufio.NewScanner(resp.Body)
		f := map[string]string{}
		for sc.Scan() {
			line := sc.Text()
			if line == "" {
				if f["id"] != "" {
					frames <- f
				}
				f = map[string]string{}
				continue
			}
			if k, v, ok := strings.Cut(line, ": "); ok {
				f[k] = v
			}
		}
	}()
	next := func() map[string]string {
		select {
		case f := <-frames:
			return f
		case <-time.After(10 * time.Second):
			t.Fatal("no event")
			return nil
		}
	}
	f := next()
	assert.Equal(t, epoch+"-2", f["id"], "the newest two: the first call is left out")
	assert.Equal(t, "online", f["event"])
	var ev struct {
		DeviceID string    `json:"device_id"`
		At       time.Time `json:"at"`
	}
	require.NoError(t, json.Unmarshal([]byte(f["data"]), &ev))
	assert.Equal(t, "aa:00:00:00:00:01", ev.DeviceID)
	assert.WithinDuration(t, time.Now(), ev.At, time.Minute, "history events carry when they happened")
	assert.Equal(t, epoch+"-3", next()["id"])
	_, _ = hub.CallTool(context.Background(), "aa:bb:cc:dd:ee:ff", "self.y", nil)
	f = next()
	assert.Equal(t, epoch+"-4", f["id"], "then live")
	var call CallEvent
	require.NoError(t, json.Unmarshal([]byte(f["data"]), &call))
	assert.Equal(t, "self.y", call.Tool)
	assert.Equal(t, "unknown_device", call.Code)
	assert.False(t, call.At.IsZero())

	plain := authGet(t, srv, "/api/events")
	defer plain.Body.Close()
	assert.Empty(t, plain.Header.Get(HistoryHeader), "no history asked, none sent")

	bad := authGet(t, srv, "/api/events?history=lots")
	defer bad.Body.Close()
	assert.Equal(t, http.StatusBadRequest, bad.StatusCode)
	var body ErrorBody
	require.NoError(t, decodeJSON(bad, &body))
	assert.Contains(t, body.Error.Message, "history=200")
}

// TestRecentStatsEndpoint: GET /api/stats/recent counts the calls the Hub
// saw, interval by interval, and wants the API's credentials.
func TestRecentStatsEndpoint(t *testing.T) {
	hub, srv := recentServer(t)
	for _, tool := range []string{"self.a", "self.b", "self.c"} {
		_, err := hub.CallTool(context.Background(), "aa:bb:cc:dd:ee:ff", tool, nil)
		require.Error(t, err)
	}

	resp, err := srv.Client().Get(srv.URL + "/api/stats/recent")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "behind the same credentials as /api")

	resp = authGet(t, srv, "/api/stats/recent")
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var snap metrics.RecentSnapshot
	require.NoError(t, decodeJSON(resp, &snap))
	assert.Equal(t, 10.0, snap.IntervalS)
	assert.Equal(t, 900.0, snap.WindowS)
	require.Len(t, snap.Intervals, 90)
	var calls, errs int64
	for _, iv := range snap.Intervals {
		calls += iv.Calls
		errs += iv.Errors
	}
	assert.EqualValues(t, 3, calls)
	assert.EqualValues(t, 3, errs, "calls to an unknown board failed")
	assert.EqualValues(t, 3, snap.LastMinute.Calls)
	require.NotNil(t, snap.LastMinute.P50MS)
}
