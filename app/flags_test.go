package app_test

import (
	"flag"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
)

// TestFlagErrorsSayWhatIsExpected: a bad flag is one line naming the flag
// and what it wants, not the flag package's "parse error" followed by the
// whole usage.
func TestFlagErrorsSayWhatIsExpected(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--call-timeout", "5"}, `--call-timeout: "5" is not a duration; use a duration like 5s, 500ms or 2m`},
		{[]string{"--simulate", "abc"}, `--simulate: "abc" is not a whole number; use a whole number like 3`},
		{[]string{"--ota-burst", "x"}, `--ota-burst: "x" is not a whole number; use a whole number like 500`},
		{[]string{"--simulate", "99999999999999999999"}, `--simulate: "99999999999999999999" is out of range; use a whole number like 3`},
		{[]string{"--mcp-rate-limit", "abc"}, `--mcp-rate-limit: "abc" is not a number; use a number like 50`},
		{[]string{"--ota=maybe"}, `--ota: "maybe" is not true or false; write --ota, --ota=true or --ota=false`},
		{[]string{"--mqtt-user", "x"}, `--mqtt-user: "x": want USER:PASSWORD`},
		{[]string{"--call-timeout"}, `--call-timeout needs a value: --call-timeout 5s`},
		{[]string{"--bogus"}, `unknown flag --bogus ('bridge --help' lists every flag)`},
		{[]string{"--simulat", "3"}, `unknown flag --simulat; did you mean --simulate? ('bridge --help' lists every flag)`},
		{[]string{"-contrl-listen", ":1"}, `unknown flag --contrl-listen; did you mean --control-listen? ('bridge --help' lists every flag)`},
	} {
		_, err := app.ParseArgs("bridge", tc.args)
		require.Error(t, err, tc.args)
		assert.Equal(t, tc.want, err.Error(), tc.args)
		assert.NotContains(t, err.Error(), "\n", "one line")
	}
}

// TestFlagsStillWorkAfterChecking: the checking wrapper changes nothing
// for good values, boolean flags without a value included, and --help
// still ends the parse.
func TestFlagsStillWorkAfterChecking(t *testing.T) {
	cfg, err := app.ParseArgs("bridge", []string{"--call-timeout", "5s", "--simulate", "2", "--ota=false", "--mcp-compact",
		"--mcp-rate-limit", "2.5", "--device-token", "a", "--device-token", "b"})
	require.NoError(t, err)
	assert.Equal(t, "5s", cfg.Devices.CallTimeout.String())
	assert.Equal(t, 2, cfg.Simulate.Count)
	assert.False(t, cfg.OTA.Enabled)
	assert.True(t, cfg.MCP.Compact)
	assert.Equal(t, 2.5, cfg.MCP.RateLimit)
	assert.Equal(t, []string{"a", "b"}, cfg.WebSocket.Tokens)

	_, err = app.ParseArgs("bridge", []string{"--help"})
	require.ErrorIs(t, err, flag.ErrHelp)
	assert.False(t, strings.Contains(err.Error(), "\n"))
}
