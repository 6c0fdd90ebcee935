// Package randid makes the bridge's random identifiers: session ids handed
// to boards in server hellos and to MCP clients, interaction and call ids,
// the UDP audio keys and SSRCs, node, client and epoch names. One place,
// so every id is drawn from the OS's cryptographic source the same way.
// (Secret keys are not ids: their owners draw them where they store them.)
package randid

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
)

// Hex returns n random bytes as 2n lowercase hex digits. Short ones (3 or
// 4 bytes) only tell apart names that already differ by host or purpose;
// use Hex16 where the id must be unguessable.
func Hex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
}

// Hex16 returns 16 random bytes (128 bits) as 32 lowercase hex digits:
// unguessable enough for a session id, and exactly the size boards expect
// of a UDP key or nonce.
func Hex16() string { return Hex(16) }

// Text returns an unguessable id of at least 128 bits in base32 (26
// characters; crypto/rand.Text). MCP session ids are these.
func Text() string { return rand.Text() }

// Uint32 returns a random 32-bit number (an RTP-style SSRC).
func Uint32() uint32 {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return binary.BigEndian.Uint32(b[:])
}
