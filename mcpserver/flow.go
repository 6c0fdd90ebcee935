package mcpserver

// This file wires package flow into the upstream server: the options, the
// engine and its tool lookup, the MCP Flow methods on /mcp (capabilities,
// interaction.start/respond/getState/cancel) and their caller identity.
// The standard MCP path (elicitation and MRTR inside tools/call) is in
// flowcall.go. docs/flow.md maps every message.

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/flow"
	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/policy"
)

const (
	// FlowVersion is the MCP Flow protocol version the bridge speaks.
	FlowVersion = "0.1.0"
	// capFlow is the key under capabilities.experimental (initialize and
	// server/discover) that advertises MCP Flow.
	capFlow = "mcpFlow"
	// metaFlow is the key under each tool's _meta.
	metaFlow = "devicebridge/flow"

	methodCapabilities = "capabilities"
	methodStart        = "interaction.start"
	methodRespond      = "interaction.respond"
	methodGetState     = "interaction.getState"
	methodCancel       = "interaction.cancel"

	// headerCaller carries the caller identity of a modern (stateless)
	// request from the front handler to the method handlers, which see
	// only the request's headers. The front handler always deletes what a
	// client sent under this name first, so it cannot be forged.
	headerCaller = "X-Devicebridge-Caller"
)

// DefaultConfirmTools are the board tools that need the user's explicit yes
// before they run: they reboot the board, replace its firmware or cut it
// off its network. Patterns use path.Match syntax against the board's own
// tool name, ignoring case. Tools annotated destructiveHint:true are added
// to whatever the list says.
var DefaultConfirmTools = []string{
	"self.reboot",
	"self.upgrade_firmware",
	"*wifi*",
	"*network*config*",
	"*config*network*",
}

// FlowOptions configure interactions (package flow): the MCP Flow methods
// on /mcp and the guided tools/call path. The zero value turns them on
// with the defaults.
type FlowOptions struct {
	// Disabled turns both off: tools/call answers bad arguments with an
	// isError as before, confirmation is not asked, and interaction.*
	// methods get "method not found".
	Disabled bool
	// Timeout is the inactivity timeout of an interaction, and the life of
	// a requestState (default flow.DefaultTimeout).
	Timeout time.Duration
	// MaxPerOwner, MaxPrompts and MaxDuration are flow.Options' limits
	// (zero: flow's defaults; negative: none).
	MaxPerOwner int
	MaxPrompts  int
	MaxDuration time.Duration
	// Confirm lists the board tools that need confirmation (see
	// DefaultConfirmTools, the value used when Confirm is nil; an empty
	// list leaves only the tools annotated destructive).
	Confirm []string
	// Secret (at least 32 bytes) signs interaction tokens and
	// requestStates. With it, interactions are stateless: a restarted
	// bridge or another replica with the same secret continues them.
	// Without it, interactions live in memory and requestStates are signed
	// with a key made at start.
	Secret []byte
	// Spent remembers the interaction tokens and requestStates already
	// used (flow.SpentStore). Every bridge sharing Secret must share it,
	// or a token used on one can be replayed on another. Nil: an
	// in-memory store, enough for one bridge.
	Spent flow.SpentStore
}

func (o FlowOptions) validate() []error {
	var errs []error
	for _, p := range o.Confirm {
		if _, err := path.Match(strings.ToLower(p), ""); err != nil || strings.TrimSpace(p) == "" {
			errs = append(errs, fmt.Errorf("flow.confirm: %q is not a valid pattern (use a tool name like self.reboot, or * wildcards like *wifi*)", p))
		}
	}
	if len(o.Secret) > 0 && len(o.Secret) < 32 {
		errs = append(errs, fmt.Errorf("flow.secret must be at least 32 bytes (it has %d); generate one with: openssl rand -hex 32", len(o.Secret)))
	}
	return errs
}

// setupFlow builds the engine and registers the Flow methods. Called by New
// before any tool is published.
func (s *Server) setupFlow() error {
	o := s.opts.Flow
	if o.Disabled {
		return nil
	}
	if o.Confirm == nil {
		o.Confirm = DefaultConfirmTools
	}
	for _, p := range o.Confirm {
		s.confirm = append(s.confirm, strings.ToLower(strings.TrimSpace(p)))
	}
	s.flowTimeout = cmp.Or(max(o.Timeout, 0), flow.DefaultTimeout)
	s.stateKey = o.Secret
	if len(s.stateKey) == 0 {
		s.stateKey = make([]byte, 32)
		_, _ = rand.Read(s.stateKey)
	}
	var secret []byte
	if len(o.Secret) > 0 {
		secret = o.Secret
	}
	s.spent = o.Spent
	if s.spent == nil {
		s.spent = flow.NewMemorySpent(0, nil)
	}
	eng, err := flow.NewEngine(flow.Options{
		Lookup:      s.lookupFlowTool,
		Timeout:     o.Timeout,
		MaxPerOwner: o.MaxPerOwner,
		MaxPrompts:  o.MaxPrompts,
		MaxDuration: o.MaxDuration,
		Secret:      secret,
		Spent:       s.spent,
		Logger:      s.log.Named("flow"),
	})
	if err != nil {
		return err
	}
	s.flow = eng
	s.mcp.AddReceivingMiddleware(s.callerMiddleware)
	for _, err := range []error{
		mcp.AddReceivingCustomMethod(s.mcp, methodCapabilities, s.flowCapabilitiesMethod),
		mcp.AddReceivingCustomMethod(s.mcp, methodStart, s.flowStart),
		mcp.AddReceivingCustomMethod(s.mcp, methodRespond, s.flowRespond),
		mcp.AddReceivingCustomMethod(s.mcp, methodGetState, s.flowGetState),
		mcp.AddReceivingCustomMethod(s.mcp, methodCancel, s.flowCancel),
	} {
		if err != nil {
			return err
		}
	}
	return nil
}

// flowCapabilities is what the bridge advertises, in the spec's shape
// (§Capability Negotiation), in initialize (capabilities.experimental) and
// as the capabilities method's result.
func flowCapabilities(stateless bool) map[string]any {
	return map[string]any{
		"interactive": true,
		"version":     FlowVersion,
		"features": map[string]any{
			"statefulSessions":    !stateless,
			"progressTracking":    true,
			"validation":          true,
			"multiplePromptTypes": true,
			"sessionPersistence":  stateless,
			// Ours: tools/call asks through elicitation (legacy) or MRTR
			// input_required (2026-07-28) when the client declared it.
			"elicitation": true,
		},
		"methods": []string{methodStart, methodRespond, methodGetState, methodCancel},
	}
}

// InteractionCounts reports interactions by state (metrics); nil when
// interactions are off.
func (s *Server) InteractionCounts() map[string]int {
	if s.flow == nil {
		return nil
	}
	out := map[string]int{}
	for st, n := range s.flow.Counts() {
		out[string(st)] = n
	}
	return out
}

// needsConfirm reports whether a board tool needs the user's yes: it
// matches a confirm pattern, or the board annotates it destructive.
// needsConfirm: the policy's confirm list (whoever calls), the confirm
// patterns, or a destructive annotation.
func (s *Server) needsConfirm(t device.Tool) bool {
	return s.opts.Access.Policy.NeedsConfirm(t.Name) || NeedsConfirm(s.confirm, t)
}

// NeedsConfirm reports whether a board tool needs the user's yes under the
// confirm patterns (FlowOptions.Confirm: path.Match patterns, compared
// ignoring case) or because the board annotates it destructive. The
// control API's interactions use it so that they confirm exactly what
// /mcp confirms.
func NeedsConfirm(patterns []string, t device.Tool) bool {
	name := strings.ToLower(t.Name)
	for _, p := range patterns {
		p = strings.ToLower(strings.TrimSpace(p))
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	if len(t.Annotations) > 0 {
		var a struct {
			Destructive *bool `json:"destructiveHint"`
		}
		if json.Unmarshal(t.Annotations, &a) == nil && a.Destructive != nil && *a.Destructive {
			return true
		}
	}
	return false
}

// flowTool is a published board tool as the engine sees it. Execute goes
// through the same path as tools/call (the Hub checks the arguments
// again, logs, converts the board's answer).
func (s *Server) flowTool(e *entry) *flow.Tool {
	return &flow.Tool{
		Name:        e.name,
		Description: e.mcpTool.Description,
		InputSchema: e.tool.InputSchema,
		Confirm:     e.confirm,
		// The confirmation names the board's tool and the board:
		// `Run self.reboot on "kitchen" (bread-compact-wifi, 02:…)?`.
		Label: e.tool.Name,
		Board: e.label(),
		Execute: func(ctx context.Context, args json.RawMessage) (flow.Result, error) {
			return flowResult(s.call(ctx, nil, e, args)), nil
		},
	}
}

// flowResult turns a tool result into the engine's: its text, its
// structured content as data, and whether it is an error.
func flowResult(res *mcp.CallToolResult) flow.Result {
	out := flow.Result{Text: resultText(res), IsError: res.IsError}
	if raw, ok := res.StructuredContent.(json.RawMessage); ok {
		var v any
		if json.Unmarshal(raw, &v) == nil {
			out.Data = v
		}
	} else if res.StructuredContent != nil {
		out.Data = res.StructuredContent
	}
	return out
}

func resultText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		switch c := c.(type) {
		case *mcp.TextContent:
			parts = append(parts, c.Text)
		case *mcp.ImageContent:
			parts = append(parts, fmt.Sprintf("[%s image, %d bytes]", c.MIMEType, len(c.Data)))
		case *mcp.AudioContent:
			parts = append(parts, fmt.Sprintf("[%s audio, %d bytes]", c.MIMEType, len(c.Data)))
		case *mcp.ResourceLink:
			parts = append(parts, fmt.Sprintf("[resource link %s: %s]", c.Name, c.URI))
		case *mcp.EmbeddedResource:
			if r := c.Resource; r != nil && r.Blob == nil {
				parts = append(parts, r.Text)
			} else if r != nil {
				parts = append(parts, fmt.Sprintf("[resource %s, %d bytes]", r.URI, len(r.Blob)))
			}
		}
	}
	return strings.Join(parts, "\n")
}

// lookupFlowTool resolves an upstream tool name for the engine, against
// the catalogue as it is now: every board tool by its upstream name (in
// compact mode too, where describe_device shows them), and in compact
// mode list_devices and describe_device. call_device_tool is resolved to
// the board tool it names before the engine sees it (flowStart).
func (s *Server) lookupFlowTool(ctx context.Context, name string) (*flow.Tool, error) {
	cat := s.cat.Load()
	if e, ok := cat.byName[name]; ok {
		if err := s.opts.Access.Policy.Check(policy.IdentityFrom(ctx), boardOf(e), e.tool.Name); err != nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: err.Error()}
		}
		return s.flowTool(e), nil
	}
	if s.opts.Compact {
		switch name {
		case toolListDevices:
			return s.compactFlowTool(name, listDevicesSchema, s.compactList), nil
		case toolDescribeDevice:
			return s.compactFlowTool(name, describeDeviceSchema, s.compactDescribe), nil
		}
	}
	s.tombMu.Lock()
	t, buried := s.tombstones[name]
	s.tombMu.Unlock()
	if buried {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf(
			"%s is not available now: board %q (%s) left or changed its tools. Nothing was run. Refresh the tool list (tools/list) and start again with a tool it shows.",
			name, t.alias, t.deviceID)}
	}
	example := "robot_audio_speaker_set_volume"
	if s.opts.Compact {
		example = toolCallDeviceTool
	}
	return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf(
		"No tool %q is published. toolName is a name exactly as tools/list shows it, e.g. {\"toolName\": %q}. Call tools/list, then interaction.start again.",
		name, example)}
}

func (s *Server) compactFlowTool(name string, schema json.RawMessage,
	h func(context.Context, *mcp.CallToolRequest, map[string]json.RawMessage) *mcp.CallToolResult) *flow.Tool {
	return &flow.Tool{Name: name, InputSchema: schema,
		Execute: func(ctx context.Context, args json.RawMessage) (flow.Result, error) {
			m := map[string]json.RawMessage{}
			_ = json.Unmarshal(args, &m)
			return flowResult(h(ctx, nil, m)), nil
		}}
}

// Caller identity. An interaction belongs to whoever started it: in the
// session-based era its MCP session (go-sdk has already refused unknown
// session ids, and with tokens it binds sessions to the token that opened
// them); in the stateless era its credentials (a hash of its bearer
// token), or, when /mcp takes no tokens, its network address (a hash of
// the client's IP: every client on one host is then one caller).

type callerKey struct{}

// callerMiddleware puts the caller of Flow methods in their context:
// custom method handlers see only the session, not the request.
func (s *Server) callerMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case methodStart, methodRespond, methodGetState, methodCancel:
			ss, _ := req.GetSession().(*mcp.ServerSession)
			ctx = context.WithValue(ctx, callerKey{}, callerOf(ss, req.GetExtra()))
		}
		return next(ctx, method, req)
	}
}

// callerOf returns the caller identity of a request ("" when unknown).
func callerOf(ss *mcp.ServerSession, extra *mcp.RequestExtra) string {
	if ss != nil && ss.ID() != "" {
		return "s:" + ss.ID()
	}
	if extra != nil && extra.Header != nil {
		return extra.Header.Get(headerCaller)
	}
	return ""
}

// statelessCaller computes the caller identity of a modern request from
// its credentials (front handler). Full SHA-256: unlike the short hashes
// in names, this must not collide.
func statelessCaller(remote, token string) string {
	if token != "" {
		sum := sha256.Sum256([]byte("token\x00" + token))
		return "t:" + hex.EncodeToString(sum[:])
	}
	sum := sha256.Sum256([]byte("addr\x00" + remote))
	return "a:" + hex.EncodeToString(sum[:])
}

func callerFrom(ctx context.Context) (string, error) {
	c, _ := ctx.Value(callerKey{}).(string)
	if c == "" {
		return "", &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: "The bridge could not tell who is calling, so it cannot keep your interactions apart from others'. " +
			"Call interaction.* inside an MCP session (after initialize, with its Mcp-Session-Id), or with MCP-Protocol-Version 2026-07-28."}
	}
	return c, nil
}

// Wire types of the Flow methods. Results embed the engine's types,
// which carry the spec's field names.

type flowCapabilitiesParams struct{ mcp.ParamsBase }

type flowMapResult struct {
	mcp.ResultBase
	fields map[string]any
}

func (r *flowMapResult) MarshalJSON() ([]byte, error) {
	m := map[string]any{}
	for k, v := range r.fields {
		m[k] = v
	}
	if len(r.Meta) > 0 {
		m["_meta"] = r.Meta
	}
	return json.Marshal(m)
}

type flowStartParams struct {
	mcp.ParamsBase
	ToolName      string          `json:"toolName"`
	InitialParams json.RawMessage `json:"initialParams,omitempty"`
	Context       json.RawMessage `json:"context,omitempty"`
	// Timeout is the inactivity timeout in milliseconds.
	Timeout int64 `json:"timeout,omitempty"`
	// Guided asks the optional arguments too, for tools without required
	// ones (an addition to the spec).
	Guided bool `json:"guided,omitempty"`
}

type flowRespondParams struct {
	mcp.ParamsBase
	SessionID string `json:"sessionId"`
	Response  *struct {
		Value     json.RawMessage `json:"value"`
		Timestamp int64           `json:"timestamp,omitempty"`
		Metadata  json.RawMessage `json:"metadata,omitempty"`
	} `json:"response"`
}

type flowIDParams struct {
	mcp.ParamsBase
	SessionID string `json:"sessionId"`
	Reason    string `json:"reason,omitempty"`
}

type flowStepResult struct {
	mcp.ResultBase
	*flow.Step
}

type flowStateResult struct {
	mcp.ResultBase
	*flow.Snapshot
}

type flowCancelResult struct {
	mcp.ResultBase
	Cancelled bool   `json:"cancelled"`
	SessionID string `json:"sessionId"`
}

func (s *Server) flowCapabilitiesMethod(context.Context, *mcp.ServerSession, *flowCapabilitiesParams) (*flowMapResult, error) {
	return &flowMapResult{fields: flowCapabilities(s.flow.Stateless())}, nil
}

func (s *Server) flowStart(ctx context.Context, _ *mcp.ServerSession, p *flowStartParams) (*flowStepResult, error) {
	owner, err := callerFrom(ctx)
	if err != nil {
		return nil, err
	}
	if p == nil || strings.TrimSpace(p.ToolName) == "" {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "interaction.start needs toolName, the tool's name as tools/list shows it, " +
			"e.g. {\"toolName\": \"robot_audio_speaker_set_volume\", \"initialParams\": {}}. Arguments you already know go in initialParams; the rest are asked."}
	}
	if p.Timeout < 0 {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf(
			"timeout is in milliseconds and must be positive (got %d), e.g. \"timeout\": 300000 for five minutes; leave it out for the default of %s.", p.Timeout, s.flowTimeout)}
	}
	name, initial := p.ToolName, p.InitialParams
	if s.opts.Compact && name == toolCallDeviceTool {
		// call_device_tool is a router: the interaction is about the board
		// tool it names, with that tool's schema and confirmation.
		e, msg := s.resolveCompactTarget(initial)
		if e == nil {
			return nil, &jsonrpc.Error{Code: int64(flow.CodeValidationFailed), Message: msg}
		}
		var in struct {
			Arguments json.RawMessage `json:"arguments"`
		}
		_ = json.Unmarshal(initial, &in)
		name, initial = e.name, in.Arguments
	}
	began := time.Now()
	step, err := s.flow.Start(ctx, owner, name, initial,
		flow.StartOptions{Timeout: time.Duration(p.Timeout) * time.Millisecond, Guided: p.Guided})
	s.auditStep(ctx, "start", step, name, err, time.Since(began))
	if err != nil {
		return nil, s.flowWireError(methodStart, err)
	}
	s.log.Debug("interaction started", zap.String("tool", name), zap.String("state", string(step.State)))
	return &flowStepResult{Step: step}, nil
}

func (s *Server) flowRespond(ctx context.Context, _ *mcp.ServerSession, p *flowRespondParams) (*flowStepResult, error) {
	owner, err := callerFrom(ctx)
	if err != nil {
		return nil, err
	}
	if p == nil || p.SessionID == "" || p.Response == nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "interaction.respond needs the sessionId from interaction.start and the answer as response.value, " +
			"e.g. {\"sessionId\": \"flw_…\", \"response\": {\"value\": 40}}. A null value takes the prompt's default."}
	}
	value := p.Response.Value
	if len(value) == 0 {
		value = json.RawMessage("null")
	}
	began := time.Now()
	step, err := s.flow.Respond(ctx, owner, p.SessionID, value)
	s.auditStep(ctx, "respond", step, "", err, time.Since(began))
	if err != nil {
		return nil, s.flowWireError(methodRespond, err)
	}
	return &flowStepResult{Step: step}, nil
}

func (s *Server) flowGetState(ctx context.Context, _ *mcp.ServerSession, p *flowIDParams) (*flowStateResult, error) {
	owner, err := callerFrom(ctx)
	if err != nil {
		return nil, err
	}
	if p == nil || p.SessionID == "" {
		return nil, errNeedSessionID(methodGetState)
	}
	snap, err := s.flow.GetState(ctx, owner, p.SessionID)
	if err != nil {
		return nil, s.flowWireError(methodGetState, err)
	}
	return &flowStateResult{Snapshot: snap}, nil
}

func (s *Server) flowCancel(ctx context.Context, _ *mcp.ServerSession, p *flowIDParams) (*flowCancelResult, error) {
	owner, err := callerFrom(ctx)
	if err != nil {
		return nil, err
	}
	if p == nil || p.SessionID == "" {
		return nil, errNeedSessionID(methodCancel)
	}
	err = s.flow.Cancel(ctx, owner, p.SessionID, p.Reason)
	s.auditStep(ctx, "cancel", nil, "", err, 0)
	if err != nil {
		return nil, s.flowWireError(methodCancel, err)
	}
	return &flowCancelResult{Cancelled: true, SessionID: p.SessionID}, nil
}

func errNeedSessionID(method string) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf(
		"%s needs the sessionId that interaction.start (or the latest interaction.respond) returned, e.g. {\"sessionId\": \"flw_…\"}.", method)}
}

// flowWireError maps the engine's errors onto JSON-RPC errors: an
// *flow.Error keeps its code (-32001…-32007) and message, and its data
// gains "flowCode", the spec's name for the code (the numbers collide
// with other meanings in MCP clients, see docs/flow.md); a JSON-RPC error
// from the lookup passes as it is.
func (s *Server) flowWireError(method string, err error) error {
	var fe *flow.Error
	if errors.As(err, &fe) {
		data := map[string]any{}
		if m, ok := fe.Data.(map[string]any); ok {
			for k, v := range m {
				data[k] = v
			}
		}
		data["flowCode"] = flow.CodeName(fe.Code)
		raw, _ := json.Marshal(data)
		s.log.Debug("interaction request refused", zap.String("method", method), zap.String("code", flow.CodeName(fe.Code)))
		return &jsonrpc.Error{Code: int64(fe.Code), Message: fe.Message, Data: raw}
	}
	var je *jsonrpc.Error
	if errors.As(err, &je) {
		return je
	}
	s.lines().flowFailed.Warn(s.log, "interaction request failed", zap.String("method", method), clip.Error(err))
	return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "The interaction could not be handled (" + err.Error() + "). Try again; if it persists, start a new interaction."}
}

// resolveCompactTarget finds the board tool that call_device_tool
// arguments name ({device, tool, arguments}), or says why not.
func (s *Server) resolveCompactTarget(args json.RawMessage) (*entry, string) {
	var in struct {
		Device string `json:"device"`
		Tool   string `json:"tool"`
	}
	if json.Unmarshal(args, &in) != nil || in.Device == "" || in.Tool == "" {
		return nil, "With call_device_tool, initialParams must name the board and its tool, e.g. " +
			"{\"device\": \"robot\", \"tool\": \"self.audio_speaker.set_volume\", \"arguments\": {}}; the tool's own arguments are then asked. Call list_devices to see the boards."
	}
	cat := s.cat.Load()
	v, fail := s.resolveDevice(cat, in.Device)
	if fail != nil {
		return nil, resultText(fail)
	}
	e := v.findTool(in.Tool)
	if e == nil {
		return nil, fmt.Sprintf("Board %s has no tool %q. Call describe_device {\"device\": %q} to see its tools.", boardLabel(v), in.Tool, v.alias)
	}
	return e, ""
}
