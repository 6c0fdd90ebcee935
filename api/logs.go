package api

import "github.com/devicebridge/devicebridge/internal/logthrottle"

// callerLines are the control API's log lines a caller can have written
// at will, one request each. Each kind has its own throttle: the first
// line at once, then one per interval with the count of those left out.
type callerLines struct {
	// Refused by the policy (access.go): a control call, an interaction.
	deniedCall, deniedInteraction logthrottle.Throttle
	// A control call the Hub failed (unknown board or tool, bad
	// arguments, a busy or silent board...).
	callFailed logthrottle.Throttle
	// An interaction id naming a node that cannot be reached.
	holderUnreachable logthrottle.Throttle
}
