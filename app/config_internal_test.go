package app

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/device"
)

// TestMaxProbesConfig: devices.max_probes defaults to the Hub's default,
// the shipped file spells it out, a file sets it, it reaches the Hub
// config, and a negative value is refused with the way out.
func TestMaxProbesConfig(t *testing.T) {
	cfg, err := ParseArgs("bridge", nil)
	require.NoError(t, err)
	assert.Equal(t, device.DefaultMaxProbes, cfg.Devices.MaxProbes)
	assert.Equal(t, device.DefaultMaxProbes, cfg.hubConfig("test").MaxProbes)

	shipped, err := ParseArgs("bridge", []string{"--config", "../configs/bridge.yaml"})
	require.NoError(t, err)
	assert.Equal(t, Default().Devices.MaxProbes, shipped.Devices.MaxProbes, "the shipped file spells out the default")

	dir := t.TempDir()
	path := filepath.Join(dir, "bridge.yaml")
	require.NoError(t, os.WriteFile(path, []byte("devices:\n  max_probes: 64\n"), 0o600))
	cfg, err = ParseArgs("bridge", []string{"--config", path})
	require.NoError(t, err)
	assert.Equal(t, 64, cfg.hubConfig("test").MaxProbes)

	for _, v := range []string{"0", "-1"} {
		require.NoError(t, os.WriteFile(path, []byte("devices:\n  max_probes: "+v+"\n"), 0o600))
		_, err = ParseArgs("bridge", []string{"--config", path})
		require.ErrorContains(t, err, "devices.max_probes "+v+": use a whole number from 1 to 4096; default 16",
			"a value that would turn the bound off or fall back silently is refused")
	}
}
