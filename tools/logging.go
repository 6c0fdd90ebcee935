package tools

import (
	"context"
	"log/slog"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// slogHandler routes the go-sdk's slog output into the bridge's zap logger.
// The SDK logs every session start and end at info, and in the modern era
// every request is a session, so its info becomes debug here; its warnings
// and errors keep their level.
type slogHandler struct {
	log    *zap.Logger
	fields []zap.Field
	group  string
}

func newSlogHandler(log *zap.Logger) slog.Handler {
	return &slogHandler{log: log.WithOptions(zap.WithCaller(false))}
}

func zapLevel(l slog.Level) zapcore.Level {
	switch {
	case l >= slog.LevelError:
		return zapcore.ErrorLevel
	case l >= slog.LevelWarn:
		return zapcore.WarnLevel
	}
	return zapcore.DebugLevel
}

func (h *slogHandler) Enabled(_ context.Context, l slog.Level) bool {
	return h.log.Core().Enabled(zapLevel(l))
}

func (h *slogHandler) Handle(_ context.Context, r slog.Record) error {
	ce := h.log.Check(zapLevel(r.Level), r.Message)
	if ce == nil {
		return nil
	}
	fields := append([]zap.Field(nil), h.fields...)
	r.Attrs(func(a slog.Attr) bool {
		fields = append(fields, h.field(a))
		return true
	})
	ce.Write(fields...)
	return nil
}

func (h *slogHandler) field(a slog.Attr) zap.Field {
	key := a.Key
	if h.group != "" {
		key = h.group + "." + key
	}
	return zap.Any(key, a.Value.Resolve().Any())
}

func (h *slogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	n := *h
	n.fields = append([]zap.Field(nil), h.fields...)
	for _, a := range attrs {
		n.fields = append(n.fields, h.field(a))
	}
	return &n
}

func (h *slogHandler) WithGroup(name string) slog.Handler {
	n := *h
	if n.group != "" {
		name = n.group + "." + name
	}
	n.group = name
	return &n
}
