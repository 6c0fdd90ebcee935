package audit

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWriteAndRotate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := Open(path, 600, 2)
	require.NoError(t, err)
	defer l.Close()
	args := []byte(`{"ssid": "home", "password": "hunter2"}`)
	d := l.Digest(args)
	require.Equal(t, d, l.Digest([]byte(`{"ssid":"home","password":"hunter2"}`)), "digests ignore formatting")
	require.NotContains(t, d, "hunter2")
	for range 20 {
		require.NoError(t, l.Write(Record{Kind: KindToolCall, Via: "mcp", Identity: "kitchen", Board: "aa:bb:cc:dd:00:01",
			Tool: "self.wifi.set", ArgsDigest: d, Outcome: "ok", DurationMS: 1.5}))
	}
	for _, p := range []string{path, path + ".1", path + ".2"} {
		st, err := os.Stat(p)
		require.NoError(t, err, p)
		require.LessOrEqual(t, st.Size(), int64(600), p)
		f, err := os.Open(p)
		require.NoError(t, err)
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var r Record
			require.NoError(t, json.Unmarshal(sc.Bytes(), &r), "every line is one JSON record")
			require.Equal(t, "kitchen", r.Identity)
			require.False(t, strings.Contains(sc.Text(), "hunter2"))
		}
		_ = f.Close()
	}
	_, err = os.Stat(path + ".3")
	require.True(t, os.IsNotExist(err), "only keep old files are kept")

	var nilLog *Log
	require.NoError(t, nilLog.Write(Record{}))
	require.Empty(t, nilLog.Digest(args))
}

// TestRotationFailureKeepsWriting: when the old file cannot be renamed
// (here path.1 is a directory), records go on into the current file.
func TestRotationFailureKeepsWriting(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	require.NoError(t, os.MkdirAll(filepath.Join(path+".1", "busy"), 0o700))
	l, err := Open(path, 200, 1)
	require.NoError(t, err)
	defer l.Close()
	failed := 0
	for range 10 {
		if l.Write(Record{Kind: KindToolCall, Via: "mcp", Identity: "kitchen", Tool: "self.reboot", Outcome: "ok"}) != nil {
			failed++
		}
	}
	require.Positive(t, failed, "the rotation failures are reported")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, 10, strings.Count(string(data), "\n"), "every record was written")
}
