package ota

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"strings"

	"github.com/devicebridge/devicebridge/device"
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

// tokenPrefix starts every WebSocket token the bridge issues; the board's
// MAC digits follow, then the HMAC: "dbw1.<12 hex>.<43 base64url>". The
// MAC in the clear is what makes a token recognisably one the bridge
// issued to a given board, so that another board presenting it is refused
// even where tokens are optional. The MAC is no secret: boards send it in
// every request.
const tokenPrefix = "dbw1."

// WebSocketToken is the token a board presents as "Bearer <token>".
func (c *Credentials) WebSocketToken(deviceID string) string {
	digits, ok := device.MACDigits(deviceID)
	if !ok {
		// Only MACs are issued tokens; keep the old, anonymous form for
		// anything else rather than invent a name.
		return c.legacyWebSocketToken(deviceID)
	}
	return tokenPrefix + digits + "." + c.derive("devicebridge/websocket-token/v2", deviceID)
}

// legacyWebSocketToken is the token issued before tokens named their
// board. Boards keep a token in NVS until their next boot, so it is still
// accepted for its own board.
func (c *Credentials) legacyWebSocketToken(deviceID string) string {
	return c.derive("devicebridge/websocket-token", deviceID)
}

// WebSocketTokenOwner reports the board a token was issued to, when it is
// one the bridge issued (its HMAC checks out for the MAC it names).
func (c *Credentials) WebSocketTokenOwner(token string) (deviceID string, ok bool) {
	rest, ok := strings.CutPrefix(token, tokenPrefix)
	if !ok || len(rest) < 13 || rest[12] != '.' {
		return "", false
	}
	if _, ok := device.MACDigits(rest[:12]); !ok {
		return "", false
	}
	id := device.NormalizeID(rest[:12])
	return id, equal(token, c.WebSocketToken(id))
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

// BridgeMQTTPassword is the bridge's own password on a Mosquitto running
// deploy/mosquitto/devicebridge.so, for the plugin's bridge username: the
// plugin derives the same from the same secret, so neither is configured
// twice.
func (c *Credentials) BridgeMQTTPassword(username string) string {
	return c.derive("devicebridge/mqtt-bridge-password", username)
}

// VerifyWebSocketToken reports whether token is the one issued to
// deviceID, in the current form or the one before it.
func (c *Credentials) VerifyWebSocketToken(deviceID, token string) bool {
	return equal(token, c.WebSocketToken(deviceID)) || equal(token, c.legacyWebSocketToken(deviceID))
}

// VerifyMQTT reports whether username and password are the ones issued to
// deviceID (the board the client id names).
func (c *Credentials) VerifyMQTT(deviceID, username, password string) bool {
	return equal(password, c.mqttPassword(deviceID, username))
}

// MQTTOwner reports the board an MQTT login was issued to, when it is one
// the bridge issued: the username names the board ("db_<mac>") and the
// password is the one derived for both.
func (c *Credentials) MQTTOwner(username, password string) (deviceID string, ok bool) {
	key, ok := strings.CutPrefix(username, "db_")
	if !ok {
		return "", false
	}
	if _, ok := device.MACDigits(key); !ok {
		return "", false
	}
	id := device.NormalizeID(key)
	return id, username == c.MQTT(id, "").Username && c.VerifyMQTT(id, username, password)
}

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }
