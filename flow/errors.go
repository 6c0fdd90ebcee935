package flow

import "fmt"

// Error codes of the MCP Flow protocol (spec §Error Handling). They travel
// as the JSON-RPC error code when mcpserver/ maps an *Error onto the wire.
//
// Which limit gives which code (each message says which limit was hit):
//   - the inactivity timeout and Options.MaxDuration expire an interaction:
//     CodeSessionExpired (restart it);
//   - Options.MaxPerOwner refuses a new interaction: CodeTimeout (retry
//     later with backoff, or finish or cancel an open one first);
//   - Options.MaxPrompts ends an interaction that needs one more prompt:
//     CodeInvalidStateTransition (the interaction moves to state error and
//     cannot go back to waiting_user; start again with more initialParams).
const (
	// CodeSessionNotFound: no interaction with this id for this owner. A
	// tampered token and another owner's id get this code too, so that an
	// id reveals nothing to anyone but its owner.
	CodeSessionNotFound = -32001
	// CodeSessionExpired: the interaction outlived its inactivity timeout
	// or the maximum duration; it has been cleaned up.
	CodeSessionExpired = -32002
	// CodeInvalidStateTransition: the call does not fit the interaction's
	// state (answering when no prompt is open, cancelling a finished
	// interaction, a second answer while one is being processed, the prompt
	// limit).
	CodeInvalidStateTransition = -32003
	// CodeValidationFailed: the initial parameters cannot be fixed by
	// prompting (not an object, unknown arguments, a constraint across
	// arguments).
	CodeValidationFailed = -32004
	// CodeTimeout: a limit that clears with time (MaxPerOwner).
	CodeTimeout = -32005
	// CodeAlreadyCancelled: the interaction was already cancelled.
	CodeAlreadyCancelled = -32006
	// CodeNotInteractive: the tool cannot be run as an interaction (its
	// schema is not an object schema the engine understands, it has no
	// Execute function, or a prompt cannot be asked through a form), or the
	// engine is closed.
	CodeNotInteractive = -32007
)

// codeNames are the spec's names for the codes, used by Error.Error.
var codeNames = map[int]string{
	CodeSessionNotFound:        "SESSION_NOT_FOUND",
	CodeSessionExpired:         "SESSION_EXPIRED",
	CodeInvalidStateTransition: "INVALID_STATE_TRANSITION",
	CodeValidationFailed:       "VALIDATION_FAILED",
	CodeTimeout:                "TIMEOUT",
	CodeAlreadyCancelled:       "ALREADY_CANCELLED",
	CodeNotInteractive:         "NOT_INTERACTIVE",
}

// Error is a protocol error, ready to be sent as a JSON-RPC error object.
// Message always teaches: what went wrong, what to change (with an example
// where one helps) and the next call to make. Data carries machine-readable
// details: always "sessionId" when an interaction is concerned, plus
// "state", "reason", "problems" or "limit" where they apply.
type Error struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data,omitempty"`
}

func (e *Error) Error() string {
	name := codeNames[e.Code]
	if name == "" {
		name = fmt.Sprint(e.Code)
	}
	return "flow: " + name + ": " + e.Message
}

// CodeName returns the spec's name for an error code, such as
// "SESSION_NOT_FOUND", or "" for a code the spec does not define.
func CodeName(code int) string { return codeNames[code] }

func newError(code int, data map[string]any, format string, args ...any) *Error {
	e := &Error{Code: code, Message: fmt.Sprintf(format, args...)}
	if len(data) > 0 {
		e.Data = data
	}
	return e
}

func errNotFound(id string) *Error {
	return newError(CodeSessionNotFound, map[string]any{"sessionId": id},
		"No interaction %s is open for you. Ids are valid only for the caller that started them, and only as returned (a changed token is rejected); "+
			"an id from another bridge is valid here only when both run with the same flow secret (--flow-secret). "+
			"Start a new one with interaction.start {\"toolName\": ..., \"initialParams\": {...}}.", short(id))
}

func errExpired(id, reason string, limit string) *Error {
	why := "it had no activity for " + limit
	if reason == reasonMaxDuration {
		why = "it ran longer than the maximum of " + limit
	}
	return newError(CodeSessionExpired, map[string]any{"sessionId": id, "reason": reason},
		"Interaction %s has expired: %s, and it has been cleaned up. Nothing more will run in it. "+
			"Start a new one with interaction.start, passing the values you already know in initialParams so that fewer questions are asked.", short(id), why)
}

// short cuts long stateless tokens down for messages.
func short(id string) string {
	if len(id) > 40 {
		return id[:16] + "…" + id[len(id)-8:]
	}
	return id
}

func errClosed() *Error {
	return newError(CodeNotInteractive, nil,
		"The interaction engine is shutting down. Retry against a running bridge; interactions from this one are gone, so start a new one.")
}

func errNotWaiting(id string, s State) *Error {
	var why string
	switch s {
	case StateProcessing, StateActive, StateIdle:
		why = "an earlier answer (or the tool) is still being processed. Wait for that call to return, then answer the prompt it gives you"
	case StateCompleted:
		why = "it has completed. Start a new interaction to run the tool again"
	case StateCancelled:
		why = "it was cancelled. Start a new interaction if you still want to run the tool"
	case StateError:
		why = "it ended with an error. Start a new interaction to try again"
	default:
		why = "no prompt is open"
	}
	return newError(CodeInvalidStateTransition, map[string]any{"sessionId": id, "state": s},
		"Interaction %s is %s and is not waiting for an answer: %s. Use interaction.getState to see where it stands.", short(id), s, why)
}

func errCannotCancel(id string, s State) error {
	switch s {
	case StateCancelled:
		return newError(CodeAlreadyCancelled, map[string]any{"sessionId": id, "state": s},
			"Interaction %s was already cancelled; nothing more to do. Start a new interaction to run the tool.", short(id))
	case StateCompleted, StateError:
		return newError(CodeInvalidStateTransition, map[string]any{"sessionId": id, "state": s},
			"Interaction %s has already ended (%s) and cannot be cancelled; what ran stays done. Use interaction.getState to see its outcome.", short(id), s)
	}
	return nil
}
