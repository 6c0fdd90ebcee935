package device_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/device"
)

// Voice events are activity, like calls: only subscriptions that ask for
// activity get them, so the MCP catalogue's subscription is never woken
// by conversations.
func TestVoiceEventsAreActivity(t *testing.T) {
	h := device.NewHub(device.HubConfig{}, nil)
	defer func() { _ = h.Close(context.Background()) }()
	plain := h.Subscribe()
	defer plain.Close()
	activity := h.SubscribeWith(device.SubscribeOptions{Calls: true})
	defer activity.Close()
	h.PublishVoice("aa:bb:cc:dd:ee:ff", device.VoiceNote{Kind: "failed", Transport: "websocket", Reason: "refused"})
	<-activity.C()
	evs := activity.Next()
	require.Len(t, evs, 1)
	assert.Equal(t, device.EventVoice, evs[0].Type)
	assert.Equal(t, "voice", evs[0].Type.String())
	assert.Equal(t, "failed", evs[0].Voice.Kind)
	assert.Equal(t, "aa:bb:cc:dd:ee:ff", evs[0].DeviceID)
	select {
	case <-plain.C():
		t.Fatalf("a plain subscription got %v", plain.Next())
	default:
	}
}
