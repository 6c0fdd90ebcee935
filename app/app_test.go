package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/api"
	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/internal/bridgetest"
	"github.com/devicebridge/devicebridge/simulator"
)

// noLeaks checks, after every other cleanup (the App's shutdown included),
// that the test left no goroutines behind.
func noLeaks(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		http.DefaultClient.CloseIdleConnections()
		goleak.VerifyNone(t, opt)
	})
}

// testConfig is the default configuration on free loopback ports, with the
// embedded MQTT broker off (these tests are about the WebSocket path).
func testConfig() app.Config {
	cfg := app.Default()
	cfg.DeviceListen = "127.0.0.1:0"
	cfg.ControlListen = "127.0.0.1:0"
	cfg.MQTT.Listen = ""
	return cfg
}

// startApp runs a bridge (internal/bridgetest) with exactly cfg, logging
// nothing, and returns it with its control base URL.
func startApp(t *testing.T, cfg app.Config) (*app.App, string) {
	t.Helper()
	b := bridgetest.Start(t, func(c *app.Config) { *c = cfg }, bridgetest.WithLogger(zap.NewNop()))
	return b.App, b.Base
}

func getJSON(t *testing.T, url string, out any) int {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	if out != nil {
		require.NoError(t, json.NewDecoder(resp.Body).Decode(out))
	}
	return resp.StatusCode
}

func postJSON(t *testing.T, url, body string, out any) int {
	t.Helper()
	resp, err := http.Post(url, "application/json", bytes.NewBufferString(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if out != nil {
		require.NoError(t, json.Unmarshal(data, out), "body: %s", data)
	}
	return resp.StatusCode
}

type deviceList struct {
	Devices []struct {
		DeviceID  string `json:"device_id"`
		State     string `json:"state"`
		Transport string `json:"transport"`
		Board     string `json:"board"`
		ToolCount int    `json:"tool_count"`
	} `json:"devices"`
}

func waitReady(t *testing.T, base string, n int) deviceList {
	t.Helper()
	var list deviceList
	require.Eventually(t, func() bool {
		list = deviceList{}
		getJSON(t, base+"/api/devices", &list)
		ready := 0
		for _, d := range list.Devices {
			if d.State == "ready" {
				ready++
			}
		}
		return ready == n
	}, 15*time.Second, 10*time.Millisecond)
	return list
}

// TestDemo is the README's first run: --simulate 3, then the control API.
func TestDemo(t *testing.T) {
	noLeaks(t)
	cfg := testConfig()
	cfg.Simulate.Count = 3
	_, base := startApp(t, cfg)

	list := waitReady(t, base, 3)
	require.Len(t, list.Devices, 3)
	for _, d := range list.Devices {
		assert.Equal(t, "websocket", d.Transport)
		assert.Equal(t, "bread-compact-wifi", d.Board)
		assert.Equal(t, 13, d.ToolCount, "common, board and user-only tools")
	}
	id := list.Devices[1].DeviceID

	var detail struct {
		DeviceID        string `json:"device_id"`
		ClientID        string `json:"client_id"`
		FirmwareVersion string `json:"firmware_version"`
		Tools           []struct {
			Name     string `json:"name"`
			UserOnly bool   `json:"user_only"`
		} `json:"tools"`
	}
	require.Equal(t, http.StatusOK, getJSON(t, base+"/api/devices/"+id, &detail))
	assert.Equal(t, id, detail.DeviceID)
	assert.NotEmpty(t, detail.ClientID)
	assert.Equal(t, "2.4.2", detail.FirmwareVersion)
	require.Len(t, detail.Tools, 13)
	assert.Equal(t, "self.get_device_status", detail.Tools[0].Name)
	assert.False(t, detail.Tools[0].UserOnly)
	assert.Equal(t, "self.get_system_info", detail.Tools[6].Name)
	assert.True(t, detail.Tools[6].UserOnly)

	var res struct {
		Content []struct{ Type, Text string } `json:"content"`
		IsError bool                          `json:"isError"`
	}
	require.Equal(t, http.StatusOK, postJSON(t, base+"/api/devices/"+id+"/call",
		`{"name":"self.audio_speaker.set_volume","arguments":{"volume":35}}`, &res))
	assert.Equal(t, "true", res.Content[0].Text)
	require.Equal(t, http.StatusOK, postJSON(t, base+"/api/devices/"+id+"/call", `{"name":"self.get_device_status"}`, &res))
	assert.Contains(t, res.Content[0].Text, `"audio_speaker":{"volume":35}`)

	// The MAC can also be written with underscores, as MQTT topics do.
	underscored := bytes.ReplaceAll([]byte(id), []byte(":"), []byte("_"))
	require.Equal(t, http.StatusOK, getJSON(t, base+"/api/devices/"+string(underscored), nil))

	var health map[string]any
	require.Equal(t, http.StatusOK, getJSON(t, base+"/healthz", &health))
	assert.Equal(t, "ok", health["status"])
}

func TestControlAPIErrors(t *testing.T) {
	noLeaks(t)
	cfg := testConfig()
	// Only the call that is about the timeout gets a short one; the others
	// must not depend on finishing within it.
	cfg.Devices.ToolTimeouts = map[string]time.Duration{"self.lamp.turn_on": 300 * time.Millisecond}
	a, base := startApp(t, cfg)

	profile, err := simulator.LoadProfile("breadboard")
	require.NoError(t, err)
	connect := func(c simulator.Config) *simulator.Board {
		c.Profile = profile
		b, err := simulator.NewBoard(c)
		require.NoError(t, err)
		t.Cleanup(func() { _ = b.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, b.ConnectWebSocket(ctx, a.DeviceURL()))
		return b
	}
	connect(simulator.Config{MAC: "aa:00:00:00:00:01",
		ToolDelay: map[string]time.Duration{"self.lamp.turn_on": 2 * time.Second}})
	connect(simulator.Config{MAC: "aa:00:00:00:00:02", OmitMCPFeature: true})
	// A separate board for the disconnect: the first one is still busy with
	// the slow call after its timeout, as a real board would be.
	connect(simulator.Config{MAC: "aa:00:00:00:00:03",
		ToolDelay:    map[string]time.Duration{"self.lamp.turn_off": 100 * time.Millisecond},
		DisconnectOn: map[string]bool{"self.lamp.turn_off": true}})
	waitReady(t, base, 2)

	tests := []struct {
		name, path, body string
		status           int
		code             string
	}{
		{"unknown device", "/api/devices/ff:ff:ff:ff:ff:ff/call", `{"name":"self.get_device_status"}`, 404, "unknown_device"},
		{"out of range: checked before the board", "/api/devices/aa:00:00:00:00:01/call", `{"name":"self.audio_speaker.set_volume","arguments":{"volume":300}}`, 422, "invalid_arguments"},
		{"missing argument", "/api/devices/aa:00:00:00:00:01/call", `{"name":"self.audio_speaker.set_volume"}`, 422, "invalid_arguments"},
		{"unknown tool", "/api/devices/aa:00:00:00:00:01/call", `{"name":"self.nope"}`, 404, "unknown_tool"},
		{"timeout", "/api/devices/aa:00:00:00:00:01/call", `{"name":"self.lamp.turn_on"}`, 504, "device_timeout"},
		{"board without mcp", "/api/devices/aa:00:00:00:00:02/call", `{"name":"self.lamp.turn_on"}`, 409, "device_without_mcp"},
		{"no name", "/api/devices/aa:00:00:00:00:01/call", `{"arguments":{}}`, 400, "bad_request"},
		{"arguments not an object", "/api/devices/aa:00:00:00:00:01/call", `{"name":"x","arguments":[1]}`, 400, "bad_request"},
		{"typo in a field", "/api/devices/aa:00:00:00:00:01/call", `{"name":"x","args":{}}`, 400, "bad_request"},
		{"not json", "/api/devices/aa:00:00:00:00:01/call", `volume=3`, 400, "bad_request"},
		{"disconnect mid-call", "/api/devices/aa:00:00:00:00:03/call", `{"name":"self.lamp.turn_off"}`, 502, "device_disconnected"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var body api.ErrorBody
			assert.Equal(t, tt.status, postJSON(t, base+tt.path, tt.body, &body))
			assert.Equal(t, tt.code, body.Error.Code)
			assert.NotEmpty(t, body.Error.Message)
		})
	}
	var body api.ErrorBody
	assert.Equal(t, http.StatusNotFound, getJSON(t, base+"/api/devices/nope", &body))
	assert.Equal(t, "unknown_device", body.Error.Code)
}

func TestControlToken(t *testing.T) {
	noLeaks(t)
	cfg := testConfig()
	cfg.Control.Tokens = []string{"ctl"}
	_, base := startApp(t, cfg)
	assert.Equal(t, http.StatusUnauthorized, getJSON(t, base+"/api/devices", nil))
	req, _ := http.NewRequest(http.MethodGet, base+"/api/devices", nil)
	req.Header.Set("Authorization", "Bearer ctl")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, http.StatusOK, getJSON(t, base+"/healthz", nil), "health stays open for probes")
}

func TestDeviceTokenWithSimulatedBoards(t *testing.T) {
	noLeaks(t)
	cfg := testConfig()
	cfg.WebSocket.Tokens = []string{"dev-secret"}
	cfg.Simulate.Count = 1
	_, base := startApp(t, cfg)
	waitReady(t, base, 1) // in-process boards use the first configured token
}

func TestParseArgs(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "bridge.yaml")
	require.NoError(t, os.WriteFile(file, []byte(`
device_listen: "127.0.0.1:9000"
control_listen: "127.0.0.1:9001"
log:
  format: json
websocket:
  tokens: [from-file]
  hello_timeout: 3s
devices:
  call_timeout: 45s
  tool_timeouts:
    self.camera.take_photo: 90s
simulate:
  count: 2
`), 0o600))

	cfg, err := app.ParseArgs("bridge", []string{"--config", file, "--control-listen", "127.0.0.1:9999", "--simulate", "5"})
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:9000", cfg.DeviceListen, "from the file")
	assert.Equal(t, "127.0.0.1:9999", cfg.ControlListen, "flags override the file")
	assert.Equal(t, 5, cfg.Simulate.Count)
	assert.Equal(t, "json", cfg.Log.Format)
	assert.Equal(t, []string{"from-file"}, cfg.WebSocket.Tokens)
	assert.Equal(t, 3*time.Second, cfg.WebSocket.HelloTimeout)
	assert.Equal(t, 45*time.Second, cfg.Devices.CallTimeout)
	assert.Equal(t, 90*time.Second, cfg.Devices.ToolTimeouts["self.camera.take_photo"])

	cfg, err = app.ParseArgs("bridge", nil)
	require.NoError(t, err)
	assert.Equal(t, "0.0.0.0:8000", cfg.DeviceListen)
	assert.Equal(t, "127.0.0.1:8080", cfg.ControlListen)

	require.NoError(t, os.WriteFile(file, []byte("devices:\n  call_timout: 3s\n"), 0o600))
	_, err = app.ParseArgs("bridge", []string{"--config", file})
	require.ErrorContains(t, err, "call_timout", "a typo is an error, not a silent default")

	require.NoError(t, os.WriteFile(file, []byte("devices:\n  max_catalog_bytes: -1\n  tool_limits: {max_schema_depth: 500}\n"), 0o600))
	_, err = app.ParseArgs("bridge", []string{"--config", file})
	require.ErrorContains(t, err, "devices.max_catalog_bytes -1")
	require.ErrorContains(t, err, "devices.tool_limits.max_schema_depth 500: use a whole number from 4 to 64")

	_, err = app.ParseArgs("bridge", []string{"--log-format", "xml"})
	require.ErrorContains(t, err, "log.format")
	_, err = app.ParseArgs("bridge", []string{"--config", filepath.Join(dir, "missing.yaml")})
	require.Error(t, err)
}

// TestShippedConfigLoads keeps configs/bridge.yaml valid.
func TestShippedConfigLoads(t *testing.T) {
	cfg, err := app.ParseArgs("bridge", []string{"--config", "../configs/bridge.yaml"})
	require.NoError(t, err)
	assert.Equal(t, app.Default().DeviceListen, cfg.DeviceListen)
}

// TestShutdownAnswersCallsInFlight: stopping the bridge while a board is
// still running a tool answers the caller with a clear shutting-down error
// and finishes the shutdown, instead of waiting for the board until the
// shutdown deadline and leaving the caller with an empty reply.
func TestShutdownAnswersCallsInFlight(t *testing.T) {
	noLeaks(t)
	cfg := testConfig()
	cfg.Devices.CallTimeout = 10 * time.Minute
	a, err := app.New(cfg, nil)
	require.NoError(t, err)
	require.NoError(t, a.Start(context.Background()))
	base := "http://" + a.ControlAddr().String()

	profile, err := simulator.LoadProfile("breadboard")
	require.NoError(t, err)
	c := simulator.Config{MAC: "aa:00:00:00:00:21", Profile: profile,
		ToolDelay: map[string]time.Duration{"self.lamp.turn_on": 10 * time.Minute}}
	board, err := simulator.NewBoard(c)
	require.NoError(t, err)
	defer board.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, board.ConnectWebSocket(ctx, a.DeviceURL()))
	waitReady(t, base, 1)

	before := board.Stats().TextReceived
	type reply struct {
		status int
		body   api.ErrorBody
	}
	replies := make(chan reply, 1)
	go func() {
		var r reply
		r.status = postJSON(t, base+"/api/devices/aa:00:00:00:00:21/call", `{"name":"self.lamp.turn_on"}`, &r.body)
		replies <- r
	}()
	require.Eventually(t, func() bool { return board.Stats().TextReceived > before }, 10*time.Second, 5*time.Millisecond,
		"the call reached the board")

	// A deadline far beyond what a shutdown needs, far below the tool's.
	sctx, scancel := context.WithTimeout(context.Background(), time.Minute)
	defer scancel()
	require.NoError(t, a.Shutdown(sctx))
	r := <-replies
	assert.Equal(t, http.StatusServiceUnavailable, r.status)
	assert.Equal(t, "shutting_down", r.body.Error.Code)
	assert.Contains(t, r.body.Error.Message, "bridge shutting down")
}

// TestPortTakenNamesTheFlag: a listener whose port is taken says so, and
// names the flag and the config key that move it.
func TestPortTakenNamesTheFlag(t *testing.T) {
	noLeaks(t)
	held, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer held.Close()
	taken := held.Addr().String()
	for _, tc := range []struct {
		mutate func(*app.Config)
		want   string
	}{
		{func(c *app.Config) { c.DeviceListen = taken }, "device listener: " + taken + " is already in use (by another bridge or program); choose another address with --device-listen (device_listen in the config file)"},
		{func(c *app.Config) { c.ControlListen = taken }, "control listener: " + taken + " is already in use (by another bridge or program); choose another address with --control-listen (control_listen in the config file)"},
	} {
		cfg := testConfig()
		tc.mutate(&cfg)
		a, err := app.New(cfg, zap.NewNop())
		require.NoError(t, err)
		err = a.Start(context.Background())
		require.Error(t, err)
		assert.Equal(t, tc.want, err.Error())
	}
}
