package mqtt

import (
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/envelope"
)

// Hellos as real firmware publishes them (firmware-protocol.md §5.4): the
// current form, with server AEC, without a font, from a board without MCP,
// and what an older or confused client might send.
var helloSeeds = []string{
	`{"type":"hello","version":3,"transport":"udp","features":{"mcp":true,"glyph_push":true},"text_font":{"bundle":"noto-v1","charset":"basic","size":14,"bpp":1},"audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`,
	`{"type":"hello","version":3,"transport":"udp","features":{"aec":true,"mcp":true},"audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`,
	`{"type":"hello","version":3,"transport":"udp","audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`,
	`{"type":"hello","version":1,"transport":"websocket","features":{"mcp":true},"audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`,
	`{"type":"hello","version":"3","transport":"udp"}`,
	`{"type":"hello","version":3,"transport":"udp","features":{"mcp":"yes"}}`,
	`{"session_id":"","type":"hello","version":3,"transport":"udp","features":{"mcp":true,},}`,
	`{"type":"hello"}`,
	`{"session_id":"S","type":"goodbye"}`,
	`{"type":"hello","version":3,"transport":"udp","audio_params":null}`,
}

// FuzzMQTTHello feeds arbitrary uplink payloads through the MQTT path's
// hello handling: decode the envelope as the link does, and parse a hello
// out of it. Nothing may panic, and a hello that is accepted must be the
// one the MQTT firmware sends (version 3 over udp), since the bridge
// answers it with UDP parameters only such a board understands.
func FuzzMQTTHello(f *testing.F) {
	for _, s := range helloSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		env, err := envelope.Decode(data, envelope.DefaultMaxMessageSize)
		if err != nil || env.Type != envelope.TypeHello {
			return
		}
		h, err := parseHello(env)
		if err != nil {
			return
		}
		if h.Version != 3 || h.Transport != "udp" {
			t.Fatalf("accepted a hello that is not version 3 over udp: %+v from %q", h, data)
		}
		// The answer must be one the firmware's ParseServerHello accepts.
		checkServerHello(t, serverHello(&audioSession{id: "s", ssrc: 7, key: strings.Repeat("ab", 16), nonce: newNonce(7)}, "10.0.0.1", 8884))
	})
}

// checkServerHello applies the firmware's checks (§5.5) to a server hello.
func checkServerHello(t *testing.T, msg []byte) {
	t.Helper()
	var h struct {
		Transport string `json:"transport"`
		UDP       *struct {
			Server string `json:"server"`
			Port   int    `json:"port"`
			Key    string `json:"key"`
			Nonce  string `json:"nonce"`
		} `json:"udp"`
	}
	if err := json.Unmarshal(msg, &h); err != nil {
		t.Fatalf("server hello is not JSON: %v", err)
	}
	if h.Transport != "udp" || h.UDP == nil || h.UDP.Server == "" || h.UDP.Port < 1 || h.UDP.Port > 65535 {
		t.Fatalf("server hello boards would ignore: %s", msg)
	}
	for _, x := range []string{h.UDP.Key, h.UDP.Nonce} {
		if b, err := hex.DecodeString(x); err != nil || len(b) != 16 {
			t.Fatalf("udp key/nonce %q is not 16 hex bytes: %s", x, msg)
		}
	}
}

// FuzzTopics feeds arbitrary topics, templates and client ids through the
// topic parsers. Nothing may panic; whatever is accepted must round-trip:
// a key read from a topic renders back to that topic, a device id read from
// a key or a client id maps to a key that maps back to it, and a parsed
// template holds {mac} exactly where Key finds it.
func FuzzTopics(f *testing.F) {
	for _, s := range [][3]string{
		{"devices/up/aa_bb_cc_dd_ee_ff", "devices/up/{mac}", "GID_test@@@aa_bb_cc_dd_ee_ff@@@1f0a2b3c-uuid"},
		{"devices/p2p/AA_BB_CC_DD_EE_FF", "devices/p2p/{mac}", "GID_test@@@AA_BB_CC_DD_EE_FF"},
		{"device-server", "{mac}", "GID_x@@@aa:bb:cc:dd:ee:ff@@@u"},
		{"devices/up/sensor-17", "a/{mac}/b", "sensor-17"},
		{"devices/up/", "devices/up/{mac}/", "GID_test@@@aa_bb_cc_dd_ee_ff@@@"},
		{"devices/up/+", "devices/{mac}{mac}", "@@@aa_bb_cc_dd_ee_ff@@@u"},
		{"//", "devices/#/{mac}", "has/slash"},
	} {
		f.Add(s[0], s[1], s[2], true)
		f.Add(s[0], s[1], s[2], false)
	}
	f.Fuzz(func(t *testing.T, topic, tmpl, clientID string, allowPlain bool) {
		for _, tm := range []Template{MustTemplate(DefaultUplink), MustTemplate(DefaultDownlink)} {
			checkKey(t, tm, topic)
		}
		if tm, err := ParseTemplate(tmpl); err == nil {
			checkKey(t, tm, topic)
			if strings.Count(tmpl, macPlaceholder) != 1 || strings.ContainsAny(tmpl, "+#") {
				t.Fatalf("accepted template %q", tmpl)
			}
			if key, ok := tm.Key(tm.Topic("k")); !ok || key != "k" {
				t.Fatalf("template %q: Key(Topic(k)) = %q, %v", tmpl, key, ok)
			}
		}
		if ci, err := ParseClientID(clientID, allowPlain); err == nil {
			if ci.Key != TopicKey(ci.DeviceID) {
				t.Fatalf("client id %q: key %q is not the topic key of %q", clientID, ci.Key, ci.DeviceID)
			}
			if id, ok := DeviceIDFromKey(ci.Key, allowPlain); !ok || id != ci.DeviceID {
				t.Fatalf("client id %q: key %q maps to %q, %v, not %q", clientID, ci.Key, id, ok, ci.DeviceID)
			}
			if strings.ContainsAny(ci.Key, "/+#") {
				t.Fatalf("client id %q gives key %q, which breaks a topic level", clientID, ci.Key)
			}
		}
	})
}

// checkKey: a key read from a topic is one whole, non-empty level, renders
// back to the same topic, and names a device whose key maps back to it.
func checkKey(t *testing.T, tm Template, topic string) {
	t.Helper()
	key, ok := tm.Key(topic)
	if !ok {
		return
	}
	if key == "" || strings.Contains(key, "/") {
		t.Fatalf("topic %q: key %q is not one level", topic, key)
	}
	if back := tm.Topic(key); back != topic {
		t.Fatalf("topic %q: key %q renders back as %q", topic, key, back)
	}
	if id, ok := DeviceIDFromKey(key, false); ok {
		if _, mac := device.CanonicalMAC(id); !mac || id != device.NormalizeID(id) {
			t.Fatalf("topic %q: key %q names %q, which is not a canonical MAC", topic, key, id)
		}
	}
	id, ok := DeviceIDFromKey(key, true)
	if !ok {
		return
	}
	if again, ok := DeviceIDFromKey(TopicKey(id), true); !ok || again != id {
		t.Fatalf("topic %q: device id %q does not survive its topic key %q (%q, %v)", topic, id, TopicKey(id), again, ok)
	}
}
