package api

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/internal/logthrottle"
	"github.com/devicebridge/devicebridge/policy"
)

// TestCallRefusalsAreThrottledAndCut: a caller repeating a control call
// the policy refuses, or one the Hub fails (no such board), gets one line
// per interval, with the count of the rest; the board id and tool name it
// sent, which may fill the whole body, are cut in the line.
func TestCallRefusalsAreThrottledAndCut(t *testing.T) {
	p, err := policy.Parse([]byte("identities:\n  anonymous:\n    boards: [\"*\"]\n    tools: [\"self.get_device_status\"]\n"))
	require.NoError(t, err)
	core, logs := observer.New(zapcore.InfoLevel)
	s := New(device.NewHub(device.HubConfig{}, nil), Options{Access: Access{Policy: policy.New(p)}}, zap.New(core))
	mux := newMux(t)
	s.Register(mux)
	srv := httptest.NewServer(JSONErrors(mux))
	defer srv.Close()

	long := strings.Repeat("n", 100_000)
	call := func(id, tool string, want int) {
		body, err := json.Marshal(map[string]string{"name": tool})
		require.NoError(t, err)
		resp, err := http.Post(srv.URL+"/api/devices/"+id+"/call", "application/json", bytes.NewReader(body))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, want, resp.StatusCode)
	}
	const n = 20
	for _, tc := range []struct {
		name, msg string
		th        *logthrottle.Throttle
		do        func()
	}{
		{"policy", "control call refused by policy", &s.lines.deniedCall, func() { call("02:00:00:00:00:01", long, http.StatusForbidden) }},
		{"hub", "control call failed", &s.lines.callFailed, func() { call(strings.Repeat("d", 4000), "self.get_device_status", http.StatusNotFound) }},
	} {
		tc.th.SetInterval(time.Hour)
		for range n {
			tc.do()
		}
		require.Equal(t, 1, logs.FilterMessage(tc.msg).Len(), "%s: one line for a flood of %d", tc.name, n)
		tc.th.SetInterval(time.Nanosecond)
		tc.do()
		lines := logs.FilterMessage(tc.msg).All()
		require.Len(t, lines, 2, tc.name)
		assert.EqualValues(t, n-1, lines[1].ContextMap()["suppressed"], tc.name)
	}
	for _, e := range logs.All() {
		for k, v := range e.ContextMap() {
			if s, ok := v.(string); ok {
				assert.LessOrEqual(t, len(s), clip.Max+40, "%s: %s is not cut", e.Message, k)
			}
		}
	}
	assert.Equal(t, clip.String(long), logs.FilterMessage("control call refused by policy").All()[0].ContextMap()["tool"])
}
