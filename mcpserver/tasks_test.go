package mcpserver_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/internal/bridgetest"
	"github.com/devicebridge/devicebridge/simulator"
)

// Long calls as tasks (tasks.go), in both eras, with the official go-sdk
// client for the tasks/* methods (registered as custom methods: go-sdk
// v1.8.0 has no task API) and raw JSON-RPC over HTTP for the tools/call
// that creates a task, which go-sdk's CallTool cannot express.

const extTasks = "io.modelcontextprotocol/tasks"

// taskLab is a board with a slow tool, one the test holds until it lets
// it go, a dangerous one, one that fails and one that runs only as a task.
const taskLab = `board: task-lab
tools:
  - name: self.compute
    description: Sleep for the given seconds, then answer.
    properties:
      - {name: seconds, type: integer, min: 0, max: 300}
    behavior: sleep
  - {name: self.hold, description: Answers when the test lets it., behavior: const, text: released}
  - {name: self.quick, description: Answers at once., behavior: const, text: quick}
  - name: self.delete
    description: Delete a file.
    properties:
      - {name: filename, type: string}
    behavior: const
    text: deleted
  - {name: self.broken, description: The board throws., behavior: fail, text: boom}
  - {name: self.must, description: Runs only as a task., behavior: const, text: must}
`

const labMAC = "02:00:00:00:20:01"

// taskBridge starts a bridge with the lab board; release lets one held
// call of self.hold answer.
type taskBridge struct {
	*bridge
	board   *simulator.Board
	release chan struct{}
}

func startTaskBridge(t *testing.T, mutate func(*app.Config)) *taskBridge {
	t.Helper()
	profile := filepath.Join(t.TempDir(), "task-lab.yaml")
	require.NoError(t, os.WriteFile(profile, []byte(taskLab), 0o600))
	b := startBridge(t, func(c *app.Config) {
		c.MCP.RateLimit = -1
		c.MCP.Tasks.Tools = []string{"self.compute", "self.hold", "self.delete", "self.broken"}
		c.MCP.Tasks.Required = []string{"self.must"}
		c.Flow.Confirm = []string{"self.delete"}
		if mutate != nil {
			mutate(c)
		}
	})
	release := make(chan struct{})
	board := b.Board(labMAC, profile, simulator.Config{Hold: map[string]<-chan struct{}{"self.hold": release}})
	return &taskBridge{bridge: b, board: board, release: release}
}

func (tb *taskBridge) let() {
	select {
	case tb.release <- struct{}{}:
	case <-time.After(10 * time.Second):
		tb.T.Fatal("no held call to release")
	}
}

// onBoard waits until the board has received a message past the count
// before (TextReceived): a call sent by then is held by the board even if
// the bridge stops waiting for it.
func (tb *taskBridge) onBoard(before uint64) {
	require.Eventually(tb.T, func() bool { return tb.board.Stats().TextReceived > before }, 10*time.Second, 5*time.Millisecond,
		"the call never reached the board")
}

func labTool(tool string) string { return bridgetest.ToolName(labMAC, tool) }

// rpcReply is a JSON-RPC answer read raw.
type rpcReply struct {
	Result map[string]any
	Error  *struct {
		Code    int             `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	}
}

// caller is who sends raw requests: a bearer token ("" for none), and for
// the modern era whether the request declares the tasks extension.
type caller struct {
	token   string
	declare bool
}

// rpcIDs numbers raw requests: ids must differ within a legacy session.
var rpcIDs atomic.Int64

// send posts one JSON-RPC request, of the legacy era in session sid, else
// of the modern era with the headers and _meta a client sends (name is
// Mcp-Name, "" to leave it out). It does not fail the test, so that
// goroutines may use it.
func (c caller) send(b *bridge, sid, method, name string, params map[string]any) (rpcReply, error) {
	if params == nil {
		params = map[string]any{}
	}
	h := map[string]string{}
	if sid != "" {
		h["MCP-Protocol-Version"], h["Mcp-Session-Id"] = legacy, sid
	} else {
		caps := map[string]any{"elicitation": map[string]any{}}
		if c.declare {
			caps["extensions"] = map[string]any{extTasks: map[string]any{}}
		}
		params["_meta"] = map[string]any{
			"io.modelcontextprotocol/protocolVersion":    modern,
			"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "raw", "version": "1"},
			"io.modelcontextprotocol/clientCapabilities": caps,
		}
		h["MCP-Protocol-Version"], h["Mcp-Method"] = modern, method
		if name != "" {
			h["Mcp-Name"] = name
		}
	}
	if c.token != "" {
		h["Authorization"] = "Bearer " + c.token
	}
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": rpcIDs.Add(1), "method": method, "params": params})
	if err != nil {
		return rpcReply{}, err
	}
	req, err := http.NewRequest(http.MethodPost, b.URL, bytes.NewReader(body))
	if err != nil {
		return rpcReply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := b.HTTP.Do(req)
	if err != nil {
		return rpcReply{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return rpcReply{}, err
	}
	data := raw
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		data = nil
		for _, line := range strings.Split(string(raw), "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok && d != "" {
				data = []byte(d)
			}
		}
	}
	var r rpcReply
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("%d %q: %w", resp.StatusCode, raw, err)
	}
	if r.Result == nil && r.Error == nil {
		return r, fmt.Errorf("neither result nor error: %s", data)
	}
	return r, nil
}

func (c caller) modernRPC(b *bridge, method, name string, params map[string]any) rpcReply {
	b.T.Helper()
	r, err := c.send(b, "", method, name, params)
	require.NoError(b.T, err)
	return r
}

func (c caller) legacyRPC(b *bridge, sid, method string, params map[string]any) rpcReply {
	b.T.Helper()
	require.NotEmpty(b.T, sid)
	r, err := c.send(b, sid, method, "", params)
	require.NoError(b.T, err)
	return r
}

// Task methods through the go-sdk client.

type taskParams struct {
	mcp.ParamsBase
	TaskID         string         `json:"taskId"`
	InputResponses map[string]any `json:"inputResponses,omitempty"`
}

type taskResult struct {
	mcp.ResultBase
	ResultType     string                     `json:"resultType"`
	TaskID         string                     `json:"taskId"`
	Status         string                     `json:"status"`
	StatusMessage  string                     `json:"statusMessage"`
	TTLMs          *int64                     `json:"ttlMs"`
	TTL            *int64                     `json:"ttl"`
	PollIntervalMs int64                      `json:"pollIntervalMs"`
	InputRequests  map[string]json.RawMessage `json:"inputRequests"`
	Result         json.RawMessage            `json:"result"`
	Error          *jsonrpc.Error             `json:"error"`
	Content        json.RawMessage            `json:"content"` // tasks/result
	Tasks          []taskResult               `json:"tasks"`   // tasks/list
}

var taskMethods = []string{"tasks/get", "tasks/result", "tasks/list", "tasks/cancel", "tasks/update"}

// taskClient connects a go-sdk client of era that can send tasks/*; a
// modern one declares the tasks extension unless plain.
func taskClient(t *testing.T, b *bridge, era string, plain bool, hc *http.Client) *mcp.ClientSession {
	t.Helper()
	opts := &mcp.ClientOptions{}
	if !plain {
		opts.Capabilities = &mcp.ClientCapabilities{}
		opts.Capabilities.AddExtension(extTasks, nil)
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "task-host", Version: "1"}, opts)
	for _, m := range taskMethods {
		require.NoError(t, mcp.AddSendingCustomMethod[*taskParams, *taskResult](c, m))
	}
	if hc == nil {
		hc = b.HTTP
	}
	ctx, cancel := withTimeout(10 * time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: b.URL, HTTPClient: hc, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: era})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func taskCall(t *testing.T, cs *mcp.ClientSession, method, id string, answers map[string]any) (*taskResult, error) {
	t.Helper()
	ctx, cancel := withTimeout(20 * time.Second)
	defer cancel()
	return mcp.CallCustomMethod[*taskParams, *taskResult](ctx, cs, method, &taskParams{TaskID: id, InputResponses: answers})
}

func mustTask(t *testing.T, cs *mcp.ClientSession, method, id string) *taskResult {
	t.Helper()
	r, err := taskCall(t, cs, method, id, nil)
	require.NoError(t, err, "%s %s", method, id)
	return r
}

func mustRPCCode(t *testing.T, err error) int64 {
	t.Helper()
	var je *jsonrpc.Error
	require.True(t, errors.As(err, &je), "not a JSON-RPC error: %v", err)
	return je.Code
}

// waitStatus polls tasks/get until the task reaches want.
func waitStatus(t *testing.T, cs *mcp.ClientSession, id, want string) *taskResult {
	t.Helper()
	var last *taskResult
	require.Eventually(t, func() bool {
		r, err := taskCall(t, cs, "tasks/get", id, nil)
		if err != nil {
			return false
		}
		last = r
		return r.Status == want
	}, 15*time.Second, 20*time.Millisecond, "task %s never reached %s (last %+v)", id, want, last)
	return last
}

// resultText is the text of a CallToolResult's first content.
func resultText(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var r struct {
		Content []struct{ Text string } `json:"content"`
		IsError bool                    `json:"isError"`
	}
	require.NoError(t, json.Unmarshal(raw, &r), "%s", raw)
	require.NotEmpty(t, r.Content, "%s", raw)
	return r.Content[0].Text
}

func str(v any) string { s, _ := v.(string); return s }

// TestTasksModern: a 2026-07-28 client that declares the extension gets a
// task for a task tool and polls it to its result; everything else about
// the call is as without a task.
func TestTasksModern(t *testing.T) {
	tb := startTaskBridge(t, nil)
	b := tb.bridge
	cs := taskClient(t, b, modern, false, nil)
	plain := taskClient(t, b, modern, true, nil)
	with, without := caller{declare: true}, caller{}
	hold := labTool("self.hold")

	// Without the extension a task tool runs as before.
	r := without.modernRPC(b, "tools/call", labTool("self.compute"), map[string]any{"name": labTool("self.compute"), "arguments": map[string]any{"seconds": 0}})
	require.Nil(t, r.Error)
	assert.Equal(t, "complete", r.Result["resultType"])
	assert.NotContains(t, r.Result, "taskId")
	// ... as does a tool that is not a task tool, with it.
	r = with.modernRPC(b, "tools/call", labTool("self.quick"), map[string]any{"name": labTool("self.quick"), "arguments": map[string]any{}})
	assert.Equal(t, "complete", r.Result["resultType"])

	// A task: the handle at once, flat, with nothing inlined.
	r = with.modernRPC(b, "tools/call", hold, map[string]any{"name": hold, "arguments": map[string]any{}, "task": map[string]any{"ttl": 1000}})
	require.Nil(t, r.Error)
	assert.Equal(t, "task", r.Result["resultType"])
	assert.Equal(t, "working", r.Result["status"])
	id := str(r.Result["taskId"])
	assert.Regexp(t, `^[0-9a-f]{32}$`, id)
	assert.EqualValues(t, 600000, r.Result["ttlMs"], "the legacy task param is ignored in this era")
	assert.EqualValues(t, 1000, r.Result["pollIntervalMs"])
	for _, k := range []string{"result", "error", "inputRequests", "requestState", "task", "ttl", "pollInterval"} {
		assert.NotContains(t, r.Result, k)
	}
	assert.Regexp(t, `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d`, r.Result["createdAt"])

	got := mustTask(t, cs, "tasks/get", id)
	assert.Equal(t, "complete", got.ResultType)
	assert.Equal(t, "working", got.Status)
	assert.Contains(t, got.StatusMessage, "self.hold")
	assert.Nil(t, got.Result)

	tb.let()
	done := waitStatus(t, cs, id, "completed")
	assert.Equal(t, "released", resultText(t, done.Result))
	assert.NotContains(t, string(done.Result), "related-task")

	// Cancelling an ended task is a no-op ack; tasks/result and tasks/list
	// are not of this era.
	ack := mustTask(t, cs, "tasks/cancel", id)
	assert.Equal(t, "complete", ack.ResultType)
	assert.Empty(t, ack.TaskID)
	for _, m := range []string{"tasks/result", "tasks/list"} {
		_, err := taskCall(t, cs, m, id, nil)
		assert.EqualValues(t, -32601, mustRPCCode(t, err), m)
	}
	// Without the extension, tasks/* are refused with what to declare.
	_, err := taskCall(t, plain, "tasks/get", id, nil)
	assert.EqualValues(t, -32021, mustRPCCode(t, err))
	e := without.modernRPC(b, "tasks/cancel", id, map[string]any{"taskId": id}).Error
	require.NotNil(t, e)
	assert.JSONEq(t, `{"requiredCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}`, string(e.Data))
	// Unknown, malformed, and a Mcp-Name that is not the task.
	_, err = taskCall(t, cs, "tasks/get", "0123456789abcdef0123456789abcdef", nil)
	assert.EqualValues(t, -32602, mustRPCCode(t, err))
	e = with.modernRPC(b, "tasks/get", "", map[string]any{"taskId": 42}).Error
	require.NotNil(t, e)
	assert.Equal(t, -32602, e.Code)
	assert.Contains(t, e.Message, "taskId must be")
	e = with.modernRPC(b, "tasks/get", "someone-else", map[string]any{"taskId": id}).Error
	require.NotNil(t, e)
	assert.Equal(t, -32020, e.Code)
	assert.Nil(t, with.modernRPC(b, "tasks/get", id, map[string]any{"taskId": id}).Error, "a matching Mcp-Name passes")

	// A board that answers with a JSON-RPC error fails the task.
	r = with.modernRPC(b, "tools/call", labTool("self.broken"), map[string]any{"name": labTool("self.broken"), "arguments": map[string]any{}})
	failed := waitStatus(t, cs, str(r.Result["taskId"]), "failed")
	require.NotNil(t, failed.Error)
	assert.EqualValues(t, -32603, failed.Error.Code)
	assert.Contains(t, failed.Error.Message, "boom")
	assert.Nil(t, failed.Result)

	// A required tool is refused to a caller without the extension.
	e = without.modernRPC(b, "tools/call", labTool("self.must"), map[string]any{"name": labTool("self.must"), "arguments": map[string]any{}}).Error
	require.NotNil(t, e)
	assert.Equal(t, -32021, e.Code)
	r = with.modernRPC(b, "tools/call", labTool("self.must"), map[string]any{"name": labTool("self.must"), "arguments": map[string]any{}})
	assert.Equal(t, "must", resultText(t, waitStatus(t, cs, str(r.Result["taskId"]), "completed").Result))
}

// TestTaskModernCancelStopsTheBoardWait: tasks/cancel ends the task at
// once and the bridge stops waiting for the board, as a cancelled request
// does.
func TestTaskModernCancelStopsTheBoardWait(t *testing.T) {
	tb := startTaskBridge(t, nil)
	b := tb.bridge
	cs := taskClient(t, b, modern, false, nil)
	hold := labTool("self.hold")
	before := tb.board.Stats().TextReceived
	r := caller{declare: true}.modernRPC(b, "tools/call", hold, map[string]any{"name": hold, "arguments": map[string]any{}})
	id := str(r.Result["taskId"])
	require.NotEmpty(t, id)
	tb.onBoard(before)
	mustTask(t, cs, "tasks/cancel", id)
	c := mustTask(t, cs, "tasks/get", id)
	assert.Equal(t, "cancelled", c.Status)
	assert.Contains(t, c.StatusMessage, "Cancelled")
	require.Eventually(t, func() bool {
		return b.Logs.FilterMessage("tool call").FilterField(zap.String("outcome", "canceled")).FilterField(zap.String("tool", "self.hold")).Len() > 0
	}, 10*time.Second, 10*time.Millisecond, "the board call was cancelled")
	tb.let() // the board itself was still holding the call
}

// TestTaskModernConfirmation: a task tool that needs the user's yes
// creates its task at once and asks inside it (input_required, answered
// by tasks/update); a no ends it without running anything.
func TestTaskModernConfirmation(t *testing.T) {
	tb := startTaskBridge(t, nil)
	b := tb.bridge
	cs := taskClient(t, b, modern, false, nil)
	del := labTool("self.delete")
	ran := tb.board.Stats().CallsRun
	start := func() string {
		r := caller{declare: true}.modernRPC(b, "tools/call", del, map[string]any{"name": del, "arguments": map[string]any{"filename": "a.txt"}})
		require.Nil(t, r.Error)
		require.Equal(t, "task", r.Result["resultType"])
		return str(r.Result["taskId"])
	}

	id := start()
	asked := waitStatus(t, cs, id, "input_required")
	require.Len(t, asked.InputRequests, 1)
	var req struct {
		Method string `json:"method"`
		Params struct {
			Message         string          `json:"message"`
			RequestedSchema json.RawMessage `json:"requestedSchema"`
		} `json:"params"`
	}
	require.NoError(t, json.Unmarshal(asked.InputRequests["flow-1"], &req))
	assert.Equal(t, "elicitation/create", req.Method)
	assert.Contains(t, req.Params.Message, "filename=a.txt")
	assert.Contains(t, string(req.Params.RequestedSchema), `"confirm"`)
	assert.Equal(t, req.Params.Message, asked.StatusMessage)

	// An answer to an unknown key is acknowledged and changes nothing.
	ack, err := taskCall(t, cs, "tasks/update", id, map[string]any{"nope": map[string]any{"ignored": true}})
	require.NoError(t, err)
	assert.Equal(t, "complete", ack.ResultType)
	assert.Equal(t, "input_required", mustTask(t, cs, "tasks/get", id).Status)
	assert.Equal(t, ran, tb.board.Stats().CallsRun, "nothing ran before the yes")

	_, err = taskCall(t, cs, "tasks/update", id, map[string]any{"flow-1": map[string]any{"action": "accept", "content": map[string]any{"confirm": true}}})
	require.NoError(t, err)
	assert.Equal(t, "deleted", resultText(t, waitStatus(t, cs, id, "completed").Result))
	assert.Equal(t, ran+1, tb.board.Stats().CallsRun)

	// A no: completed, nothing sent.
	id = start()
	waitStatus(t, cs, id, "input_required")
	_, err = taskCall(t, cs, "tasks/update", id, map[string]any{"flow-1": map[string]any{"action": "decline"}})
	require.NoError(t, err)
	assert.Contains(t, resultText(t, waitStatus(t, cs, id, "completed").Result), "declined")
	assert.Equal(t, ran+1, tb.board.Stats().CallsRun)

	// Cancelled while it asks.
	id = start()
	waitStatus(t, cs, id, "input_required")
	mustTask(t, cs, "tasks/cancel", id)
	c := mustTask(t, cs, "tasks/get", id)
	assert.Equal(t, "cancelled", c.Status)
	assert.Empty(t, c.InputRequests)
	assert.Equal(t, ran+1, tb.board.Stats().CallsRun)
}

// TestTaskModernMRTRThenTask: missing arguments are asked through MRTR
// before the task exists; the round that settles them answers the task.
func TestTaskModernMRTRThenTask(t *testing.T) {
	tb := startTaskBridge(t, nil)
	b := tb.bridge
	cs := taskClient(t, b, modern, false, nil)
	compute := labTool("self.compute")
	with := caller{declare: true}
	r1 := with.modernRPC(b, "tools/call", compute, map[string]any{"name": compute, "arguments": map[string]any{}})
	require.Nil(t, r1.Error)
	assert.Equal(t, "input_required", r1.Result["resultType"])
	assert.NotContains(t, r1.Result, "taskId")
	state := str(r1.Result["requestState"])
	require.NotEmpty(t, state)
	r2 := with.modernRPC(b, "tools/call", compute, map[string]any{"name": compute, "arguments": map[string]any{},
		"requestState": state, "inputResponses": map[string]any{"flow": map[string]any{"action": "accept", "content": map[string]any{"seconds": 1}}}})
	require.Nil(t, r2.Error)
	assert.Equal(t, "task", r2.Result["resultType"])
	assert.NotContains(t, r2.Result, "requestState")
	assert.NotContains(t, r2.Result, "inputRequests")
	assert.Equal(t, "done after 1 s", resultText(t, waitStatus(t, cs, str(r2.Result["taskId"]), "completed").Result))

	// The same round again runs nothing more: its call was spent.
	r3 := with.modernRPC(b, "tools/call", compute, map[string]any{"name": compute, "arguments": map[string]any{},
		"requestState": state, "inputResponses": map[string]any{"flow": map[string]any{"action": "accept", "content": map[string]any{"seconds": 1}}}})
	require.Nil(t, r3.Error)
	assert.NotContains(t, r3.Result, "taskId")
	assert.Contains(t, fmt.Sprint(r3.Result["content"]), "was not run again")
}

// TestTasksLegacy: a 2025-11-25 session asks for a task with params.task,
// on any board tool, and follows it with tasks/get, tasks/list and
// tasks/result; tasks/cancel stops one that runs.
func TestTasksLegacy(t *testing.T) {
	tb := startTaskBridge(t, nil)
	b := tb.bridge
	cs := taskClient(t, b, legacy, false, nil)
	other := taskClient(t, b, legacy, false, nil)
	sid := cs.ID()
	me := caller{}
	hold := labTool("self.hold")

	// tools/list shows every board tool's taskSupport.
	list := me.legacyRPC(b, sid, "tools/list", map[string]any{})
	support := map[string]string{}
	for _, tool := range list.Result["tools"].([]any) {
		m := tool.(map[string]any)
		ex, _ := m["execution"].(map[string]any)
		support[str(m["name"])] = str(ex["taskSupport"])
	}
	assert.Equal(t, "optional", support[labTool("self.quick")], "every board tool may run as a task")
	assert.Equal(t, "required", support[labTool("self.must")])

	// Without params.task a call runs as before; a required tool is refused.
	r := me.legacyRPC(b, sid, "tools/call", map[string]any{"name": labTool("self.quick"), "arguments": map[string]any{}})
	assert.NotContains(t, r.Result, "task")
	e := me.legacyRPC(b, sid, "tools/call", map[string]any{"name": labTool("self.must"), "arguments": map[string]any{}}).Error
	require.NotNil(t, e)
	assert.Equal(t, -32601, e.Code)

	// A task, with the ttl asked for.
	r = me.legacyRPC(b, sid, "tools/call", map[string]any{"name": hold, "arguments": map[string]any{}, "task": map[string]any{"ttl": 60000}})
	require.Nil(t, r.Error)
	task, _ := r.Result["task"].(map[string]any)
	require.NotNil(t, task, "CreateTaskResult wraps the task: %v", r.Result)
	assert.NotContains(t, r.Result, "resultType")
	id := str(task["taskId"])
	assert.Equal(t, "working", task["status"])
	assert.EqualValues(t, 60000, task["ttl"])
	assert.EqualValues(t, 1000, task["pollInterval"])
	assert.NotContains(t, task, "ttlMs")

	got := mustTask(t, cs, "tasks/get", id)
	assert.Equal(t, "working", got.Status)
	assert.EqualValues(t, 60000, *got.TTL)
	assert.Empty(t, got.ResultType)
	listed := mustTask(t, cs, "tasks/list", "")
	require.Len(t, listed.Tasks, 1)
	assert.Equal(t, id, listed.Tasks[0].TaskID)

	// Another session sees nothing of it.
	_, err := taskCall(t, other, "tasks/get", id, nil)
	assert.EqualValues(t, -32602, mustRPCCode(t, err))
	_, err = taskCall(t, other, "tasks/cancel", id, nil)
	assert.EqualValues(t, -32602, mustRPCCode(t, err))
	assert.Empty(t, mustTask(t, other, "tasks/list", "").Tasks)

	// tasks/result waits for the end and returns the tool's result.
	results := make(chan *taskResult, 1)
	go func() {
		res, _ := taskCall(t, cs, "tasks/result", id, nil)
		results <- res
	}()
	tb.let()
	var res *taskResult
	select {
	case res = <-results:
	case <-time.After(20 * time.Second):
		t.Fatal("tasks/result never answered")
	}
	require.NotNil(t, res)
	assert.Contains(t, string(res.Content), "released")
	assert.Equal(t, map[string]any{"taskId": id}, res.Meta["io.modelcontextprotocol/related-task"])
	assert.Equal(t, "completed", mustTask(t, cs, "tasks/get", id).Status)
	_, err = taskCall(t, cs, "tasks/cancel", id, nil)
	assert.EqualValues(t, -32602, mustRPCCode(t, err), "an ended task cannot be cancelled")
	_, err = taskCall(t, cs, "tasks/update", id, nil)
	assert.EqualValues(t, -32601, mustRPCCode(t, err), "tasks/update is not of this era")

	// Cancel while it runs.
	before := tb.board.Stats().TextReceived
	r = me.legacyRPC(b, sid, "tools/call", map[string]any{"name": hold, "arguments": map[string]any{}, "task": map[string]any{}})
	id = str(r.Result["task"].(map[string]any)["taskId"])
	tb.onBoard(before)
	c := mustTask(t, cs, "tasks/cancel", id)
	assert.Equal(t, "cancelled", c.Status)
	_, err = taskCall(t, cs, "tasks/result", id, nil)
	assert.EqualValues(t, -32602, mustRPCCode(t, err))
	tb.let()

	// A board error fails the task; tasks/result is that error.
	r = me.legacyRPC(b, sid, "tools/call", map[string]any{"name": labTool("self.broken"), "arguments": map[string]any{}, "task": map[string]any{}})
	_, err = taskCall(t, cs, "tasks/result", str(r.Result["task"].(map[string]any)["taskId"]), nil)
	assert.EqualValues(t, -32603, mustRPCCode(t, err))
	assert.ErrorContains(t, err, "boom")

	// A tool that needs confirmation, from a client that cannot ask: no
	// task without "confirm": true, a task with it.
	r = me.legacyRPC(b, sid, "tools/call", map[string]any{"name": labTool("self.delete"), "arguments": map[string]any{"filename": "x"}, "task": map[string]any{}})
	assert.NotContains(t, r.Result, "task")
	assert.Equal(t, true, r.Result["isError"])
	r = me.legacyRPC(b, sid, "tools/call", map[string]any{"name": labTool("self.delete"), "arguments": map[string]any{"filename": "x", "confirm": true}, "task": map[string]any{}})
	res, err = taskCall(t, cs, "tasks/result", str(r.Result["task"].(map[string]any)["taskId"]), nil)
	require.NoError(t, err)
	assert.Contains(t, string(res.Content), "deleted")
}

// TestTaskRetention: a task is kept for its ttl from creation (at least
// a second), then forgotten; its room is free again.
func TestTaskRetention(t *testing.T) {
	tb := startTaskBridge(t, func(c *app.Config) { c.MCP.Tasks.MaxPerCaller = 1 })
	b := tb.bridge
	cs := taskClient(t, b, legacy, false, nil)
	sid := cs.ID()
	r := caller{}.legacyRPC(b, sid, "tools/call", map[string]any{"name": labTool("self.quick"), "arguments": map[string]any{}, "task": map[string]any{"ttl": 1}})
	task := r.Result["task"].(map[string]any)
	assert.EqualValues(t, 1000, task["ttl"], "the shortest life is a second")
	id := str(task["taskId"])
	waitStatus(t, cs, id, "completed")
	e := caller{}.legacyRPC(b, sid, "tools/call", map[string]any{"name": labTool("self.quick"), "arguments": map[string]any{}, "task": map[string]any{}}).Error
	require.NotNil(t, e, "one task per caller, and the finished one is still kept")
	assert.Equal(t, -32000, e.Code)
	assert.Contains(t, e.Message, "mcp.tasks.max_per_caller")
	assert.JSONEq(t, `{"setting":"mcp.tasks.max_per_caller","limit":1}`, string(e.Data))

	require.Eventually(t, func() bool {
		_, err := taskCall(t, cs, "tasks/get", id, nil)
		return err != nil && mustRPCCode(t, err) == -32602
	}, 15*time.Second, 50*time.Millisecond, "the task is forgotten after its ttl")
	r = caller{}.legacyRPC(b, sid, "tools/call", map[string]any{"name": labTool("self.quick"), "arguments": map[string]any{}, "task": map[string]any{}})
	assert.Contains(t, r.Result, "task", "its room is free again")
}

// TestTaskLimitAll: past mcp.tasks.max_tasks a task is refused with a
// JSON-RPC error that names the setting, in both eras.
func TestTaskLimitAll(t *testing.T) {
	tb := startTaskBridge(t, func(c *app.Config) { c.MCP.Tasks.MaxTasks = 1 })
	b := tb.bridge
	cs := taskClient(t, b, legacy, false, nil)
	hold := labTool("self.hold")
	r := caller{}.legacyRPC(b, cs.ID(), "tools/call", map[string]any{"name": hold, "arguments": map[string]any{}, "task": map[string]any{}})
	require.Contains(t, r.Result, "task")
	e := caller{declare: true}.modernRPC(b, "tools/call", hold, map[string]any{"name": hold, "arguments": map[string]any{}}).Error
	require.NotNil(t, e)
	assert.Equal(t, -32000, e.Code)
	assert.Contains(t, e.Message, "mcp.tasks.max_tasks")
	assert.Contains(t, e.Message, "nothing was sent to the board")
	tb.let()
}

// TestTasksBelongToTheIdentity: with tokens, a task belongs to the
// identity, whatever session or era it polls from; another identity is
// told it does not exist.
func TestTasksBelongToTheIdentity(t *testing.T) {
	const aliceToken, bobToken = "alice-secret-0123456789abcdef", "bob-secret-0123456789abcdef"
	tb := startTaskBridge(t, func(c *app.Config) { c.MCP.Tokens = []string{"alice=" + aliceToken, "bob=" + bobToken} })
	b := tb.bridge
	alice, bob := caller{token: aliceToken, declare: true}, caller{token: bobToken, declare: true}
	hold := labTool("self.hold")
	r := alice.modernRPC(b, "tools/call", hold, map[string]any{"name": hold, "arguments": map[string]any{}})
	id := str(r.Result["taskId"])
	require.NotEmpty(t, id, "%+v", r)

	e := bob.modernRPC(b, "tasks/get", id, map[string]any{"taskId": id}).Error
	require.NotNil(t, e)
	assert.Equal(t, -32602, e.Code)
	assert.NotNil(t, bob.modernRPC(b, "tasks/cancel", id, map[string]any{"taskId": id}).Error)

	// Alice's legacy session sees her task.
	aliceHTTP := tokenHTTP(t, aliceToken)
	cs := taskClient(t, b, legacy, false, aliceHTTP)
	assert.Equal(t, "working", mustTask(t, cs, "tasks/get", id).Status)
	tb.let()
	assert.Equal(t, "completed", waitStatus(t, cs, id, "completed").Status)
	assert.Nil(t, alice.modernRPC(b, "tasks/get", id, map[string]any{"taskId": id}).Error)
}

// TestTasksOff: with mcp.tasks.disabled nothing is declared and tasks/*
// are unknown methods.
func TestTasksOff(t *testing.T) {
	tb := startTaskBridge(t, func(c *app.Config) { c.MCP.Tasks.Disabled = true })
	b := tb.bridge
	hold := labTool("self.quick")
	r := caller{declare: true}.modernRPC(b, "tools/call", hold, map[string]any{"name": hold, "arguments": map[string]any{}})
	assert.NotContains(t, r.Result, "taskId")
	e := caller{declare: true}.modernRPC(b, "tasks/get", "x", map[string]any{"taskId": "x"}).Error
	require.NotNil(t, e)
	assert.Equal(t, -32601, e.Code)
	_, _, body := rawStatus(b, "POST", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`, nil)
	assert.False(t, strings.Contains(body, `"tasks"`), body)
}

// TestTasksConcurrently: many callers start tasks at once, in both eras;
// each gets its own, and each ends with its own result.
func TestTasksConcurrently(t *testing.T) {
	tb := startTaskBridge(t, nil)
	b := tb.bridge
	cs := taskClient(t, b, modern, false, nil)
	legacyCS := taskClient(t, b, legacy, false, nil)
	compute := labTool("self.compute")
	ids := make(chan string, 16)
	errs := make(chan error, 16)
	for i := range 16 {
		go func() {
			args := map[string]any{"name": compute, "arguments": map[string]any{"seconds": 0}}
			var r rpcReply
			var err error
			if i%2 == 0 {
				r, err = caller{declare: true}.send(b, "", "tools/call", compute, args)
			} else {
				args["task"] = map[string]any{}
				r, err = caller{}.send(b, legacyCS.ID(), "tools/call", "", args)
				if task, ok := r.Result["task"].(map[string]any); ok {
					r.Result = task
				}
			}
			if err != nil {
				errs <- err
				return
			}
			if r.Error != nil || str(r.Result["taskId"]) == "" {
				errs <- fmt.Errorf("no task: %+v", r)
				return
			}
			ids <- fmt.Sprintf("%d %s", i%2, str(r.Result["taskId"]))
		}()
	}
	seen := map[string]bool{}
	for range 16 {
		select {
		case id := <-ids:
			seen[id] = true
		case err := <-errs:
			t.Fatal(err)
		case <-time.After(30 * time.Second):
			t.Fatal("the calls did not all answer")
		}
	}
	require.Len(t, seen, 16, "16 distinct tasks")
	for entry := range seen {
		era, id, _ := strings.Cut(entry, " ")
		if era == "1" {
			assert.Contains(t, string(mustTask(t, legacyCS, "tasks/result", id).Content), "done after 0 s")
			continue
		}
		assert.Equal(t, "done after 0 s", resultText(t, waitStatus(t, cs, id, "completed").Result))
	}
}
