package app

// This file picks where the bridge keeps its state (OTA approvals and the
// credential secret) when the user does not say: the user's state
// directory, so that a restart changes no board's credentials and forgets
// no approval. --data-dir '' keeps the state in memory.

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
)

// DefaultDataDir is where the bridge keeps its state unless --data-dir
// (ota.data_dir) says otherwise: $XDG_STATE_HOME/devicebridge, else
// ~/.local/state/devicebridge (%LocalAppData%\devicebridge on Windows).
// A node of a fleet (nodeID set) gets a directory of its own below it, so
// that several nodes on one machine never share one state file.
func DefaultDataDir(nodeID string) (string, error) {
	base := os.Getenv("XDG_STATE_HOME")
	if !filepath.IsAbs(base) {
		base = ""
	}
	if base == "" && runtime.GOOS == "windows" {
		base = os.Getenv("LocalAppData")
	}
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		if home == "" {
			return "", errors.New("no home directory")
		}
		base = filepath.Join(home, ".local", "state")
	}
	dir := filepath.Join(base, "devicebridge")
	if nodeID != "" {
		dir = filepath.Join(dir, nodeID)
	}
	return dir, nil
}
