package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/audit"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/policy"
)

// Headers of a routed call.
const (
	hdrCallID   = "Devicebridge-Call-Id"
	hdrDeadline = "Devicebridge-Deadline"
	// hdrCaller is who asked for a routed call or forwarded interaction
	// request, as the calling node authenticated them (a JSON caller);
	// the holder refuses a request without it.
	hdrCaller = "Devicebridge-Caller"
	// hdrFrom names the node that sent the request (for the holder's
	// logs and audit line).
	hdrFrom = "Devicebridge-From"
	// hdrRefused, on a reply, says why the holder refused the request.
	hdrRefused = "Devicebridge-Refused"
)

// caller is a policy.Identity on the wire.
type caller struct {
	Name   string   `json:"name"`
	Groups []string `json:"groups,omitempty"`
}

// setCaller puts on msg who is calling (the identity in ctx, as
// policy.IdentityFrom reads it) and this node's id.
func (n *Node) setCaller(ctx context.Context, msg *nats.Msg) {
	id := policy.IdentityFrom(ctx)
	data, _ := json.Marshal(caller{Name: id.Name, Groups: id.Groups})
	msg.Header.Set(hdrCaller, string(data))
	msg.Header.Set(hdrFrom, n.cfg.NodeID)
}

// callerOf reads the identity of the caller off a request; false when it
// has none (a node that does not send it, or not a node at all).
func callerOf(m *nats.Msg) (policy.Identity, bool) {
	var c caller
	if err := json.Unmarshal([]byte(m.Header.Get(hdrCaller)), &c); err != nil || c.Name == "" {
		return policy.Identity{}, false
	}
	return policy.Identity{Name: c.Name, Groups: c.Groups}, true
}

// errNoCaller is the holder's answer to a request that does not say who
// is calling.
const errNoCaller = "the request did not say who is calling, so nothing was sent to the board"

type callRequest struct {
	DeviceID  string          `json:"device_id"`
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

type callReply struct {
	Result *device.CallResult `json:"result,omitempty"`
	Error  *callFailure       `json:"error,omitempty"`
}

// callFailure carries a failed call's Code across nodes, with what the
// caller needs to rebuild the same error (the tools an unknown-tool error
// lists, the method of a device error).
type callFailure struct {
	Code    device.Code `json:"code"`
	Message string      `json:"message"`
	Tool    string      `json:"tool,omitempty"`
	Known   []string    `json:"known,omitempty"`
	Method  string      `json:"method,omitempty"`
	Node    string      `json:"node"`
}

// serveCalls answers the calls other nodes route to this node's boards on
// <prefix>.call.<node>.<board key>, and their cancellations on
// <prefix>.cancel.<node>.
func (n *Node) serveCalls() error {
	call, err := n.nc.Subscribe(n.subject("call", n.cfg.NodeID, "*"), func(m *nats.Msg) {
		n.goOwned(func() { n.answer(m) })
	})
	if err != nil {
		return fmt.Errorf("cluster: subscribe to calls: %w", err)
	}
	cancel, err := n.nc.Subscribe(n.subject("cancel", n.cfg.NodeID), func(m *nats.Msg) {
		n.router.cancelAnswer(string(m.Data))
	})
	if err != nil {
		_ = call.Unsubscribe()
		return fmt.Errorf("cluster: subscribe to cancellations: %w", err)
	}
	n.subs = append(n.subs, call, cancel)
	for kind, h := range map[string]func(context.Context, []byte) []byte{"interaction": n.cfg.Interactions, "task": n.cfg.Tasks} {
		if h == nil {
			continue
		}
		sub, err := n.nc.Subscribe(n.subject(kind, n.cfg.NodeID), func(m *nats.Msg) {
			n.goOwned(func() {
				ctx, cancel := n.deadlineOf(m)
				defer cancel()
				reply := &nats.Msg{Header: nats.Header{}}
				if who, ok := callerOf(m); ok {
					// The interaction's tool runs as the caller, and a
					// call it routes on carries them.
					reply.Data = h(policy.WithIdentity(ctx, who), m.Data)
				} else {
					n.refusals.Warn(n.log, "refused a forwarded "+kind+" request that did not say who is calling",
						clip.Field("from", m.Header.Get(hdrFrom)))
					reply.Header.Set(hdrRefused, errNoCaller)
				}
				if err := m.RespondMsg(reply); err != nil && n.ctx.Err() == nil {
					n.log.Debug("could not answer a forwarded request", zap.String("kind", kind), zap.Error(err))
				}
			})
		})
		if err != nil {
			return fmt.Errorf("cluster: subscribe to %ss: %w", kind, err)
		}
		n.subs = append(n.subs, sub)
	}
	return nil
}

// deadlineOf is the node's context bounded by the caller's deadline, when
// the request carries one.
func (n *Node) deadlineOf(m *nats.Msg) (context.Context, context.CancelFunc) {
	if d, err := time.Parse(time.RFC3339Nano, m.Header.Get(hdrDeadline)); err == nil {
		return context.WithDeadline(n.ctx, d)
	}
	return context.WithCancel(n.ctx)
}

// ErrNodeGone: no node answers on the subject of the node asked for.
var ErrNodeGone = errors.New("the node does not answer")

// ForwardInteraction sends a request for a control-API interaction to the
// node that holds it (Config.Interactions there) and returns its reply.
// The caller's deadline travels with it (RemoteCallLimit without one). An
// error wraps ErrNodeGone when that node is not in the fleet any more.
func (n *Node) ForwardInteraction(ctx context.Context, node string, req []byte) ([]byte, error) {
	return n.forward(ctx, "interaction", node, req)
}

// ForwardTask sends a request for an MCP task to the node that holds it
// (Config.Tasks there) and returns its reply, as ForwardInteraction does.
func (n *Node) ForwardTask(ctx context.Context, node string, req []byte) ([]byte, error) {
	return n.forward(ctx, "task", node, req)
}

// forward is a request/reply to node's handler of kind, with the caller.
func (n *Node) forward(ctx context.Context, kind, node string, req []byte) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, n.cfg.RemoteCallLimit)
		defer cancel()
	}
	deadline, _ := ctx.Deadline()
	if sanitize(node) != node {
		return nil, fmt.Errorf("%w: %q is not a node id", ErrNodeGone, node)
	}
	msg := &nats.Msg{Subject: n.subject(kind, node), Data: req, Header: nats.Header{}}
	msg.Header.Set(hdrDeadline, deadline.UTC().Format(time.RFC3339Nano))
	n.setCaller(ctx, msg)
	resp, err := n.nc.RequestMsgWithContext(ctx, msg)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return nil, fmt.Errorf("node %s: %w", node, ErrNodeGone)
	case err != nil:
		return nil, fmt.Errorf("node %s: %w", node, err)
	case resp.Header.Get(hdrRefused) != "":
		return nil, fmt.Errorf("node %s refused the request: %s", node, resp.Header.Get(hdrRefused))
	}
	return resp.Data, nil
}

func (n *Node) answer(m *nats.Msg) {
	var req callRequest
	if err := json.Unmarshal(m.Data, &req); err != nil {
		n.reply(m, callReply{Error: &callFailure{Code: device.CodeFailed, Message: "unreadable routed call", Node: n.cfg.NodeID}})
		return
	}
	// The holder decides too: the calling node checked the caller with its
	// own policy, but this node's policy is the one in force for its
	// boards, and a request without a caller came from no node that
	// checked anything.
	from := m.Header.Get(hdrFrom)
	who, ok := callerOf(m)
	if !ok {
		n.refusals.Warn(n.log, "refused a routed call that did not say who is calling", clip.Field("from", from),
			clip.Field("device_id", req.DeviceID), clip.Field("tool", req.Tool))
		n.auditCall(policy.Identity{}, from, req, "denied", "no caller identity", 0)
		n.refuse(m, errNoCaller)
		return
	}
	board := policy.Board{ID: req.DeviceID}
	if n.cfg.Alias != nil {
		board.Alias = n.cfg.Alias(req.DeviceID)
	}
	if err := n.cfg.Policy.Check(who, board, req.Tool); err != nil {
		n.denied.Info(n.log, "routed call refused by policy", clip.Field("identity", who.Name), clip.Field("from", from),
			clip.Field("device_id", req.DeviceID), clip.Field("tool", req.Tool))
		n.auditCall(who, from, req, "denied", "policy", 0)
		n.refuse(m, err.Error())
		return
	}
	ctx, cancel := context.WithCancelCause(policy.WithIdentity(n.ctx, who))
	defer cancel(nil)
	if d, err := time.Parse(time.RFC3339Nano, m.Header.Get(hdrDeadline)); err == nil {
		var stop context.CancelFunc
		ctx, stop = context.WithDeadline(ctx, d)
		defer stop()
	}
	id := m.Header.Get(hdrCallID)
	if id != "" {
		n.router.answering(id, cancel)
		defer n.router.answered(id)
	}
	start := time.Now()
	res, err := n.hub.CallLocal(ctx, req.DeviceID, req.Tool, req.Arguments)
	took := time.Since(start)
	if err == nil {
		n.obs.RoutedCallDone(DirectionIn, "", took)
		outcome := "ok"
		if res != nil && res.IsError {
			outcome = "tool_error"
		}
		n.auditCall(who, from, req, outcome, "", took)
		n.reply(m, callReply{Result: res})
		return
	}
	f := &callFailure{Code: device.CodeOf(err), Message: err.Error(), Node: n.cfg.NodeID}
	var toolErr *device.UnknownToolError
	var devErr *device.DeviceError
	switch {
	case f.Code == device.CodeUnknownDevice:
		// Listed a moment ago on this node: it went away since.
		f.Code, f.Message = device.CodeOffline, fmt.Sprintf("%s is no longer connected to node %s", req.DeviceID, n.cfg.NodeID)
	case errors.As(err, &toolErr):
		f.Tool, f.Known = toolErr.Tool, toolErr.Known
	case errors.As(err, &devErr):
		f.Method, f.Message = devErr.Method, devErr.Message
	}
	n.obs.RoutedCallDone(DirectionIn, f.Code, took)
	n.auditCall(who, from, req, string(f.Code), "", took)
	n.reply(m, callReply{Error: f})
}

// refuse answers a routed call the holder will not run; the caller gets
// why, from this node.
func (n *Node) refuse(m *nats.Msg, why string) {
	n.obs.RoutedCallDone(DirectionIn, device.CodeFailed, 0)
	n.reply(m, callReply{Error: &callFailure{Code: device.CodeFailed, Node: n.cfg.NodeID,
		Message: fmt.Sprintf("node %s, which holds the board, refused the call: %s", n.cfg.NodeID, why)}})
}

// auditCall records a routed call in this node's audit log (the calling
// node records it in its own).
func (n *Node) auditCall(who policy.Identity, from string, req callRequest, outcome, reason string, took time.Duration) {
	l := n.cfg.Audit
	if l == nil {
		return
	}
	err := l.Write(audit.Record{Kind: audit.KindToolCall, Via: "fleet", Node: from, Identity: who.Name, Board: req.DeviceID,
		Tool: req.Tool, ArgsDigest: l.Digest(req.Arguments), Outcome: outcome, Reason: reason,
		DurationMS: float64(took.Microseconds()) / 1000})
	if err != nil {
		n.log.Warn("audit log write failed", zap.Error(err))
	}
}

func (n *Node) reply(m *nats.Msg, r callReply) {
	data, _ := json.Marshal(r)
	if err := m.Respond(data); err != nil && n.ctx.Err() == nil {
		n.log.Debug("could not answer a routed call", zap.Error(err))
	}
}

// CallTool calls a tool on a board another node holds, by NATS
// request/reply to that node (device.Remote). The caller's deadline and
// cancellation travel with it; the call is never retried elsewhere.
func (n *Node) CallTool(ctx context.Context, info device.Info, tool string, args json.RawMessage) (*device.CallResult, error) {
	start := time.Now()
	res, err := n.callRemote(ctx, info, tool, args)
	n.obs.RoutedCallDone(DirectionOut, device.CodeOf(err), time.Since(start))
	return res, err
}

func (n *Node) callRemote(ctx context.Context, info device.Info, tool string, args json.RawMessage) (*device.CallResult, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, n.cfg.RemoteCallLimit)
		defer cancel()
	}
	deadline, _ := ctx.Deadline()
	data, _ := json.Marshal(callRequest{DeviceID: info.DeviceID, Tool: tool, Arguments: args})
	id := nats.NewInbox()[len(nats.InboxPrefix):]
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if !n.router.track(info.Node, id, cancel) {
		return nil, fmt.Errorf("%w: this node has left the fleet", device.ErrShutdown)
	}
	defer n.router.untrack(info.Node, id)
	msg := &nats.Msg{Subject: n.subject("call", info.Node, keyFor(info.DeviceID)), Data: data, Header: nats.Header{}}
	msg.Header.Set(hdrCallID, id)
	msg.Header.Set(hdrDeadline, deadline.UTC().Format(time.RFC3339Nano))
	n.setCaller(ctx, msg)
	resp, err := n.nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			// Tell the holder, so the board's queue is not held for nothing.
			_ = n.nc.Publish(n.subject("cancel", info.Node), []byte(id))
			return nil, fmt.Errorf("call to %s on node %s: %w", info.DeviceID, info.Node, context.Cause(ctx))
		case errors.Is(err, nats.ErrNoResponders):
			n.obs.RoutedCallNoResponder()
			return nil, fmt.Errorf("%w: node %s, which holds %s, does not answer", device.ErrOffline, info.Node, info.DeviceID)
		default:
			return nil, fmt.Errorf("%w: %s is on node %s, unreachable: %v", device.ErrOffline, info.DeviceID, info.Node, err)
		}
	}
	var r callReply
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return nil, fmt.Errorf("node %s answered a call to %s unreadably: %w", info.Node, info.DeviceID, err)
	}
	if r.Error != nil {
		return nil, r.Error.err()
	}
	if r.Result == nil {
		return nil, fmt.Errorf("node %s answered a call to %s without a result", info.Node, info.DeviceID)
	}
	return r.Result, nil
}

// router knows the routed calls in flight through this node, so that
// each can be cancelled from outside the goroutine that runs it.
// Invariant: once stopped, every call it knew of is cancelled and it takes
// no new outgoing call.
type router struct {
	mu      sync.Mutex
	stopped bool
	// inflight: calls this node answers for another node, by call id (the
	// caller's cancellation names it).
	inflight map[string]context.CancelCauseFunc
	// outgoing: calls this node routed and waits for, by holder node and
	// call id, so that they end as offline when the holder is declared
	// dead or this node loses NATS (the answer can no longer come).
	outgoing map[string]map[string]context.CancelCauseFunc
}

func newRouter() *router {
	return &router{inflight: map[string]context.CancelCauseFunc{}, outgoing: map[string]map[string]context.CancelCauseFunc{}}
}

// answering notes a call this node answers; answered forgets it.
func (r *router) answering(id string, cancel context.CancelCauseFunc) {
	r.mu.Lock()
	r.inflight[id] = cancel
	r.mu.Unlock()
}

func (r *router) answered(id string) {
	r.mu.Lock()
	delete(r.inflight, id)
	r.mu.Unlock()
}

// cancelAnswer cancels a call this node answers, as its caller asked.
func (r *router) cancelAnswer(id string) {
	r.mu.Lock()
	c := r.inflight[id]
	r.mu.Unlock()
	if c != nil {
		c(context.Canceled)
	}
}

// track notes a call this node routed to node; false once stopped.
func (r *router) track(node, id string, cancel context.CancelCauseFunc) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return false
	}
	calls := r.outgoing[node]
	if calls == nil {
		calls = map[string]context.CancelCauseFunc{}
		r.outgoing[node] = calls
	}
	calls[id] = cancel
	return true
}

func (r *router) untrack(node, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.outgoing[node], id)
	if len(r.outgoing[node]) == 0 {
		delete(r.outgoing, node)
	}
}

// fail ends the calls waiting for an answer from node (every node when
// ""): that answer can no longer come.
func (r *router) fail(node string, cause error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for holder, calls := range r.outgoing {
		if node == "" || holder == node {
			for _, c := range calls {
				c(cause)
			}
		}
	}
}

// stop cancels every call, both ways, and refuses new outgoing ones.
func (r *router) stop(cause error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
	for _, c := range r.inflight {
		c(cause)
	}
	for _, calls := range r.outgoing {
		for _, c := range calls {
			c(cause)
		}
	}
}

// err rebuilds the error the holder's Hub returned, so that CodeOf (and
// errors.As for the detailed types) gives the same answer as for a local
// call.
func (f *callFailure) err() error {
	switch f.Code {
	case device.CodeUnknownTool:
		return &device.UnknownToolError{Tool: f.Tool, Known: f.Known}
	case device.CodeDeviceError:
		return &device.DeviceError{Method: f.Method, Message: f.Message}
	}
	return &RemoteError{Code: f.Code, Node: f.Node, Message: f.Message}
}

// RemoteError is a failure another node reported for a call it answered.
// errors.Is matches the sentinel of its Code (device.ErrBusy for busy...).
type RemoteError struct {
	Code    device.Code
	Node    string
	Message string
}

func (e *RemoteError) Error() string { return e.Message }

// Is makes errors.Is (and so device.CodeOf) see the Code's sentinel.
func (e *RemoteError) Is(target error) bool {
	s := sentinels[e.Code]
	return s != nil && target == s
}

var sentinels = map[device.Code]error{
	device.CodeUnknownDevice:    device.ErrUnknownDevice,
	device.CodeInvalidArguments: device.ErrInvalidArguments,
	device.CodeNotReady:         device.ErrNotReady,
	device.CodeNoMCP:            device.ErrNoMCP,
	device.CodeBusy:             device.ErrBusy,
	device.CodeQueueTimeout:     device.ErrQueueTimeout,
	device.CodeTimeout:          device.ErrTimeout,
	device.CodeOffline:          device.ErrOffline,
	device.CodeShuttingDown:     device.ErrShutdown,
	device.CodeCanceled:         context.Canceled,
}
