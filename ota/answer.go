package ota

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Limits of what a board can store from an answer.
const (
	// MaxKeyLen is the longest key the firmware can write to NVS: every
	// member of mqtt and websocket is stored under its own name, and a
	// longer name makes ESP_ERROR_CHECK abort the board.
	MaxKeyLen = 15
	// MaxValueLen bounds every string value inside mqtt and websocket.
	// NVS refuses strings of about 4000 bytes with an abort; a quarter of
	// that leaves room and is far above any URL or credential we send.
	MaxValueLen = 1024
)

// Answer is the JSON body of a 200 OTA response. Every member is optional
// to the firmware; the bridge always sends server_time and exactly one
// transport, except while an activation is pending, when it sends the
// activation instead of a transport.
type Answer struct {
	ServerTime *ServerTime `json:"server_time,omitempty"`
	Firmware   *Firmware   `json:"firmware,omitempty"`
	Activation *Activation `json:"activation,omitempty"`
	WebSocket  *WebSocket  `json:"websocket,omitempty"`
	MQTT       *MQTT       `json:"mqtt,omitempty"`
}

// ServerTime sets the board's clock: milliseconds since the epoch, and an
// optional offset in minutes.
type ServerTime struct {
	Timestamp      int64 `json:"timestamp"`
	TimezoneOffset *int  `json:"timezone_offset,omitempty"`
}

// Firmware echoes the board's own version, so that it neither upgrades nor
// parses a version it cannot read.
type Firmware struct {
	Version string `json:"version"`
	URL     string `json:"url"`
}

// Activation asks the board to show Code and to poll <ota>/activate until
// an operator approves it. Challenge must be present: without it the board
// does not poll at all. The bridge's own sets all three; one passed on
// from a voice upstream (upstream.go) carries what the upstream sent.
type Activation struct {
	Message   string `json:"message,omitempty"`
	Code      string `json:"code,omitempty"`
	Challenge string `json:"challenge,omitempty"`
}

// WebSocket is the websocket object: where to connect, with which token.
type WebSocket struct {
	URL     string `json:"url"`
	Token   string `json:"token"`
	Version int    `json:"version"`
}

// MQTT is the mqtt object. Endpoint is "host:port" (8883 would mean TLS).
type MQTT struct {
	Endpoint       string `json:"endpoint"`
	ClientID       string `json:"client_id"`
	Username       string `json:"username"`
	Password       string `json:"password"`
	PublishTopic   string `json:"publish_topic"`
	SubscribeTopic string `json:"subscribe_topic"`
	KeepAlive      int    `json:"keepalive"`
}

// Crash rules CheckAnswer enforces; each error wraps one of them.
var (
	ErrLongKey         = errors.New("a key longer than 15 characters inside mqtt/websocket aborts the board (NVS key limit)")
	ErrLongValue       = errors.New("a string value this long inside mqtt/websocket aborts the board (NVS value limit)")
	ErrVersionPart     = errors.New("firmware.version has a part that is not a number; the board's std::stoi aborts")
	ErrNewerFirmware   = errors.New("firmware.version is newer than the board's; the board would download and flash firmware.url")
	ErrMQTTPort        = errors.New("mqtt.endpoint has a port that is not a number; the board's std::stoi aborts")
	ErrNoTransport     = errors.New("an answer without websocket or mqtt leaves the board on stale settings")
	ErrBothTransports  = errors.New("an answer with both websocket and mqtt makes the board use mqtt")
	ErrWebSocketFields = errors.New("websocket needs a ws:// or wss:// url and a version of 1, 2 or 3")
	ErrMQTTFields      = errors.New("mqtt needs an endpoint, a client_id and a publish_topic")
)

// Marshal renders the answer and checks it against the crash rules for a
// board running boardVersion. It never returns bytes that fail CheckAnswer.
func (a Answer) Marshal(boardVersion string) ([]byte, error) {
	body, err := json.Marshal(a)
	if err != nil {
		return nil, err
	}
	if err := CheckAnswer(body, boardVersion); err != nil {
		return nil, err
	}
	return body, nil
}

// CheckAnswer reports the first thing in an OTA answer body that would
// crash, brick or misdirect a board running boardVersion. It reads the
// bytes, not a struct, so it checks exactly what goes on the wire.
func CheckAnswer(body []byte, boardVersion string) error {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return fmt.Errorf("answer is not a JSON object: %w", err)
	}
	objects := map[string]map[string]any{}
	for _, name := range []string{"websocket", "mqtt"} {
		raw, ok := top[name]
		if !ok {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			return fmt.Errorf("%s is not an object: %w", name, err)
		}
		for k, v := range m {
			if len(k) > MaxKeyLen {
				return fmt.Errorf("%s.%s: %w", name, k, ErrLongKey)
			}
			if s, ok := v.(string); ok && len(s) > MaxValueLen {
				return fmt.Errorf("%s.%s (%d bytes): %w", name, k, len(s), ErrLongValue)
			}
		}
		objects[name] = m
	}
	if raw, ok := top["firmware"]; ok {
		var fw struct {
			Version *string `json:"version"`
		}
		if err := json.Unmarshal(raw, &fw); err != nil {
			return fmt.Errorf("firmware is not an object: %w", err)
		}
		if fw.Version != nil {
			theirs, err := parseVersion(*fw.Version)
			if err != nil {
				return fmt.Errorf("firmware.version %q: %w", *fw.Version, err)
			}
			mine, err := parseVersion(boardVersion)
			if err != nil || compareVersions(theirs, mine) > 0 {
				return fmt.Errorf("firmware.version %q, board runs %q: %w", *fw.Version, boardVersion, ErrNewerFirmware)
			}
		}
	}
	_, pending := top["activation"]
	ws, hasWS := objects["websocket"]
	mq, hasMQTT := objects["mqtt"]
	switch {
	case hasWS && hasMQTT:
		return ErrBothTransports
	case !hasWS && !hasMQTT && !pending:
		return ErrNoTransport
	}
	if hasWS {
		u, _ := ws["url"].(string)
		v, _ := ws["version"].(float64)
		if !strings.HasPrefix(u, "ws://") && !strings.HasPrefix(u, "wss://") || (v != 1 && v != 2 && v != 3) {
			return ErrWebSocketFields
		}
	}
	if hasMQTT {
		ep, _ := mq["endpoint"].(string)
		cid, _ := mq["client_id"].(string)
		pub, _ := mq["publish_topic"].(string)
		if ep == "" || cid == "" || pub == "" {
			return ErrMQTTFields
		}
		if err := checkEndpoint(ep); err != nil {
			return err
		}
	}
	return nil
}

// checkEndpoint applies the firmware's reading of mqtt.endpoint: "host"
// or "host:port", the port going through std::stoi.
func checkEndpoint(ep string) error {
	i := strings.LastIndexByte(ep, ':')
	if i < 0 {
		return nil
	}
	port := ep[i+1:]
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 || strings.TrimLeft(port, "0123456789") != "" {
		return fmt.Errorf("mqtt.endpoint %q: %w", ep, ErrMQTTPort)
	}
	if _, _, err := net.SplitHostPort(ep); err != nil {
		return fmt.Errorf("mqtt.endpoint %q: %w", ep, ErrMQTTPort)
	}
	return nil
}

// parseVersion reads a dotted version whose every part is a plain decimal
// number. The firmware only needs each part to start with a digit, but a
// stricter reading costs nothing and leaves no doubt.
func parseVersion(v string) ([]int, error) {
	if v == "" {
		return nil, ErrVersionPart
	}
	parts := strings.Split(v, ".")
	out := make([]int, len(parts))
	for i, p := range parts {
		if p == "" || strings.TrimLeft(p, "0123456789") != "" || len(p) > 9 {
			return nil, ErrVersionPart
		}
		out[i], _ = strconv.Atoi(p)
	}
	return out, nil
}

// compareVersions compares part by part, a missing part counting as 0.
func compareVersions(a, b []int) int {
	for i := 0; i < max(len(a), len(b)); i++ {
		var x, y int
		if i < len(a) {
			x = a[i]
		}
		if i < len(b) {
			y = b[i]
		}
		if x != y {
			if x < y {
				return -1
			}
			return 1
		}
	}
	return 0
}

// firmwareEcho is the firmware object for a board running version: its
// own version when that is safe to send back, else nil (omitted).
func firmwareEcho(version string) *Firmware {
	if _, err := parseVersion(version); err != nil {
		return nil
	}
	return &Firmware{Version: version, URL: ""}
}
