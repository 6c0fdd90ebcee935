package logthrottle

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestAllowCountsWhatItLeavesOut(t *testing.T) {
	th := &Throttle{Interval: time.Second}
	t0 := time.Unix(1000, 0)
	n, ok := th.allowAt(t0)
	require.True(t, ok, "the first occurrence is logged")
	assert.Zero(t, n)
	for i := range 5 {
		_, ok := th.allowAt(t0.Add(time.Duration(i) * 100 * time.Millisecond))
		assert.False(t, ok)
	}
	n, ok = th.allowAt(t0.Add(time.Second))
	require.True(t, ok, "one interval later a line is due")
	assert.EqualValues(t, 5, n)
	n, ok = th.allowAt(t0.Add(3 * time.Second))
	require.True(t, ok)
	assert.Zero(t, n, "the count starts again after each line")
}

func TestWarnAddsSuppressedField(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	log := zap.New(core)
	th := &Throttle{Interval: time.Hour}
	for range 100 {
		th.Warn(log, "flood", zap.String("k", "v"))
	}
	require.Equal(t, 1, logs.Len(), "one line for a hundred occurrences within the interval")
	assert.EqualValues(t, 99, th.Suppressed())
	assert.NotContains(t, logs.All()[0].ContextMap(), "suppressed")
	th.last = th.last.Add(-2 * time.Hour) // the interval has passed
	th.Warn(log, "flood")
	require.Equal(t, 2, logs.Len())
	assert.EqualValues(t, 99, logs.All()[1].ContextMap()["suppressed"])
}

func TestDisabledLevelNeitherLogsNorCounts(t *testing.T) {
	core, logs := observer.New(zapcore.ErrorLevel)
	th := &Throttle{}
	th.Warn(zap.New(core), "quiet")
	assert.Zero(t, logs.Len())
	_, ok := th.Allow()
	assert.True(t, ok, "a line the logger dropped used no allowance")
}

// TestSamplerSeesOnlyWhatTheThrottleLetsThrough: behind zap's sampler (as
// the app's logger is), a flood is still counted in full in "suppressed",
// and the line due after the interval is written, not dropped by the
// sampler for the flood it never saw.
func TestSamplerSeesOnlyWhatTheThrottleLetsThrough(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	var dropped int
	sampled := zapcore.NewSamplerWithOptions(core, time.Hour, 2, 0, zapcore.SamplerHook(func(_ zapcore.Entry, d zapcore.SamplingDecision) {
		if d&zapcore.LogDropped != 0 {
			dropped++
		}
	}))
	log := zap.New(sampled)
	th := &Throttle{Interval: time.Hour}
	for range 1000 {
		th.Warn(log, "flood")
	}
	th.last = th.last.Add(-2 * time.Hour) // the interval has passed
	th.Warn(log, "flood")
	require.Equal(t, 2, logs.Len(), "the line due after the interval is written")
	assert.EqualValues(t, 999, logs.All()[1].ContextMap()["suppressed"])
	assert.Zero(t, dropped, "the sampler never had to drop a throttled line")
}

// TestSetIntervalWhileInUse: shortening the interval of a throttle in use
// lets the line that counts the flood through at once.
func TestSetIntervalWhileInUse(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	log := zap.New(core)
	th := &Throttle{Interval: time.Hour}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 50 {
			th.Warn(log, "flood")
		}
	}()
	<-done
	th.SetInterval(time.Nanosecond)
	th.Warn(log, "flood")
	require.Equal(t, 2, logs.Len())
	assert.EqualValues(t, 49, logs.All()[1].ContextMap()["suppressed"])
}

func TestErrorLevel(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	th := &Throttle{Interval: time.Hour}
	for range 3 {
		th.Error(zap.New(core), "broken")
	}
	require.Equal(t, 1, logs.Len())
	assert.Equal(t, zapcore.ErrorLevel, logs.All()[0].Level)
}
