package mcpserver

import (
	"maps"

	"github.com/devicebridge/devicebridge/internal/logthrottle"
)

// Throttles are s's throttled log lines, by kind, for the tests that
// flood them.
func Throttles(s *Server) map[string]*logthrottle.Throttle {
	l := s.lines()
	m := map[string]*logthrottle.Throttle{
		"denied": &l.denied, "unconfirmed": &l.unconfirmed,
		"unknown_device": &l.unknownDevice, "unknown_tool": &l.unknownTool, "ask_failed": &l.askFailed,
		"bad_state": &l.badState, "replay_unchecked": &l.replayUnchecked, "replayed": &l.replayed,
		"flow_failed": &l.flowFailed,
	}
	maps.Copy(m, s.http.Throttles()) // rate_limited, too_big
	return m
}

// SubscriptionCount is how many resource subscriptions s holds.
func SubscriptionCount(s *Server) int {
	s.res.mu.Lock()
	defer s.res.mu.Unlock()
	return s.res.total
}

// ToolHash is the hash a tool name that clashes gets (toolNames).
func ToolHash(deviceID, tool string) string { return shortHash(deviceID, tool) }
