package ota

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openTestStore opens a store over dir that is closed (and so written) at
// the end of the test.
func openTestStore(t *testing.T, dir string, lim Limits, now time.Time) *Store {
	t.Helper()
	s, _, err := OpenStore(dir, lim, now)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

// writesOf counts the times s has written its file.
func writesOf(s *Store) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writes
}

// setInterval changes how long s lets a change wait before writing it;
// an hour keeps coalesced changes off the disk for the whole test.
func setInterval(s *Store, d time.Duration) {
	s.mu.Lock()
	s.interval = d
	s.mu.Unlock()
}

// onDisk reads the records in dir's file, as a bridge restarting after a
// crash would find them.
func onDisk(t *testing.T, dir string) map[string]Record {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, DevicesFile))
	if errors.Is(err, os.ErrNotExist) {
		return map[string]Record{}
	}
	require.NoError(t, err)
	var f storeFile
	require.NoError(t, json.Unmarshal(data, &f))
	out := map[string]Record{}
	for _, r := range f.Devices {
		out[r.DeviceID] = r
	}
	return out
}

func mac(i int) string { return fmt.Sprintf("02:00:00:00:%02x:%02x", i>>8, i&0xff) }

func TestStoreWritesOnlyRealChanges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		s := openTestStore(t, dir, Limits{}, time.Unix(100, 0))
		req := Request{DeviceID: "aa:bb:cc:dd:ee:ff", Board: "b", Firmware: "2.4.2"}
		_, err := s.Seen(req, time.Unix(100, 0), SeenPolicy{})
		require.NoError(t, err)
		time.Sleep(writeInterval)
		synctest.Wait()
		require.Equal(t, 1, writesOf(s), "a new board is written within the interval")
		path := filepath.Join(dir, DevicesFile)
		before, err := os.ReadFile(path)
		require.NoError(t, err)
		// Another boot with nothing new: LastSeen moves in memory, the
		// file stays as it was (a fleet rebooting together must not keep
		// the writer busy).
		_, err = s.Seen(req, time.Unix(200, 0), SeenPolicy{})
		require.NoError(t, err)
		time.Sleep(3 * writeInterval)
		synctest.Wait()
		assert.Equal(t, 1, writesOf(s))
		after, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.Equal(t, before, after)
		r, _ := s.Get(req.DeviceID)
		assert.Equal(t, time.Unix(200, 0), r.LastSeen)
		// No temp files left behind: the state file and the lock only.
		entries, _ := os.ReadDir(dir)
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		assert.ElementsMatch(t, []string{DevicesFile, LockFile}, names)
	})
}

// TestDataDirLocked: a second store on the same directory is refused, with
// a way out, until the first closes.
func TestDataDirLocked(t *testing.T) {
	dir := t.TempDir()
	first, _, err := OpenStore(dir, Limits{}, time.Now())
	require.NoError(t, err)
	_, _, err = OpenStore(dir, Limits{}, time.Now())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "in use by another bridge")
	assert.Contains(t, err.Error(), "--data-dir")
	require.NoError(t, first.Close())
	second, _, err := OpenStore(dir, Limits{}, time.Now())
	require.NoError(t, err, "free again once the first closed")
	require.NoError(t, second.Close())
}

// TestStoreCoalescesWrites: a thousand new boards over ten seconds cost
// about ten writes of the file, one per writeInterval, not a thousand.
// Each write holds the whole store, so writing once per board made a
// fleet's first boot write O(n²) bytes, under the store's lock, and let
// anyone inventing MACs keep the disk busy.
func TestStoreCoalescesWrites(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		s := openTestStore(t, dir, Limits{}, time.Unix(100, 0))
		const boards = 1000
		for i := range boards {
			_, err := s.Seen(Request{DeviceID: mac(i), Firmware: "2.4.2"}, time.Now(), SeenPolicy{})
			require.NoError(t, err)
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(writeInterval)
		synctest.Wait()
		assert.InDelta(t, 10, writesOf(s), 1, "one write per second of boots")
		assert.Len(t, onDisk(t, dir), boards)
	})
}

// TestStoreDurableChanges: an approval, a Client-Id binding that comes
// with credentials, and a reset are on disk when the call that made them
// returns, even while coalesced changes wait (here for an hour). A crash
// at that moment loses only what is not security: a pending board (it
// asks again and gets a new code), the transport handed out, a firmware
// string. Close writes those too.
func TestStoreDurableChanges(t *testing.T) {
	dir := t.TempDir()
	now := time.Unix(1000, 0)
	s := openTestStore(t, dir, Limits{}, now)
	setInterval(s, time.Hour)
	approval := SeenPolicy{Approval: true, Bind: true}

	pending, err := s.Seen(Request{DeviceID: mac(1), ClientID: "uuid-1"}, now, approval)
	require.NoError(t, err)
	require.True(t, pending.Pending())
	assert.Empty(t, onDisk(t, dir), "a pending board is not security: it waits for the next write")

	_, err = s.Approve(pending.Code, now)
	require.NoError(t, err)
	disk := onDisk(t, dir)
	assert.True(t, disk[mac(1)].Approved, "on disk when Approve returns")
	assert.Equal(t, "uuid-1", disk[mac(1)].ClientID, "with the Client-Id it is bound to")

	// Where credentials are required without approval, the board gets
	// them in the answer to this call: its binding is on disk first.
	_, err = s.Seen(Request{DeviceID: mac(2), ClientID: "uuid-2"}, now, SeenPolicy{Bind: true})
	require.NoError(t, err)
	assert.Equal(t, "uuid-2", onDisk(t, dir)[mac(2)].ClientID)
	assert.Equal(t, 2, writesOf(s))

	// Coalesced changes wait.
	s.SetTransport(mac(2), TransportMQTT)
	_, err = s.Seen(Request{DeviceID: mac(2), ClientID: "uuid-2", Firmware: "2.4.3"}, now, SeenPolicy{Bind: true})
	require.NoError(t, err)
	_, err = s.Seen(Request{DeviceID: mac(3), ClientID: "uuid-3"}, now, approval)
	require.NoError(t, err)
	_, err = s.Seen(Request{DeviceID: mac(2), ClientID: "uuid-other"}, now, SeenPolicy{Bind: true})
	require.ErrorIs(t, err, ErrClientIDConflict)
	disk = onDisk(t, dir)
	assert.Empty(t, disk[mac(2)].Transport)
	assert.Empty(t, disk[mac(2)].Firmware)
	assert.Zero(t, disk[mac(2)].Rejections)
	assert.NotContains(t, disk, mac(3))
	assert.Equal(t, 2, writesOf(s), "none of these wrote the file")

	// A reset is durable, and carries what waited with it.
	_, err = s.Reset(mac(2), "")
	require.NoError(t, err)
	disk = onDisk(t, dir)
	assert.Empty(t, disk[mac(2)].ClientID)
	assert.Equal(t, TransportMQTT, disk[mac(2)].Transport)
	assert.Contains(t, disk, mac(3))

	// Close writes what is left: the last-seen times and refusals that
	// never make a write of their own.
	later := now.Add(time.Minute)
	_, err = s.Seen(Request{DeviceID: mac(4), ClientID: "uuid-4"}, later, approval)
	require.NoError(t, err)
	s.Reject(mac(1), "uuid-impostor", later)
	require.NoError(t, s.Close())
	disk = onDisk(t, dir)
	assert.Contains(t, disk, mac(4))
	assert.Equal(t, "uuid-impostor", disk[mac(1)].RejectedClientID)
	assert.Equal(t, 4, writesOf(s))

	// After Close, a durable change cannot be written and says so.
	_, err = s.Seen(Request{DeviceID: mac(5), ClientID: "uuid-5"}, later, SeenPolicy{Bind: true})
	assert.ErrorIs(t, err, ErrStoreClosed)
}

// TestStoreFailedWrite: when the file cannot be written, an approval
// fails instead of being reported as stored; it holds in memory, a second
// approval waits for a new write, and once the disk works again it lands.
func TestStoreFailedWrite(t *testing.T) {
	dir := t.TempDir()
	now := time.Unix(1000, 0)
	s := openTestStore(t, dir, Limits{}, now)
	setInterval(s, time.Hour)
	_, err := s.Seen(Request{DeviceID: mac(1), ClientID: "uuid-1"}, now, SeenPolicy{Approval: true, Bind: true})
	require.NoError(t, err)

	// A directory where the file goes makes every rename fail (even for
	// root, which file modes would not stop).
	path := filepath.Join(dir, DevicesFile)
	require.NoError(t, os.MkdirAll(filepath.Join(path, "blocker"), 0o700))
	_, err = s.Approve(mac(1), now)
	require.Error(t, err)
	r, _ := s.Get(mac(1))
	assert.True(t, r.Approved, "kept in memory")
	_, err = s.Approve(mac(1), now)
	require.Error(t, err, "approving again waits for a new write")
	// A board asking for credentials bound to a binding not on disk is
	// refused too.
	_, err = s.Seen(Request{DeviceID: mac(1), ClientID: "uuid-1"}, now, SeenPolicy{Approval: true, Bind: true})
	require.Error(t, err)

	require.NoError(t, os.RemoveAll(path))
	_, err = s.Approve(mac(1), now)
	require.NoError(t, err)
	assert.True(t, onDisk(t, dir)[mac(1)].Approved)
}

func TestStoreRefusesCorruptFile(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, DevicesFile), []byte("{not json"), 0o600))
	_, _, err := OpenStore(dir, Limits{}, time.Now())
	assert.ErrorContains(t, err, "fix or remove the file")
}
