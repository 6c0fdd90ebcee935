//go:build !unix

package ota

import "os"

// LockFile is the file a unix bridge holds locked in its data directory.
const LockFile = ".lock"

// lockDir does nothing where flock is missing: one bridge per data
// directory is then the operator's to keep.
func lockDir(string) (*os.File, error) { return nil, nil }
