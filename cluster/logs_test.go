package cluster

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/policy"
)

// TestRoutedRefusalsAreThrottledAndCut: routed calls the holder's policy
// refuses come from callers on other nodes, as often as they like; a flood
// of them is one line per interval with the count of the rest, and what
// the request said (node, caller, board, tool) is cut in the line.
func TestRoutedRefusalsAreThrottledAndCut(t *testing.T) {
	url := startNATS(t)
	p, err := policy.Parse([]byte("identities:\n  kitchen:\n    boards: [\"*\"]\n    tools: [\"self.get_device_status\"]\n"))
	require.NoError(t, err)
	core, logs := observer.New(zapcore.InfoLevel)
	hub := device.NewHub(device.HubConfig{}, nil)
	n, err := Start(context.Background(), Config{URL: url, NodeID: "b", Auth: fleetAuth, Policy: policy.New(p)}, hub, zap.New(core))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		n.Stop(ctx)
		require.NoError(t, hub.Close(ctx))
	})
	nc := connectAsFleet(t, url)
	defer nc.Close()

	long := strings.Repeat("t", 20_000)
	caller, _ := json.Marshal(caller{Name: "kitchen"})
	data, _ := json.Marshal(callRequest{DeviceID: "bb:00:00:00:00:09", Tool: long})
	call := func() {
		msg := &nats.Msg{Subject: "devicebridge.call.b." + keyFor("bb:00:00:00:00:09"), Data: data, Header: nats.Header{}}
		msg.Header.Set(hdrCaller, string(caller))
		msg.Header.Set(hdrFrom, "a"+long)
		resp, err := nc.RequestMsg(msg, 5*time.Second)
		require.NoError(t, err)
		var r callReply
		require.NoError(t, json.Unmarshal(resp.Data, &r))
		require.NotNil(t, r.Error)
		require.Contains(t, r.Error.Message, "not allowed for kitchen")
	}
	const flood = 20
	const msg = "routed call refused by policy"
	n.denied.SetInterval(time.Hour)
	for range flood {
		call()
	}
	require.Equal(t, 1, logs.FilterMessage(msg).Len(), "one line for a flood of %d", flood)
	n.denied.SetInterval(time.Nanosecond)
	call()
	lines := logs.FilterMessage(msg).All()
	require.Len(t, lines, 2)
	assert.EqualValues(t, flood-1, lines[1].ContextMap()["suppressed"])
	assert.Equal(t, clip.String(long), lines[0].ContextMap()["tool"])
	assert.Equal(t, clip.String("a"+long), lines[0].ContextMap()["from"])
}
