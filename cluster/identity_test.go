package cluster

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/natstest"
)

// TestMACSpellingsAreOneBoardAcrossNodes: a board attached on another node
// under another spelling of its MAC is the same board: it replaces the
// connection the first node holds.
func TestMACSpellingsAreOneBoardAcrossNodes(t *testing.T) {
	url := startNATS(t)
	a, b := startNode(t, url, "a"), startNode(t, url, "b")
	old := a.attach(t, "cc:00:00:00:0f:01", nil)
	require.Eventually(t, func() bool { return readyIDs(b.hub)["cc:00:00:00:0f:01"] == "a" }, 10*time.Second, 20*time.Millisecond)

	b.attach(t, "CC-00-00-00-0F-01", nil)
	select {
	case <-old.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the connection on node a was not replaced by the same MAC spelled otherwise on node b")
	}
	require.ErrorIs(t, old.Err(), device.ErrReplaced)
	require.Eventually(t, func() bool {
		ids := readyIDs(a.hub)
		return len(ids) == 1 && ids["cc:00:00:00:0f:01"] == "b"
	}, 10*time.Second, 20*time.Millisecond)
}

// TestDirectoryRecordsMatchTheirKeys: a directory record names its board
// in canonical form, and one filed under another board's key is ignored.
func TestDirectoryRecordsMatchTheirKeys(t *testing.T) {
	url := startNATS(t)
	a, _ := startNode(t, url, "a"), startNode(t, url, "b")
	nc, err := nats.Connect(url, nats.UserInfo(natstest.User, natstest.Password))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := js.KeyValue(context.Background(), DefaultPrefix+"_boards")
	require.NoError(t, err)
	put := func(key, id string) {
		data, err := json.Marshal(Record{Node: "b", DeviceID: id, Transport: "websocket", State: "ready", ConnectedAt: time.Now()})
		require.NoError(t, err)
		_, err = kv.Put(context.Background(), key, data)
		require.NoError(t, err)
	}
	put(keyFor("cc:00:00:00:0f:02"), "CC-00-00-00-0F-02")
	put(keyFor("cc:00:00:00:0f:03"), "cc:00:00:00:0f:04") // filed under another board's key
	put(keyFor("cc:00:00:00:0f:05"), "cc:00:00:00:0f:05") // the watcher reads in order: once this shows, so did the others
	listed := func() map[string]bool {
		out := map[string]bool{}
		for _, d := range a.hub.Devices() {
			out[d.DeviceID] = true
		}
		return out
	}
	require.Eventually(t, func() bool { return listed()["cc:00:00:00:0f:05"] }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, map[string]bool{"cc:00:00:00:0f:02": true, "cc:00:00:00:0f:05": true}, listed())
}
