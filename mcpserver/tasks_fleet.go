package mcpserver

// Tasks in a fleet. A task lives on the node whose bridge started it (its
// goroutine waits for the board there), and its id says which: "<node>.
// <32 hex digits>". A stateless client behind a load balancer may poll any
// node; a node that gets tasks/get, tasks/result, tasks/cancel or
// tasks/update for a task another node holds forwards the request there
// (TaskOptions.Forward: the cluster's request/reply), with the caller it
// authenticated, and passes the answer back. tasks/list lists only the
// tasks of the node asked.

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/internal/clip"
)

// forwardedTask is a tasks/* request another node sends to the holder.
type forwardedTask struct {
	Method         string          `json:"method"`
	Owner          string          `json:"owner"`
	Modern         bool            `json:"modern"`
	TaskID         string          `json:"task_id"`
	InputResponses json.RawMessage `json:"input_responses,omitempty"`
}

// forwardedReply is the holder's answer: a result or a JSON-RPC error.
type forwardedReply struct {
	Result json.RawMessage `json:"result,omitempty"`
	Error  *jsonrpc.Error  `json:"error,omitempty"`
}

// ErrTaskHolderGone is what Forward wraps when the node that holds a task
// is no longer in the fleet.
var ErrTaskHolderGone = errors.New("the node that holds the task is not in the fleet")

// forwardTask sends the request to the node that holds task id, when that
// is another node; forwarded is false when this node answers itself.
func (s *Server) forwardTask(ctx context.Context, method string, tr *taskRequest, id string, p *taskParams) (res mcp.Result, err error, forwarded bool) {
	node := taskIDNode(id)
	self := s.nodeID()
	if node == "" || node == self || s.opts.Tasks.Forward == nil {
		return nil, nil, false
	}
	req := forwardedTask{Method: method, Owner: tr.owner, Modern: tr.modern, TaskID: id}
	if p != nil {
		req.InputResponses = p.InputResponses
	}
	data, _ := json.Marshal(req)
	out, err := s.opts.Tasks.Forward(ctx, node, data)
	if err != nil {
		if errors.Is(err, ErrTaskHolderGone) {
			return nil, invalidParams("Task %s was held by node %s, which is no longer in the fleet: it is gone with that node. Start the call again.",
				cut(id, 80), node), true
		}
		s.lines().taskForward.Warn(s.log, "could not reach the node that holds a task", zap.String("node", node),
			zap.String("method", method), clip.Error(err))
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "Task " + cut(id, 80) + " is held by node " + node +
			", which could not be reached (" + err.Error() + "). Try again in a moment."}, true
	}
	var reply forwardedReply
	if err := json.Unmarshal(out, &reply); err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "node " + node + " answered unreadably: " + err.Error()}, true
	}
	if reply.Error != nil {
		return nil, reply.Error, true
	}
	return &rawResult{raw: reply.Result}, nil, true
}

// ServeForwardedTask answers a tasks/* request another node forwarded for
// a task this node holds (the cluster's Config.Tasks). The other node has
// authenticated the caller; its owner key is taken as given, as the
// cluster trusts its nodes with the caller of a routed call.
func (s *Server) ServeForwardedTask(ctx context.Context, req []byte) []byte {
	reply := func(r forwardedReply) []byte {
		out, _ := json.Marshal(r)
		return out
	}
	if s.tk == nil {
		return reply(forwardedReply{Error: &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "tasks are off on node " + s.nodeID()}})
	}
	var f forwardedTask
	if err := json.Unmarshal(req, &f); err != nil || f.Owner == "" || f.TaskID == "" {
		return reply(forwardedReply{Error: &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: "unreadable forwarded task request"}})
	}
	switch f.Method {
	case methodTasksGet, methodTasksResult, methodTasksCancel, methodTasksUpdate:
	default:
		return reply(forwardedReply{Error: &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: f.Method + " cannot be forwarded"}})
	}
	tr := &taskRequest{owner: f.Owner, modern: f.Modern, declared: true}
	res, err := s.localTask(ctx, f.Method, tr, f.TaskID, &taskParams{InputResponses: f.InputResponses})
	if err != nil {
		var je *jsonrpc.Error
		if !errors.As(err, &je) {
			je = &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: err.Error()}
		}
		return reply(forwardedReply{Error: je})
	}
	raw, err := json.Marshal(res)
	if err != nil {
		return reply(forwardedReply{Error: &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: err.Error()}})
	}
	return reply(forwardedReply{Result: raw})
}
