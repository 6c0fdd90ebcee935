package ota

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStoreWritesOnlyRealChanges(t *testing.T) {
	dir := t.TempDir()
	s, _, err := OpenStore(dir, Limits{}, time.Unix(100, 0))
	require.NoError(t, err)
	req := Request{DeviceID: "aa:bb:cc:dd:ee:ff", Board: "b", Firmware: "2.4.2"}
	_, err = s.Seen(req, time.Unix(100, 0), SeenPolicy{})
	require.NoError(t, err)
	path := filepath.Join(dir, DevicesFile)
	before, err := os.ReadFile(path)
	require.NoError(t, err)
	// Another boot with nothing new: LastSeen moves in memory, the file
	// stays as it was (a fleet rebooting together must not rewrite it
	// once per board).
	_, err = s.Seen(req, time.Unix(200, 0), SeenPolicy{})
	require.NoError(t, err)
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, before, after)
	r, _ := s.Get(req.DeviceID)
	assert.Equal(t, time.Unix(200, 0), r.LastSeen)
	// No temp files left behind.
	entries, _ := os.ReadDir(dir)
	assert.Len(t, entries, 1)
}

func TestStoreRefusesCorruptFile(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, DevicesFile), []byte("{not json"), 0o600))
	_, _, err := OpenStore(dir, Limits{}, time.Now())
	assert.ErrorContains(t, err, "fix or remove the file")
}
