package mqtt_test

import (
	"context"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/mqtt"
	"github.com/devicebridge/devicebridge/mqtt/broker"
	"github.com/devicebridge/devicebridge/mqtt/mosquittotest"
	"github.com/devicebridge/devicebridge/simulator"
)

// rawBoard connects a bare MQTT client under clientID, without automatic
// reconnects (a simulated board would reconnect after being replaced, and
// the two would take turns). It does not answer MCP.
func rawBoard(t *testing.T, url, clientID string) paho.Client {
	t.Helper()
	c := paho.NewClient(paho.NewClientOptions().AddBroker(url).SetClientID(clientID).SetProtocolVersion(4).
		SetCleanSession(true).SetAutoReconnect(false).SetConnectTimeout(wait))
	tok := c.Connect()
	require.True(t, tok.WaitTimeout(wait), clientID)
	require.NoError(t, tok.Error(), "%s was refused", clientID)
	t.Cleanup(func() { c.Disconnect(0) })
	return c
}

// TestEmbeddedMACSpellingsAreOneBoard: a client id naming a connected
// board's MAC in another spelling (separators, none, upper case; in the
// GID@@@mac@@@uuid form or, where plain ids are allowed, alone) is that
// board connecting again: it replaces the live connection under the
// canonical id instead of becoming a second board beside it.
func TestEmbeddedMACSpellingsAreOneBoard(t *testing.T) {
	br := startEmbedded(t, options{broker: func(c *broker.Config) { c.Auth.AllowAnyClientID = true },
		gateway: func(c *mqtt.Config) { c.AllowAnyDeviceID = true }})
	const mac = "02:00:00:00:0b:01"
	rawBoard(t, br.endpoint(), "GID_test@@@02_00_00_00_0b_01@@@5b1c0f4e-0000-4000-8000-000000000000")
	require.Eventually(t, func() bool { _, ok := br.hub.Session(mac); return ok }, wait, tick)
	prev, _ := br.hub.Session(mac)
	for _, clientID := range []string{
		"GID_test@@@02-00-00-00-0B-01@@@5b1c0f4e-0000-4000-8000-000000000001",
		"GID_test@@@020000000b01",
		"GID_test@@@02_00_00_00_0B_01@@@5b1c0f4e-0000-4000-8000-000000000002",
		"020000000B01",
		"02-00-00-00-0b-01",
		"0200.0000.0b01",
	} {
		rawBoard(t, br.endpoint(), clientID)
		var cur *device.Session
		require.Eventually(t, func() bool {
			s, ok := br.hub.Session(mac)
			cur = s
			return ok && s != prev
		}, wait, tick, "%s did not take over the board", clientID)
		select {
		case <-prev.Done():
		case <-time.After(wait):
			t.Fatalf("%s: the connection it replaced is still open", clientID)
		}
		require.Equal(t, []string{mac}, deviceIDs(br.hub), "%s sits beside the board", clientID)
		assert.Equal(t, mac, cur.Info().DeviceID)
		assert.Len(t, br.broker.Boards(), 1, "%s: the broker holds one connection per board", clientID)
		prev = cur
	}
	// A real board under a spelled-otherwise client id is served as the
	// board, calls included.
	b := newBoard(t, simulator.Config{MAC: mac})
	br.connect(b, simulator.MQTTConfig{ClientID: "GID_test@@@02-00-00-00-0B-01@@@" + b.ClientID()})
	info := br.waitReady(mac)
	assert.Equal(t, b.ClientID(), info.ClientID)
	br.mustCall("02_00_00_00_0B_01", "self.audio_speaker.set_volume", map[string]any{"volume": 12})
	assert.Equal(t, 12, b.State()["audio_speaker.volume"])
	require.Equal(t, []string{mac}, deviceIDs(br.hub))
}

func deviceIDs(hub *device.Hub) []string {
	var ids []string
	for _, d := range hub.Devices() {
		ids = append(ids, d.DeviceID)
	}
	return ids
}

// TestMosquittoTopicKeysNameBoards: on an external broker the uplink topic
// names the board. Another spelling of a connected board's MAC is that
// board, not a second one; a key that is not a MAC is dropped (counted and
// logged) unless plain ids are allowed.
func TestMosquittoTopicKeysNameBoards(t *testing.T) {
	mq := mosquittotest.Start(t)
	br := startExternal(t, mq.URL(), options{})
	br.waitSubscribed()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	hello := []byte(`{"type":"hello","version":3,"transport":"udp","features":{"mcp":true},"audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`)

	const mac = "02:00:00:00:0c:01"
	real := newBoard(t, simulator.Config{MAC: mac})
	rc := br.connect(real, simulator.LegacyMQTTConfig(mq.URL()))
	require.NoError(t, rc.OpenAudioChannel(ctx))
	br.waitReady(mac)
	require.EqualValues(t, 1, br.gw.Stats().Hellos)

	impostor := newBoard(t, simulator.Config{MAC: "02:00:00:00:0c:02"})
	ic := br.connect(impostor, simulator.MQTTConfig{Endpoint: mq.URL(), Legacy: true,
		PublishTopic: "devices/up/02-00-00-00-0C-01", SubscribeTopic: "devices/p2p/02-00-00-00-0C-01"})
	for _, key := range []string{"02-00-00-00-0C-01", "020000000c01"} {
		require.NoError(t, ic.PublishRaw(ctx, "devices/up/"+key, hello))
	}
	// Both hellos were answered (the gateway counts a hello once it has
	// replied), so both were routed somewhere by now.
	require.Eventually(t, func() bool { return br.gw.Stats().Hellos == 3 }, wait, tick)
	require.Equal(t, []string{mac}, deviceIDs(br.hub), "a MAC spelled otherwise is the same board")

	require.NoError(t, ic.PublishRaw(ctx, "devices/up/kitchen", hello))
	require.Eventually(t, func() bool { return br.gw.Stats().UnknownTopic == 1 }, wait, tick, "a non-MAC key is dropped")
	_, ok := br.hub.Session("kitchen")
	assert.False(t, ok)
	require.Equal(t, []string{mac}, deviceIDs(br.hub))

	// Allowed, a plain key names a board of its own.
	open := startExternal(t, mq.URL(), options{gateway: func(c *mqtt.Config) { c.AllowAnyDeviceID = true }})
	open.waitSubscribed()
	require.NoError(t, ic.PublishRaw(ctx, "devices/up/kitchen", hello))
	require.Eventually(t, func() bool { _, ok := open.hub.Session("kitchen"); return ok }, wait, tick)
}
