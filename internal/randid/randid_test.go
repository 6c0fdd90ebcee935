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
