package app

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/devicebridge/devicebridge/ota"
)

// TestDataDirDefault: the command line keeps state in the user's state
// directory unless --data-dir or ota.data_dir says otherwise (empty for
// memory); a fleet node gets a directory of its own; Default(), which
// tests and embedders use, stays in memory.
func TestDataDirDefault(t *testing.T) {
	state := t.TempDir()
	t.Setenv("XDG_STATE_HOME", state)
	parse := func(args ...string) string {
		t.Helper()
		cfg, err := ParseArgs("bridge", args)
		require.NoError(t, err, args)
		return cfg.OTA.DataDir
	}
	assert.Equal(t, filepath.Join(state, "devicebridge"), parse())
	assert.Equal(t, "", parse("--data-dir", ""), "explicitly in memory")
	assert.Equal(t, "", parse("--data-dir="), "explicitly in memory")
	assert.Equal(t, "/srv/bridge", parse("--data-dir", "/srv/bridge"))
	assert.Equal(t, filepath.Join(state, "devicebridge", "a"), parse("--node-id", "a"), "a node of its own")
	assert.Equal(t, "", parse("--ota=false"), "no OTA, no state")

	path := filepath.Join(t.TempDir(), "bridge.yaml")
	require.NoError(t, os.WriteFile(path, []byte("ota:\n  data_dir: \"\"\n"), 0o600))
	assert.Equal(t, "", parse("--config", path), "the key, explicitly empty")
	require.NoError(t, os.WriteFile(path, []byte("ota:\n  data_dir: /var/lib/devicebridge\n"), 0o600))
	assert.Equal(t, "/var/lib/devicebridge", parse("--config", path))
	assert.Equal(t, "", parse("--config", path, "--data-dir", ""), "the flag wins over the file")
	require.NoError(t, os.WriteFile(path, []byte("ota:\n  approval: true\n"), 0o600))
	assert.Equal(t, filepath.Join(state, "devicebridge"), parse("--config", path), "a file that leaves data_dir alone")

	home := t.TempDir()
	t.Setenv("XDG_STATE_HOME", "")
	t.Setenv("HOME", home)
	assert.Equal(t, filepath.Join(home, ".local", "state", "devicebridge"), parse())

	assert.Equal(t, "", Default().OTA.DataDir, "Default() writes nowhere")
}

// TestStateSurvivesRestartByDefault: a bridge started from the command
// line's defaults creates its state directory (0700), says where it is in
// one line, refuses a second bridge while it runs, and the next start
// finds the same credential secret there.
func TestStateSurvivesRestartByDefault(t *testing.T) {
	leakCheck(t)
	state := t.TempDir()
	t.Setenv("XDG_STATE_HOME", state)
	cfg, err := ParseArgs("bridge", []string{"--device-listen", "127.0.0.1:0", "--control-listen", "127.0.0.1:0", "--mqtt-listen", ""})
	require.NoError(t, err)
	dir := filepath.Join(state, "devicebridge")
	require.Equal(t, dir, cfg.OTA.DataDir)

	core, logs := observer.New(zapcore.InfoLevel)
	first, err := New(cfg, zap.New(core))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), mqttWait)
	defer cancel()
	require.NoError(t, first.Start(ctx))
	info, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), info.Mode().Perm())
	lines := logs.FilterField(zap.String("data_dir", dir)).All()
	require.Len(t, lines, 1)
	assert.Equal(t, "board approvals and the credential secret are kept in "+dir+" (--data-dir; '' keeps them in memory)", lines[0].Message)
	assert.Zero(t, logs.FilterMessageSnippet("no data_dir").Len(), "no in-memory warning")
	secret, err := os.ReadFile(filepath.Join(dir, ota.SecretFile))
	require.NoError(t, err)

	// A second bridge on the same directory while the first runs would
	// overwrite its approvals: refused, with the way out.
	_, err = New(cfg, zap.NewNop())
	require.ErrorContains(t, err, "in use by another bridge")
	require.NoError(t, first.Shutdown(ctx))

	again, err := New(cfg, zap.NewNop())
	require.NoError(t, err)
	require.NoError(t, again.OTA().Close())
	after, err := os.ReadFile(filepath.Join(dir, ota.SecretFile))
	require.NoError(t, err)
	assert.Equal(t, secret, after, "the same secret, so every issued credential still holds")
}
