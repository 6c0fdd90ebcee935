package voicestub

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Binary framing (firmware-protocol §3.7). All integers are big-endian.
const (
	v2HeaderSize = 16
	v3HeaderSize = 4
	// maxV3Payload is what v3's uint16 payload_size can carry.
	maxV3Payload = 0xFFFF
)

// ErrBadFrame reports a binary frame whose header does not fit its length.
var ErrBadFrame = errors.New("voicestub: malformed binary frame")

// Frame wraps payload in the binary framing of protocol version 1 (raw),
// 2 (16-byte header: version 2, type 0, reserved 0, timestamp in ms,
// payload size) or 3 (4-byte header: type 0, reserved 0, payload size).
func Frame(version int, timestamp uint32, payload []byte) ([]byte, error) {
	switch version {
	case 1:
		return append([]byte(nil), payload...), nil
	case 2:
		b := make([]byte, v2HeaderSize, v2HeaderSize+len(payload))
		binary.BigEndian.PutUint16(b[0:], 2)
		binary.BigEndian.PutUint16(b[2:], 0)
		binary.BigEndian.PutUint32(b[4:], 0)
		binary.BigEndian.PutUint32(b[8:], timestamp)
		binary.BigEndian.PutUint32(b[12:], uint32(len(payload)))
		return append(b, payload...), nil
	case 3:
		if len(payload) > maxV3Payload {
			return nil, fmt.Errorf("voicestub: payload of %d bytes does not fit a v3 frame", len(payload))
		}
		b := make([]byte, v3HeaderSize, v3HeaderSize+len(payload))
		binary.BigEndian.PutUint16(b[2:], uint16(len(payload)))
		return append(b, payload...), nil
	}
	return nil, fmt.Errorf("voicestub: protocol version %d: want 1, 2 or 3", version)
}

// Deframe returns the payload of a frame in the given protocol version. A
// v2/v3 frame shorter than its header, or whose payload_size exceeds what
// follows the header, is ErrBadFrame; bytes after the declared payload are
// ignored, as the firmware ignores them. The payload shares frame's memory.
func Deframe(version int, frame []byte) ([]byte, error) {
	switch version {
	case 1:
		return frame, nil
	case 2:
		if len(frame) < v2HeaderSize {
			return nil, ErrBadFrame
		}
		n := binary.BigEndian.Uint32(frame[12:])
		if uint64(n) > uint64(len(frame)-v2HeaderSize) {
			return nil, ErrBadFrame
		}
		return frame[v2HeaderSize : v2HeaderSize+int(n)], nil
	case 3:
		if len(frame) < v3HeaderSize {
			return nil, ErrBadFrame
		}
		n := int(binary.BigEndian.Uint16(frame[2:]))
		if n > len(frame)-v3HeaderSize {
			return nil, ErrBadFrame
		}
		return frame[v3HeaderSize : v3HeaderSize+n], nil
	}
	return nil, fmt.Errorf("voicestub: protocol version %d: want 1, 2 or 3", version)
}

// MaxReplyPayload caps each TTS payload, so the answer to a large heard
// frame still fits any framing and stays a plausible Opus packet size.
const MaxReplyPayload = 1024

// ExpectedReply is the payload of TTS frame k (0-based) of an answer to a
// turn whose heard Opus payloads are heard: "tts-<k>-" followed by the first
// heard payload (nothing if the turn heard no frame or its first frame was
// malformed), cut to MaxReplyPayload bytes. That is the whole payload
// unless Config.Stamp is set (see StampedReply).
func ExpectedReply(heard [][]byte, k int) []byte {
	p := []byte("tts-" + strconv.Itoa(k) + "-")
	if len(heard) > 0 {
		p = append(p, heard[0]...)
	}
	if len(p) > MaxReplyPayload {
		p = p[:MaxReplyPayload]
	}
	return p
}

// ReplyFrameDuration is the spacing of the v2 timestamps of TTS frames:
// frame k carries k*60 ms, the firmware's frame duration.
const ReplyFrameDuration = 60

// ExpectedFrame is TTS frame k as it goes on the wire in the given
// protocol version: ExpectedReply framed with timestamp k*60 (v2 only),
// without Config.Stamp.
func ExpectedFrame(version int, heard [][]byte, k int) []byte {
	f, err := Frame(version, uint32(k*ReplyFrameDuration), ExpectedReply(heard, k))
	if err != nil {
		return nil // only for a bad version; the payload always fits
	}
	return f
}

// StampSize is the length of the send time Config.Stamp puts in front of
// each TTS payload.
const StampSize = 8

// StampedReply is the payload of TTS frame k with Config.Stamp, stamped
// at: the send time (8 bytes, big-endian Unix nanoseconds) followed by
// ExpectedReply(heard, k).
func StampedReply(heard [][]byte, k int, at time.Time) []byte {
	p := make([]byte, StampSize, StampSize+MaxReplyPayload)
	binary.BigEndian.PutUint64(p, uint64(at.UnixNano()))
	return append(p, ExpectedReply(heard, k)...)
}

// ReadStamp returns the send time at the start of a stamped TTS payload,
// and false if the payload is too short to carry one.
func ReadStamp(payload []byte) (time.Time, bool) {
	if len(payload) < StampSize {
		return time.Time{}, false
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(payload))), true
}

// headerSize is the framing header's length in a protocol version.
func headerSize(version int) int {
	switch version {
	case 2:
		return v2HeaderSize
	case 3:
		return v3HeaderSize
	}
	return 0
}

// Token makes the gateway token xiaozhi-esp32-server verifies:
// base64url_nopad(HMAC-SHA256(secret, clientID|deviceID|ts)) + "." + ts,
// with ts in unix seconds. It is sent as "Authorization: Bearer <token>"
// alongside the Device-Id and Client-Id headers it was made for.
func Token(secret, clientID, deviceID string, at time.Time) string {
	ts := strconv.FormatInt(at.Unix(), 10)
	return tokenSig(secret, clientID, deviceID, ts) + "." + ts
}

func tokenSig(secret, clientID, deviceID, ts string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(clientID + "|" + deviceID + "|" + ts))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// Token age bounds: xiaozhi-esp32-server accepts a token for 30 days and
// tolerates a client clock a little ahead of its own.
const (
	TokenMaxAge    = 30 * 24 * time.Hour
	TokenMaxFuture = 5 * time.Minute
)

// checkToken verifies an HMAC token for the given headers at now.
func checkToken(secret, token, clientID, deviceID string, now time.Time) bool {
	i := strings.LastIndexByte(token, '.')
	if i < 0 {
		return false
	}
	sig, ts := token[:i], token[i+1:]
	if ts == "" || len(ts) > 19 {
		return false
	}
	for _, c := range ts {
		if c < '0' || c > '9' {
			return false
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return false
	}
	at := time.Unix(sec, 0)
	if now.Sub(at) > TokenMaxAge || at.Sub(now) > TokenMaxFuture {
		return false
	}
	// The signature covers ts exactly as sent.
	return hmac.Equal([]byte(sig), []byte(tokenSig(secret, clientID, deviceID, ts)))
}
