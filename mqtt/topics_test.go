package mqtt

import (
	"encoding/hex"
	"encoding/json"
	"testing"

	"github.com/devicebridge/devicebridge/internal/randid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseClientID(t *testing.T) {
	for _, tc := range []struct {
		in         string
		allowPlain bool
		want       ClientIdentity
		err        bool
	}{
		{in: "GID_test@@@aa_bb_cc_dd_ee_ff@@@1f0a-uuid", want: ClientIdentity{DeviceID: "aa:bb:cc:dd:ee:ff", Key: "aa_bb_cc_dd_ee_ff", Group: "GID_test", UUID: "1f0a-uuid"}},
		{in: "GID_test@@@AA_BB_CC_DD_EE_FF", want: ClientIdentity{DeviceID: "aa:bb:cc:dd:ee:ff", Key: "aa_bb_cc_dd_ee_ff", Group: "GID_test"}},
		{in: "GID_x@@@aa:bb:cc:dd:ee:ff@@@u", want: ClientIdentity{DeviceID: "aa:bb:cc:dd:ee:ff", Key: "aa_bb_cc_dd_ee_ff", Group: "GID_x", UUID: "u"}},
		{in: "GID_x@@@AA-BB-CC-DD-EE-FF@@@u", want: ClientIdentity{DeviceID: "aa:bb:cc:dd:ee:ff", Key: "aa_bb_cc_dd_ee_ff", Group: "GID_x", UUID: "u"}},
		{in: "GID_x@@@aabbccddeeff", want: ClientIdentity{DeviceID: "aa:bb:cc:dd:ee:ff", Key: "aa_bb_cc_dd_ee_ff", Group: "GID_x"}},
		{in: "AA-BB-CC-DD-EE-FF", allowPlain: true, want: ClientIdentity{DeviceID: "aa:bb:cc:dd:ee:ff", Key: "aa_bb_cc_dd_ee_ff"}},
		{in: "GID_x@@@kitchen@@@u", allowPlain: true, err: true},
		{in: "GID_test@@@aa_bb_cc_dd_ee_ff@@@", err: true},
		{in: "@@@aa_bb_cc_dd_ee_ff@@@u", err: true},
		{in: "GID_test@@@aa_bb_cc_dd_ee@@@u", err: true},
		{in: "GID_test@@@aa_bb_cc_dd_ee_ff@@@u@@@x", err: true},
		{in: "sensor-17", err: true},
		{in: "sensor-17", allowPlain: true, want: ClientIdentity{DeviceID: "sensor-17", Key: "sensor-17"}},
		{in: "has/slash", allowPlain: true, err: true},
		{in: "has+plus", allowPlain: true, err: true},
		{in: "", allowPlain: true, err: true},
	} {
		got, err := ParseClientID(tc.in, tc.allowPlain)
		if tc.err {
			assert.ErrorIs(t, err, ErrClientID, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, got, tc.in)
	}
	assert.Equal(t, "GID_test@@@aa_bb_cc_dd_ee_ff@@@u", FormatClientID("GID_test", "AA:BB:CC:DD:EE:FF", "u"))
}

func TestTemplates(t *testing.T) {
	up := MustTemplate(DefaultUplink)
	assert.Equal(t, "devices/up/+", up.Filter())
	assert.Equal(t, "devices/up/aa_bb", up.Topic("aa_bb"))
	key, ok := up.Key("devices/up/aa_bb_cc_dd_ee_ff")
	assert.True(t, ok)
	assert.Equal(t, "aa_bb_cc_dd_ee_ff", key)
	for _, bad := range []string{"devices/up", "devices/up/x/y", "devices/down/x", "devices/up/"} {
		_, ok := up.Key(bad)
		assert.False(t, ok, bad)
	}
	mid := MustTemplate("fleet/{mac}/up")
	key, ok = mid.Key("fleet/k1/up")
	assert.True(t, ok)
	assert.Equal(t, "k1", key)

	for _, bad := range []string{"", "devices/up", "devices/{mac}/{mac}", "devices/x{mac}", "devices/+/{mac}", "#/{mac}"} {
		_, err := ParseTemplate(bad)
		assert.Error(t, err, bad)
	}
	assert.Error(t, Topics{Uplink: "a/{mac}", Downlink: "a/{mac}"}.Validate())
	assert.Error(t, Topics{Uplink: "a/{mac}", Downlink: "b/{mac}", Shared: []string{"x/+"}}.Validate())
	assert.NoError(t, DefaultTopics().Validate())
	assert.Equal(t, []string{}, Topics{Shared: []string{}}.WithDefaults().Shared, "an explicit empty list stays empty")
}

func TestDeviceIDFromKey(t *testing.T) {
	for _, key := range []string{"AA_BB_CC_DD_EE_FF", "aa-bb-cc-dd-ee-ff", "aabbccddeeff", "AABBCCDDEEFF", "aabb.ccdd.eeff"} {
		for _, allowAny := range []bool{false, true} {
			id, ok := DeviceIDFromKey(key, allowAny)
			assert.True(t, ok, key)
			assert.Equal(t, "aa:bb:cc:dd:ee:ff", id, "%s: every spelling of a MAC is one board", key)
		}
	}
	assert.Equal(t, "aa_bb_cc_dd_ee_ff", TopicKey("aa:bb:cc:dd:ee:ff"))
	_, ok := DeviceIDFromKey("lab-sensor.3", false)
	assert.False(t, ok, "a board named otherwise than by its MAC, unless allowed")
	id, ok := DeviceIDFromKey("lab-sensor.3", true)
	assert.True(t, ok)
	assert.Equal(t, "lab-sensor.3", id)
	_, ok = DeviceIDFromKey("<script>", true)
	assert.False(t, ok)
}

func TestHMACPassword(t *testing.T) {
	// Computed independently with Python's hmac module.
	got := HMACPassword("secret", "GID_test@@@aa_bb_cc_dd_ee_ff@@@u", "user")
	assert.Equal(t, "6+Avl0B8clZNyEbh1NGo3Xzr+CnrRuVRrlKsvg85t3Y=", got)
	assert.NotEqual(t, got, HMACPassword("secret", "GID_test@@@aa_bb_cc_dd_ee_ff@@@u", "other"))
	assert.NotEqual(t, got, HMACPassword("other", "GID_test@@@aa_bb_cc_dd_ee_ff@@@u", "user"))
}

// TestServerHello checks what real boards require of an MQTT server hello:
// transport udp, a session id, and all four udp fields with 16-byte hex
// key and nonce, the nonce being 01 00 0000 <ssrc> 00000000 00000000.
func TestServerHello(t *testing.T) {
	a := &audioSession{id: "sess-1", ssrc: 0x0a0b0c0d, key: randid.Hex16(), nonce: newNonce(0x0a0b0c0d)}
	raw := serverHello(a, "192.168.1.10", 8884)
	var h struct {
		Type, Transport, SessionID string
		Version                    int
		AudioParams                struct {
			SampleRate    int `json:"sample_rate"`
			FrameDuration int `json:"frame_duration"`
		} `json:"audio_params"`
		UDP map[string]any `json:"udp"`
	}
	require.NoError(t, json.Unmarshal(raw, &h))
	assert.Equal(t, "hello", h.Type)
	assert.Equal(t, 3, h.Version)
	assert.Equal(t, "udp", h.Transport)
	assert.Equal(t, 24000, h.AudioParams.SampleRate)
	assert.Equal(t, 60, h.AudioParams.FrameDuration)
	assert.Equal(t, "192.168.1.10", h.UDP["server"])
	assert.EqualValues(t, 8884, h.UDP["port"])
	key, err := hex.DecodeString(h.UDP["key"].(string))
	require.NoError(t, err)
	assert.Len(t, key, 16)
	nonce, err := hex.DecodeString(h.UDP["nonce"].(string))
	require.NoError(t, err)
	assert.Equal(t, []byte{1, 0, 0, 0, 0x0a, 0x0b, 0x0c, 0x0d, 0, 0, 0, 0, 0, 0, 0, 0}, nonce)
	var keys map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(raw, &keys))
	assert.Contains(t, keys, "session_id")
}

func TestUDPCounting(t *testing.T) {
	u := &udpServer{sessions: map[uint32]*audioSession{}}
	a := u.open("s")
	pkt := func(typ byte, ssrc uint32, declared, actual int) []byte {
		p := make([]byte, udpHeaderLen+actual)
		p[0] = typ
		p[2], p[3] = byte(declared>>8), byte(declared)
		p[4], p[5], p[6], p[7] = byte(ssrc>>24), byte(ssrc>>16), byte(ssrc>>8), byte(ssrc)
		p[15] = 1
		return p
	}
	u.count(pkt(1, a.ssrc, 10, 10), nil)
	u.count(pkt(1, a.ssrc, 10, 9), nil)    // length mismatch
	u.count(pkt(2, a.ssrc, 10, 10), nil)   // wrong type
	u.count([]byte{1, 0, 0}, nil)          // short
	u.count(pkt(1, a.ssrc+1, 10, 10), nil) // unknown ssrc
	assert.Equal(t, UDPStats{Packets: 1, Bytes: 10, Malformed: 3, Unknown: 1}, u.stats())
	assert.EqualValues(t, 1, a.packets.Load())
	u.close(a)
	u.count(pkt(1, a.ssrc, 10, 10), nil)
	assert.EqualValues(t, 2, u.stats().Unknown)
}
