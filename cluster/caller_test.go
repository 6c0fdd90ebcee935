package cluster

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/audit"
	"github.com/devicebridge/devicebridge/policy"
)

// auditLines reads an audit log file as records.
func auditLines(t *testing.T, path string) []audit.Record {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var out []audit.Record
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line == "" {
			continue
		}
		var r audit.Record
		require.NoError(t, json.Unmarshal([]byte(line), &r), line)
		out = append(out, r)
	}
	return out
}

// TestRoutedCallsCarryTheCaller (issue 24, defect 15): a routed call
// carries who is calling; the holder checks it against its own policy and
// writes its own audit line; a call that does not say who is calling (as
// an outsider on an open NATS published one to reboot a board) is refused
// before it reaches the board.
func TestRoutedCallsCarryTheCaller(t *testing.T) {
	url := startNATS(t)
	p, err := policy.Parse([]byte(`
identities:
  kitchen:
    boards: ["bb:00:00:00:00:01"]
    tools: ["self.get_device_status"]
`))
	require.NoError(t, err)
	logPath := filepath.Join(t.TempDir(), "audit.log")
	l, err := audit.Open(logPath, 0, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	a := startNode(t, url, "a") // no policy: the holder's decides
	b := startNodeCfg(t, Config{URL: url, NodeID: "b", OfflineAfter: 1500 * time.Millisecond, Auth: fleetAuth,
		Policy: policy.New(p), Audit: l})
	_, board := b.attachBoard(t, "bb:00:00:00:00:01", nil)
	require.Eventually(t, func() bool { return len(readyIDs(a.hub)) == 1 }, 10*time.Second, 20*time.Millisecond)
	calls := func() int { return board.Count("tools/call") }

	kitchen := policy.WithIdentity(context.Background(), policy.Identity{Name: "kitchen"})
	res, err := a.hub.CallTool(kitchen, "bb:00:00:00:00:01", "self.get_device_status", nil)
	require.NoError(t, err)
	require.Equal(t, "bb:00:00:00:00:01", res.Text())
	require.Equal(t, 1, calls())

	_, err = a.hub.CallTool(kitchen, "bb:00:00:00:00:01", "self.fail", json.RawMessage(`{}`))
	require.ErrorContains(t, err, "node b, which holds the board, refused the call: not allowed for kitchen (policy): self.fail on board bb:00:00:00:00:01")
	_, err = a.hub.CallTool(context.Background(), "bb:00:00:00:00:01", "self.get_device_status", nil)
	require.ErrorContains(t, err, "not allowed for anonymous", "a call without an identity in its context is anonymous's")
	require.Equal(t, 1, calls(), "refused calls never reach the board")

	// A request with the fleet's credentials but no caller: what an
	// outsider on an open NATS sent, or a node that checked nothing.
	nc := connectAsFleet(t, url)
	defer nc.Close()
	data, _ := json.Marshal(callRequest{DeviceID: "bb:00:00:00:00:01", Tool: "self.get_device_status"})
	resp, err := nc.Request("devicebridge.call.b."+keyFor("bb:00:00:00:00:01"), data, 5*time.Second)
	require.NoError(t, err)
	var r callReply
	require.NoError(t, json.Unmarshal(resp.Data, &r))
	require.NotNil(t, r.Error)
	require.Contains(t, r.Error.Message, "did not say who is calling")
	require.Equal(t, 1, calls())

	recs := auditLines(t, logPath)
	require.Len(t, recs, 4)
	for _, r := range recs {
		require.Equal(t, audit.KindToolCall, r.Kind)
		require.Equal(t, "fleet", r.Via)
		require.Equal(t, "bb:00:00:00:00:01", r.Board)
	}
	require.Equal(t, []string{"kitchen", "ok", "a"}, []string{recs[0].Identity, recs[0].Outcome, recs[0].Node})
	require.Equal(t, []string{"kitchen", "denied", "a", "self.fail"}, []string{recs[1].Identity, recs[1].Outcome, recs[1].Node, recs[1].Tool})
	require.Equal(t, []string{"anonymous", "denied"}, []string{recs[2].Identity, recs[2].Outcome})
	require.Equal(t, []string{"", "denied", "", "no caller identity"}, []string{recs[3].Identity, recs[3].Outcome, recs[3].Node, recs[3].Reason})
}

// TestForwardedInteractionsCarryTheCaller: a forwarded interaction request
// reaches the holder's handler as the caller (so the tool it may run is
// called, and routed on, as them); one without a caller is refused.
func TestForwardedInteractionsCarryTheCaller(t *testing.T) {
	url := startNATS(t)
	var mu sync.Mutex
	var seen []string
	a := startNode(t, url, "a")
	startNodeCfg(t, Config{URL: url, NodeID: "b", OfflineAfter: 1500 * time.Millisecond, Auth: fleetAuth,
		Interactions: func(ctx context.Context, req []byte) []byte {
			mu.Lock()
			seen = append(seen, policy.IdentityFrom(ctx).Name)
			mu.Unlock()
			return append([]byte("echo "), req...)
		}})
	ctx := policy.WithIdentity(context.Background(), policy.Identity{Name: "kitchen", Groups: []string{"family"}})
	out, err := a.node.ForwardInteraction(ctx, "b", []byte("x"))
	require.NoError(t, err)
	require.Equal(t, "echo x", string(out))

	nc := connectAsFleet(t, url)
	defer nc.Close()
	resp, err := nc.RequestMsg(&nats.Msg{Subject: "devicebridge.interaction.b", Data: []byte("y")}, 5*time.Second)
	require.NoError(t, err)
	require.Empty(t, resp.Data)
	require.Contains(t, resp.Header.Get(hdrRefused), "did not say who is calling")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"kitchen"}, seen, "the refused request never reached the handler")
}
