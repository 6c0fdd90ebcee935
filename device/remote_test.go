package device

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeRemote holds one remote board and records the calls routed to it.
type fakeRemote struct {
	info  Info
	calls []string
}

func (f *fakeRemote) Devices() []Info { return []Info{f.info} }

func (f *fakeRemote) Device(id string) (Info, bool) { return f.info, id == f.info.DeviceID }

func (f *fakeRemote) CallTool(_ context.Context, info Info, tool string, _ json.RawMessage) (*CallResult, error) {
	f.calls = append(f.calls, info.DeviceID+"/"+tool)
	if tool == "busy" {
		return nil, fmt.Errorf("remote: %w", ErrBusy)
	}
	return &CallResult{Content: []Content{{Type: "text", Text: "remote"}}}, nil
}

func TestRemoteBoardsAreListedAndCalledThroughTheHub(t *testing.T) {
	h := newHub(t)
	_, link := startBoard(t, twoTools)
	_, err := h.Attach(link, Identity{DeviceID: "aa:00:00:00:00:01", Transport: "websocket", HasMCP: true})
	require.NoError(t, err)
	r := &fakeRemote{info: Info{Identity: Identity{DeviceID: "bb:00:00:00:00:01", Transport: "mqtt", HasMCP: true},
		State: StateReady, Node: "node-b"}}
	h.SetRemote(r)

	list := h.Devices()
	require.Len(t, list, 2)
	require.Equal(t, "aa:00:00:00:00:01", list[0].DeviceID)
	require.Empty(t, list[0].Node)
	require.Equal(t, "node-b", list[1].Node)

	res, err := h.CallTool(context.Background(), "bb:00:00:00:00:01", "self.x", nil)
	require.NoError(t, err)
	require.Equal(t, "remote", res.Text())
	_, err = h.CallTool(context.Background(), "bb:00:00:00:00:01", "busy", nil)
	require.Equal(t, CodeBusy, CodeOf(err))
	// A local board is called locally; CallLocal never leaves the node.
	_, err = h.CallTool(context.Background(), "aa:00:00:00:00:01", "self.get_device_status", nil)
	require.NoError(t, err)
	_, err = h.CallLocal(context.Background(), "bb:00:00:00:00:01", "self.x", nil)
	require.Equal(t, CodeUnknownDevice, CodeOf(err))
	require.Equal(t, []string{"bb:00:00:00:00:01/self.x", "bb:00:00:00:00:01/busy"}, r.calls)

	info, ok := h.Device("bb:00:00:00:00:01")
	require.True(t, ok)
	require.Equal(t, "node-b", info.Node)

	sub := h.Subscribe()
	defer sub.Close()
	h.PublishRemote(Event{Type: EventOffline, DeviceID: "bb:00:00:00:00:01", Info: info})
	got := waitEvents(t, sub, 1)
	require.Equal(t, EventOffline, got[0].Type)
	require.Equal(t, "node-b", got[0].Info.Node)

	h.SetRemote(nil)
	require.Len(t, h.Devices(), 1)
}
