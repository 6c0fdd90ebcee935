//go:build unix

package ota

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// LockFile is the file in the data directory that one bridge holds locked
// (flock) while it uses the directory.
const LockFile = ".lock"

// lockDir takes the data directory for this process. Two bridges on one
// directory would each rewrite the other's approvals from memory, so the
// second is refused with a way out. The lock is the kernel's: it goes
// with the process, whatever way it ends.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, LockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("ota data dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("data directory %s is in use by another bridge; give this one its own --data-dir (data_dir), or a --node-id, which keeps its state in a folder of its own", dir)
		}
		return nil, fmt.Errorf("ota data dir: lock %s: %w", f.Name(), err)
	}
	return f, nil
}
