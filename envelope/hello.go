package envelope

import (
	"encoding/json"
	"fmt"
)

// Features is the "features" object of a device hello.
type Features struct {
	AEC       bool `json:"aec,omitempty"`
	MCP       bool `json:"mcp"`
	GlyphPush bool `json:"glyph_push,omitempty"`
}

// AudioParams describes an Opus stream.
type AudioParams struct {
	Format        string `json:"format,omitempty"`
	SampleRate    int    `json:"sample_rate,omitempty"`
	Channels      int    `json:"channels,omitempty"`
	FrameDuration int    `json:"frame_duration,omitempty"`
}

// DeviceHello is the first message a board sends on a new audio channel.
// Over WebSocket its version is the binary protocol version (1..3); over
// MQTT it is always 3 with transport "udp".
type DeviceHello struct {
	Type        string       `json:"type"`
	Version     int          `json:"version"`
	Transport   string       `json:"transport"`
	Features    Features     `json:"features"`
	AudioParams *AudioParams `json:"audio_params,omitempty"`
}

// ParseDeviceHello extracts a device hello from a decoded envelope.
func ParseDeviceHello(env Envelope) (DeviceHello, error) {
	if env.Type != TypeHello {
		return DeviceHello{}, fmt.Errorf("envelope: expected hello, got type %q", env.Type)
	}
	var h DeviceHello
	if err := json.Unmarshal(env.Raw, &h); err != nil {
		return DeviceHello{}, fmt.Errorf("%w: hello: %v", ErrMalformed, err)
	}
	return h, nil
}

// UDPParams is the "udp" object of an MQTT server hello. Key and Nonce are
// 32 hex digits (16 bytes) each; boards reject anything else.
type UDPParams struct {
	Server     string `json:"server"`
	Port       int    `json:"port"`
	Encryption string `json:"encryption"`
	Key        string `json:"key"`
	Nonce      string `json:"nonce"`
}

// ServerHello is the bridge's answer to a device hello. Transport must always
// be set: a WebSocket board dereferences it unchecked and crashes without it.
type ServerHello struct {
	Type        string       `json:"type"`
	Version     int          `json:"version,omitempty"`
	Transport   string       `json:"transport"`
	SessionID   string       `json:"session_id"`
	AudioParams *AudioParams `json:"audio_params,omitempty"`
	UDP         *UDPParams   `json:"udp,omitempty"`
}

// DownlinkAudio is what the bridge declares for its (future) TTS stream:
// boards size their decoder from it.
var DownlinkAudio = AudioParams{Format: "opus", SampleRate: 24000, Channels: 1, FrameDuration: 60}

// Marshal renders the hello; it panics only on programmer error (a hello
// without transport), because sending one would crash real boards.
func (h ServerHello) Marshal() []byte {
	if h.Transport == "" {
		panic("envelope: server hello without transport crashes boards")
	}
	h.Type = TypeHello
	b, err := json.Marshal(h)
	if err != nil {
		panic(err)
	}
	return b
}
