package device

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/devicebridge/devicebridge/internal/argcheck"
)

// Code classifies why a call to a board failed. It is the one error
// vocabulary of the device layer: the control API maps a Code to an HTTP
// status and /mcp to a message, instead of each switching on sentinels.
type Code string

// Call failure codes. Each names who can fix it: the caller (unknown tool,
// invalid arguments), time (not ready, busy, queue_timeout), the board
// (offline, device_error, timeout) or nobody (shutting down).
const (
	CodeUnknownDevice    Code = "unknown_device"
	CodeUnknownTool      Code = "unknown_tool"
	CodeInvalidArguments Code = "invalid_arguments"
	CodeNotReady         Code = "not_ready"
	CodeNoMCP            Code = "no_mcp"
	CodeBusy             Code = "busy"
	CodeQueueTimeout     Code = "queue_timeout"
	CodeTimeout          Code = "timeout"
	CodeOffline          Code = "offline"
	CodeDeviceError      Code = "device_error"
	CodeShuttingDown     Code = "shutting_down"
	CodeCanceled         Code = "canceled"
	CodeFailed           Code = "failed"
)

// Codes lists every Code, for metrics that pre-declare their labels.
var Codes = []Code{CodeUnknownDevice, CodeUnknownTool, CodeInvalidArguments, CodeNotReady, CodeNoMCP,
	CodeBusy, CodeQueueTimeout, CodeTimeout, CodeOffline, CodeDeviceError, CodeShuttingDown, CodeCanceled, CodeFailed}

// CodeOf classifies an error returned by Hub.CallTool or Session.CallTool.
// A nil error has no code ("").
func CodeOf(err error) Code {
	var devErr *DeviceError
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrShutdown), errors.Is(err, ErrHubClosed):
		return CodeShuttingDown
	case errors.Is(err, ErrUnknownTool):
		return CodeUnknownTool
	case errors.Is(err, ErrInvalidArguments):
		return CodeInvalidArguments
	case errors.As(err, &devErr):
		return CodeDeviceError
	case errors.Is(err, ErrUnknownDevice):
		return CodeUnknownDevice
	case errors.Is(err, ErrNotReady):
		return CodeNotReady
	case errors.Is(err, ErrNoMCP):
		return CodeNoMCP
	case errors.Is(err, ErrBusy):
		return CodeBusy
	case errors.Is(err, ErrQueueTimeout):
		return CodeQueueTimeout
	case errors.Is(err, ErrTimeout):
		return CodeTimeout
	case errors.Is(err, ErrOffline), errors.Is(err, ErrDisconnected):
		return CodeOffline
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return CodeCanceled
	}
	return CodeFailed
}

// Errors for calls refused before they reached the board.
var (
	// ErrUnknownTool: the board has no tool of that name.
	ErrUnknownTool = errors.New("unknown tool")
	// ErrInvalidArguments: the arguments do not match the tool's schema.
	ErrInvalidArguments = errors.New("invalid arguments")
)

// UnknownToolError names a tool the board does not have, with the ones it
// has so the caller can correct itself.
type UnknownToolError struct {
	Tool  string
	Known []string // in device order
}

func (e *UnknownToolError) Error() string {
	if len(e.Known) == 0 {
		return fmt.Sprintf("unknown tool %q: this board has no tools", e.Tool)
	}
	msg := fmt.Sprintf("unknown tool %q", e.Tool)
	if guess := closestName(e.Tool, e.Known); guess != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", guess)
	}
	return msg + "; this board has: " + strings.Join(e.Known, ", ")
}

// Is makes errors.Is(err, ErrUnknownTool) true.
func (e *UnknownToolError) Is(target error) bool { return target == ErrUnknownTool }

// closestName finds a known tool the caller probably meant: the same name
// after the last '.', or one containing the name.
func closestName(name string, known []string) string {
	short := name[strings.LastIndexByte(name, '.')+1:]
	if i := slices.IndexFunc(known, func(k string) bool {
		return strings.EqualFold(k[strings.LastIndexByte(k, '.')+1:], short)
	}); i >= 0 {
		return known[i]
	}
	if short == "" {
		return ""
	}
	if i := slices.IndexFunc(known, func(k string) bool { return strings.Contains(k, short) }); i >= 0 {
		return known[i]
	}
	return ""
}

// ArgumentsError says what is wrong with a call's arguments and how to fix
// them. Nothing reached the board.
type ArgumentsError struct {
	Tool    string
	Invalid *argcheck.Invalid
	Schema  *argcheck.Schema
}

func (e *ArgumentsError) Error() string { return e.Invalid.Explain(e.Tool, e.Schema) }

// Is makes errors.Is(err, ErrInvalidArguments) true.
func (e *ArgumentsError) Is(target error) bool { return target == ErrInvalidArguments }

// LogSafe returns err in a form fit for logs at info level and above. An
// invalid-arguments error quotes what the caller sent (so that the caller
// can correct it); its logged form names the tool and the arguments at
// fault, never their values. Other errors are returned as they are.
func LogSafe(err error) error {
	var ae *ArgumentsError
	if !errors.As(err, &ae) {
		return err
	}
	var names []string
	if ae.Invalid != nil {
		for _, p := range ae.Invalid.Problems {
			if p.Arg != "" && !slices.Contains(names, p.Arg) {
				names = append(names, p.Arg)
			}
		}
	}
	what := "the arguments as a whole"
	if len(names) > 0 {
		what = "argument " + strings.Join(names, ", ")
	}
	return fmt.Errorf("%w for %s: %s (values not logged)", ErrInvalidArguments, ae.Tool, what)
}
