// Package logthrottle keeps a warning that an outsider can repeat at will
// (a flood of refused connections, a board that never stops publishing)
// from flooding the log: the first occurrence is logged at once, later ones
// at most once per interval, each carrying how many were left out since the
// last line. zap's own sampler drops lines silently; an operator reading a
// sampled log must still see how big the flood was.
package logthrottle

import (
	"cmp"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// DefaultInterval is the quiet time between two lines of one Throttle.
const DefaultInterval = 10 * time.Second

// Throttle rate-limits one kind of log line. The zero value logs at most
// once per DefaultInterval; it is safe for concurrent use.
type Throttle struct {
	// Interval is the least time between two lines; 0 means
	// DefaultInterval. Set it before the throttle is used, or with
	// SetInterval.
	Interval time.Duration

	mu         sync.Mutex
	last       time.Time
	suppressed int64
}

// Allow reports whether a line may be written now and, when it may, how
// many occurrences were left out since the previous line.
func (t *Throttle) Allow() (suppressed int64, ok bool) {
	return t.allowAt(time.Now())
}

func (t *Throttle) allowAt(now time.Time) (int64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	interval := cmp.Or(max(t.Interval, 0), DefaultInterval)
	if !t.last.IsZero() && now.Sub(t.last) < interval {
		t.suppressed++
		return 0, false
	}
	n := t.suppressed
	t.last, t.suppressed = now, 0
	return n, true
}

// SetInterval changes Interval while the throttle is in use (a test
// shortens it to have the line that counts a flood written at once).
func (t *Throttle) SetInterval(d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.Interval = d
}

// Suppressed is how many occurrences were left out since the last line
// (a test polls it to know that a flood was handled).
func (t *Throttle) Suppressed() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.suppressed
}

// Warn writes msg at warn level through log when the throttle allows it,
// adding a "suppressed" field with the count of lines left out since the
// last one (omitted when none were). A level the logger does not write
// neither logs nor counts.
//
// The throttle decides before the logger's own sampler (the app wraps its
// logger in zap's) sees the line: the sampler sees only the lines let
// through, a few a minute, so it never drops them, and every occurrence
// the throttle leaves out is counted in "suppressed" rather than lost in
// the sampler.
func (t *Throttle) Warn(log *zap.Logger, msg string, fields ...zap.Field) {
	t.write(log, zapcore.WarnLevel, msg, fields)
}

// Info is Warn at info level.
func (t *Throttle) Info(log *zap.Logger, msg string, fields ...zap.Field) {
	t.write(log, zapcore.InfoLevel, msg, fields)
}

// Error is Warn at error level.
func (t *Throttle) Error(log *zap.Logger, msg string, fields ...zap.Field) {
	t.write(log, zapcore.ErrorLevel, msg, fields)
}

func (t *Throttle) write(log *zap.Logger, lvl zapcore.Level, msg string, fields []zap.Field) {
	if !log.Core().Enabled(lvl) {
		return
	}
	n, ok := t.Allow()
	if !ok {
		return
	}
	ce := log.Check(lvl, msg)
	if ce == nil {
		return
	}
	if n > 0 {
		fields = append(fields[:len(fields):len(fields)], zap.Int64("suppressed", n))
	}
	ce.Write(fields...)
}
