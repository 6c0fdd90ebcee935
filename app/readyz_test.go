package app

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/api"
)

// getReady fetches /readyz.
func getReady(t *testing.T, a *App) (int, api.ReadyBody) {
	t.Helper()
	resp, err := http.Get("http://" + a.ControlAddr().String() + "/readyz")
	require.NoError(t, err)
	defer resp.Body.Close()
	var body api.ReadyBody
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	return resp.StatusCode, body
}

// holdDefaultMQTTPort makes sure the embedded broker's default port is
// taken for the test: it takes it, or finds it taken already (a system
// Mosquitto), as on the machines of finding 5 of issue 23.
func holdDefaultMQTTPort(t *testing.T) {
	ln, err := net.Listen("tcp", DefaultMQTTListen)
	switch {
	case err == nil:
		t.Cleanup(func() { _ = ln.Close() })
	case errors.Is(err, syscall.EADDRINUSE):
	default:
		t.Skipf("cannot hold %s: %v", DefaultMQTTListen, err)
	}
}

// TestReadyWhenDefaultMQTTPortTaken: with MQTT left at its defaults and
// 1883 taken, the bridge is ready (WebSocket boards are served), /readyz
// says why mqtt is degraded, and the warning says /readyz passes. Once
// MQTT is asked for (the flag or key set, even to the default address, or
// another address), the same start fails readiness.
func TestReadyWhenDefaultMQTTPortTaken(t *testing.T) {
	leakCheck(t)
	holdDefaultMQTTPort(t)
	a, logs := loggedApp(t, func(c *Config) {
		c.MQTT.Listen = DefaultMQTTListen
		c.MQTT.UDP.Listen = "127.0.0.1:0"
	})
	require.Nil(t, a.MQTTGateway())
	code, body := getReady(t, a)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "ready", body.Status)
	assert.Empty(t, body.Failing)
	assert.Equal(t, []string{"mqtt"}, body.Degraded)
	require.Len(t, body.Checks, 2)
	assert.True(t, body.Checks[1].OK)
	assert.Contains(t, body.Checks[1].Degraded, "MQTT is off: the embedded broker's default port (:1883) was taken at start, and MQTT was not asked for")
	warn := logs.FilterMessageSnippet("MQTT port 1883 is already in use").All()
	require.Len(t, warn, 1)
	assert.Contains(t, warn[0].Message, "/readyz still passes, with mqtt reported as degraded")

	asked, logs := loggedApp(t, func(c *Config) {
		c.MQTT.Listen = DefaultMQTTListen
		c.MQTT.UDP.Listen = "127.0.0.1:0"
		c.mqttAsked = true // --mqtt-listen :1883
	})
	code, body = getReady(t, asked)
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Equal(t, []string{"mqtt"}, body.Failing)
	assert.Contains(t, body.Checks[1].Error, "the embedded broker's port (:1883) was taken at start")
	warn = logs.FilterMessageSnippet("MQTT port 1883 is already in use").All()
	require.Len(t, warn, 1)
	assert.Contains(t, warn[0].Message, "/readyz fails (mqtt) until the bridge runs with MQTT")
}

// TestReadyFailsWhenChosenMQTTPortTaken: an embedded broker moved to
// another address is asked for: its port taken fails readiness.
func TestReadyFailsWhenChosenMQTTPortTaken(t *testing.T) {
	leakCheck(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	a, _ := loggedApp(t, func(c *Config) {
		c.MQTT.Listen = taken.Addr().String()
		c.MQTT.UDP.Listen = "127.0.0.1:0"
	})
	code, body := getReady(t, a)
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Equal(t, []string{"mqtt"}, body.Failing)
	assert.Empty(t, body.Degraded)
}

// TestMQTTAskedForByFlagOrKey: ParseArgs tells MQTT set by the user, even
// to the default address, from MQTT left at its default.
func TestMQTTAskedForByFlagOrKey(t *testing.T) {
	cfg, err := ParseArgs("bridge", nil)
	require.NoError(t, err)
	assert.False(t, cfg.mqttRequested(), "the defaults")
	cfg, err = ParseArgs("bridge", []string{"--mqtt-listen", DefaultMQTTListen})
	require.NoError(t, err)
	assert.True(t, cfg.mqttRequested(), "the flag, at the default address")
	path := t.TempDir() + "/bridge.yaml"
	require.NoError(t, writeFile(path, "mqtt:\n  listen: \":1883\"\n"))
	cfg, err = ParseArgs("bridge", []string{"--config", path})
	require.NoError(t, err)
	assert.True(t, cfg.mqttRequested(), "the key, at the default address")
	require.NoError(t, writeFile(path, "log:\n  level: info\n"))
	cfg, err = ParseArgs("bridge", []string{"--config", path})
	require.NoError(t, err)
	assert.False(t, cfg.mqttRequested(), "a file that leaves MQTT alone")
}

func writeFile(path, content string) error { return os.WriteFile(path, []byte(content), 0o600) }
