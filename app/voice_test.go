package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
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
func converse(t *testing.T, b *simulator.Board, stub *voicestub.Server, version int, pace time.Duration, lossy bool) {
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
	if !lossy {
		require.Len(t, got, 4)
		for k := range got {
			assert.Equal(t, voicestub.ExpectedReply(sent, k), got[k], "downlink frame %d", k)
		}
	} else {
		// Over MQTT+UDP the board may drop the first frames when its tts
		// start comes late through the broker (as real boards do): what it
		// played is the upstream's frames, byte for byte, in order.
		require.NotEmpty(t, got)
		k := 0
		for _, p := range got {
			for k < 4 && !bytes.Equal(voicestub.ExpectedReply(sent, k), p) {
				k++
			}
			require.Less(t, k, 4, "downlink frame %q is none of the upstream's, or out of order", p)
			k++
		}
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
	// Audio paced as a real server sends it.
	stub := startStub(t, func(c *voicestub.Config) { c.Pace = 60 * time.Millisecond })
	a := voiceBridge(t, stub, nil)
	api := apiOf(t, a)
	for v := 1; v <= 3; v++ {
		t.Run(fmt.Sprintf("websocket v%d", v), func(t *testing.T) {
			mac := fmt.Sprintf("0a:00:00:00:00:0%d", v)
			b := wsBoard(t, a, mac, v)
			api.waitReady(mac)
			converse(t, b, stub, v, 0, false)
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
		converse(t, b, stub, 1, 60*time.Millisecond, true)
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

	cs, err := mcp.NewClient(&mcp.Implementation{Name: "voice-test", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: "http://" + a.ControlAddr().String() + "/mcp", MaxRetries: -1}, nil)
	require.NoError(t, err)
	defer cs.Close()
	var setVolume string
	eventually(t, "the bridge publishes the board's set_volume", func() error {
		list, err := cs.ListTools(ctx, nil)
		if err != nil {
			return err
		}
		for _, tl := range list.Tools {
			if strings.HasSuffix(tl.Name, "set_volume") {
				setVolume = tl.Name
				return nil
			}
		}
		return fmt.Errorf("set_volume not among %d tools", len(list.Tools))
	})
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
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: setVolume, Arguments: map[string]any{"volume": 50}})
				if err != nil || res.IsError {
					errs <- fmt.Errorf("bridge call: %v %+v", err, res)
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
	_, err = stub.CallTool(ctx, mac, "self.audio_speaker.set_volume", map[string]any{"volume": 77})
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

func wsBoardWith(t *testing.T, a *App, cfg simulator.Config) *simulator.Board {
	t.Helper()
	cfg.Profile = loadProfile(t, "breadboard")
	cfg.Logger = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	b, err := simulator.NewBoard(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), mqttWait)
	defer cancel()
	require.NoError(t, b.ConnectWebSocket(ctx, a.DeviceURL()))
	return b
}

// A board that drops mid-conversation ends its upstream conversation too:
// nothing stays open on either side.
func TestVoiceBoardLeavesMidConversation(t *testing.T) {
	leakCheck(t)
	stub := startStub(t, func(c *voicestub.Config) { c.TTSFrames = 200; c.Pace = 60 * time.Millisecond })
	a := voiceBridge(t, stub, nil)
	mac := "0a:00:00:00:00:41"
	b := wsBoard(t, a, mac, 1)
	apiOf(t, a).waitReady(mac)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = b.Converse(ctx, simulator.ConverseOptions{Frames: 5})
	}()
	eventually(t, "the board speaking", func() error {
		if s := b.AudioState(); s != "speaking" {
			return fmt.Errorf("board is %s", s)
		}
		return nil
	})
	require.NoError(t, b.Close())
	cancel()
	<-done
	eventually(t, "the conversation ended on both sides", func() error {
		if st := a.voice.Stats(); st.Active != 0 {
			return fmt.Errorf("%d conversations still open", st.Active)
		}
		for _, c := range stub.Device(mac) {
			if !c.Closed {
				return fmt.Errorf("upstream connection %d still open", c.ID)
			}
		}
		return nil
	})
}

// The upstream going away in the middle of its own tool call: the call
// the board is running ends as the board ends it, the bridge's calls go on,
// and the board's next conversation reaches the upstream again.
func TestVoiceUpstreamClosesMidCall(t *testing.T) {
	leakCheck(t)
	stub := startStub(t, nil)
	a := voiceBridge(t, stub, func(c *Config) { c.Voice.RetryAfter = 10 * time.Millisecond })
	mac := "0a:00:00:00:00:42"
	release := make(chan struct{})
	b := wsBoardWith(t, a, simulator.Config{MAC: mac, Hold: map[string]<-chan struct{}{"self.lamp.turn_on": release}})
	api := apiOf(t, a)
	api.waitReady(mac)
	ctx, cancel := context.WithTimeout(context.Background(), mqttWait)
	defer cancel()
	require.NoError(t, stub.WaitTools(ctx, mac))
	callErr := make(chan error, 1)
	go func() {
		_, err := stub.CallTool(ctx, mac, "self.lamp.turn_on", nil)
		callErr <- err
	}()
	eventually(t, "the upstream's call on the board", func() error {
		if s, ok := a.Hub.Session(mac); !ok || s.Pending() == 0 {
			return fmt.Errorf("nothing pending")
		}
		return nil
	})
	require.Equal(t, 1, stub.Disconnect(mac))
	require.Error(t, <-callErr)
	close(release)
	code, body := api.call(mac, "self.get_device_status", nil)
	require.Equal(t, 200, code, body)
	eventually(t, "the old conversation gone", func() error {
		if st := a.voice.Stats(); st.Active != 0 {
			return fmt.Errorf("%d open", st.Active)
		}
		return nil
	})
	// The board still holds its socket; its next conversation opens a new
	// upstream conversation and gets the new hello.
	conv, err := b.Converse(ctx, simulator.ConverseOptions{Frames: 5, DecodeQueue: -1})
	require.NoError(t, err)
	assert.Equal(t, []string{"heard 5 frames"}, conv.STT)
	conns := stub.Device(mac)
	require.Len(t, conns, 2)
	assert.Equal(t, conns[1].SessionID, b.SessionID(), "the board took the new upstream session")
}

// An upstream that stops reading for a while: the relay holds a bounded
// queue and drops the audio past it (as a board drops audio it cannot play
// in time), keeps the conversation's messages and their order, and the
// board keeps its tools; once the upstream reads again the turn completes
// with what was relayed.
func TestVoiceUpstreamSlow(t *testing.T) {
	leakCheck(t)
	stub := startStub(t, func(c *voicestub.Config) { c.AutoFrames = 100000 })
	stub.SetFaults(voicestub.Faults{StallAfter: 1, StallFor: time.Second})
	a := voiceBridge(t, stub, func(c *Config) { c.Voice.QueueFrames = 4 })
	mac := "0a:00:00:00:00:43"
	b := wsBoard(t, a, mac, 1)
	api := apiOf(t, a)
	api.waitReady(mac)
	ctx, cancel := context.WithTimeout(context.Background(), mqttWait)
	defer cancel()
	const frames = 3000
	conv, err := b.Converse(ctx, simulator.ConverseOptions{Frames: frames, FrameBytes: 1400, Mode: simulator.ModeManual,
		DecodeQueue: -1, ReplyTimeout: 10 * time.Second})
	require.NoError(t, err)
	st := a.voice.Stats()
	assert.Positive(t, st.DroppedUp, "audio past the queue is dropped")
	assert.Equal(t, int64(frames), st.FramesUp+st.DroppedUp, "every frame relayed or counted as dropped")
	require.Len(t, conv.STT, 1)
	assert.Equal(t, fmt.Sprintf("heard %d frames", st.FramesUp), conv.STT[0], "the upstream heard exactly what was relayed")
	code, body := api.call(mac, "self.get_device_status", nil)
	assert.Equal(t, 200, code, body)
}
