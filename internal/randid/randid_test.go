package randid

import (
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHex16(t *testing.T) {
	a, b := Hex16(), Hex16()
	require.Len(t, a, 32)
	raw, err := hex.DecodeString(a)
	require.NoError(t, err)
	assert.Len(t, raw, 16)
	assert.NotEqual(t, a, b)
}

func TestHex(t *testing.T) {
	for _, n := range []int{0, 3, 4, 16} {
		s := Hex(n)
		raw, err := hex.DecodeString(s)
		require.NoError(t, err)
		assert.Len(t, raw, n)
	}
	assert.NotEqual(t, Hex(8), Hex(8))
}

func TestText(t *testing.T) {
	a, b := Text(), Text()
	assert.Len(t, a, 26)
	assert.NotEqual(t, a, b)
}

func TestUint32(t *testing.T) {
	// Two equal draws in a row happen once in 4 billion; three, never.
	a, b, c := Uint32(), Uint32(), Uint32()
	assert.False(t, a == b && b == c)
}
