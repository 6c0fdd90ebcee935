package device

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestNormalizeID(t *testing.T) {
	assert.Equal(t, "aa:bb:cc:dd:ee:ff", NormalizeID("AA-BB-CC-DD-EE-FF"))
	assert.Equal(t, "aa:bb:cc:dd:ee:ff", NormalizeID("aabbccddeeff"))
	assert.Equal(t, "aa:bb:cc:dd:ee:ff", NormalizeID("aa_bb_cc_dd_ee_ff"))
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
	}
}

func BenchmarkMACDigits(b *testing.B) {
	for b.Loop() {
		_, _ = MACDigits("02:00:00:00:0a:01")
	}
}
