package app_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
)

// TestConfigFileFoundAfterOtherFlags: --config is read wherever it stands
// among the flags, and flags override the file whatever their order.
func TestConfigFileFoundAfterOtherFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bridge.yaml")
	require.NoError(t, os.WriteFile(path, []byte("device_listen: 127.0.0.1:7001\ncontrol_listen: 127.0.0.1:7002\n"), 0o600))
	cfg, err := app.ParseArgs("bridge", []string{"--device-listen", "127.0.0.1:7100", "--mcp=false", "--config", path})
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:7100", cfg.DeviceListen, "the flag wins over the file")
	assert.Equal(t, "127.0.0.1:7002", cfg.ControlListen, "the file wins over the default")
	_, err = app.ParseArgs("bridge", []string{"--version"})
	require.ErrorIs(t, err, app.ErrVersion)
}

// TestFlowConfig: the flow: section has working defaults, the secret comes
// from the flag or a file, and mistakes are refused with a way out.
func TestFlowConfig(t *testing.T) {
	cfg, err := app.ParseArgs("bridge", nil)
	require.NoError(t, err)
	assert.True(t, cfg.Flow.Enabled)
	assert.Contains(t, cfg.Flow.Confirm, "self.reboot")

	secret := "0123456789abcdef0123456789abcdef"
	cfg, err = app.ParseArgs("bridge", []string{"--flow-secret", secret})
	require.NoError(t, err)
	assert.Equal(t, secret, cfg.Flow.Secret)

	_, err = app.ParseArgs("bridge", []string{"--flow-secret", "short"})
	require.ErrorContains(t, err, "flow.secret must be at least 32 bytes")

	dir := t.TempDir()
	path := filepath.Join(dir, "bridge.yaml")
	require.NoError(t, os.WriteFile(path, []byte("flow:\n  confirm: [\"self.[\"]\n"), 0o600))
	_, err = app.ParseArgs("bridge", []string{"--config", path})
	require.ErrorContains(t, err, "flow.confirm")

	secretFile := filepath.Join(dir, "secret")
	require.NoError(t, os.WriteFile(secretFile, []byte(secret+"\n"), 0o600))
	require.NoError(t, os.WriteFile(path, []byte("flow:\n  secret_file: "+secretFile+"\n  timeout: 2m\n"), 0o600))
	cfg, err = app.ParseArgs("bridge", []string{"--config", path})
	require.NoError(t, err)
	assert.Equal(t, "2m0s", cfg.Flow.Timeout.String())

	// Off: nothing checked.
	_, err = app.ParseArgs("bridge", []string{"--flow=false", "--flow-secret", "short"})
	require.NoError(t, err)
}

// TestEventsReplayConfig: control.events_replay defaults to 1024, is read
// from the file (0 keeps none), and a negative value is refused.
func TestEventsReplayConfig(t *testing.T) {
	cfg, err := app.ParseArgs("bridge", nil)
	require.NoError(t, err)
	assert.Equal(t, 1024, cfg.Control.EventsReplay)

	path := filepath.Join(t.TempDir(), "bridge.yaml")
	require.NoError(t, os.WriteFile(path, []byte("control:\n  events_replay: 0\n"), 0o600))
	cfg, err = app.ParseArgs("bridge", []string{"--config", path})
	require.NoError(t, err)
	assert.Equal(t, 0, cfg.Control.EventsReplay)

	require.NoError(t, os.WriteFile(path, []byte("control:\n  events_replay: -1\n"), 0o600))
	_, err = app.ParseArgs("bridge", []string{"--config", path})
	require.ErrorContains(t, err, "control.events_replay -1: use a whole number from 0 to 1048576")
}

// TestSimulateProfileCheckedUpFront: an unknown --simulate-profile fails
// the configuration, before anything starts; without --simulate it is
// not read.
func TestSimulateProfileCheckedUpFront(t *testing.T) {
	_, err := app.ParseArgs("bridge", []string{"--simulate", "2", "--simulate-profile", "nosuch"})
	require.ErrorContains(t, err, `simulate.profile (--simulate-profile): unknown profile "nosuch"`)
	_, err = app.ParseArgs("bridge", []string{"--simulate", "2", "--simulate-profile", filepath.Join(t.TempDir(), "none.yaml")})
	require.ErrorContains(t, err, "simulate.profile (--simulate-profile): read profile")
	_, err = app.ParseArgs("bridge", []string{"--simulate-profile", "nosuch"})
	require.NoError(t, err)
	_, err = app.ParseArgs("bridge", []string{"--simulate", "1", "--simulate-profile", "robot"})
	require.NoError(t, err)
}
