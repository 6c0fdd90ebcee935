package envelope

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
)

// DefaultMaxMessageSize bounds one text message from a board. Real boards
// cannot send more than one 65535-byte WebSocket frame; 64 KiB leaves the
// bridge a little slack without letting a peer make it buffer megabytes.
const DefaultMaxMessageSize = 64 << 10

// Message types the bridge handles itself. Other types (listen, abort, ...)
// are valid envelopes that the MCP layer simply does not consume.
const (
	TypeHello   = "hello"
	TypeMCP     = "mcp"
	TypeGoodbye = "goodbye"
)

// Errors returned by Decode and Encode. They are wrapped with detail; test
// with errors.Is.
var (
	// ErrTooLarge means the message exceeds the size limit.
	ErrTooLarge = errors.New("envelope: message too large")
	// ErrMalformed means the message is not a JSON object, even after the
	// firmware dialect was repaired.
	ErrMalformed = errors.New("envelope: malformed message")
	// ErrMissingType means the message has no string "type"; boards drop such
	// messages, and so does the bridge.
	ErrMissingType = errors.New("envelope: missing or non-string type")
	// ErrPayloadNotObject means "payload" is present but not a JSON object.
	// Boards silently ignore an MCP payload that is a string, so the bridge
	// refuses to send one and rejects one on receipt.
	ErrPayloadNotObject = errors.New("envelope: payload must be a JSON object")
)

// Envelope is one decoded board message.
type Envelope struct {
	// SessionID is "" when absent; boards send the last id the server gave.
	SessionID string
	// Type is the message type ("hello", "mcp", "listen", ...).
	Type string
	// Payload is the raw "payload" member, nil when absent. When non-nil it
	// is a JSON object.
	Payload json.RawMessage
	// Raw is the whole message as valid JSON (after dialect repair), for
	// callers that need type-specific fields such as a hello's features.
	Raw json.RawMessage
	// Repaired reports that the message was invalid JSON as received and was
	// fixed by escaping an error message (see the package doc).
	Repaired bool
}

// Decode parses one board message. maxSize <= 0 means DefaultMaxMessageSize.
func Decode(data []byte, maxSize int) (Envelope, error) {
	maxSize = cmp.Or(max(maxSize, 0), DefaultMaxMessageSize)
	if len(data) > maxSize {
		return Envelope{}, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(data), maxSize)
	}
	var env Envelope
	var head struct {
		SessionID json.RawMessage `json:"session_id"`
		Type      json.RawMessage `json:"type"`
		Payload   json.RawMessage `json:"payload"`
	}
	raw := data
	if err := json.Unmarshal(raw, &head); err != nil {
		fixed, ok := repairErrorMessage(data)
		if !ok {
			return Envelope{}, fmt.Errorf("%w: %v", ErrMalformed, err)
		}
		if err2 := json.Unmarshal(fixed, &head); err2 != nil {
			return Envelope{}, fmt.Errorf("%w: %v", ErrMalformed, err)
		}
		raw, env.Repaired = fixed, true
	}
	if len(bytes.TrimSpace(raw)) == 0 || bytes.TrimSpace(raw)[0] != '{' {
		return Envelope{}, fmt.Errorf("%w: not a JSON object", ErrMalformed)
	}
	if err := json.Unmarshal(head.Type, &env.Type); err != nil || env.Type == "" {
		return Envelope{}, ErrMissingType
	}
	// A non-string session id is tolerated as absent: boards never check it
	// and neither does anything above this layer.
	_ = json.Unmarshal(head.SessionID, &env.SessionID)
	if head.Payload != nil && !isNull(head.Payload) {
		if !isObject(head.Payload) {
			return Envelope{}, fmt.Errorf("%w (type %q)", ErrPayloadNotObject, env.Type)
		}
		env.Payload = head.Payload
	}
	env.Raw = raw
	return env, nil
}

// Encode builds one message for a board: {"session_id":..,"type":..,"payload":..}.
// payload may be nil (no payload member); otherwise it must be a JSON object.
func Encode(sessionID, typ string, payload json.RawMessage) ([]byte, error) {
	if typ == "" {
		return nil, ErrMissingType
	}
	if payload != nil && !isObject(payload) {
		return nil, ErrPayloadNotObject
	}
	var b bytes.Buffer
	b.Grow(len(payload) + len(sessionID) + len(typ) + 48)
	b.WriteString(`{"session_id":`)
	writeJSONString(&b, sessionID)
	b.WriteString(`,"type":`)
	writeJSONString(&b, typ)
	if payload != nil {
		b.WriteString(`,"payload":`)
		b.Write(payload)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func writeJSONString(b *bytes.Buffer, s string) {
	enc, _ := json.Marshal(s) // marshalling a string cannot fail
	b.Write(enc)
}

func isObject(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) >= 2 && t[0] == '{' && json.Valid(t)
}

func isNull(raw json.RawMessage) bool {
	return bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}
