package app

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestToolTimeoutFlagAndTaskTools: --tool-timeout sets a per-tool timeout
// up to 5 minutes (beyond is refused with the range), and a tool given
// longer than devices.call_timeout runs as a task, with those
// mcp.tasks.tools and --mcp-task-tool name.
func TestToolTimeoutFlagAndTaskTools(t *testing.T) {
	cfg, err := ParseArgs("bridge", []string{"--tool-timeout", "self.upgrade_firmware=300s", "--tool-timeout", "self.fw.flash=4m",
		"--mcp-task-tool", "*photo*"})
	require.NoError(t, err)
	assert.Equal(t, 300*time.Second, cfg.Devices.ToolTimeouts["self.upgrade_firmware"])
	assert.Equal(t, 4*time.Minute, cfg.Devices.ToolTimeouts["self.fw.flash"])
	assert.Equal(t, time.Minute, cfg.Devices.ToolTimeouts["self.camera.take_photo"], "the defaults stay")
	assert.Equal(t, []string{"*photo*", "self.camera.take_photo", "self.fw.flash", "self.screen.snapshot", "self.upgrade_firmware"},
		taskTools(cfg))
	assert.Equal(t, 30*time.Second, cfg.Devices.CallTimeout, "the default call timeout is unchanged")

	_, err = ParseArgs("bridge", []string{"--tool-timeout", "self.upgrade_firmware=301s"})
	require.ErrorContains(t, err, "devices.tool_timeouts.self.upgrade_firmware 5m1s: use a duration from 100ms to 5m")
	_, err = ParseArgs("bridge", []string{"--tool-timeout", "self.upgrade_firmware"})
	require.ErrorContains(t, err, "want TOOL=DURATION")

	// The same from a file; a tool no longer than call_timeout is not a
	// task tool.
	path := filepath.Join(t.TempDir(), "bridge.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`devices:
  call_timeout: 45s
  tool_timeouts: {self.upgrade_firmware: 5m, self.camera.take_photo: 40s}
mcp:
  tasks: {tools: [self.slow.*], ttl: 2m, max_per_caller: 4}
`), 0o600))
	cfg, err = ParseArgs("bridge", []string{"--config", path})
	require.NoError(t, err)
	assert.Equal(t, []string{"self.screen.snapshot", "self.slow.*", "self.upgrade_firmware"}, taskTools(cfg))
	assert.Equal(t, 2*time.Minute, cfg.MCP.Tasks.TTL)
	assert.Equal(t, 4, cfg.MCP.Tasks.MaxPerCaller)
	assert.Equal(t, 256, cfg.MCP.Tasks.MaxTasks, "defaults fill what the file leaves out")

	require.NoError(t, os.WriteFile(path, []byte("mcp: {tasks: {tools: ['[']}}\n"), 0o600))
	_, err = ParseArgs("bridge", []string{"--config", path})
	require.ErrorContains(t, err, `mcp.tasks.tools: "[" is not a valid pattern`)
}
