package sealed

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var key = []byte("0123456789abcdef0123456789abcdef")

type state struct {
	Tool string `json:"t"`
	N    int    `json:"n"`
}

func seal(t *testing.T, owner string) string {
	t.Helper()
	tok, err := Seal(key, "tst1", owner, state{Tool: "wizard", N: 3})
	require.NoError(t, err)
	return tok
}

func TestRoundTrip(t *testing.T) {
	tok := seal(t, "alice")
	assert.True(t, strings.HasPrefix(tok, "tst1."))
	assert.Equal(t, 2, strings.Count(tok, "."))
	var got state
	require.NoError(t, Open(key, "tst1", "alice", tok, 1<<10, &got))
	assert.Equal(t, state{Tool: "wizard", N: 3}, got)
}

func TestOwnerIsNotInTheToken(t *testing.T) {
	tok := seal(t, "owner-credential-hash-123")
	assert.NotContains(t, tok, "owner-credential-hash-123")
	assert.NotContains(t, tok, b64.EncodeToString([]byte("owner-credential-hash-123")))
}

func TestEveryFlippedByteIsRefused(t *testing.T) {
	tok := seal(t, "alice")
	for i := range len(tok) {
		for _, bit := range []byte{0x01, 0x20} {
			b := []byte(tok)
			b[i] ^= bit
			var got state
			err := Open(key, "tst1", "alice", string(b), 1<<10, &got)
			// Base64's last character may carry unused bits: flipping one of
			// those can leave the decoded bytes as they were, and the token
			// is then the same token.
			if err == nil {
				assert.Equal(t, state{Tool: "wizard", N: 3}, got, "byte %d ^ %#x", i, bit)
				continue
			}
			assert.Contains(t, []error{ErrMalformed, ErrVersion, ErrSignature}, err, "byte %d ^ %#x", i, bit)
			assert.Zero(t, got, "nothing is decoded from a refused token")
		}
	}
}

func TestOtherOwnerKeyOrVersion(t *testing.T) {
	tok := seal(t, "alice")
	var got state
	assert.ErrorIs(t, Open(key, "tst1", "bob", tok, 1<<10, &got), ErrSignature)
	assert.ErrorIs(t, Open(key, "tst1", "", tok, 1<<10, &got), ErrSignature)
	assert.ErrorIs(t, Open([]byte(strings.Repeat("z", 32)), "tst1", "alice", tok, 1<<10, &got), ErrSignature)
	assert.ErrorIs(t, Open(key, "tst2", "alice", tok, 1<<10, &got), ErrVersion)

	// The version is signed: renaming it does not carry the MAC over.
	renamed := "oth1" + strings.TrimPrefix(tok, "tst1")
	assert.ErrorIs(t, Open(key, "oth1", "alice", renamed, 1<<10, &got), ErrSignature)

	// NUL framing: moving bytes between the payload and the owner does not
	// make another valid (signed, owner) pair.
	assert.ErrorIs(t, Open(key, "tst1", "alice\x00", tok, 1<<10, &got), ErrSignature)
	assert.Zero(t, got)
}

func TestOversizeIsRefusedBeforeDecoding(t *testing.T) {
	tok := seal(t, "alice")
	var got state
	assert.ErrorIs(t, Open(key, "tst1", "alice", tok, len(tok)-1, &got), ErrTooLong)
	assert.Zero(t, got)
	require.NoError(t, Open(key, "tst1", "alice", tok, len(tok), &got))
	// Length first: a huge token of garbage is not even parsed.
	assert.ErrorIs(t, Open(key, "tst1", "alice", strings.Repeat("x", 1<<12), 1<<10, &got), ErrTooLong)
}

func TestGarbage(t *testing.T) {
	tok := seal(t, "alice")
	dot := strings.LastIndexByte(tok, '.')
	for bad, want := range map[string]error{
		"":                               ErrMalformed,
		"flw_" + strings.Repeat("0", 32): ErrMalformed,
		"tst1":                           ErrMalformed,
		"tst1.":                          ErrMalformed,
		"tst1..":                         ErrSignature,
		"tst1.e30":                       ErrMalformed, // no MAC
		tok[:dot]:                        ErrMalformed,
		tok + "x":                        ErrSignature,
		tok + ".":                        ErrSignature,
		tok[:dot] + ".!!!":               ErrSignature,
		"tst2" + tok[4:]:                 ErrVersion,
		".." + tok:                       ErrVersion,
	} {
		var got state
		assert.ErrorIs(t, Open(key, "tst1", "alice", bad, 1<<10, &got), want, "%q", bad)
		assert.Zero(t, got)
	}
}

func TestSignedButNotTheCallersShape(t *testing.T) {
	// A genuine token whose JSON does not fit v is malformed, not a panic.
	tok, err := Seal(key, "tst1", "alice", []int{1, 2})
	require.NoError(t, err)
	var got state
	assert.ErrorIs(t, Open(key, "tst1", "alice", tok, 1<<10, &got), ErrMalformed)
}

func TestSealRefusesBadVersions(t *testing.T) {
	for _, v := range []string{"", "a.b", "a\x00"} {
		_, err := Seal(key, v, "alice", 1)
		assert.Error(t, err, "%q", v)
	}
	_, err := Seal(key, "tst1", "alice", func() {})
	assert.Error(t, err, "a value JSON cannot encode")
}
