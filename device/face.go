package device

import (
	"context"
	"time"

	"github.com/devicebridge/devicebridge/device/internal/mcpclient"
)

// The device layer is the one face of the layers below it: callers above
// (mcpserver/, api/, the transports, app/) use these names and never import
// mcpclient. They are aliases, as go-sdk's jsonrpc package aliases its
// internal types, so no value is copied at the boundary.
type (
	// Tool is one board tool as the board declares it.
	Tool = mcpclient.Tool
	// CallResult is a board's tools/call result.
	CallResult = mcpclient.CallResult
	// Content is one item of a CallResult.
	Content = mcpclient.Content
	// DeviceError is an error reply from the board (a message, no code).
	DeviceError = mcpclient.DeviceError
	// ClientOptions configures each board's MCP client.
	ClientOptions = mcpclient.Options
	// Vision is the camera explain endpoint advertised in initialize.
	Vision = mcpclient.Vision
	// CallStage is a step a call passes on its way to the board, reported
	// to the function of WithCallStages.
	CallStage = mcpclient.Stage
	// CallStageKind names a CallStage.
	CallStageKind = mcpclient.StageKind
)

// The steps of a call, in the order it meets them.
const (
	// StageWaitReady: the board is initializing or reconnecting; the
	// call waits for it (up to HubConfig.ReadyWait).
	StageWaitReady = mcpclient.StageWaitReady
	// StageForwarded: another bridge of the fleet holds the board; the
	// call went to it.
	StageForwarded = mcpclient.StageForwarded
	// StageQueued: the call waits behind CallStage.Ahead others to the
	// same board.
	StageQueued = mcpclient.StageQueued
	// StageSent: the call was written to the board.
	StageSent = mcpclient.StageSent
)

// WithCallStages returns a context whose tool calls (Hub.CallTool) report
// their steps to f, on the call's own goroutine and sometimes while the
// call holds the board's turn: f must return at once.
func WithCallStages(ctx context.Context, f func(CallStage)) context.Context {
	return mcpclient.WithStages(ctx, f)
}

// Errors from a board's MCP client. Test with errors.Is, or use CodeOf.
var (
	// ErrBusy: the board's request queue is full; nothing was sent.
	ErrBusy = mcpclient.ErrBusy
	// ErrTimeout: no reply in time; the outcome is unknown.
	ErrTimeout = mcpclient.ErrTimeout
	// ErrQueueTimeout: the call's time ran out while it waited behind
	// earlier calls to the same board; nothing was sent.
	ErrQueueTimeout = mcpclient.ErrQueueTimeout
	// ErrDisconnected: the link went away before the reply.
	ErrDisconnected = mcpclient.ErrDisconnected
)

// Defaults of ClientOptions, for configuration that shows them.
const (
	DefaultRequestTimeout = mcpclient.DefaultRequestTimeout
	DefaultCallTimeout    = mcpclient.DefaultCallTimeout
	DefaultQueueSize      = mcpclient.DefaultQueueSize
	DefaultMaxPages       = mcpclient.DefaultMaxPages
	DefaultMaxTools       = mcpclient.DefaultMaxTools
	// DefaultMaxCatalogBytes bounds a board's tools/list replies, pages
	// together (ClientOptions.MaxListBytes).
	DefaultMaxCatalogBytes = mcpclient.DefaultMaxListBytes
)

// DefaultToolTimeouts are the per-tool call timeouts boards need (tools that
// legitimately take long, such as taking a photo).
func DefaultToolTimeouts() map[string]time.Duration { return mcpclient.DefaultToolTimeouts() }
