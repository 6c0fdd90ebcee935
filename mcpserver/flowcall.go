package mcpserver

// The standard MCP path for hosts that never call interaction.*: a
// tools/call with missing or invalid arguments, or on a tool that needs
// confirmation, asks the user through the protocol's own mechanism.
//
//   - 2026-07-28 clients that declared elicitation (in the request's
//     _meta clientCapabilities): the call returns MRTR input requests (one
//     elicitation form, key "flow") and a signed requestState; the client
//     retries with inputResponses and the state. go-sdk marks the result
//     resultType "input_required".
//   - Session-based clients that declared elicitation: the handler sends
//     elicitation/create itself (ServerSession.Elicit) and loops until the
//     plan is settled. go-sdk's own legacy bridge for MRTR results
//     (serverMultiRoundTripMiddleware) would do the first round, but it
//     re-invokes the handler only once and fails the whole call when an
//     answer does not match the form's schema, so it cannot re-ask; the
//     forms are the same either way.
//   - Clients that declared neither: no question is ever sent. Bad
//     arguments get the Hub's teaching isError as before, and a tool that
//     needs confirmation is refused unless the call carries "confirm":
//     true (the caller asserts that the user agreed).

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/flow"
	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/internal/randid"
	"github.com/devicebridge/devicebridge/internal/sealed"
)

const (
	// inputKey is the key of the one input request a round carries.
	inputKey = "flow"
	// stateVersion prefixes requestStates, so that a format change is
	// recognised rather than misread.
	stateVersion = "dbs1"
)

// guardedCall is tools/call on a board tool: it settles the arguments and
// the confirmation with the user when it can, then runs the tool. Its
// error is a JSON-RPC error for the request (an MRTR retry whose
// requestState is not the bridge's: badState).
func (s *Server) guardedCall(ctx context.Context, req *mcp.CallToolRequest, e *entry, args json.RawMessage) (*mcp.CallToolResult, error) {
	notesOf(ctx).received(e)
	if res := s.denied(ctx, e, args); res != nil {
		return res, nil // before asking the user anything
	}
	if s.flow == nil {
		return s.run(ctx, req, e, args), nil
	}
	args, confirmed := s.splitConfirm(e, args)
	modern, canAsk := askable(req)
	if !canAsk {
		if e.confirm && !confirmed {
			s.lines().unconfirmed.Info(s.log, "tool call refused: needs confirmation", zap.String("device_id", e.deviceID), zap.String("tool", e.tool.Name))
			notesOf(ctx).refused(e, "it needs the user's confirmation, and this client cannot ask the user")
			return confirmRequired(e, args), nil
		}
		return s.run(ctx, req, e, args), nil
	}
	ft := s.flowTool(e)
	plan, err := ft.Plan(args, false)
	if err != nil {
		// Nothing a form could fix (an unknown argument, not an object…).
		// The Hub explains it in its usual words and refuses it before the
		// board; a confirm tool is not risked on a second opinion.
		if e.confirm {
			return errorResult("%s", flowMessage(err)), nil
		}
		return s.run(ctx, req, e, args), nil
	}
	if modern {
		return s.mrtrRound(ctx, req, e, ft, args, plan)
	}
	return s.elicitRounds(ctx, req, e, ft, plan), nil
}

// askable reports whether the caller declared form elicitation, and in
// which era it speaks: modern clients get MRTR rounds, session-based ones
// elicitation/create requests. The era test is go-sdk's own (a session
// without initialize parameters is the newest protocol).
func askable(req *mcp.CallToolRequest) (modern, ok bool) {
	if req == nil || req.Session == nil {
		return false, false
	}
	caps := req.ClientCapabilities()
	ok = caps != nil && caps.Elicitation != nil && (caps.Elicitation.Form != nil || caps.Elicitation.URL == nil)
	ip := req.Session.InitializeParams()
	modern = ip == nil || ip.ProtocolVersion >= modernVersion
	return modern, ok
}

// splitConfirm takes the "confirm" flag out of the arguments of a tool
// that needs confirmation (unless the board's schema declares an argument
// of that name), so that the board never sees it.
func (s *Server) splitConfirm(e *entry, args json.RawMessage) (json.RawMessage, bool) {
	if !e.confirm || !bytes.Contains(args, []byte(`"`+flow.ConfirmField+`"`)) || declares(e.tool.InputSchema, flow.ConfirmField) {
		return args, false
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(args, &m) != nil {
		return args, false
	}
	v, ok := m[flow.ConfirmField]
	if !ok {
		return args, false
	}
	rest, err := flow.Merge(args, map[string]json.RawMessage{flow.ConfirmField: json.RawMessage("null")})
	if err != nil {
		return args, false
	}
	return rest, string(bytes.TrimSpace(v)) == "true"
}

// confirmRequired refuses a confirm tool for a client that cannot ask.
func confirmRequired(e *entry, args json.RawMessage) *mcp.CallToolResult {
	example, _ := flow.Merge(args, map[string]json.RawMessage{flow.ConfirmField: json.RawMessage("true")})
	return errorResult("%s on board %s needs the user's confirmation, and this client cannot ask the user (it declared no elicitation support), so nothing was sent to the board. "+
		"Ask the user whether to run it; only if they agree, call %s again with \"confirm\": true added to the arguments: %s. "+
		"Alternatively use interaction.start {\"toolName\": %q}, which asks for the confirmation itself.",
		e.tool.Name, e.label(), e.name, example, e.name)
}

// declined is the answer when the user said no: nothing ran.
func declined(e *entry, action string) *mcp.CallToolResult {
	what := "declined"
	if action == "cancel" {
		what = "dismissed the question for"
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(
		"Not run: the user %s %s on board %s, so nothing was sent to the board. Do not retry unless the user asks for it again.",
		what, e.tool.Name, e.label())}}}
}

// ask builds the elicitation form for what the plan still needs: the
// missing or refused arguments first, then (once they are settled, so that
// the question shows the final arguments) the confirmation.
func ask(e *entry, plan *flow.Plan) (*mcp.ElicitParams, error) {
	prompts := plan.Prompts
	if len(prompts) == 0 && plan.Confirm != nil {
		prompts = []flow.Prompt{*plan.Confirm}
	}
	schema, err := flow.ElicitSchema(prompts)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	if len(plan.Prompts) == 0 {
		b.WriteString(prompts[0].Message) // the confirmation names the board
	} else {
		names := make([]string, len(prompts))
		for i, p := range prompts {
			names[i] = p.Property
		}
		fmt.Fprintf(&b, "%s on board %s needs %s.", e.tool.Name, e.label(), strings.Join(names, ", "))
	}
	for _, p := range prompts {
		if p.Error != "" {
			fmt.Fprintf(&b, " Not accepted: %s.", strings.TrimSuffix(p.Error, "."))
			if p.Suggestion != "" {
				fmt.Fprintf(&b, " %s", p.Suggestion)
			}
		}
	}
	return &mcp.ElicitParams{Mode: "form", Message: b.String(), RequestedSchema: schema}, nil
}

// answers turns a form's content into the plan's answers.
func answers(content map[string]any) map[string]json.RawMessage {
	out := make(map[string]json.RawMessage, len(content))
	for k, v := range content {
		raw, err := json.Marshal(v)
		if err == nil {
			out[k] = raw
		}
	}
	return out
}

// maxRounds bounds the questions one call may ask (MaxPrompts).
func (s *Server) maxRounds() int {
	if n := s.opts.Flow.MaxPrompts; n != 0 {
		if n < 0 {
			return 1 << 20
		}
		return n
	}
	return flow.DefaultMaxPrompts
}

func tooManyRounds(e *entry, n int) *mcp.CallToolResult {
	return errorResult("%s on board %s was not run: its arguments were still not settled after %d questions. "+
		"Call it again with every argument given, as its inputSchema describes, or use interaction.start {\"toolName\": %q} to go through them one by one.",
		e.tool.Name, e.label(), n, e.name)
}

// elicitRounds asks a session-based client with elicitation/create until
// the plan is settled, then runs the tool (or not, if the user said no).
func (s *Server) elicitRounds(ctx context.Context, req *mcp.CallToolRequest, e *entry, ft *flow.Tool, plan *flow.Plan) *mcp.CallToolResult {
	for round := 0; ; round++ {
		done, params := s.nextStep(ctx, req, e, plan, round)
		if done != nil {
			return done
		}
		s.log.Debug("asking the user", zap.String("tool", e.tool.Name), zap.Int("round", round+1))
		notesOf(ctx).asking(e, round+1)
		res, err := req.Session.Elicit(ctx, params)
		if err != nil {
			if ctx.Err() == nil && strings.Contains(err.Error(), "does not match requested schema") {
				// The client returned something the form forbids: ask again,
				// saying why (MRTR's rule: re-ask rather than fail).
				plan = withError(plan, "the answer did not fit the form ("+err.Error()+")")
				continue
			}
			// The client's answer may quote anything: cut.
			s.lines().askFailed.Info(s.log, "could not ask the user", zap.String("tool", e.tool.Name), clip.Error(err))
			return errorResult("%s on board %s was not run: the question to the user failed (%v). Nothing was sent to the board. "+
				"Call it again with every argument given, as its inputSchema describes.", e.tool.Name, e.label(), err)
		}
		if res.Action != "accept" {
			return declined(e, res.Action)
		}
		if plan, err = ft.Answer(plan, answers(res.Content)); err != nil {
			return errorResult("%s", flowMessage(err))
		}
	}
}

// nextStep decides what a plan needs after round rounds: a final result
// (the user said no, the tool ran, too many rounds, or no form can carry
// the question), or the form to put to the user next.
func (s *Server) nextStep(ctx context.Context, req *mcp.CallToolRequest, e *entry, plan *flow.Plan, round int) (*mcp.CallToolResult, *mcp.ElicitParams) {
	if plan.Declined {
		return declined(e, "decline"), nil
	}
	if plan.Ready() {
		return s.run(ctx, req, e, plan.Args), nil
	}
	if s.confirmsInTask(ctx, e, plan) {
		return s.startConfirming(ctx, e, plan), nil // the task asks (tasks.go)
	}
	if round >= s.maxRounds() {
		return tooManyRounds(e, round), nil
	}
	params, err := ask(e, plan)
	if err != nil {
		return s.cannotAsk(ctx, req, e, plan, err), nil
	}
	return nil, params
}

// withError marks the open prompts of a plan with why the last answer was
// refused, for the next form's message.
func withError(plan *flow.Plan, why string) *flow.Plan {
	p := *plan
	if len(p.Prompts) > 0 {
		p.Prompts = append([]flow.Prompt(nil), p.Prompts...)
		p.Prompts[0].Error = why
	} else if p.Confirm != nil {
		c := *p.Confirm
		c.Error = why
		p.Confirm = &c
	}
	return &p
}

// cannotAsk handles a plan whose questions no form can carry (an object
// or list argument): the caller must pass the arguments itself.
func (s *Server) cannotAsk(ctx context.Context, req *mcp.CallToolRequest, e *entry, plan *flow.Plan, err error) *mcp.CallToolResult {
	if e.confirm {
		return errorResult("%s", flowMessage(err))
	}
	return s.run(ctx, req, e, plan.Args)
}

// mrtrRound is one round of the modern path. The first call plans from the
// arguments; a retry carries the requestState of the previous round and
// the user's answer. Each round either runs the tool, reports the user's
// no, or returns the next form with a new state. A retry whose state the
// bridge did not issue for this caller, tool and arguments is a JSON-RPC
// error (badState); one whose state has only expired is asked again.
func (s *Server) mrtrRound(ctx context.Context, req *mcp.CallToolRequest, e *entry, ft *flow.Tool, args json.RawMessage, plan *flow.Plan) (*mcp.CallToolResult, error) {
	caller := callerOf(req.Session, req.Extra)
	argsSum := argsDigest(args)
	round := 0
	call := "" // the MRTR call's id, the same in all its rounds
	if token := req.Params.RequestState; token != "" {
		st, why, expired := s.openState(token, caller, e.name, argsSum)
		switch {
		case st == nil && !expired:
			// Forged, tampered, another caller's, another call's, or signed
			// under another key (another flow secret, or none and a restart):
			// nothing in it can be trusted, and asking again would hide a
			// client's or a deployment's fault. Nothing runs.
			s.lines().badState.Info(s.log, "requestState refused", zap.String("tool", e.tool.Name), zap.String("why", why))
			return nil, badState(e, why)
		case st == nil:
			// Authentic but too old: ignore it and the answers that came
			// with it, and ask afresh (nothing runs on a stale answer).
			s.lines().badState.Info(s.log, "requestState expired; asking again", zap.String("tool", e.tool.Name))
			if plan != nil && !plan.Ready() {
				plan = withError(plan, fmt.Sprintf("the previous answer was not used: it came after the question expired (flow.timeout, %s). Answer again", s.flowTimeout))
			}
		default:
			plan, round, call = st.Plan, st.Round, st.Call
			if call == "" {
				call = spentKey(token)
			}
			if refused := s.checkCall(ctx, e, call); refused != nil {
				return refused, nil
			}
			switch r := req.Params.InputResponses[inputKey].(type) {
			case *mcp.ElicitResult:
				if r.Action != "accept" {
					return declined(e, r.Action), nil
				}
				next, err := ft.Answer(plan, answers(r.Content))
				if err != nil {
					return errorResult("%s", flowMessage(err)), nil
				}
				plan = next
			default:
				plan = withError(plan, "no answer came back for the question")
			}
		}
	}
	if call != "" && !plan.Declined && (plan.Ready() || s.confirmsInTask(ctx, e, plan)) {
		if refused := s.spendCall(ctx, e, call); refused != nil {
			return refused, nil
		}
	}
	if call == "" {
		call = newCallID()
	}
	done, params := s.nextStep(ctx, req, e, plan, round)
	if done != nil {
		return done, nil
	}
	s.log.Debug("asking the user (input_required)", zap.String("tool", e.tool.Name), zap.Int("round", round+1))
	notesOf(ctx).asking(e, round+1)
	return &mcp.CallToolResult{
		InputRequests: mcp.InputRequestMap{inputKey: params},
		RequestState: s.sealState(&callState{Tool: e.name, Args: argsSum, Round: round + 1, Plan: plan,
			Exp: time.Now().Add(s.flowTimeout).UnixMilli(), Call: call}, caller),
	}, nil
}

// badState is the JSON-RPC error (invalid params) for an MRTR retry whose
// requestState fails its checks; why says which (never the token).
func badState(e *entry, why string) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf(
		"requestState rejected: %s. Nothing was sent to board %s and the answers that came with it were not used. "+
			"Send a requestState back exactly as the bridge returned it, from the same client, with the same tool and arguments. "+
			"Bridges behind one load balancer need the same flow secret (--flow-secret); without one, a bridge that restarts "+
			"(an upgrade) no longer accepts the requestStates it gave before. To start over, call %s again without requestState and inputResponses.",
		why, e.label(), e.name)}
}

// Replay protection of MRTR calls. Every round of one call carries the
// call's id in its requestState; when a round's answers settle the call,
// the id is spent (flow.SpentStore, shared by every bridge with the same
// flow secret) just before the tool runs. So a call runs its tool at most
// once, on any bridge, however its requestStates are replayed: the round
// that ran it, or an earlier one (which could otherwise be answered again).
//
// Rounds that only ask are not consumed: a client that retries one after a
// network failure gets the same form back. The retry of the round that ran
// the tool is refused, though — its result went to the lost response, and
// running it again (a second reboot) is exactly what this prevents; the
// refusal says so. When the store cannot be reached, nothing runs (fail
// closed) and the refusal says to retry.

// checkCall refuses a round of a call whose tool already ran.
func (s *Server) checkCall(ctx context.Context, e *entry, call string) *mcp.CallToolResult {
	use, err := s.spent.Spent(ctx, mrtrKey(call))
	if err != nil {
		return s.replayUnchecked(e, err)
	}
	if use != "" {
		return s.alreadyRan(e)
	}
	return nil
}

// spendCall consumes the call before its tool runs.
func (s *Server) spendCall(ctx context.Context, e *entry, call string) *mcp.CallToolResult {
	// Any requestState of this call was issued before now, so none outlives
	// now + the flow timeout; neither must the entry.
	first, _, err := s.spent.Spend(ctx, mrtrKey(call), flow.UseAnswered, time.Now().Add(s.flowTimeout))
	if err != nil {
		return s.replayUnchecked(e, err)
	}
	if !first {
		return s.alreadyRan(e)
	}
	return nil
}

func (s *Server) replayUnchecked(e *entry, err error) *mcp.CallToolResult {
	s.lines().replayUnchecked.Warn(s.log, "requestState not checked: replay store unavailable; not running the tool",
		zap.String("device_id", e.deviceID), zap.String("tool", e.tool.Name), zap.Error(err))
	return errorResult("%s on board %s was not run: the bridge could not check that this requestState was not already used (%v), so nothing was sent to the board. "+
		"Retry the same request in a few seconds.", e.tool.Name, e.label(), err)
}

func (s *Server) alreadyRan(e *entry) *mcp.CallToolResult {
	s.lines().replayed.Info(s.log, "requestState replayed; not running the tool again", zap.String("device_id", e.deviceID), zap.String("tool", e.tool.Name))
	return errorResult("%s on board %s was not run again: the form of this call was already answered, and that answer ran it (on this bridge or another one sharing its flow secret); "+
		"its result went to that request. Do not resend this requestState. If the result was lost, check the board's state first; "+
		"to run the tool once more, make a new tools/call without requestState.", e.tool.Name, e.label())
}

func mrtrKey(call string) string { return "mrtr." + call }

// spentKey derives a call id from a requestState that carries none.
func spentKey(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:16])
}

// newCallID names a new MRTR call.
func newCallID() string { return randid.Hex16() }

// callState is what a requestState carries between MRTR rounds. It is
// signed (HMAC-SHA256 under the flow secret, or a key made at start) over
// the caller identity as well, which it does not contain: a state is
// valid only for the caller it was given to, for the same tool and
// arguments, until Exp. The plan it holds is the caller's own input.
type callState struct {
	Tool  string     `json:"t"`
	Args  string     `json:"a"` // digest of the call's arguments
	Round int        `json:"r"`
	Exp   int64      `json:"x"` // Unix ms
	Plan  *flow.Plan `json:"p"`
	Call  string     `json:"c,omitempty"` // the call's id, the same in all its rounds
}

// sealState signs a requestState for the caller (internal/sealed).
func (s *Server) sealState(st *callState, caller string) string {
	tok, _ := sealed.Seal(s.stateKey, stateVersion, caller, st) // a callState always encodes
	return tok
}

// openState checks a requestState. When it cannot be used it returns nil
// and the reason (for the caller and the logs; never the token), and
// whether the state is authentic and merely expired.
func (s *Server) openState(token, caller, tool, argsSum string) (st *callState, why string, expired bool) {
	st = &callState{}
	switch err := sealed.Open(s.stateKey, stateVersion, caller, token, int(s.opts.MaxBodyBytes), st); {
	case errors.Is(err, sealed.ErrTooLong):
		return nil, "it is longer than any the bridge issues", false
	case errors.Is(err, sealed.ErrSignature):
		return nil, "its signature does not match (it was altered, issued to another client, or signed by a bridge with another flow secret)", false
	case err != nil: // another version, or not shaped like a token
		return nil, "it is not a requestState this bridge issued", false
	case st.Plan == nil:
		return nil, "it holds no question", false
	}
	switch {
	case st.Tool != tool:
		return nil, "it was issued for another tool", false
	case st.Args != argsSum:
		return nil, "it was issued for other arguments", false
	case time.Now().UnixMilli() > st.Exp:
		return nil, "it expired", true
	}
	return st, "", false
}

// argsDigest identifies a call's arguments whatever their key order or
// spacing (the retry echoes the original arguments).
func argsDigest(args json.RawMessage) string {
	var v any
	canon := []byte("null")
	if len(bytes.TrimSpace(args)) > 0 && json.Unmarshal(args, &v) == nil {
		canon, _ = json.Marshal(v)
	}
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:16])
}

// flowMessage is the teaching text of an engine error.
func flowMessage(err error) string {
	var fe *flow.Error
	if errors.As(err, &fe) {
		return fe.Message
	}
	return err.Error()
}

// declares reports whether an input schema has a property of that name.
func declares(schema json.RawMessage, name string) bool {
	var sc struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if json.Unmarshal(schema, &sc) != nil {
		return false
	}
	_, ok := sc.Properties[name]
	return ok
}
