// Package configs holds the project's documented configuration files and the
// board profiles used by the simulator.
//
// The files are embedded so that the simulator binary and tests work from any
// directory without a copy of the repository next to them. Profiles live in
// configs/profiles/<name>.yaml; their format is described by package
// simulator (see simulator.LoadProfile).
package configs

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
)

//go:embed profiles/*.yaml
var profileFS embed.FS

// profileDir is the directory inside profileFS that holds the profiles.
const profileDir = "profiles"

// Profile returns the raw YAML of the embedded board profile called name
// (the file name without ".yaml"). An unknown name yields an error that wraps
// fs.ErrNotExist, so callers can fall back to reading a file from disk.
func Profile(name string) ([]byte, error) {
	// Names are bare identifiers; refusing separators and dots keeps a name
	// from reaching outside the profile directory or naming a non-YAML file.
	if name == "" || strings.ContainsAny(name, `/\.`) {
		return nil, fmt.Errorf("configs: profile %q: %w", name, fs.ErrNotExist)
	}
	data, err := profileFS.ReadFile(path.Join(profileDir, name+".yaml"))
	if err != nil {
		return nil, fmt.Errorf("configs: profile %q: %w", name, fs.ErrNotExist)
	}
	return data, nil
}

// ProfileNames lists the embedded profiles, sorted, without the ".yaml"
// suffix.
func ProfileNames() []string {
	entries, err := profileFS.ReadDir(profileDir)
	if err != nil {
		// The directory is part of the binary; failing to list it means the
		// embed pattern itself is broken, which tests catch.
		return nil
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if n, ok := strings.CutSuffix(e.Name(), ".yaml"); ok && !e.IsDir() {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}
