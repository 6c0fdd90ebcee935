package api

// Access control on the control API: the policy's view of the fleet for
// the caller (whose identity the authentication step put in the request's
// context), and the audit log. The decisions are the policy package's.

import (
	"encoding/json"
	"net/http"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/audit"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/internal/logthrottle"
	"github.com/devicebridge/devicebridge/policy"
)

// Access configures the policy and the audit log of the control API.
// Credentials are checked before a request gets here, by the
// authentication step the app mounts the routes behind (authn.Guard); the
// zero value allows everything and records nothing.
type Access struct {
	// Policy decides which boards and tools each identity sees; nil: all.
	Policy *policy.Gate
	// Alias names a board as the policy's board patterns may (the alias
	// its MCP tools are published under); nil: boards match by MAC only.
	Alias func(deviceID string) string
	// Audit records control calls; nil records nothing.
	Audit *audit.Log
}

// resolveBoard is the board a route's {id} names: its device id (the
// connected board's own, when there is one) and the board as the policy
// sees it.
func (s *Server) resolveBoard(id string) (string, policy.Board) {
	if info, ok := s.device(id); ok {
		return info.DeviceID, s.board(info)
	}
	id = s.boardID(id)
	return id, s.board(device.Info{Identity: device.Identity{DeviceID: id}})
}

// refused answers 403 when the policy does not let who call tool on board
// (logged as what through th, and audited), before anything reaches the
// board; false when the call is allowed.
func (s *Server) refused(w http.ResponseWriter, th *logthrottle.Throttle, what string, who policy.Identity, id string, board policy.Board, tool string, args json.RawMessage) bool {
	err := s.opts.Access.Policy.Check(who, board, tool)
	if err == nil {
		return false
	}
	th.Info(s.log, what+" refused by policy", zap.String("identity", who.Name), clip.Field("device_id", id), clip.Field("tool", tool))
	s.auditCall(who, id, tool, args, "denied", 0)
	writeError(w, http.StatusForbidden, "not_allowed", err.Error())
	return true
}

func (s *Server) board(info device.Info) policy.Board {
	b := policy.Board{ID: info.DeviceID}
	if s.opts.Access.Alias != nil {
		b.Alias = s.opts.Access.Alias(info.DeviceID)
	}
	return b
}

// view returns what id may see of a board: false when nothing, else the
// info with only the tools it may call.
func (s *Server) view(id policy.Identity, info device.Info) (device.Info, bool) {
	g := s.opts.Access.Policy
	if !g.Enabled() {
		return info, true
	}
	b := s.board(info)
	if !g.BoardVisible(id, b) {
		return info, false
	}
	info.Tools = slices.DeleteFunc(slices.Clone(info.Tools), func(t device.Tool) bool { return !g.ToolAllowed(id, b, t.Name) })
	return info, true
}

// visibleEvent filters an event for the stream of id: events about boards
// it may not see are dropped, tool lists trimmed.
func (s *Server) visibleEvent(id policy.Identity, ev device.Event) (device.Event, bool) {
	if !s.opts.Access.Policy.Enabled() || ev.Type == device.EventResync {
		return ev, true
	}
	info := ev.Info
	if info.DeviceID == "" {
		info.DeviceID = ev.DeviceID
	}
	v, ok := s.view(id, info)
	if !ok {
		return ev, false
	}
	if ev.Type == device.EventCall && !s.opts.Access.Policy.ToolAllowed(id, s.board(info), ev.Call.Tool) {
		return ev, false
	}
	if ev.Info.DeviceID != "" {
		ev.Info = v
	}
	return ev, true
}

// auditCall records one control call.
func (s *Server) auditCall(id policy.Identity, deviceID, tool string, args json.RawMessage, outcome string, took time.Duration) {
	l := s.opts.Access.Audit
	if l == nil {
		return
	}
	_ = l.Write(audit.Record{Kind: audit.KindToolCall, Via: "api", Identity: id.Name, Board: deviceID, Tool: tool,
		ArgsDigest: l.Digest(args), Outcome: outcome, DurationMS: float64(took.Microseconds()) / 1000})
}
