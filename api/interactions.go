package api

// This file serves guided calls on the control API: a tool call that
// lacks arguments, carries invalid ones or needs the user's confirmation
// runs as an interaction, prompt by prompt, over the same engine (package
// flow) that serves interaction.* on /mcp. The web console and
// `devicebridge interact` use these routes rather than /mcp because they
// speak the control API's vocabulary (a board by its MAC, a tool by the
// board's own name, user-only tools included), take the control tokens,
// and need no MCP session. README "Control API" documents them.

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/flow"
	"github.com/devicebridge/devicebridge/internal/bearer"
	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/policy"
)

// InteractionOptions turn on the interaction routes.
type InteractionOptions struct {
	// NeedsConfirm says whether a board tool needs the user's yes before
	// it runs (the app passes /mcp's rule, tools.NeedsConfirm); nil: none.
	NeedsConfirm func(device.Tool) bool
	// Timeout, MaxPerOwner, MaxPrompts and MaxDuration are flow.Options'.
	Timeout     time.Duration
	MaxPerOwner int
	MaxPrompts  int
	MaxDuration time.Duration
	// Node, in a fleet, names this node ("" alone); it is read at every
	// Start. Ids of interactions started here are then "<node>.<id>", so
	// that any node can tell which node holds one.
	Node func() string
	// Forward sends an answer, state or cancel request for an interaction
	// another node holds to that node, which serves it with
	// ServeForwardedInteraction, and returns its reply. An error wrapping
	// ErrHolderGone means no node answers for it. nil: ids of other nodes
	// are unknown here.
	Forward func(ctx context.Context, node string, req []byte) ([]byte, error)
}

// ErrHolderGone is what Forward returns when the node that holds an
// interaction no longer answers: the interaction is gone with it.
var ErrHolderGone = errors.New("the node that holds the interaction does not answer")

// forwardedOp is a request for an interaction held by another node: the
// caller's identity as the receiving node computed it, and the operation.
type forwardedOp struct {
	Op     string          `json:"op"` // respond, state, cancel
	Owner  string          `json:"owner"`
	ID     string          `json:"id"` // as the client gave it
	Value  json.RawMessage `json:"value,omitempty"`
	Reason string          `json:"reason,omitempty"`
}

// forwardedReply is the holder's HTTP answer, to be sent as it stands.
type forwardedReply struct {
	Status int    `json:"status"`
	Body   string `json:"body"` // a string, so that it is sent byte for byte
}

// InteractionStart is the body of POST /api/devices/{id}/interactions:
// the tool (the board's own name) and the arguments known so far.
type InteractionStart struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
	// Guided also asks the optional arguments of a tool without required
	// ones.
	Guided bool `json:"guided,omitempty"`
}

// InteractionAnswer is the body of POST /api/interactions/{sid}.
type InteractionAnswer struct {
	// Value answers the open prompt; null takes its default.
	Value json.RawMessage `json:"value"`
}

// lookupError is how the interaction lookup says a board or tool is
// missing; the routes turn it into the control API's usual error.
type lookupError struct {
	status int
	detail ErrorDetail
}

func (e *lookupError) Error() string { return e.detail.Message }

// interactionKey names a board tool for the engine: device id, "/", tool.
// A device id never holds "/" here (the routes refuse such boards).
func interactionKey(deviceID, tool string) string { return deviceID + "/" + tool }

func (s *Server) setupInteractions() error {
	o := s.opts.Interactions
	if o == nil {
		return nil
	}
	eng, err := flow.NewEngine(flow.Options{
		Lookup:      s.lookupInteractionTool,
		Timeout:     o.Timeout,
		MaxPerOwner: o.MaxPerOwner,
		MaxPrompts:  o.MaxPrompts,
		MaxDuration: o.MaxDuration,
		Logger:      s.log.Named("interactions"),
	})
	if err != nil {
		return err
	}
	s.flow = eng
	return nil
}

func (s *Server) registerInteractions(r Routes) {
	if s.flow == nil {
		return
	}
	r.Handle("POST /api/devices/{id}/interactions", http.HandlerFunc(s.startInteraction))
	r.Handle("GET /api/interactions/{sid}", http.HandlerFunc(s.interactionState))
	r.Handle("POST /api/interactions/{sid}", http.HandlerFunc(s.answerInteraction))
	r.Handle("DELETE /api/interactions/{sid}", http.HandlerFunc(s.cancelInteraction))
}

// lookupInteractionTool resolves "<device>/<tool>" against the board as it
// is now. Execute goes through the Hub like POST .../call (same checks,
// same events and metrics); the board's whole answer is the outcome's data,
// so that images reach the console.
func (s *Server) lookupInteractionTool(_ context.Context, key string) (*flow.Tool, error) {
	id, name, _ := strings.Cut(key, "/")
	info, ok := s.hub.Device(id)
	if !ok {
		return nil, &lookupError{http.StatusNotFound, ErrorDetail{Code: "unknown_device",
			Message: fmt.Sprintf("no connected device %q (GET /api/devices lists them)", id)}}
	}
	var known []string
	for _, t := range info.Tools {
		known = append(known, t.Name)
		if t.Name != name {
			continue
		}
		// The policy's confirm list applies whoever calls, as on /mcp.
		confirm := s.opts.Access.Policy.NeedsConfirm(t.Name)
		if !confirm && s.opts.Interactions.NeedsConfirm != nil {
			confirm = s.opts.Interactions.NeedsConfirm(t)
		}
		return &flow.Tool{Name: t.Name, Description: t.Description, InputSchema: t.InputSchema, Confirm: confirm,
			Board: cmp.Or(s.alias(info.DeviceID), info.DeviceID),
			Execute: func(ctx context.Context, args json.RawMessage) (flow.Result, error) {
				res, err := s.hub.CallTool(ctx, id, name, args)
				if err != nil {
					status, code := classify(err)
					return flow.Result{Text: err.Error(), IsError: true,
						Data: map[string]any{"error": ErrorDetail{Code: code, Message: err.Error()}, "status": status}}, nil
				}
				return flow.Result{Text: res.Text(), IsError: res.IsError, Data: res}, nil
			}}, nil
	}
	return nil, &lookupError{http.StatusNotFound, ErrorDetail{Code: "unknown_tool", Tools: known,
		Message: fmt.Sprintf("device %s has no tool %q (GET /api/devices/%s lists its tools)", id, name, id)}}
}

// interactionOwner is who may see an interaction: the bearer token's
// hash, or, without tokens, the client's IP address (as on /mcp in the
// stateless era).
func interactionOwner(r *http.Request) string {
	if tok, ok := bearer.FromHeader(r.Header.Get("Authorization")); ok && tok != "" {
		sum := sha256.Sum256([]byte("token\x00" + tok))
		return "t:" + hex.EncodeToString(sum[:])
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	sum := sha256.Sum256([]byte("addr\x00" + host))
	return "a:" + hex.EncodeToString(sum[:])
}

func (s *Server) readBody(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("request body over %d bytes", s.opts.MaxBodyBytes))
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", "body is not the expected JSON object: "+err.Error())
		return false
	}
	return true
}

func (s *Server) startInteraction(w http.ResponseWriter, r *http.Request) {
	var req InteractionStart
	if !s.readBody(w, r, &req) {
		return
	}
	if req.Name == "" {
		writeError(w, http.StatusBadRequest, "bad_request", `"name" (the device tool to call) is required, e.g. {"name": "self.audio_speaker.set_volume", "arguments": {}}`)
		return
	}
	id := r.PathValue("id")
	who := policy.IdentityFrom(r.Context())
	id, board := s.resolveBoard(id)
	if strings.Contains(id, "/") {
		writeError(w, http.StatusNotFound, "unknown_device", fmt.Sprintf("no connected device %q", id))
		return
	}
	// The same decision as a direct call: a guided call is a call.
	if s.refused(w, &s.lines.deniedInteraction, "interaction", who, id, board, req.Name, req.Arguments) {
		return
	}
	step, err := s.flow.Start(r.Context(), interactionOwner(r), interactionKey(id, req.Name), req.Arguments, flow.StartOptions{Guided: req.Guided})
	if err != nil {
		status, body := interactionError(err, "", "")
		writeResult(w, status, body)
		return
	}
	local := step.SessionID
	step.SessionID = s.publicID(local)
	writeJSON(w, http.StatusOK, step)
}

func (s *Server) answerInteraction(w http.ResponseWriter, r *http.Request) {
	var req InteractionAnswer
	if !s.readBody(w, r, &req) {
		return
	}
	if len(req.Value) == 0 {
		req.Value = json.RawMessage("null")
	}
	s.dispatch(w, r, forwardedOp{Op: "respond", ID: r.PathValue("sid"), Value: req.Value})
}

func (s *Server) interactionState(w http.ResponseWriter, r *http.Request) {
	s.dispatch(w, r, forwardedOp{Op: "state", ID: r.PathValue("sid")})
}

func (s *Server) cancelInteraction(w http.ResponseWriter, r *http.Request) {
	s.dispatch(w, r, forwardedOp{Op: "cancel", ID: r.PathValue("sid"), Reason: r.URL.Query().Get("reason")})
}

// self is this node's id in a fleet, "" alone.
func (s *Server) self() string {
	if f := s.opts.Interactions.Node; f != nil {
		return f()
	}
	return ""
}

// publicID is the id a client sees for a local interaction id.
func (s *Server) publicID(local string) string {
	if node := s.self(); node != "" {
		return node + "." + local
	}
	return local
}

// holder splits a client's id into the node that holds the interaction
// and the engine's id there; node is "" for an id without a node.
func holder(id string) (node, local string) {
	if n, l, ok := strings.Cut(id, "."); ok && n != "" {
		return n, l
	}
	return "", id
}

// dispatch serves an operation on an interaction here, or forwards it to
// the node that holds it and sends that node's answer as it stands, so
// that statuses and error codes are the same wherever the client lands.
func (s *Server) dispatch(w http.ResponseWriter, r *http.Request, op forwardedOp) {
	op.Owner = interactionOwner(r)
	node, _ := holder(op.ID)
	forward := s.opts.Interactions.Forward
	if node == "" || node == s.self() || forward == nil {
		status, body := s.runInteraction(r.Context(), op)
		writeResult(w, status, body)
		return
	}
	req, _ := json.Marshal(op)
	data, err := forward(r.Context(), node, req)
	var rep forwardedReply
	if err == nil {
		err = json.Unmarshal(data, &rep)
	}
	switch {
	case err == nil && rep.Status != 0:
	case errors.Is(err, ErrHolderGone):
		writeError(w, http.StatusNotFound, "unknown_interaction", fmt.Sprintf(
			"Interaction %s was held by node %s, which is no longer in the fleet: it is gone with that node. Start a new one (POST /api/devices/{id}/interactions).", op.ID, node))
		return
	default:
		if err == nil {
			err = errors.New("empty reply")
		}
		s.lines.holderUnreachable.Warn(s.log, "could not reach the node that holds an interaction", clip.Field("peer", node), clip.Error(err))
		writeError(w, http.StatusServiceUnavailable, "unavailable", fmt.Sprintf("interaction %s is held by node %s, which could not be reached: %v; retry", op.ID, node, err))
		return
	}
	if rep.Status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(rep.Status)
	_, _ = io.WriteString(w, rep.Body)
}

// ServeForwardedInteraction serves an operation another node forwarded
// (InteractionOptions.Forward) on an interaction this node holds, and
// returns the reply that node sends its client as it stands.
func (s *Server) ServeForwardedInteraction(ctx context.Context, req []byte) []byte {
	var op forwardedOp
	var status int
	var body any
	if s.flow == nil {
		status, body = http.StatusNotFound, ErrorBody{Error: ErrorDetail{Code: "not_found", Message: "interactions are off on this node"}}
	} else if err := json.Unmarshal(req, &op); err != nil {
		status, body = http.StatusBadRequest, ErrorBody{Error: ErrorDetail{Code: "bad_request", Message: "unreadable forwarded interaction request"}}
	} else {
		status, body = s.runInteraction(ctx, op)
	}
	out, _ := json.Marshal(forwardedReply{Status: status, Body: string(encodeJSON(body))})
	return out
}

// runInteraction runs an answer, state or cancel operation on this node's
// engine and returns the HTTP status and body to send.
func (s *Server) runInteraction(ctx context.Context, op forwardedOp) (int, any) {
	_, local := holder(op.ID)
	switch op.Op {
	case "respond":
		step, err := s.flow.Respond(ctx, op.Owner, local, op.Value)
		if err != nil {
			return interactionError(err, local, op.ID)
		}
		step.SessionID = s.publicID(step.SessionID)
		return http.StatusOK, step
	case "state":
		snap, err := s.flow.GetState(ctx, op.Owner, local)
		if err != nil {
			return interactionError(err, local, op.ID)
		}
		snap.SessionID = s.publicID(snap.SessionID)
		return http.StatusOK, snap
	case "cancel":
		if err := s.flow.Cancel(ctx, op.Owner, local, op.Reason); err != nil {
			return interactionError(err, local, op.ID)
		}
		return http.StatusOK, map[string]any{"cancelled": true, "sessionId": op.ID}
	}
	return http.StatusBadRequest, ErrorBody{Error: ErrorDetail{Code: "bad_request", Message: "unknown interaction operation " + op.Op}}
}

func writeResult(w http.ResponseWriter, status int, body any) {
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, status, body)
}

// interactionError maps the engine's errors onto the control API's: a
// missing board or tool as for a call, the flow codes by what a client
// should do about them. Messages name the interaction by the id the
// client knows (public) rather than the engine's (local).
func interactionError(err error, local, public string) (int, any) {
	var le *lookupError
	if errors.As(err, &le) {
		return le.status, ErrorBody{Error: le.detail}
	}
	var fe *flow.Error
	if !errors.As(err, &fe) {
		return http.StatusInternalServerError, ErrorBody{Error: ErrorDetail{Code: "interaction_failed", Message: err.Error()}}
	}
	status, code := http.StatusConflict, "interaction_state"
	switch fe.Code {
	case flow.CodeSessionNotFound:
		status, code = http.StatusNotFound, "unknown_interaction"
	case flow.CodeSessionExpired:
		status, code = http.StatusGone, "interaction_expired"
	case flow.CodeValidationFailed:
		status, code = http.StatusUnprocessableEntity, "invalid_arguments"
	case flow.CodeTimeout:
		status, code = http.StatusTooManyRequests, "too_many_interactions"
	case flow.CodeAlreadyCancelled:
		code = "interaction_cancelled"
	case flow.CodeNotInteractive:
		code = "not_interactive"
	}
	msg := fe.Message
	if local != "" && public != local {
		msg = strings.ReplaceAll(msg, local, public)
	}
	detail := ErrorDetail{Code: code, Message: msg}
	if m, ok := fe.Data.(map[string]any); ok {
		if ps, ok := m["problems"].([]flow.Problem); ok {
			for _, p := range ps {
				detail.Problems = append(detail.Problems, p.Error)
			}
		}
	}
	return status, ErrorBody{Error: detail}
}
