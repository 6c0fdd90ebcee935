package mcpserver

// The tasks methods and their wire shapes, one per era (tasks.go has the
// model). 2025-11-25 tasks carry ttl and pollInterval, come wrapped in
// {task: …} when created, and have tasks/result and tasks/list;
// 2026-07-28 tasks carry ttlMs and pollIntervalMs, come flat with
// resultType "task" when created, inline their result, error or input
// requests in tasks/get, and have tasks/update instead.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/devicebridge/devicebridge/mcpserver/taskstore"
)

// taskRequest is who sends a tasks/* request and how (taskMiddleware).
type taskRequest struct {
	owner    string
	modern   bool
	declared bool   // modern: the request declares the tasks extension
	name     string // the Mcp-Name header
}

type taskRequestKey struct{}

// taskParams are the params of every tasks/* method. taskId and
// inputResponses are read by hand, so that a malformed one is an invalid
// params error that says what is wrong.
type taskParams struct {
	mcp.ParamsBase
	TaskID         json.RawMessage `json:"taskId,omitempty"`
	Cursor         string          `json:"cursor,omitempty"`
	InputResponses json.RawMessage `json:"inputResponses,omitempty"`
}

// taskIDPattern is what a task id of this bridge looks like: 32 hex
// digits, after "<node>." in a fleet. Anything else of this charset is
// simply unknown; anything outside it is malformed.
var taskIDPattern = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,256}$`)

// target checks a tasks/* request in the order the extension's clients
// expect and returns the caller and the task id: the method exists in the
// caller's era, a modern caller declared the extension, the task id is
// well formed and agrees with Mcp-Name.
func (s *Server) taskTarget(ctx context.Context, method string, p *taskParams, needID bool) (*taskRequest, string, error) {
	tr, _ := ctx.Value(taskRequestKey{}).(*taskRequest)
	if tr == nil {
		return nil, "", &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the task request has no caller"}
	}
	switch {
	case tr.modern && (method == methodTasksResult || method == methodTasksList):
		return nil, "", &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: method +
			" is not part of the 2026-07-28 tasks extension: tasks/get returns the result once the task has ended."}
	case !tr.modern && method == methodTasksUpdate:
		return nil, "", &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "tasks/update is part of the 2026-07-28 tasks extension; " +
			"in a 2025-11-25 session a task asks its questions before it starts."}
	case tr.modern && !tr.declared:
		return nil, "", missingTasksCapability(method)
	}
	if !needID {
		return tr, "", nil
	}
	var id string
	if p == nil || len(p.TaskID) == 0 {
		return nil, "", invalidParams("%s needs taskId, the id tools/call returned, e.g. {\"taskId\": \"…\"}.", method)
	}
	if json.Unmarshal(p.TaskID, &id) != nil || !taskIDPattern.MatchString(id) {
		return nil, "", invalidParams("taskId must be the string tools/call returned (letters, digits, '.', '_' and '-', at most 256); got %s.",
			clipRaw(p.TaskID))
	}
	if tr.modern && tr.name != "" && tr.name != id {
		return nil, "", &jsonrpc.Error{Code: codeHeaderMismatch, Message: fmt.Sprintf(
			"header mismatch: Mcp-Name is %q but params.taskId is %q; on tasks/* Mcp-Name must be the task id.", cut(tr.name, 80), id)}
	}
	return tr, id, nil
}

func clipRaw(raw json.RawMessage) string { return cut(string(raw), 80) }

// cut bounds a string a caller sent before it is quoted back.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func notFound(id string) error {
	return invalidParams("Task %s not found: it does not exist, it has expired (tasks are kept for their ttl from creation), "+
		"or it belongs to another caller. Start the call again.", cut(id, 80))
}

// taskByID serves a tasks/* method that names one task (get, result,
// cancel, update): checked, then answered by the node that holds it.
func (s *Server) taskByID(method string) func(context.Context, *mcp.ServerSession, *taskParams) (mcp.Result, error) {
	return func(ctx context.Context, _ *mcp.ServerSession, p *taskParams) (mcp.Result, error) {
		tr, id, err := s.taskTarget(ctx, method, p, true)
		if err != nil {
			return nil, err
		}
		if res, err, forwarded := s.forwardTask(ctx, method, tr, id, p); forwarded {
			return res, err
		}
		return s.localTask(ctx, method, tr, id, p)
	}
}

// tasksList lists the caller's tasks held by this node (2025-11-25).
func (s *Server) tasksList(ctx context.Context, _ *mcp.ServerSession, p *taskParams) (mcp.Result, error) {
	tr, _, err := s.taskTarget(ctx, methodTasksList, p, false)
	if err != nil {
		return nil, err
	}
	cursor := ""
	if p != nil {
		cursor = p.Cursor
	}
	page, next := s.tk.store.List(tr.owner, cursor, s.opts.PageSize)
	out := &legacyTaskList{Tasks: make([]legacyTask, 0, len(page)), NextCursor: next}
	for _, t := range page {
		out.Tasks = append(out.Tasks, s.legacyTask(t))
	}
	return out, nil
}

// localTask runs a tasks/* method on a task this node holds (or none).
func (s *Server) localTask(ctx context.Context, method string, tr *taskRequest, id string, p *taskParams) (mcp.Result, error) {
	st := s.tk.store
	switch method {
	case methodTasksGet:
		t, err := st.Get(tr.owner, id)
		if err != nil {
			return nil, notFound(id)
		}
		if tr.modern {
			return &modernTaskResult{ResultType: "complete", modernTask: s.modernTask(t, true)}, nil
		}
		return &legacyTaskResult{legacyTask: s.legacyTask(t)}, nil

	case methodTasksResult:
		t, err := st.Wait(ctx, tr.owner, id)
		switch {
		case errors.Is(err, taskstore.ErrNotFound):
			return nil, notFound(id)
		case err != nil:
			return nil, err
		}
		switch t.Status {
		case taskstore.Completed:
			return &relatedResult{raw: t.Result, taskID: id}, nil
		case taskstore.Failed:
			return nil, &jsonrpc.Error{Code: t.Error.Code, Message: t.Error.Message, Data: t.Error.Data}
		default:
			return nil, invalidParams("Task %s was cancelled before it finished; it has no result.", id)
		}

	case methodTasksCancel:
		t, err := st.Cancel(tr.owner, id, "Cancelled by the client; the bridge stopped waiting for the board, "+
			"which may still carry the call out.")
		switch {
		case errors.Is(err, taskstore.ErrNotFound):
			return nil, notFound(id)
		case errors.Is(err, taskstore.ErrTerminal):
			if tr.modern {
				return &ackResult{ResultType: "complete"}, nil // cancelling an ended task is a no-op
			}
			return nil, invalidParams("Task %s has already ended (%s); it cannot be cancelled.", id, t.Status)
		}
		if tr.modern {
			return &ackResult{ResultType: "complete"}, nil
		}
		return &legacyTaskResult{legacyTask: s.legacyTask(t)}, nil

	case methodTasksUpdate:
		answers := map[string]json.RawMessage{}
		if p != nil && len(p.InputResponses) > 0 && string(p.InputResponses) != "null" {
			if json.Unmarshal(p.InputResponses, &answers) != nil {
				return nil, invalidParams("inputResponses must be an object of answers by the keys of the task's inputRequests, "+
					"e.g. {\"flow-1\": {\"action\": \"accept\", \"content\": {\"confirm\": true}}}; got %s.", clipRaw(p.InputResponses))
			}
		}
		if err := st.Update(tr.owner, id, answers); err != nil {
			return nil, notFound(id)
		}
		return &ackResult{ResultType: "complete"}, nil
	}
	return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: method + " is not a tasks method"}
}

// createResult is the answer to a tools/call that became a task.
func (s *Server) createResult(t *taskstore.Snapshot, modern bool) mcp.Result {
	if modern {
		return &modernTaskResult{ResultType: "task", modernTask: s.modernTask(*t, false)}
	}
	return &legacyCreateResult{Task: s.legacyTask(*t)}
}

// isoTime is a task's timestamps' format (ISO 8601, UTC, milliseconds).
func isoTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// modernTask is a 2026-07-28 Task; detailed adds what its status inlines
// (tasks/get), which CreateTaskResult must not carry.
type modernTask struct {
	TaskID         string                     `json:"taskId"`
	Status         taskstore.Status           `json:"status"`
	StatusMessage  string                     `json:"statusMessage,omitempty"`
	CreatedAt      string                     `json:"createdAt"`
	LastUpdatedAt  string                     `json:"lastUpdatedAt"`
	TTLMs          int64                      `json:"ttlMs"`
	PollIntervalMs int64                      `json:"pollIntervalMs,omitempty"`
	InputRequests  map[string]json.RawMessage `json:"inputRequests,omitempty"`
	Result         json.RawMessage            `json:"result,omitempty"`
	Error          *taskstore.Error           `json:"error,omitempty"`
}

func (s *Server) modernTask(t taskstore.Snapshot, detailed bool) modernTask {
	out := modernTask{TaskID: t.ID, Status: t.Status, StatusMessage: t.Message, CreatedAt: isoTime(t.Created),
		LastUpdatedAt: isoTime(t.Updated), TTLMs: t.TTL.Milliseconds(), PollIntervalMs: s.tk.opts.PollInterval.Milliseconds()}
	if detailed {
		switch t.Status {
		case taskstore.InputRequired:
			out.InputRequests = t.Input
		case taskstore.Completed:
			out.Result = t.Result
		case taskstore.Failed:
			out.Error = t.Error
		}
	}
	return out
}

// modernTaskResult is tools/call's CreateTaskResult (resultType "task")
// and tasks/get's DetailedTask (resultType "complete").
type modernTaskResult struct {
	mcp.ResultBase
	ResultType string `json:"resultType"`
	modernTask
}

// ackResult is the empty acknowledgement of tasks/update and tasks/cancel.
type ackResult struct {
	mcp.ResultBase
	ResultType string `json:"resultType"`
}

// legacyTask is a 2025-11-25 Task.
type legacyTask struct {
	TaskID        string           `json:"taskId"`
	Status        taskstore.Status `json:"status"`
	StatusMessage string           `json:"statusMessage,omitempty"`
	CreatedAt     string           `json:"createdAt"`
	LastUpdatedAt string           `json:"lastUpdatedAt"`
	TTL           int64            `json:"ttl"`
	PollInterval  int64            `json:"pollInterval,omitempty"`
}

func (s *Server) legacyTask(t taskstore.Snapshot) legacyTask {
	return legacyTask{TaskID: t.ID, Status: t.Status, StatusMessage: t.Message, CreatedAt: isoTime(t.Created),
		LastUpdatedAt: isoTime(t.Updated), TTL: t.TTL.Milliseconds(), PollInterval: s.tk.opts.PollInterval.Milliseconds()}
}

type legacyCreateResult struct {
	mcp.ResultBase
	Task legacyTask `json:"task"`
}

// legacyTaskResult is tasks/get's and tasks/cancel's result.
type legacyTaskResult struct {
	mcp.ResultBase
	legacyTask
}

type legacyTaskList struct {
	mcp.ResultBase
	Tasks      []legacyTask `json:"tasks"`
	NextCursor string       `json:"nextCursor,omitempty"`
}

// relatedResult is tasks/result's answer: the tool's result as the task
// stored it, with the related-task _meta.
type relatedResult struct {
	mcp.ResultBase
	raw    json.RawMessage
	taskID string
}

func (r *relatedResult) MarshalJSON() ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(r.raw, &m); err != nil {
		return nil, err
	}
	meta := map[string]any{}
	if old, ok := m["_meta"]; ok {
		_ = json.Unmarshal(old, &meta)
	}
	for k, v := range r.Meta {
		meta[k] = v
	}
	meta[metaRelatedTask] = map[string]string{"taskId": r.taskID}
	raw, err := json.Marshal(meta)
	if err != nil {
		return nil, err
	}
	m["_meta"] = raw
	return json.Marshal(m)
}

// rawResult is a result another node answered, passed on as it came
// (with this node's _meta merged in, if go-sdk adds any).
type rawResult struct {
	mcp.ResultBase
	raw json.RawMessage
}

func (r *rawResult) MarshalJSON() ([]byte, error) {
	if len(r.Meta) == 0 {
		return r.raw, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(r.raw, &m); err != nil {
		return nil, err
	}
	meta := map[string]any{}
	if old, ok := m["_meta"]; ok {
		_ = json.Unmarshal(old, &meta)
	}
	for k, v := range r.Meta {
		if _, there := meta[k]; !there {
			meta[k] = v
		}
	}
	raw, err := json.Marshal(meta)
	if err != nil {
		return nil, err
	}
	m["_meta"] = raw
	return json.Marshal(m)
}

// legacyInitResult is initialize's result with capabilities.tasks, the
// 2025-11-25 declaration, instead of the 2026-07-28 extension.
type legacyInitResult struct{ *mcp.InitializeResult }

func (r *legacyInitResult) MarshalJSON() ([]byte, error) {
	var caps any = r.Capabilities
	if c := r.Capabilities; c != nil {
		ext := map[string]any{}
		for k, v := range c.Extensions {
			if k != extTasks {
				ext[k] = v
			}
		}
		caps = struct {
			*mcp.ServerCapabilities
			Extensions map[string]any `json:"extensions,omitempty"`
			Tasks      any            `json:"tasks"`
		}{c, ext, map[string]any{"list": struct{}{}, "cancel": struct{}{},
			"requests": map[string]any{"tools": map[string]any{"call": struct{}{}}}}}
	}
	// InitializeResult's own fields, in its order.
	return json.Marshal(struct {
		Meta            mcp.Meta            `json:"_meta,omitempty"`
		Capabilities    any                 `json:"capabilities"`
		Instructions    string              `json:"instructions,omitempty"`
		ProtocolVersion string              `json:"protocolVersion"`
		ServerInfo      *mcp.Implementation `json:"serverInfo"`
	}{r.Meta, caps, r.Instructions, r.ProtocolVersion, r.ServerInfo})
}

// legacyToolList adds execution.taskSupport to each board tool of a
// 2025-11-25 tools/list.
func (s *Server) legacyToolList(lr *mcp.ListToolsResult) mcp.Result {
	cat := s.cat.Load()
	tools := make([]legacyTool, len(lr.Tools))
	for i, t := range lr.Tools {
		tools[i].Tool = t
		if e, ok := cat.byName[t.Name]; ok {
			tools[i].Execution = &toolExecution{TaskSupport: s.taskSupport(e)}
		} else if t.Name == toolCallDeviceTool {
			tools[i].Execution = &toolExecution{TaskSupport: "optional"}
		}
	}
	return &legacyToolListResult{ListToolsResult: lr, tools: tools}
}

type toolExecution struct {
	TaskSupport string `json:"taskSupport"`
}

type legacyTool struct {
	*mcp.Tool
	Execution *toolExecution `json:"execution,omitempty"`
}

type legacyToolListResult struct {
	*mcp.ListToolsResult
	tools []legacyTool
}

func (r *legacyToolListResult) MarshalJSON() ([]byte, error) {
	type plain mcp.ListToolsResult
	return json.Marshal(struct {
		*plain
		Tools []legacyTool `json:"tools"`
	}{(*plain)(r.ListToolsResult), r.tools})
}

// taskIDNode is the node a task id names ("" for an id without one).
func taskIDNode(id string) string {
	node, _, ok := strings.Cut(id, ".")
	if !ok {
		return ""
	}
	return node
}
