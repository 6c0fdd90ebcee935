package app

import (
	"fmt"
	"os"
	"testing"
)

// TestMain points the user's state directory at a directory of its own,
// so that no test of this package, even one that forgets to set
// ota.data_dir after ParseArgs, writes into the real one.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "devicebridge-app-state-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	_ = os.Setenv("XDG_STATE_HOME", dir)
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}
