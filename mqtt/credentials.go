package mqtt

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
)

// HMACPassword derives a board's MQTT password from a shared secret the way
// existing xiaozhi backends do: base64(HMAC-SHA256(secret, clientID + "|" +
// username)), standard base64 with padding. The OTA endpoint that hands a
// board its MQTT settings computes it; the broker recomputes it on CONNECT,
// so no per-board password has to be stored anywhere.
func HMACPassword(secret, clientID, username string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(clientID + "|" + username))
	return base64.StdEncoding.EncodeToString(m.Sum(nil))
}
