package ota

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"

	"github.com/devicebridge/devicebridge/mqtt"
)

// MQTTClientGroup is the group part of the client ids the bridge issues
// (GID_devicebridge@@@<mac>@@@<uuid>, the form xiaozhi backends use).
const MQTTClientGroup = "GID_devicebridge"

// minSecretLen is the shortest server secret accepted: 16 bytes.
const minSecretLen = 16

// Credentials derives every board's credentials from one server secret:
// HMAC-SHA256(secret, purpose || device id). Nothing per board is stored,
// and a board's credentials are worthless for any other board, because
// the transports recompute them from the identity the board claims (its
// Device-Id on WebSocket, the MAC in its client id on MQTT).
type Credentials struct{ key []byte }

// ErrShortSecret means a configured secret is too short to be one.
var ErrShortSecret = errors.New("ota secret must be at least 16 bytes")

// NewCredentials uses secret as the HMAC key.
func NewCredentials(secret []byte) (*Credentials, error) {
	if len(secret) < minSecretLen {
		return nil, ErrShortSecret
	}
	return &Credentials{key: append([]byte(nil), secret...)}, nil
}

// derive is HMAC-SHA256(key, purpose 0 part 0 part...), base64url without
// padding: 43 characters, safe in headers, URLs and MQTT fields.
func (c *Credentials) derive(purpose string, parts ...string) string {
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte(purpose))
	for _, p := range parts {
		m.Write([]byte{0})
		m.Write([]byte(p))
	}
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// WebSocketToken is the token a board presents as "Bearer <token>".
func (c *Credentials) WebSocketToken(deviceID string) string {
	return c.derive("devicebridge/websocket-token", deviceID)
}

// MQTTLogin is what a board presents to the broker.
type MQTTLogin struct {
	ClientID, Username, Password string
}

// MQTT issues a board's MQTT login. The client id names the board (the
// broker reads the MAC out of it); the password binds the device id and
// the username.
func (c *Credentials) MQTT(deviceID, uuid string) MQTTLogin {
	key := mqtt.TopicKey(deviceID)
	user := "db_" + key
	return MQTTLogin{
		ClientID: mqtt.FormatClientID(MQTTClientGroup, deviceID, uuid),
		Username: user,
		Password: c.mqttPassword(deviceID, user),
	}
}

func (c *Credentials) mqttPassword(deviceID, username string) string {
	return c.derive("devicebridge/mqtt-password", deviceID, username)
}

// VerifyWebSocketToken reports whether token is the one issued to deviceID.
func (c *Credentials) VerifyWebSocketToken(deviceID, token string) bool {
	return equal(token, c.WebSocketToken(deviceID))
}

// VerifyMQTT reports whether username and password are the ones issued to
// deviceID (the board the client id names).
func (c *Credentials) VerifyMQTT(deviceID, username, password string) bool {
	return equal(password, c.mqttPassword(deviceID, username))
}

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }
