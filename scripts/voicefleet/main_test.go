package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/devicebridge/devicebridge/simulator"
	"github.com/devicebridge/devicebridge/voice/voicestub"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"-transport", "mqtt", "-boards", "7", "-frames", "3", "-bridge-arg=--ota-burst=9", "-bridge-arg=--log-level=error"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "mqtt", o.transport)
	assert.Equal(t, 7, o.boards)
	assert.Equal(t, 60*time.Millisecond, o.pace)
	assert.Equal(t, []string{"--ota-burst=9", "--log-level=error"}, o.bridgeArgs)
	for _, bad := range [][]string{{"-transport", "udp"}, {"-boards", "0"}, {"-frames", "0"}, {"-pace", "0s"},
		{"-protocol-version", "4"}, {"-frame-bytes", "2000"}, {"extra"}} {
		_, err := parseFlags(bad, io.Discard)
		assert.Error(t, err, "%q", bad)
	}
}

func TestParseMetrics(t *testing.T) {
	m, err := parseMetrics(strings.NewReader(`# HELP x
devicebridge_voice_frames_total{direction="up"} 12
devicebridge_boards{state="ready",transport="mqtt"} 3
devicebridge_voice_upstream_errors_total 1e+03
bad line
`))
	require.NoError(t, err)
	assert.Equal(t, map[string]float64{
		`devicebridge_voice_frames_total{direction="up"}`:     12,
		`devicebridge_boards{state="ready",transport="mqtt"}`: 3,
		`devicebridge_voice_upstream_errors_total`:            1000,
	}, m)
}

func TestPayloadIndexes(t *testing.T) {
	const mac = "02:00:00:00:00:01"
	k, ok := uplinkIndex(simulator.DefaultPayload(mac, 17, 120), mac)
	assert.True(t, ok)
	assert.Equal(t, 17, k)
	_, ok = uplinkIndex(simulator.DefaultPayload("02:00:00:00:00:02", 1, 120), mac)
	assert.False(t, ok, "another board's payload")

	k, ok = replyIndex(voicestub.ExpectedReply([][]byte{[]byte("x")}, 42))
	assert.True(t, ok)
	assert.Equal(t, 42, k)
	for _, bad := range []string{"", "tts-", "tts--x", "tts-a-", "opus"} {
		_, ok := replyIndex([]byte(bad))
		assert.False(t, ok, bad)
	}
}

func TestUpstreamView(t *testing.T) {
	const mac = "02:00:00:00:00:01"
	assert.Equal(t, "no upstream connection", upstreamView(nil, mac))
	c := voicestub.Connection{DeviceID: "02:00:00:00:00:01", Status: 101}
	assert.Equal(t, "no listen start", upstreamView([]voicestub.Connection{c}, mac))
	c.Conversations = []voicestub.Conversation{{}}
	assert.Equal(t, "turn never stopped (no listen stop)", upstreamView([]voicestub.Connection{c}, mac))
	c.Conversations = []voicestub.Conversation{{EndedBy: "stop", Answered: true}}
	assert.Equal(t, "answered", upstreamView([]voicestub.Connection{c}, mac))
}

func TestPercentiles(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	assert.Equal(t, 50.0, pct(ds, 0.5))
	assert.Equal(t, 99.0, pct(ds, 0.99))
	assert.Equal(t, 100.0, pct(ds, 1))
	assert.Equal(t, 0.0, pct(nil, 0.5))
}

// TestRunSmoke runs the whole measurement with a few boards on both
// transports: the bridge is built and run as a process, as the script does.
func TestRunSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the bridge")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin, err := buildBridge(ctx, t.TempDir())
	require.NoError(t, err)
	for _, tr := range []string{"ws", "mqtt"} {
		t.Run(tr, func(t *testing.T) {
			o, err := parseFlags([]string{"-transport", tr, "-boards", "3", "-frames", "4", "-pace", "10ms", "-spread", "0s",
				"-bridge", bin, "-log-dir", t.TempDir()}, io.Discard)
			require.NoError(t, err)
			res, err := run(ctx, o, io.Discard)
			require.NoError(t, err)
			assert.Equal(t, 3, res.Connected)
			assert.Equal(t, 3, res.ConversationsOK, "failures: %v", res.Failures)
			assert.Equal(t, 12, res.UplinkSent)
			assert.Equal(t, 12, res.UplinkHeard)
			assert.Equal(t, 12, res.DownlinkSent)
			assert.Equal(t, 0, res.DownlinkLost)
			assert.Zero(t, res.UplinkMismatch+res.DownlinkMismatch+res.DownlinkUnstamped)
			// MQTT: a last frame can lose the race with tts stop (two paths).
			assert.GreaterOrEqual(t, res.DownlinkPlayed, 12-res.DownlinkAfterStop)
			assert.Positive(t, res.LatP50)
			assert.Equal(t, int64(3), res.RelayOpened)
		})
	}
}
