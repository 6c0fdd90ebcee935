package mcpserver

import "github.com/devicebridge/devicebridge/internal/logthrottle"

// Throttles are s's throttled log lines, by kind, for the tests that
// flood them.
func Throttles(s *Server) map[string]*logthrottle.Throttle {
	l := s.lines()
	return map[string]*logthrottle.Throttle{
		"rate_limited": &l.rateLimited, "too_big": &l.tooBig, "denied": &l.denied, "unconfirmed": &l.unconfirmed,
		"unknown_device": &l.unknownDevice, "unknown_tool": &l.unknownTool, "ask_failed": &l.askFailed,
		"bad_state": &l.badState, "replay_unchecked": &l.replayUnchecked, "replayed": &l.replayed,
		"flow_failed": &l.flowFailed,
	}
}
