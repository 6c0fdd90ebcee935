package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mainArgsEnv carries the arguments of a bridge run as this test binary
// (TestMain runs main with them).
const mainArgsEnv = "DEVICEBRIDGE_TEST_MAIN_ARGS"

func TestMain(m *testing.M) {
	if raw := os.Getenv(mainArgsEnv); raw != "" {
		var args []string
		if err := json.Unmarshal([]byte(raw), &args); err != nil {
			panic(err)
		}
		os.Args = append([]string{"bridge"}, args...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// bridgeRun is what one run of the bridge command printed and returned.
type bridgeRun struct {
	stdout, stderr string
	code           int
}

// runBridge runs the bridge command with args until it exits (it must,
// within a minute), its stderr a pipe as under a service manager.
func runBridge(t *testing.T, args ...string) bridgeRun {
	t.Helper()
	raw, err := json.Marshal(args)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	// No state of the tests in the user's state directory, whatever args say.
	cmd.Env = append(os.Environ(), mainArgsEnv+"="+string(raw), "XDG_STATE_HOME="+t.TempDir())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	run := bridgeRun{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		run.code = exit.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return run
}

// TestBadFlagIsOneLine: a flag error is one line saying what was expected,
// exit status 2, without the usage text; --help prints the usage.
func TestBadFlagIsOneLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--call-timeout", "5"}, `bridge: --call-timeout: "5" is not a duration; use a duration like 5s, 500ms or 2m`},
		{[]string{"--bogus"}, `bridge: unknown flag --bogus ('bridge --help' lists every flag)`},
	} {
		run := runBridge(t, tc.args...)
		assert.Equal(t, 2, run.code, tc.args)
		assert.Equal(t, tc.want+"\n", run.stderr, tc.args)
		assert.Empty(t, run.stdout)
	}
	run := runBridge(t, "--help")
	assert.Equal(t, 0, run.code)
	assert.True(t, strings.HasPrefix(run.stderr, "Usage of bridge:\n"), run.stderr)
	assert.Contains(t, run.stderr, "-call-timeout duration")
}

// TestUnknownSimulateProfileStopsBeforeListening: a bad --simulate-profile
// is a configuration error like any other: status 2, and nothing listened.
func TestUnknownSimulateProfileStopsBeforeListening(t *testing.T) {
	run := runBridge(t, "--simulate", "1", "--simulate-profile", "nosuch",
		"--device-listen", "127.0.0.1:0", "--control-listen", "127.0.0.1:0", "--mqtt-listen", "")
	assert.Equal(t, 2, run.code)
	assert.Contains(t, run.stderr, `bridge: simulate.profile (--simulate-profile): unknown profile "nosuch" (embedded profiles: breadboard, catalog, conformance, conformance-tasks, robot`)
	assert.NotContains(t, run.stderr, "listening")
}
