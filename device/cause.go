package device

import "errors"

// CloseCause classifies why a session ended. It is a small fixed set, fit
// for a metrics label and for branching; the full reason (with addresses
// and details) stays in Info.CloseReason for people.
type CloseCause string

// Close causes.
const (
	// CauseClosed: the link closed without saying why.
	CauseClosed CloseCause = "closed"
	// CauseDisconnected: the board closed the connection or the network
	// dropped it.
	CauseDisconnected CloseCause = "disconnected"
	// CauseReplaced: the same board connected again.
	CauseReplaced CloseCause = "replaced"
	// CauseRefused: the bridge turned the connection away (for example a
	// device id flapping between two live connections).
	CauseRefused CloseCause = "refused"
	// CauseShutdown: the bridge is shutting down.
	CauseShutdown CloseCause = "shutdown"
	// CauseInitFailed: initialize or tools/list failed.
	CauseInitFailed CloseCause = "init_failed"
	// CauseUnresponsive: the board stopped answering keepalive probes.
	CauseUnresponsive CloseCause = "unresponsive"
	// CauseProtocol: the board broke the protocol (oversized or malformed
	// frames, a second hello).
	CauseProtocol CloseCause = "protocol_error"
	// CauseBrokerLost: the MQTT broker connection carrying the board went away.
	CauseBrokerLost CloseCause = "broker_lost"
)

// CloseCauses lists every CloseCause, for metrics that pre-declare labels.
var CloseCauses = []CloseCause{CauseClosed, CauseDisconnected, CauseReplaced, CauseRefused, CauseShutdown,
	CauseInitFailed, CauseUnresponsive, CauseProtocol, CauseBrokerLost}

// CloseError is a link close reason with its cause. Transports close links
// with Closing so the cause survives wrapping.
type CloseError struct {
	Cause CloseCause
	Err   error
}

// Closing wraps err (which may be nil) with a cause.
func Closing(cause CloseCause, err error) error {
	if err == nil {
		err = errors.New(string(cause))
	}
	return &CloseError{Cause: cause, Err: err}
}

func (e *CloseError) Error() string { return e.Err.Error() }
func (e *CloseError) Unwrap() error { return e.Err }

// CauseOf classifies a link's close reason.
func CauseOf(reason error) CloseCause {
	var ce *CloseError
	switch {
	case reason == nil, errors.Is(reason, ErrLinkClosed) && !errors.As(reason, &ce):
		return CauseClosed
	case errors.As(reason, &ce):
		return ce.Cause
	case errors.Is(reason, ErrReplaced):
		return CauseReplaced
	case errors.Is(reason, ErrShutdown):
		return CauseShutdown
	case errors.Is(reason, ErrFlapping):
		return CauseRefused
	case errors.Is(reason, ErrUnresponsive):
		return CauseUnresponsive
	case errors.Is(reason, errInitFailed):
		return CauseInitFailed
	}
	return CauseDisconnected
}
