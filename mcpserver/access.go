package mcpserver

// Access control on /mcp: who the caller is (the control listener's front
// door verifies credentials; accessMiddleware puts the identity in the
// context of every method), what the policy lets them see (tools/list,
// compact listings) and call (tools/call, interactions), and the audit
// log. The decisions themselves are the policy package's; this file only
// asks it.

import (
	"context"
	"encoding/json"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/audit"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/flow"
	"github.com/devicebridge/devicebridge/policy"
)

// Access configures authorization and audit on /mcp. The zero value
// allows everything and records nothing.
type Access struct {
	// Authenticated says the front door authenticates /mcp (an
	// authn.Guard with a verifier; so do Options.Tokens): sessions are
	// then bound to the identity that opened them, and tool lists are
	// private to it.
	Authenticated bool
	// Policy decides which boards and tools each identity sees; nil allows
	// everything.
	Policy *policy.Gate
	// Audit records calls, interaction steps and refusals; nil records
	// nothing.
	Audit *audit.Log
	// Tracer, when set, traces every request (MCP semantic conventions,
	// trace context from params._meta) and each board call within it.
	Tracer trace.Tracer
}

// accessMiddleware puts the caller's identity in the context of every
// method and filters tools/list down to what the policy lets it see.
func (s *Server) accessMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		var ti *auth.TokenInfo
		if extra := req.GetExtra(); extra != nil {
			ti = extra.TokenInfo
		}
		id := policy.FromTokenInfo(ti)
		ctx = policy.WithIdentity(ctx, id)
		ctx, span := s.startSpan(ctx, method, req)
		res, err := next(ctx, method, req)
		endSpan(span, res, err)
		if method == "tools/list" && err == nil && s.opts.Access.Policy.Enabled() {
			if lr, ok := res.(*mcp.ListToolsResult); ok && lr != nil {
				cat := s.cat.Load()
				kept := lr.Tools[:0:0]
				for _, t := range lr.Tools {
					if e, board := cat.byName[t.Name]; board && !s.mayUse(id, e) {
						continue
					}
					kept = append(kept, t)
				}
				cp := *lr
				cp.Tools = kept
				res = &cp
			}
		}
		return res, err
	}
}

func boardOf(e *entry) policy.Board { return policy.Board{ID: e.deviceID, Alias: e.alias} }

// mayUse reports whether id may see and call the board tool e.
func (s *Server) mayUse(id policy.Identity, e *entry) bool {
	return s.opts.Access.Policy.ToolAllowed(id, boardOf(e), e.tool.Name)
}

// mayView reports whether the caller in ctx may see board v.
func (s *Server) mayView(ctx context.Context, v *deviceView) bool {
	return s.opts.Access.Policy.BoardVisible(policy.IdentityFrom(ctx), policy.Board{ID: v.info.DeviceID, Alias: v.alias})
}

// authenticated reports whether a request reaches /mcp only with
// verified credentials.
func (s *Server) authenticated() bool {
	return s.opts.Access.Authenticated || len(s.opts.Tokens) > 0
}

// denied answers a call the policy does not allow, before anything
// reaches the board (nil when it is allowed), and records the refusal.
func (s *Server) denied(ctx context.Context, e *entry, args json.RawMessage) *mcp.CallToolResult {
	id := policy.IdentityFrom(ctx)
	err := s.opts.Access.Policy.Check(id, boardOf(e), e.tool.Name)
	if err == nil {
		return nil
	}
	s.lines().denied.Info(s.log, "tool call refused by policy", zap.String("identity", id.Name), zap.String("device_id", e.deviceID),
		zap.String("tool", e.tool.Name))
	s.auditCall(ctx, e, args, "denied", 0)
	notesOf(ctx).refused(e, "the bridge's policy does not allow this caller to call it")
	return errorResult("%s", err.Error())
}

// auditCall records one board tool call in the audit log and, with
// tracing on, as a span (child of the request's) covering the board call.
func (s *Server) auditCall(ctx context.Context, e *entry, args json.RawMessage, outcome string, took time.Duration) {
	s.boardSpan(ctx, e, outcome, took)
	l := s.opts.Access.Audit
	if l == nil {
		return
	}
	err := l.Write(audit.Record{Kind: audit.KindToolCall, Via: "mcp", Identity: policy.IdentityFrom(ctx).Name,
		Board: e.deviceID, Tool: e.tool.Name, ArgsDigest: l.Digest(args), Outcome: outcome,
		DurationMS: float64(took.Microseconds()) / 1000})
	if err != nil {
		s.log.Warn("audit log write failed", zap.Error(err))
	}
}

// auditStep records one interaction step: its outcome is the state it
// led to, or "error". The interaction id is recorded as a digest (in
// stateless mode it is a signed state token).
func (s *Server) auditStep(ctx context.Context, step string, st *flow.Step, tool string, err error, took time.Duration) {
	l := s.opts.Access.Audit
	if l == nil {
		return
	}
	outcome, reason, id := "error", "", ""
	if err != nil {
		reason = err.Error()
	} else if st != nil {
		outcome, id = string(st.State), l.Digest([]byte(st.SessionID))
	} else {
		outcome = "ok"
	}
	r := audit.Record{Kind: audit.KindInteraction, Via: "mcp", Identity: policy.IdentityFrom(ctx).Name, Step: step,
		Interaction: id, Tool: tool, Outcome: outcome, Reason: reason, DurationMS: float64(took.Microseconds()) / 1000}
	if e, ok := s.cat.Load().byName[tool]; ok {
		r.Board, r.Tool = e.deviceID, e.tool.Name
	}
	if err := l.Write(r); err != nil {
		s.log.Warn("audit log write failed", zap.Error(err))
	}
}

// Alias is the alias board deviceID's tools are published under, so that
// other surfaces (the control API, the console, the fleet's record of a
// board) show and match a board as /mcp does. A board the Hub lists that
// the catalogue has not named yet (it connected a moment ago) is named
// now, for good; a board that left a short while ago is shown with the
// alias it had. "" for a board unknown here.
func (s *Server) Alias(deviceID string) string {
	cat := s.cat.Load()
	if v, ok := cat.byDevice[deviceID]; ok {
		return v.alias
	}
	id := device.NormalizeID(deviceID)
	if v, ok := cat.byDevice[id]; ok {
		return v.alias
	}
	now := time.Now()
	if info, ok := s.hub.Device(id); ok && info.State != device.StateClosed {
		return s.names.hold(namingOf(info, s.aliases), s.aliases.byName, now)
	}
	a, _ := s.names.lookup(id, now)
	return a
}

// viewCatalog is the catalogue as the caller in ctx may see it: boards it
// may not see left out, and tools it may not call (the compact listings).
func (s *Server) viewCatalog(ctx context.Context) *catalog {
	cat := s.cat.Load()
	if !s.opts.Access.Policy.Enabled() {
		return cat
	}
	id := policy.IdentityFrom(ctx)
	out := emptyCatalog()
	for _, v := range cat.devices {
		if !s.mayView(ctx, v) {
			continue
		}
		cp := *v
		cp.tools = nil
		for _, e := range v.tools {
			if s.mayUse(id, e) {
				cp.tools = append(cp.tools, e)
				out.byName[e.name] = e
			}
		}
		out.devices = append(out.devices, &cp)
		out.byDevice[cp.info.DeviceID] = &cp
	}
	return out
}
