package ota

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A websocket answer real boards accept (firmware-protocol.md §2.5).
const goodWS = `{"server_time":{"timestamp":1754611200000},"firmware":{"version":"2.4.2","url":""},` +
	`"websocket":{"url":"ws://192.168.1.10:8000/xiaozhi/v1/","token":"t","version":1}}`

const goodMQTT = `{"server_time":{"timestamp":1754611200000},"mqtt":{"endpoint":"192.168.1.10:1883",` +
	`"client_id":"GID_x@@@aa_bb_cc_dd_ee_ff@@@u","username":"u","password":"p","publish_topic":"devices/up/aa_bb_cc_dd_ee_ff",` +
	`"subscribe_topic":"devices/p2p/aa_bb_cc_dd_ee_ff","keepalive":240}}`

func TestCheckAnswerAcceptsWhatBoardsAccept(t *testing.T) {
	assert.NoError(t, CheckAnswer([]byte(goodWS), "2.4.2"))
	assert.NoError(t, CheckAnswer([]byte(goodMQTT), "2.4.2"))
	// An endpoint without a port (the firmware then uses 8883).
	assert.NoError(t, CheckAnswer([]byte(strings.Replace(goodMQTT, "192.168.1.10:1883", "mqtt.example.com", 1)), "2.4.2"))
}

// Rule: a key longer than 15 characters inside mqtt or websocket aborts
// the board at every boot. subscribe_topic is exactly 15 and fine.
func TestRuleKeyLength(t *testing.T) {
	require.Len(t, "subscribe_topic", MaxKeyLen)
	bad := strings.Replace(goodMQTT, `"keepalive"`, `"keepalive_seconds"`, 1)
	assert.ErrorIs(t, CheckAnswer([]byte(bad), "2.4.2"), ErrLongKey)
	bad = strings.Replace(goodWS, `"token"`, `"authorization_token"`, 1)
	assert.ErrorIs(t, CheckAnswer([]byte(bad), "2.4.2"), ErrLongKey)
}

// Rule: string values near the NVS limit abort the board.
func TestRuleValueLength(t *testing.T) {
	bad := strings.Replace(goodWS, `"token":"t"`, `"token":"`+strings.Repeat("x", 4000)+`"`, 1)
	assert.ErrorIs(t, CheckAnswer([]byte(bad), "2.4.2"), ErrLongValue)
	ok := strings.Replace(goodWS, `"token":"t"`, `"token":"`+strings.Repeat("x", MaxValueLen)+`"`, 1)
	assert.NoError(t, CheckAnswer([]byte(ok), "2.4.2"))
}

// Rule: every part of firmware.version goes through std::stoi; one that
// does not start with a digit aborts the board.
func TestRuleVersionParts(t *testing.T) {
	for _, v := range []string{"v2.4.2", "2.x", "", "2..4", "2.4.2-beta"} {
		bad := strings.Replace(goodWS, `"version":"2.4.2"`, `"version":"`+v+`"`, 1)
		assert.ErrorIs(t, CheckAnswer([]byte(bad), "2.4.2"), ErrVersionPart, v)
	}
}

// Rule: a firmware.version newer than the board's makes it download and
// flash firmware.url.
func TestRuleNoNewerFirmware(t *testing.T) {
	for _, v := range []string{"2.4.3", "2.5", "3", "2.4.2.1"} {
		bad := strings.Replace(goodWS, `"version":"2.4.2"`, `"version":"`+v+`"`, 1)
		assert.ErrorIs(t, CheckAnswer([]byte(bad), "2.4.2"), ErrNewerFirmware, v)
	}
	older := strings.Replace(goodWS, `"version":"2.4.2"`, `"version":"2.4.1"`, 1)
	assert.NoError(t, CheckAnswer([]byte(older), "2.4.2"))
	// A board whose own version we cannot read gets no firmware object.
	assert.ErrorIs(t, CheckAnswer([]byte(goodWS), "v2"), ErrNewerFirmware)
}

// Rule: the port in mqtt.endpoint goes through std::stoi too.
func TestRuleNumericMQTTPort(t *testing.T) {
	for _, ep := range []string{"host:mqtt", "host:", "host:99999", "host:18 83"} {
		bad := strings.Replace(goodMQTT, "192.168.1.10:1883", ep, 1)
		assert.ErrorIs(t, CheckAnswer([]byte(bad), "2.4.2"), ErrMQTTPort, ep)
	}
}

// Rule: a board without websocket or mqtt in the answer falls back to
// MQTT with whatever it stored before; with both it takes MQTT.
func TestRuleExactlyOneTransport(t *testing.T) {
	assert.ErrorIs(t, CheckAnswer([]byte(`{"server_time":{"timestamp":1}}`), "2.4.2"), ErrNoTransport)
	both := strings.TrimSuffix(goodMQTT, "}") + `,"websocket":{"url":"ws://h/","token":"t","version":1}}`
	assert.ErrorIs(t, CheckAnswer([]byte(both), "2.4.2"), ErrBothTransports)
	// While an activation is pending the board does not set up a transport.
	assert.NoError(t, CheckAnswer([]byte(`{"activation":{"message":"m","code":"123456","challenge":"c"}}`), "2.4.2"))
}

func TestMarshalRefusesUnsafeAnswers(t *testing.T) {
	a := Answer{WebSocket: &WebSocket{URL: "ws://h:8000/xiaozhi/v1/", Token: strings.Repeat("t", 5000), Version: 1}}
	_, err := a.Marshal("2.4.2")
	assert.ErrorIs(t, err, ErrLongValue)
	// The error names the rule and the key, never the value.
	assert.NotContains(t, err.Error(), "tttt")

	a = Answer{Firmware: firmwareEcho("2.4.2"), WebSocket: &WebSocket{URL: "ws://h:8000/xiaozhi/v1/", Token: "t", Version: 1}}
	body, err := a.Marshal("2.4.2")
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(body, &m))
	assert.NotContains(t, m, "mqtt")
	assert.Nil(t, firmwareEcho("v2.4"), "an unreadable version is not echoed")
	assert.Nil(t, firmwareEcho("2.4.2-rc1"))
}
