package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zapcore"
)

// logMetrics count what the log's sampler (the app wraps its logger in
// zap's) drops, so that a flood the log no longer shows line by line is
// still seen, by level.
type logMetrics struct {
	dropped *prometheus.CounterVec
	// byLevel holds dropped's counter of each level, DebugLevel to
	// FatalLevel, resolved once: the hook runs for every line dropped.
	byLevel [zapcore.FatalLevel - zapcore.DebugLevel + 1]prometheus.Counter
}

func newLogMetrics() *logMetrics {
	l := &logMetrics{dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "log_lines_dropped_total",
		Help: "Log lines the log's sampler dropped (log.sampling: past the first lines of one message per tick), by level.",
	}, []string{"level"})}
	for lvl := zapcore.DebugLevel; lvl <= zapcore.FatalLevel; lvl++ {
		l.byLevel[lvl-zapcore.DebugLevel] = l.dropped.WithLabelValues(lvl.String())
	}
	return l
}

// LogSampled is a zapcore.SamplerHook: it counts each line the sampler
// drops in devicebridge_log_lines_dropped_total{level}.
func (m *Metrics) LogSampled(ent zapcore.Entry, dec zapcore.SamplingDecision) {
	if dec&zapcore.LogDropped == 0 {
		return
	}
	if i := ent.Level - zapcore.DebugLevel; i >= 0 && int(i) < len(m.logs.byLevel) {
		m.logs.byLevel[i].Inc()
	}
}
