package zapslog

import (
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestHandler(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	var off atomic.Bool
	l := New(zap.New(core), Options{
		Level: func(l slog.Level) zapcore.Level { return zapcore.DebugLevel },
		Field: func(key string, v slog.Value) zap.Field {
			if key == "g.payload" {
				return zap.Int(key, len(v.String()))
			}
			return zap.Any(key, v.Any())
		},
		Off: &off,
	})
	l.With("a", 1).WithGroup("g").Info("hello", "payload", "secret!", "n", 2)
	off.Store(true)
	l.Error("after close")

	entries := logs.AllUntimed()
	assert.Len(t, entries, 1)
	e := entries[0]
	assert.Equal(t, zapcore.DebugLevel, e.Level)
	assert.Equal(t, "hello", e.Message)
	assert.Equal(t, map[string]any{"a": int64(1), "g.payload": int64(7), "g.n": int64(2)}, e.ContextMap())
}

func TestOneToOne(t *testing.T) {
	assert.Equal(t, zapcore.ErrorLevel, OneToOne(slog.LevelError))
	assert.Equal(t, zapcore.WarnLevel, OneToOne(slog.LevelWarn))
	assert.Equal(t, zapcore.InfoLevel, OneToOne(slog.LevelInfo))
	assert.Equal(t, zapcore.DebugLevel, OneToOne(slog.LevelDebug))
}
