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
