package mcpserver

// Long calls as tasks (MCP tasks, both eras). A board tool call that may
// outlast the caller's patience (a photo, a firmware upgrade) can run as a
// task: the caller gets a task handle at once and polls for the outcome.
//
//   - 2025-11-25 sessions (the experimental tasks of that revision): the
//     client asks for a task with params.task on tools/call (every board
//     tool is listed with execution.taskSupport "optional", or "required"
//     for the tools mcp.tasks.required names) and gets
//     {task: {taskId, status, ttl, ...}}; tasks/get, tasks/result (blocks
//     until the task ends and returns the tool's result), tasks/list and
//     tasks/cancel follow. initialize declares capabilities.tasks.
//   - 2026-07-28 (the extension io.modelcontextprotocol/tasks, declared in
//     capabilities.extensions): the server decides. A call from a client
//     that declares the extension (in the request's clientCapabilities) on
//     a tool that mcp.tasks.tools or mcp.tasks.required names (the app adds
//     the tools whose devices.tool_timeouts exceed devices.call_timeout)
//     answers resultType "task"; tasks/get inlines the result, tasks/update
//     answers the task's input requests, tasks/cancel stops it.
//
// A task's call is a tools/call like any other: the same argument checks,
// policy, confirmation, audit and the board's one-call-at-a-time queue
// (guardedCall and call); only the board call itself moves to the task's
// goroutine (Server.run). Missing or invalid arguments are settled before
// the task exists (elicitation, or MRTR rounds): a task is created for a
// call that can run. A tool that needs the user's yes asks it inside the
// task for a modern client (status input_required, answered by
// tasks/update), and before the task for a session-based one, whose
// elicitation goes through the tools/call request.
//
// Tasks belong to their caller (taskOwner): the verified identity when
// there is one, else the legacy session, else (stateless, no credentials)
// the client's address; anyone else is told the task does not exist. Ids
// are 128 random bits, so a stateless client without credentials behind a
// shared address is protected by its ids alone. The store
// (package taskstore) bounds their number, in all and per caller, and
// their life (mcp.tasks.ttl, from creation: a task still running then is
// cancelled). In a fleet a task's id starts with its node's id, and
// another node forwards tasks/* for it there (tasks_fleet.go).
//
// Status notifications (notifications/tasks/status) are not sent: go-sdk
// v1.8.0 gives a server no way to send a notification it does not know.
// Hosts poll (pollInterval), or wait in tasks/result.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/flow"
	"github.com/devicebridge/devicebridge/mcpserver/taskstore"
	"github.com/devicebridge/devicebridge/policy"
)

const (
	// extTasks is the 2026-07-28 tasks extension's identifier.
	extTasks = "io.modelcontextprotocol/tasks"
	// metaRelatedTask ties a 2025-11-25 tasks/result to its task.
	metaRelatedTask = "io.modelcontextprotocol/related-task"

	methodTasksGet    = "tasks/get"
	methodTasksResult = "tasks/result"
	methodTasksList   = "tasks/list"
	methodTasksCancel = "tasks/cancel"
	methodTasksUpdate = "tasks/update"

	// codeMissingCapability is MCP's "missing required client
	// capability"; codeHeaderMismatch its "header mismatch" (SEP-2243).
	codeMissingCapability = -32021
	codeHeaderMismatch    = -32020
	// codeTaskLimit refuses a task past a bound: the generic server error,
	// as for the session caps.
	codeTaskLimit = -32000

	// headerTask carries, from the front handler to the tools/call
	// handler, that a legacy tools/call asked for a task (params.task,
	// which go-sdk does not decode), with its ttl in milliseconds ("0":
	// none given). The front handler deletes what a client sent under
	// this name first.
	headerTask = "X-Devicebridge-Task"
	// headerName is SEP-2243's Mcp-Name: on tasks/*, the task id.
	headerName = "Mcp-Name"
)

// Defaults of TaskOptions.
const (
	DefaultTaskTTL          = 10 * time.Minute
	DefaultTaskPollInterval = time.Second
	DefaultMaxTasks         = 256
	DefaultMaxTasksPerCall  = 32
)

// TaskOptions configure tasks (the mcp.tasks: section).
type TaskOptions struct {
	// Disabled turns tasks off in both eras: no capability is declared,
	// params.task is ignored and tasks/* are unknown methods.
	Disabled bool `yaml:"disabled"`
	// Tools are the board tools that run as tasks for 2026-07-28 clients
	// that declare the tasks extension: path.Match patterns against the
	// board's own tool name or the name /mcp publishes, ignoring case.
	Tools []string `yaml:"tools"`
	// Required are tools that run only as tasks: a client that cannot
	// take a task (2026-07-28 without the extension: -32021; 2025-11-25
	// without params.task: -32601) is refused. They are task tools too.
	Required []string `yaml:"required"`
	// TTL is a task's life, from its creation, and the longest a client
	// may ask for: the task is forgotten then, and cancelled if it still
	// runs.
	TTL time.Duration `yaml:"ttl"`
	// PollInterval is the polling interval suggested to clients.
	PollInterval time.Duration `yaml:"poll_interval"`
	// MaxTasks bounds the tasks kept at once (finished ones until they
	// expire); MaxPerCaller those of one caller.
	MaxTasks     int `yaml:"max_tasks"`
	MaxPerCaller int `yaml:"max_per_caller"`
	// Node, in a fleet, returns this node's id: task ids start with it.
	Node func() string `yaml:"-"`
	// Forward sends a tasks/* request for a task another node holds to
	// that node (its Server.ServeForwardedTask) and returns the reply.
	Forward func(ctx context.Context, node string, req []byte) ([]byte, error) `yaml:"-"`
}

func (o TaskOptions) withDefaults() TaskOptions {
	o.TTL = max(o.TTL, 0)
	if o.TTL == 0 {
		o.TTL = DefaultTaskTTL
	}
	if o.PollInterval <= 0 {
		o.PollInterval = DefaultTaskPollInterval
	}
	if o.MaxTasks <= 0 {
		o.MaxTasks = DefaultMaxTasks
	}
	if o.MaxPerCaller <= 0 {
		o.MaxPerCaller = DefaultMaxTasksPerCall
	}
	return o
}

func (o TaskOptions) validate() []error {
	var errs []error
	for key, list := range map[string][]string{"mcp.tasks.tools": o.Tools, "mcp.tasks.required": o.Required} {
		for _, p := range list {
			if _, err := path.Match(strings.ToLower(p), ""); err != nil || strings.TrimSpace(p) == "" {
				errs = append(errs, fmt.Errorf("%s: %q is not a valid pattern (use a tool name like self.camera.take_photo, or * wildcards like *upgrade*)", key, p))
			}
		}
	}
	return errs
}

// taskState is the server's tasks: their store and the task tool patterns.
type taskState struct {
	opts     TaskOptions
	store    *taskstore.Store
	tools    []string // lower case, Required included
	required []string
}

// setupTasks registers the tasks methods and middleware (New). The
// middleware must sit outside accessMiddleware, which filters the tool
// list it annotates.
func (s *Server) setupTasks() error {
	o := s.opts.Tasks
	if o.Disabled {
		return nil
	}
	st := &taskState{opts: o}
	for _, p := range o.Required {
		st.required = append(st.required, strings.ToLower(strings.TrimSpace(p)))
	}
	for _, p := range o.Tools {
		st.tools = append(st.tools, strings.ToLower(strings.TrimSpace(p)))
	}
	st.tools = append(st.tools, st.required...)
	st.store = taskstore.New(taskstore.Options{MaxTasks: o.MaxTasks, MaxPerOwner: o.MaxPerCaller, Prefix: s.nodeID})
	s.tk = st
	s.mcp.AddReceivingMiddleware(s.taskMiddleware)
	for _, err := range []error{
		mcp.AddReceivingCustomMethod(s.mcp, methodTasksGet, s.taskByID(methodTasksGet)),
		mcp.AddReceivingCustomMethod(s.mcp, methodTasksResult, s.taskByID(methodTasksResult)),
		mcp.AddReceivingCustomMethod(s.mcp, methodTasksList, s.tasksList),
		mcp.AddReceivingCustomMethod(s.mcp, methodTasksCancel, s.taskByID(methodTasksCancel)),
		mcp.AddReceivingCustomMethod(s.mcp, methodTasksUpdate, s.taskByID(methodTasksUpdate)),
	} {
		if err != nil {
			return err
		}
	}
	return nil
}

// closeTasks cancels every task and waits for them (Close).
func (s *Server) closeTasks() {
	if s.tk != nil {
		s.tk.store.Close()
	}
}

// nodeID is this node's id in a fleet, "" alone.
func (s *Server) nodeID() string {
	if f := s.opts.Tasks.Node; f != nil {
		return f()
	}
	return ""
}

// TaskCount reports the tasks held now (metrics, tests); 0 when tasks are
// off.
func (s *Server) TaskCount() int {
	if s.tk == nil {
		return 0
	}
	return s.tk.store.Len()
}

// matches reports whether a board tool matches one of the patterns, by its
// own name or its published one.
func matches(patterns []string, e *entry) bool {
	board, pub := strings.ToLower(e.tool.Name), strings.ToLower(e.name)
	for _, p := range patterns {
		if ok, _ := path.Match(p, board); ok {
			return true
		}
		if ok, _ := path.Match(p, pub); ok {
			return true
		}
	}
	return false
}

// taskSupport is what a board tool declares to 2025-11-25 clients.
func (s *Server) taskSupport(e *entry) string {
	if matches(s.tk.required, e) {
		return "required"
	}
	return "optional"
}

// requiredTask finds the board tool a tools/call names when it runs only
// as a task (nil otherwise).
func (s *Server) requiredTask(name string) *entry {
	if e, ok := s.cat.Load().byName[name]; ok && matches(s.tk.required, e) {
		return e
	}
	return nil
}

// isModernRequest reports whether a request is of the stateless era (the
// same test as askable's).
func isModernRequest(req mcp.Request) bool {
	ss, _ := req.GetSession().(*mcp.ServerSession)
	if ss == nil {
		return false
	}
	ip := ss.InitializeParams()
	return ip == nil || ip.ProtocolVersion >= modernVersion
}

// declaresTasks reports whether a modern request's clientCapabilities
// declare the tasks extension.
func declaresTasks(req mcp.Request) bool {
	r, ok := req.(interface {
		ClientCapabilities() *mcp.ClientCapabilities
	})
	if !ok {
		return false
	}
	caps := r.ClientCapabilities()
	if caps == nil {
		return false
	}
	_, ok = caps.Extensions[extTasks]
	return ok
}

// taskOwner is who a task belongs to: the verified identity, else the
// legacy session, else (stateless) the caller the front handler computed
// from the credentials or the address.
func taskOwner(req mcp.Request) string {
	extra := req.GetExtra()
	if extra != nil && extra.TokenInfo != nil && extra.TokenInfo.UserID != "" {
		return "i:" + extra.TokenInfo.UserID
	}
	ss, _ := req.GetSession().(*mcp.ServerSession)
	return callerOf(ss, extra)
}

func missingTasksCapability(what string) error {
	data, _ := json.Marshal(map[string]any{"requiredCapabilities": map[string]any{"extensions": map[string]any{extTasks: map[string]any{}}}})
	return &jsonrpc.Error{Code: codeMissingCapability, Data: data, Message: "Missing required client capability: " + what +
		" needs the tasks extension. Declare it in the request's _meta \"io.modelcontextprotocol/clientCapabilities\": {\"extensions\": {\"" + extTasks + "\": {}}}."}
}

// taskMiddleware: capabilities.tasks and execution.taskSupport for
// 2025-11-25 sessions, the task decision on tools/call, and the caller of
// tasks/* for their handlers.
func (s *Server) taskMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case "initialize":
			res, err := next(ctx, method, req)
			if ir, ok := res.(*mcp.InitializeResult); ok && err == nil && ir != nil {
				return &legacyInitResult{InitializeResult: ir}, nil
			}
			return res, err
		case "tools/list":
			res, err := next(ctx, method, req)
			if lr, ok := res.(*mcp.ListToolsResult); ok && err == nil && lr != nil && !isModernRequest(req) {
				return s.legacyToolList(lr), nil
			}
			return res, err
		case "tools/call":
			return s.taskCall(ctx, next, method, req)
		case methodTasksGet, methodTasksResult, methodTasksList, methodTasksCancel, methodTasksUpdate:
			// A request without params (tasks/list as the TypeScript SDK v1
			// sends it) carries a nil *taskParams, whose isNil, promoted from
			// ParamsBase, dereferences it: go-sdk's ClientCapabilities would
			// panic on it. Give the handlers empty params instead.
			if r, ok := req.(*mcp.ServerRequest[*taskParams]); ok && r.Params == nil {
				r.Params = &taskParams{}
			}
			extra := req.GetExtra()
			tr := &taskRequest{owner: taskOwner(req), modern: isModernRequest(req), declared: declaresTasks(req)}
			if extra != nil && extra.Header != nil {
				tr.name = extra.Header.Get(headerName)
			}
			return next(context.WithValue(ctx, taskRequestKey{}, tr), method, req)
		}
		return next(ctx, method, req)
	}
}

// taskCall is tools/call with tasks: it decides whether the caller can
// take a task, lets the call run its usual path with a taskStart in its
// context, and answers the task handle if that path started one.
func (s *Server) taskCall(ctx context.Context, next mcp.MethodHandler, method string, req mcp.Request) (mcp.Result, error) {
	p, _ := req.GetParams().(*mcp.CallToolParamsRaw)
	if p == nil {
		return next(ctx, method, req)
	}
	ts := &taskStart{s: s, modern: isModernRequest(req), owner: taskOwner(req), ttl: s.tk.opts.TTL}
	if ts.modern {
		if !declaresTasks(req) {
			if e := s.requiredTask(p.Name); e != nil {
				return nil, missingTasksCapability(fmt.Sprintf("%s runs only as a task, so it", p.Name))
			}
			return next(ctx, method, req)
		}
	} else {
		var h string
		if extra := req.GetExtra(); extra != nil && extra.Header != nil {
			h = extra.Header.Get(headerTask)
		}
		if h == "" {
			if e := s.requiredTask(p.Name); e != nil {
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: fmt.Sprintf(
					"%s (%s on board %s) runs only as a task: call it with \"task\": {} in the params (MCP tasks), then poll tasks/get and read tasks/result.",
					p.Name, e.tool.Name, e.label())}
			}
			return next(ctx, method, req)
		}
		if ms, err := strconv.ParseInt(h, 10, 64); err == nil && ms > 0 {
			ts.ttl = min(ts.ttl, time.Duration(ms)*time.Millisecond)
		}
		ts.requested = true
		// The caller's progress token stays good for the task's life.
		ts.req, _ = req.(*mcp.CallToolRequest)
	}
	res, err := next(context.WithValue(ctx, taskStartKey{}, ts), method, req)
	switch {
	case ts.refused != nil:
		return nil, ts.refused
	case ts.created != nil:
		return s.createResult(ts.created, ts.modern), nil
	}
	return res, err
}

// taskStart is a tools/call that may become a task: the middleware puts
// it in the call's context, and the call's path (Server.run) starts the
// task when the tool is about to run.
type taskStart struct {
	s         *Server
	modern    bool
	requested bool // legacy: the client asked (params.task)
	owner     string
	ttl       time.Duration
	req       *mcp.CallToolRequest // legacy: for progress notifications

	created *taskstore.Snapshot // set when a task was started
	refused error               // set when one could not be
}

type taskStartKey struct{}

// taskFor returns the taskStart of a call that runs tool e as a task, nil
// when it runs now: a legacy client asked for one, or a modern one took
// the extension and the tool is a task tool.
func (s *Server) taskFor(ctx context.Context, e *entry) *taskStart {
	ts, _ := ctx.Value(taskStartKey{}).(*taskStart)
	if ts == nil || ts.created != nil || ts.refused != nil {
		return nil
	}
	if ts.requested || (ts.modern && matches(ts.s.tk.tools, e)) {
		return ts
	}
	return nil
}

// confirmsInTask reports whether the call's confirmation is asked inside
// its task (modern clients): the plan then waits for nothing else.
func (s *Server) confirmsInTask(ctx context.Context, e *entry, plan *flow.Plan) bool {
	ts := s.taskFor(ctx, e)
	return ts != nil && ts.modern && !plan.Declined && len(plan.Prompts) == 0 && plan.Confirm != nil
}

// run is where a settled call goes to its board: now (call), or as the
// task the caller takes (the result is then a placeholder, which the
// middleware replaces by the task handle).
func (s *Server) run(ctx context.Context, req *mcp.CallToolRequest, e *entry, args json.RawMessage) *mcp.CallToolResult {
	if ts := s.taskFor(ctx, e); ts != nil {
		return ts.start(ctx, e, args, nil)
	}
	return s.call(ctx, req, e, args)
}

// startConfirming starts the task of a call whose plan still needs the
// user's yes: the task asks it (confirmsInTask).
func (s *Server) startConfirming(ctx context.Context, e *entry, plan *flow.Plan) *mcp.CallToolResult {
	return s.taskFor(ctx, e).start(ctx, e, plan.Args, plan)
}

// placeholder is what the call path returns for a call that became a
// task; the client never sees it. A new one each time: go-sdk sets fields
// of the result it is handed.
func placeholder() *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "started as a task"}}}
}

// start starts the task. plan, when not nil, still needs the
// confirmation, which the task asks first.
func (ts *taskStart) start(ctx context.Context, e *entry, args json.RawMessage, plan *flow.Plan) *mcp.CallToolResult {
	s := ts.s
	// The task runs as the caller, traced under its request, but on a
	// context of its own: the request ends now.
	id := policy.IdentityFrom(ctx)
	span := trace.SpanFromContext(ctx)
	req := ts.req
	msg := fmt.Sprintf("Running %s on board %s.", e.tool.Name, e.label())
	snap, err := s.tk.store.Start(ts.owner, ts.ttl, msg, func(run *taskstore.Run) {
		tctx := trace.ContextWithSpan(policy.WithIdentity(run.Context(), id), span)
		s.runTask(tctx, run, req, e, args, plan)
	})
	if err != nil {
		var le *taskstore.LimitError
		switch {
		case errors.As(err, &le):
			setting := "mcp.tasks.max_tasks"
			if le.PerOwner {
				setting = "mcp.tasks.max_per_caller"
			}
			s.lines().taskRefused.Info(s.log, "task refused", zap.String("setting", setting), zap.Int("limit", le.Limit))
			data, _ := json.Marshal(map[string]any{"setting": setting, "limit": le.Limit})
			ts.refused = &jsonrpc.Error{Code: codeTaskLimit, Data: data, Message: fmt.Sprintf(
				"%s was not started as a task and nothing was sent to the board: %v (%s). Wait for a task to end (and its result to expire, %s after it began) or cancel one (tasks/cancel), then try again.",
				e.tool.Name, err, setting, s.tk.opts.TTL)}
		default:
			ts.refused = &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("%s was not started as a task: %v.", e.tool.Name, err)}
		}
		return placeholder()
	}
	ts.created = &snap
	s.log.Info("tool call runs as a task", zap.String("device_id", e.deviceID), zap.String("tool", e.tool.Name),
		zap.Bool("confirm_in_task", plan != nil), zap.Duration("ttl", snap.TTL))
	return placeholder()
}

// callErrKey carries, into call, where to leave the board's error.
type callErrKey struct{}

// noteCallErr tells a task what its board call failed with (call).
func noteCallErr(ctx context.Context, err error) {
	if p, ok := ctx.Value(callErrKey{}).(*error); ok {
		*p = err
	}
}

// runTask is a task's work: the confirmation when the plan still needs
// it, then the board call.
func (s *Server) runTask(ctx context.Context, run *taskstore.Run, req *mcp.CallToolRequest, e *entry, args json.RawMessage, plan *flow.Plan) {
	if plan != nil {
		var done *mcp.CallToolResult
		if args, done = s.confirmInTask(run, e, plan); done == nil && args == nil {
			return // cancelled, expired or closing while it waited
		}
		if done != nil {
			s.completeTask(run, done)
			return
		}
	}
	var callErr error
	res := s.call(context.WithValue(ctx, callErrKey{}, &callErr), req, e, args)
	var devErr *device.DeviceError
	if errors.As(callErr, &devErr) {
		// The board answered the call with a JSON-RPC error: the request
		// failed, which is what a failed task says (a call without a task
		// shows it as an isError result).
		data, _ := json.Marshal(map[string]any{"board": e.label(), "tool": e.tool.Name})
		run.Fail(&taskstore.Error{Code: jsonrpc.CodeInternalError, Message: "board refused the call: " + devErr.Message, Data: data},
			fmt.Sprintf("Board %s answered %s with an error: %s", e.label(), e.tool.Name, devErr.Message))
		return
	}
	s.completeTask(run, res)
}

func (s *Server) completeTask(run *taskstore.Run, res *mcp.CallToolResult) {
	raw, err := json.Marshal(res)
	if err != nil {
		run.Fail(&taskstore.Error{Code: jsonrpc.CodeInternalError, Message: "the result could not be encoded: " + err.Error()}, "")
		return
	}
	msg := "Done."
	if res.IsError {
		msg = "Done, with an error result."
	}
	run.Complete(raw, msg)
}

// confirmInTask asks the user's yes through the task's input requests
// until the plan is settled: it returns the arguments to run with, or the
// final result when nothing runs (the user said no, too many rounds), or
// neither when the task ended while it waited.
func (s *Server) confirmInTask(run *taskstore.Run, e *entry, plan *flow.Plan) (json.RawMessage, *mcp.CallToolResult) {
	ft := s.flowTool(e)
	for round := 1; ; round++ {
		switch {
		case plan.Declined:
			return nil, declined(e, "decline")
		case plan.Ready():
			return plan.Args, nil
		case round > s.maxRounds():
			return nil, tooManyRounds(e, round-1)
		}
		params, err := ask(e, plan)
		if err != nil {
			return nil, errorResult("%s", flowMessage(err))
		}
		// Keys are never reused within a task.
		key := fmt.Sprintf("%s-%d", inputKey, round)
		raw, err := json.Marshal(mcp.InputRequestMap{key: params})
		var one map[string]json.RawMessage
		if err == nil {
			err = json.Unmarshal(raw, &one)
		}
		if err != nil {
			return nil, errorResult("%s on board %s was not run: its question could not be encoded (%v).", e.tool.Name, e.label(), err)
		}
		got, err := run.Ask(one, params.Message)
		if err != nil {
			return nil, nil
		}
		var r mcp.ElicitResult
		if json.Unmarshal(got[key], &r) != nil || r.Action == "" {
			plan = withError(plan, "the answer was not an elicitation result ({\"action\": \"accept\", \"content\": {...}})")
			continue
		}
		if r.Action != "accept" {
			return nil, declined(e, r.Action)
		}
		next, err := ft.Answer(plan, answers(r.Content))
		if err != nil {
			return nil, errorResult("%s", flowMessage(err))
		}
		plan = next
	}
}
