// Package randid makes the bridge's random identifiers: session ids handed
// to boards in server hellos, and the UDP audio keys. One helper, so every
// transport draws them the same way.
package randid

import (
	"crypto/rand"
	"encoding/hex"
)

// Hex16 returns 16 random bytes (128 bits) as 32 lowercase hex digits:
// unguessable enough for a session id, and exactly the size boards expect
// of a UDP key or nonce.
func Hex16() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}
