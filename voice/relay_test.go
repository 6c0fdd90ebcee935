package voice

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The token is the one xiaozhi-esp32-server's AuthManager verifies:
// signature over "client|device|ts", URL-safe base64 without padding, a
// dot, ts.
func TestHMACToken(t *testing.T) {
	now := time.Unix(1764000000, 0)
	tok := HMACToken("s3cret", "uuid-1", "aa:bb:cc:dd:ee:ff", now)
	sig, ts, ok := strings.Cut(tok, ".")
	require.True(t, ok)
	assert.Equal(t, "1764000000", ts)
	m := hmac.New(sha256.New, []byte("s3cret"))
	m.Write([]byte("uuid-1|aa:bb:cc:dd:ee:ff|1764000000"))
	assert.Equal(t, base64.RawURLEncoding.EncodeToString(m.Sum(nil)), sig)
	assert.NotContains(t, sig, "=")
}

func TestParseServerHello(t *testing.T) {
	sh, err := parseServerHello([]byte(`{"type":"hello","transport":"websocket","session_id":"abc-1_2","audio_params":{"sample_rate":16000,"frame_duration":20}}`))
	require.NoError(t, err)
	assert.Equal(t, ServerHello{SessionID: "abc-1_2", SampleRate: 16000, FrameDuration: 20}, sh)

	// A board crashes on a hello without transport: the relay never passes
	// one on, it refuses the upstream's.
	for _, bad := range []string{`{"type":"hello"}`, `{"type":"hello","transport":"udp"}`, `{"type":"hello","transport":1}`, `[1]`} {
		_, err := parseServerHello([]byte(bad))
		assert.ErrorIs(t, err, ErrBadHello, bad)
	}
	// What a board cannot take is replaced, never passed on.
	sh, err = parseServerHello([]byte(`{"transport":"websocket","session_id":"has space\"","audio_params":{"sample_rate":1e9,"frame_duration":"60"}}`))
	require.NoError(t, err)
	assert.Regexp(t, `^[0-9a-f]{32}$`, sh.SessionID)
	assert.Equal(t, 24000, sh.SampleRate)
	assert.Equal(t, 60, sh.FrameDuration)
}

func TestConfigValidate(t *testing.T) {
	assert.NoError(t, Config{}.Validate())
	assert.NoError(t, Config{Upstream: "ws://h:8000/xiaozhi/v1/", Boards: map[string]string{"aa:bb:cc:dd:ee:ff": Off}}.Validate())
	assert.ErrorContains(t, Config{Upstream: "http://h/"}.Validate(), "voice.upstream")
	assert.ErrorContains(t, Config{Boards: map[string]string{"x": "tcp://h"}}.Validate(), "voice.boards[x]")
	assert.ErrorContains(t, Config{HelloTimeout: 10 * time.Second}.Validate(), "voice.hello_timeout")
	assert.ErrorContains(t, Config{Token: "a", Secret: "b"}.Validate(), "set one")
	_, err := NewRelay(Config{Upstream: "ws://h/", Boards: map[string]string{"not-a-mac": Off}}, nil, nil)
	assert.ErrorContains(t, err, "not a MAC")
}

func TestUpstreamPerBoard(t *testing.T) {
	r, err := NewRelay(Config{Upstream: "ws://all/", Boards: map[string]string{
		"AA-BB-CC-DD-EE-01": Off, "aabbccddee02": "ws://other/"}}, nil, nil)
	require.NoError(t, err)
	assert.Equal(t, "", r.Upstream("aa:bb:cc:dd:ee:01"))
	assert.Equal(t, "ws://other/", r.Upstream("aa:bb:cc:dd:ee:02"))
	assert.Equal(t, "ws://all/", r.Upstream("aa:bb:cc:dd:ee:03"))
	var nilRelay *Relay
	assert.False(t, nilRelay.Enabled("aa:bb:cc:dd:ee:03"))
	assert.Equal(t, "ws://h:1/x", Redact("ws://user:pw@h:1/x?token=t"))
}

func TestBusyReply(t *testing.T) {
	assert.JSONEq(t, `{"jsonrpc":"2.0","id":7,"error":{"code":-32000,"message":"busy: 8 requests already wait for this board (voice.mcp_queue)"}}`,
		string(busyReply([]byte(`{"jsonrpc":"2.0","id":7,"method":"tools/call"}`), 8)))
	assert.Nil(t, busyReply([]byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`), 8))
	assert.Nil(t, busyReply([]byte(`not json`), 8))
}
