package mcpclient

import (
	"context"
	"time"
)

// StageKind names a step a request passes on its way to the board.
type StageKind int

// The steps, in the order a request meets them. StageWaitReady and
// StageForwarded are reported by the layer above (package device), the
// others by the Client.
const (
	// StageWaitReady: the board is still initializing (or reconnecting);
	// the call waits for it.
	StageWaitReady StageKind = iota + 1
	// StageForwarded: the board is held by another bridge of the fleet;
	// the call was handed to it.
	StageForwarded
	// StageQueued: the request waits behind others to the same board;
	// Stage.Ahead says how many.
	StageQueued
	// StageSent: the request was written to the board; Stage.At is when.
	StageSent
)

// Stage is one step of a request, reported to the function its caller put
// in the request's context with WithStages.
type Stage struct {
	Kind StageKind
	// Ahead is, for StageQueued, the requests held before this one (the
	// one on the board included).
	Ahead int
	// At is when the step happened.
	At time.Time
}

type stagesKey struct{}

// WithStages returns a context whose requests report their steps to f.
// f is called on the request's own goroutine, sometimes while the
// request holds the board's turn: it must return at once (queue the news,
// never send it from there).
func WithStages(ctx context.Context, f func(Stage)) context.Context {
	return context.WithValue(ctx, stagesKey{}, f)
}

// Report tells the function in ctx (if any) that the request reached a
// step.
func Report(ctx context.Context, kind StageKind, ahead int) {
	if f, ok := ctx.Value(stagesKey{}).(func(Stage)); ok && f != nil {
		f(Stage{Kind: kind, Ahead: ahead, At: time.Now()})
	}
}
