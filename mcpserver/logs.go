package mcpserver

import "github.com/devicebridge/devicebridge/internal/logthrottle"

// callerLines are the MCP server's log lines that a caller can have
// written at will, one request each: a refusal (policy, confirmation; the
// HTTP front's refusals, rate and size, are package mcphttp's), a forged
// or replayed requestState, a call naming no board or tool. Each kind has its own throttle: the first line at once,
// then one per interval with the count of those left out.
type callerLines struct {
	// Calls refused before the board (access.go, flowcall.go, compact.go).
	denied, unconfirmed, unknownDevice, unknownTool logthrottle.Throttle
	// Asking the user and the requestState of the modern era (flowcall.go).
	askFailed, badState, replayUnchecked, replayed logthrottle.Throttle
	// Interaction requests that failed inside the bridge (flow.go).
	flowFailed logthrottle.Throttle
	// Tasks refused past a bound, and tasks/* forwarded in vain (tasks.go).
	taskRefused, taskForward logthrottle.Throttle
}

// lines are the server's callerLines.
func (s *Server) lines() *callerLines { return &s.throttled }
