package app

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/mcpserver"
)

// TestLimitsConfig: the HTTP listener bounds and the MCP session bounds
// have defaults the shipped file spells out, are set by file and flags, and
// a bad value stops the start with the key and what is allowed.
func TestLimitsConfig(t *testing.T) {
	def := Default()
	assert.Equal(t, HTTPConfig{ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second,
		IdleTimeout: time.Minute, DeviceMaxConnections: 20480, ControlMaxConnections: 1024, MaxHeaderBytes: 64 << 10}, def.HTTP)
	assert.Equal(t, mcpserver.DefaultMaxSessions, def.MCP.MaxSessions)
	assert.Equal(t, mcpserver.DefaultMaxSessionsPerClient, def.MCP.MaxSessionsPerClient)
	assert.Equal(t, 10*time.Minute, def.MCP.SessionTimeout)

	shipped, err := ParseArgs("bridge", []string{"--config", "../configs/bridge.yaml"})
	require.NoError(t, err)
	assert.Equal(t, def.HTTP, shipped.HTTP, "the shipped file spells out the defaults")
	assert.Equal(t, def.MCP.MaxSessions, shipped.MCP.MaxSessions)
	assert.Equal(t, def.MCP.MaxSessionsPerClient, shipped.MCP.MaxSessionsPerClient)
	assert.Equal(t, def.MCP.SessionTimeout, shipped.MCP.SessionTimeout)

	path := filepath.Join(t.TempDir(), "bridge.yaml")
	require.NoError(t, os.WriteFile(path, []byte("http:\n  idle_timeout: 5s\n  control_max_connections: 64\nmcp:\n  max_sessions: 50\n"), 0o600))
	cfg, err := ParseArgs("bridge", []string{"--config", path, "--http-read-timeout", "7s", "--device-max-connections", "30000",
		"--mcp-max-sessions-per-client", "8", "--mcp-session-timeout", "2m"})
	require.NoError(t, err)
	assert.Equal(t, HTTPConfig{ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 7 * time.Second, WriteTimeout: 30 * time.Second,
		IdleTimeout: 5 * time.Second, DeviceMaxConnections: 30000, ControlMaxConnections: 64, MaxHeaderBytes: 64 << 10}, cfg.HTTP)
	assert.Equal(t, 50, cfg.MCP.MaxSessions)
	assert.Equal(t, 8, cfg.MCP.MaxSessionsPerClient)
	assert.Equal(t, 2*time.Minute, cfg.MCP.SessionTimeout)

	for _, bad := range []struct{ file, want string }{
		{"http:\n  read_timeout: -1s\n", "http.read_timeout -1s: use a duration from 10ms to 1h; default 30s"},
		{"http:\n  idle_timeout: 0s\n", "http.idle_timeout 0s: use a duration from 10ms to 24h; default 1m"},
		{"http:\n  write_timeout: 2h\n", "http.write_timeout 2h: use a duration from 10ms to 1h; default 30s"},
		{"http:\n  control_max_connections: 0\n", "http.control_max_connections 0: use a whole number from 1 to 1048576; default 1024"},
		{"http:\n  device_max_connections: -1\n", "http.device_max_connections -1: use a whole number from 1 to 16777216; default 20480"},
		{"http:\n  device_max_connections: 100\n", "http.device_max_connections 100 is below websocket.max_connections 16384"},
		{"mcp:\n  max_sessions: -3\n", "mcp.max_sessions -3: use a whole number from 1 to 1048576; default 1024"},
		{"mcp:\n  max_sessions_per_client: -1\n", "mcp.max_sessions_per_client -1"},
	} {
		require.NoError(t, os.WriteFile(path, []byte(bad.file), 0o600))
		_, err := ParseArgs("bridge", []string{"--config", path})
		require.ErrorContains(t, err, bad.want, bad.file)
	}
	require.NoError(t, os.WriteFile(path, []byte("http:\n  device_max_connections: 100\nwebsocket:\n  max_connections: 50\n"), 0o600))
	_, err = ParseArgs("bridge", []string{"--config", path})
	require.NoError(t, err, "a smaller fleet lowers both")
}
