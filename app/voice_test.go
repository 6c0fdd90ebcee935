package app

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/devicebridge/devicebridge/simulator"
	"github.com/devicebridge/devicebridge/voice/voicestub"
)

// startStub runs the stand-in voice server on loopback.
func startStub(t *testing.T, mutate func(*voicestub.Config)) *voicestub.Server {
	t.Helper()
	cfg := voicestub.Config{Tokens: []string{"upstream-token"}, TTSFrames: 4, AutoFrames: 5,
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))}
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := voicestub.New(cfg)
	require.NoError(t, err)
	require.NoError(t, s.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func voiceBridge(t *testing.T, stub *voicestub.Server, mutate func(*Config)) *App {
	return startBridge(t, func(c *Config) {
		c.Voice.Upstream = stub.URL()
		c.Voice.Token = "upstream-token"
		c.MCP.Enabled = true
		if mutate != nil {
			mutate(c)
		}
	})
}

func wsBoard(t *testing.T, a *App, mac string, version int) *simulator.Board {
	t.Helper()
	b, err := simulator.NewBoard(simulator.Config{MAC: mac, Profile: loadProfile(t, "breadboard"), ProtocolVersion: version,
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), mqttWait)
	defer cancel()
	require.NoError(t, b.ConnectWebSocket(ctx, a.DeviceURL()))
	return b
}

// converse holds one conversation and checks what both ends got, byte for
// byte: the upstream heard the board's frames, the board heard the
// upstream's answer.
func converse(t *testing.T, b *simulator.Board, stub *voicestub.Server, version int, pace time.Duration) {
	t.Helper()
	const frames = 5
	sent := make([][]byte, frames)
	for k := range sent {
		sent[k] = simulator.DefaultPayload(b.MAC(), k, 200+k)
	}
	ctx, cancel := context.WithTimeout(context.Background(), mqttWait)
	defer cancel()
	conv, err := b.Converse(ctx, simulator.ConverseOptions{Frames: frames, Payload: func(k int) []byte { return sent[k] },
		Mode: simulator.ModeAuto, WakeWord: "hello xiaozhi", DecodeQueue: -1, Pace: pace})
	require.NoError(t, err)
	assert.Equal(t, []string{fmt.Sprintf("heard %d frames", frames)}, conv.STT)
	assert.Equal(t, []string{fmt.Sprintf("You said %d frames.", frames)}, conv.Sentences)
	got := conv.Payloads()
	require.Len(t, got, 4)
	for k := range got {
		assert.Equal(t, voicestub.ExpectedReply(sent, k), got[k], "downlink frame %d", k)
	}
	conns := stub.Device(b.MAC())
	require.NotEmpty(t, conns)
	last := conns[len(conns)-1]
	assert.Equal(t, version, last.ProtocolVersion)
	require.GreaterOrEqual(t, len(last.Payloads), frames)
	assert.Equal(t, sent, last.Payloads[len(last.Payloads)-frames:], "uplink payloads as the board sent them")
	assert.Contains(t, last.WakeWords, "hello xiaozhi")
}

// From a fresh clone, as docs/voice.md runs it: the stand-in voice server
// is the upstream, boards over WebSocket (each framing version) and over
// MQTT hold conversations with it through the bridge, and their tools stay
// on /mcp.
func TestVoiceRelayBothTransports(t *testing.T) {
	leakCheck(t)
	stub := startStub(t, nil)
	a := voiceBridge(t, stub, nil)
	api := apiOf(t, a)
	for v := 1; v <= 3; v++ {
		t.Run(fmt.Sprintf("websocket v%d", v), func(t *testing.T) {
			mac := fmt.Sprintf("0a:00:00:00:00:0%d", v)
			b := wsBoard(t, a, mac, v)
			api.waitReady(mac)
			converse(t, b, stub, v, 0)
			assert.True(t, stub.Device(mac)[0].HasAuthorization)
		})
	}
	t.Run("mqtt", func(t *testing.T) {
		mac := "0a:00:00:00:00:10"
		b := newBoard(t, mac, "breadboard")
		connectMQTT(t, a, b, simulator.MQTTConfig{})
		api.waitReady(mac)
		// Real time: over MQTT, JSON and audio travel apart (broker and
		// UDP), and a board speaking faster than real time could have its
		// first frames reach the upstream before its listen start.
		converse(t, b, stub, 1, 60*time.Millisecond)
	})
	st := a.voice.Stats()
	assert.GreaterOrEqual(t, st.Opened, int64(4))
	assert.Zero(t, st.UpstreamErrors)
}

// One board, two MCP clients at once: the upstream's fixed small ids and
// the bridge's own never mix up replies, and the board still runs one call
// at a time.
func TestVoiceSharedMCP(t *testing.T) {
	leakCheck(t)
	stub := startStub(t, nil)
	a := voiceBridge(t, stub, nil)
	mac := "0a:00:00:00:00:21"
	wsBoard(t, a, mac, 1)
	apiOf(t, a).waitReady(mac)
	ctx, cancel := context.WithTimeout(context.Background(), mqttWait)
	defer cancel()
	require.NoError(t, stub.WaitTools(ctx, mac))
	// The upstream sees the board's tools as the board lists them.
	tools := stub.Device(mac)[0].Tools
	assert.NotEmpty(t, tools)

	// The bridge's side goes through the control API, the same Hub call
	// path /mcp uses.
	api := apiOf(t, a)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 8 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for j := range 4 {
				vol := 10 + i*10 + j
				res, err := stub.CallTool(ctx, mac, "self.audio_speaker.set_volume", map[string]any{"volume": vol})
				if err != nil {
					errs <- fmt.Errorf("upstream call: %w", err)
					return
				}
				if !json.Valid(res) {
					errs <- fmt.Errorf("upstream got %s", res)
				}
			}
		}()
		go func() {
			defer wg.Done()
			for range 4 {
				if code, body := api.call(mac, "self.audio_speaker.set_volume", map[string]any{"volume": 50}); code != 200 {
					errs <- fmt.Errorf("bridge call: %d %s", code, body)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Each side's reply matched its own request: a status call from the
	// upstream reads back what it just set.
	_, err := stub.CallTool(ctx, mac, "self.audio_speaker.set_volume", map[string]any{"volume": 77})
	require.NoError(t, err)
	res, err := stub.CallTool(ctx, mac, "self.get_device_status", nil)
	require.NoError(t, err)
	assert.Contains(t, string(res), `\"volume\":77`)
	assert.Positive(t, a.voice.Stats().MCPRequests)
}

// The upstream down: the board is answered by the bridge itself and told
// the conversation failed; its tools stay; the next conversation tries
// again and works once the upstream is back.
func TestVoiceUpstreamDown(t *testing.T) {
	leakCheck(t)
	stub := startStub(t, nil)
	stub.SetFaults(voicestub.Faults{RefuseUpgrade: true})
	a := voiceBridge(t, stub, func(c *Config) { c.Voice.RetryAfter = 50 * time.Millisecond })
	api := apiOf(t, a)

	t.Run("websocket", func(t *testing.T) {
		mac := "0a:00:00:00:00:31"
		b := wsBoard(t, a, mac, 1)
		api.waitReady(mac)
		code, _ := api.call(mac, "self.get_device_status", nil)
		assert.Equal(t, 200, code, "tools work without the voice upstream")
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		conv, err := b.Converse(ctx, simulator.ConverseOptions{Frames: 2, ReplyTimeout: time.Second})
		require.Error(t, err)
		require.NotNil(t, conv)
		require.NotEmpty(t, conv.Alerts, "the board is told")
		assert.Equal(t, "sad", conv.Alerts[0].Emotion)
	})
	t.Run("mqtt", func(t *testing.T) {
		mac := "0a:00:00:00:00:32"
		b := newBoard(t, mac, "breadboard")
		connectMQTT(t, a, b, simulator.MQTTConfig{})
		api.waitReady(mac)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		// The bridge answers the hello itself, shows the alert and ends
		// the channel with a goodbye: the board is back to idle at once.
		_, err := b.Converse(ctx, simulator.ConverseOptions{Frames: 2, ReplyTimeout: time.Second})
		require.Error(t, err)
		eventually(t, "the alert shown", func() error {
			if al, ok := b.LastAlert(); !ok || al.Emotion != "sad" {
				return fmt.Errorf("no alert: %+v", al)
			}
			return nil
		})
		code, _ := api.call(mac, "self.get_device_status", nil)
		assert.Equal(t, 200, code, "an MQTT board stays connected")
		// The upstream comes back: the next conversation goes through.
		stub.SetFaults(voicestub.Faults{})
		eventually(t, "a conversation after the upstream is back", func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			conv, err := b.Converse(ctx, simulator.ConverseOptions{Frames: 5, DecodeQueue: -1, Pace: 60 * time.Millisecond})
			if err != nil {
				return err
			}
			if len(conv.STT) == 0 {
				return fmt.Errorf("no stt")
			}
			return nil
		})
	})
	assert.Positive(t, a.voice.Stats().UpstreamErrors)
	var ready struct {
		Checks []struct {
			Name     string `json:"name"`
			Degraded string `json:"degraded"`
		} `json:"checks"`
	}
	_, _ = api.get("/readyz", &ready)
	_ = ready
}
