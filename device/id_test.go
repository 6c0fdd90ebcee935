package device

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNormalizeID(t *testing.T) {
	assert.Equal(t, "aa:bb:cc:dd:ee:ff", NormalizeID("AA-BB-CC-DD-EE-FF"))
	assert.Equal(t, "aa:bb:cc:dd:ee:ff", NormalizeID("aabbccddeeff"))
	assert.Equal(t, "aa:bb:cc:dd:ee:ff", NormalizeID("aa_bb_cc_dd_ee_ff"))
	assert.Equal(t, "aa:bb:cc:dd:ee:ff", NormalizeID("aabb.ccdd.eeff"))
	assert.Equal(t, "not-a-mac", NormalizeID("not-a-mac"))
	h, ok := MACDigits("02:00:00:00:00:01")
	assert.True(t, ok)
	assert.Equal(t, "020000000001", h)
	_, ok = MACDigits("02:00:00:00:00:0g")
	assert.False(t, ok)
	h, ok = MACDigits("AA-bb_CC:dd:EEff")
	assert.True(t, ok)
	assert.Equal(t, "aabbccddeeff", h)
	for _, bad := range []string{"", "02:00:00:00:00", "02:00:00:00:00:01:02", "02:00:00:00:00:1", "02 00 00 00 00 01"} {
		_, ok = MACDigits(bad)
		assert.False(t, ok, bad)
		_, ok = CanonicalMAC(bad)
		assert.False(t, ok, bad)
	}
}

// TestBoardID: every spelling of one MAC is one id; other ids only when
// allowed, and then only plain ones.
func TestBoardID(t *testing.T) {
	for _, v := range []string{"02:00:00:00:00:01", "02-00-00-00-00-01", "020000000001", "02_00_00_00_00_01",
		"02:00:00:00:00:01", "0200.0000.0001", "02-00-00-00-00-01"} {
		for _, spelled := range []string{v, upper(v)} {
			id, err := BoardID(spelled, false)
			require.NoError(t, err, spelled)
			assert.Equal(t, "02:00:00:00:00:01", id, spelled)
		}
	}
	for _, bad := range []string{"kitchen", "dev_ef0002", "", "02:00:00:00:00", "a b", "<x>"} {
		_, err := BoardID(bad, false)
		require.ErrorIs(t, err, ErrNotMAC, bad)
	}
	id, err := BoardID("sensor-17", true)
	require.NoError(t, err)
	assert.Equal(t, "sensor-17", id)
	id, err = BoardID("02-00-00-00-00-01", true)
	require.NoError(t, err)
	assert.Equal(t, "02:00:00:00:00:01", id, "a MAC is canonical even where any id is allowed")
	for _, bad := range []string{"", "a b", "a:b", "<script>", "ü", string(make([]byte, MaxPlainIDLen+1))} {
		_, err := BoardID(bad, true)
		assert.Error(t, err, "%q", bad)
	}
}

func upper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'a' && c <= 'f' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}

// TestHubKeysCanonicalMACs: a link attached under another spelling of a
// connected board's MAC replaces it (flap guard included) instead of
// sitting beside it, and lookups by any spelling find it.
func TestHubKeysCanonicalMACs(t *testing.T) {
	h := NewHub(HubConfig{ReadyWait: 2 * time.Second, Flapping: FlapPolicy{Limit: 2, Window: time.Hour, Backoff: time.Hour}}, nil)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, h.Close(ctx))
	})
	_, l1 := startBoard(t, twoTools)
	s1, err := h.Attach(l1, Identity{DeviceID: "02:00:00:00:00:01", Transport: "test", HasMCP: true})
	require.NoError(t, err)
	_, l2 := startBoard(t, twoTools)
	s2, err := h.Attach(l2, Identity{DeviceID: "02-00-00-00-00-01", Transport: "test", HasMCP: true})
	require.NoError(t, err)
	select {
	case <-s1.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the board under another spelling of its MAC was not replaced")
	}
	assert.Equal(t, ErrReplaced.Error(), s1.Info().CloseReason)
	assert.Equal(t, "02:00:00:00:00:01", s2.Info().DeviceID)
	require.Len(t, h.Devices(), 1)
	for _, v := range []string{"020000000001", "02_00_00_00_00_01", "02:00:00:00:00:01"} {
		s, ok := h.Session(v)
		require.True(t, ok, v)
		assert.Same(t, s2, s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = h.CallTool(ctx, "02_00_00_00_00_01", "self.get_device_status", nil)
	require.NoError(t, err)

	// Spellings count as the same device id for the flap guard.
	_, l3 := startBoard(t, twoTools)
	_, err = h.Attach(l3, Identity{DeviceID: "020000000001", Transport: "test", HasMCP: true})
	require.NoError(t, err)
	_, l4 := startBoard(t, twoTools)
	_, err = h.Attach(l4, Identity{DeviceID: "02_00_00_00_00_01", Transport: "test", HasMCP: true})
	require.ErrorIs(t, err, ErrFlapping)
	require.Len(t, h.Devices(), 1)
}

func BenchmarkMACDigits(b *testing.B) {
	for b.Loop() {
		_, _ = MACDigits("02:00:00:00:0a:01")
	}
}

func BenchmarkNormalizeCanonical(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = NormalizeID("02:00:00:00:0a:01")
	}
}
