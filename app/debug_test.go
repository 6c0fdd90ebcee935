package app_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
)

// TestDebugListener: pprof is served on its own listener only, loopback
// unless forced, and a profile in progress does not hold up the shutdown.
func TestDebugListener(t *testing.T) {
	for _, tt := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"--debug-listen", "127.0.0.1:6060"}, true},
		{[]string{"--debug-listen", "[::1]:6060"}, true},
		{[]string{"--debug-listen", "localhost:6060"}, true},
		{[]string{"--debug-listen", ":6060"}, false},
		{[]string{"--debug-listen", "0.0.0.0:6060"}, false},
		{[]string{"--debug-listen", "192.168.1.5:6060"}, false},
		{[]string{"--debug-listen", "0.0.0.0:6060", "--debug-allow-remote"}, true},
		{[]string{"--debug-listen", "6060"}, false},
	} {
		_, err := app.ParseArgs("bridge", tt.args)
		if tt.ok {
			assert.NoError(t, err, tt.args)
		} else {
			assert.ErrorContains(t, err, "debug_listen", tt.args)
		}
	}
	assert.Empty(t, app.Default().DebugListen, "off by default")

	noLeaks(t)
	cfg := testConfig()
	cfg.DebugListen = "127.0.0.1:0"
	a, err := app.New(cfg, nil)
	require.NoError(t, err)
	require.NoError(t, a.Start(context.Background()))
	require.NotNil(t, a.DebugAddr())
	debug := "http://" + a.DebugAddr().String()

	resp, err := http.Get(debug + "/debug/pprof/")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, string(body), "goroutine")
	assert.Equal(t, http.StatusNotFound, getJSON(t, "http://"+a.ControlAddr().String()+"/debug/pprof/", nil), "never on the control listener")
	resp, err = http.Get("http://" + a.DeviceAddr().String() + "/debug/pprof/")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "never on the device listener")

	// A long CPU profile in progress ends when the bridge shuts down.
	profile := make(chan int, 1)
	go func() {
		resp, err := http.Get(debug + "/debug/pprof/profile?seconds=600")
		if err != nil {
			profile <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		profile <- resp.StatusCode
	}()
	require.Eventually(t, func() bool {
		resp, err := http.Get(debug + "/debug/pprof/goroutine?debug=1")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(b), "pprof.Profile")
	}, obsWait, 10*time.Millisecond, "the profile is running")
	ctx, cancel := context.WithTimeout(context.Background(), obsWait)
	defer cancel()
	require.NoError(t, a.Shutdown(ctx))
	select {
	case <-profile:
	case <-time.After(obsWait):
		t.Fatal("the profile request was not ended by the shutdown")
	}
	assert.Nil(t, a.DebugAddr())
}
