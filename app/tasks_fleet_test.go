package app_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
)

// MCP tasks in a fleet: a stateless client behind a load balancer may
// poll any node for a task; the node whose id the task carries holds it,
// and the others forward tasks/get, tasks/update and tasks/cancel there.

const fleetTaskMAC = "0a:00:00:00:00:21"

type fleetTaskParams struct {
	mcp.ParamsBase
	TaskID         string         `json:"taskId"`
	InputResponses map[string]any `json:"inputResponses,omitempty"`
}

type fleetTask struct {
	mcp.ResultBase
	ResultType    string                     `json:"resultType"`
	TaskID        string                     `json:"taskId"`
	Status        string                     `json:"status"`
	InputRequests map[string]json.RawMessage `json:"inputRequests"`
	Result        json.RawMessage            `json:"result"`
}

// taskClientOf is a modern go-sdk client of one node that declares the
// tasks extension and can send tasks/*.
func taskClientOf(t *testing.T, base string) *mcp.ClientSession {
	t.Helper()
	opts := &mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}}
	opts.Capabilities.AddExtension("io.modelcontextprotocol/tasks", nil)
	c := mcp.NewClient(&mcp.Implementation{Name: "fleet-host", Version: "1"}, opts)
	for _, m := range []string{"tasks/get", "tasks/update", "tasks/cancel"} {
		require.NoError(t, mcp.AddSendingCustomMethod[*fleetTaskParams, *fleetTask](c, m))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: base + "/mcp", MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: modernMCP})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func fleetTaskCall(t *testing.T, cs *mcp.ClientSession, method, id string, answers map[string]any) (*fleetTask, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return mcp.CallCustomMethod[*fleetTaskParams, *fleetTask](ctx, cs, method, &fleetTaskParams{TaskID: id, InputResponses: answers})
}

// startTask makes a tools/call on base that the node answers with a task
// (raw JSON-RPC: go-sdk's CallTool has no task result), and returns its id.
func startTask(t *testing.T, base, tool string, args map[string]any) string {
	t.Helper()
	params := map[string]any{"name": tool, "arguments": args, "_meta": map[string]any{
		"io.modelcontextprotocol/protocolVersion":    modernMCP,
		"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "raw", "version": "1"},
		"io.modelcontextprotocol/clientCapabilities": map[string]any{"elicitation": map[string]any{}, "extensions": map[string]any{"io.modelcontextprotocol/tasks": map[string]any{}}},
	}}
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, base+"/mcp", bytes.NewReader(body))
	require.NoError(t, err)
	for k, v := range map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"MCP-Protocol-Version": modernMCP, "Mcp-Method": "tools/call", "Mcp-Name": tool} {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var data []byte
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "data: ") {
			data = []byte(strings.TrimPrefix(line, "data: "))
		}
	}
	var msg struct {
		Result struct {
			ResultType string `json:"resultType"`
			TaskID     string `json:"taskId"`
		} `json:"result"`
	}
	require.NoError(t, json.Unmarshal(data, &msg), "%s", data)
	require.Equal(t, "task", msg.Result.ResultType, "%s", data)
	return msg.Result.TaskID
}

func waitTask(t *testing.T, cs *mcp.ClientSession, id, status string) *fleetTask {
	t.Helper()
	var last *fleetTask
	require.Eventually(t, func() bool {
		r, err := fleetTaskCall(t, cs, "tasks/get", id, nil)
		if err == nil {
			last = r
		}
		return err == nil && r.Status == status
	}, 15*time.Second, 20*time.Millisecond, "task %s never %s (last %+v)", id, status, last)
	return last
}

// TestTasksAcrossTheFleet: a task started on node b for a board node a
// holds lives on b (its id says so) and is polled, answered and cancelled
// through node a, and the other way round; a task of a node that is not
// in the fleet is unknown.
func TestTasksAcrossTheFleet(t *testing.T) {
	noLeaks(t)
	url := startNATS(t)
	start := func(id string) (*app.App, string) {
		cfg := fleetConfig(url, id)
		cfg.MCP.RateLimit = -1
		cfg.MCP.Tasks.Tools = []string{"self.lamp.*"}
		cfg.Flow.Confirm = []string{"self.lamp.turn_off"}
		return startApp(t, cfg)
	}
	a, baseA := start("a")
	_, baseB := start("b")
	connectBoard(t, a, fleetTaskMAC)
	on, off := upstream(fleetTaskMAC, "self.lamp.turn_on"), upstream(fleetTaskMAC, "self.lamp.turn_off")
	onA, onB := taskClientOf(t, baseA), taskClientOf(t, baseB)
	for _, cs := range []*mcp.ClientSession{onA, onB} {
		require.Eventually(t, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			list, err := cs.ListTools(ctx, nil)
			require.NoError(t, err)
			for _, tool := range list.Tools {
				if tool.Name == on {
					return true
				}
			}
			return false
		}, 15*time.Second, 20*time.Millisecond, "every node lists the board")
	}

	// Started on b (the call is routed to a's board), polled on a.
	id := startTask(t, baseB, on, map[string]any{})
	require.True(t, strings.HasPrefix(id, "b."), id)
	done := waitTask(t, onA, id, "completed")
	assert.Contains(t, string(done.Result), `"true"`)
	ack, err := fleetTaskCall(t, onA, "tasks/cancel", id, nil)
	require.NoError(t, err)
	assert.Equal(t, "complete", ack.ResultType)

	// Started on a, with a question, answered through b.
	id = startTask(t, baseA, off, map[string]any{})
	require.True(t, strings.HasPrefix(id, "a."), id)
	asked := waitTask(t, onB, id, "input_required")
	require.Contains(t, asked.InputRequests, "flow-1")
	_, err = fleetTaskCall(t, onB, "tasks/update", id, map[string]any{"flow-1": map[string]any{"action": "accept", "content": map[string]any{"confirm": true}}})
	require.NoError(t, err)
	waitTask(t, onB, id, "completed")
	waitTask(t, onA, id, "completed")

	// Cancelled through the other node while it waits for its answer.
	id = startTask(t, baseA, off, map[string]any{})
	waitTask(t, onB, id, "input_required")
	_, err = fleetTaskCall(t, onB, "tasks/cancel", id, nil)
	require.NoError(t, err)
	assert.Equal(t, "cancelled", waitTask(t, onA, id, "cancelled").Status)

	// A node that is not in the fleet holds nothing.
	_, err = fleetTaskCall(t, onA, "tasks/get", "zz.0123456789abcdef0123456789abcdef", nil)
	var je *jsonrpc.Error
	require.True(t, errors.As(err, &je), "%v", err)
	assert.EqualValues(t, -32602, je.Code)
	assert.Contains(t, je.Message, "no longer in the fleet")
}
