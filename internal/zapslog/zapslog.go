// Package zapslog routes the log/slog output of libraries the bridge embeds
// (the MCP go-sdk, the mochi MQTT broker) into the bridge's zap loggers, so
// every line shares one format, one level setting and the component names.
package zapslog

import (
	"context"
	"log/slog"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Options adapt a library's logging to the bridge's.
type Options struct {
	// Level maps a slog level to zap's. Libraries disagree about what is
	// info-worthy, so each caller decides; nil maps levels one to one.
	Level func(slog.Level) zapcore.Level
	// Field turns an attribute into a zap field; nil uses zap.Any. Use it to
	// keep payloads out of the log.
	Field func(key string, v slog.Value) zap.Field
	// Off, when set and true, silences the handler: a library's goroutines
	// may still log after the component that owns them has closed.
	Off *atomic.Bool
}

// New returns a slog.Logger writing to log.
func New(log *zap.Logger, opts Options) *slog.Logger {
	return slog.New(NewHandler(log, opts))
}

// NewHandler returns a slog.Handler writing to log.
func NewHandler(log *zap.Logger, opts Options) slog.Handler {
	if opts.Level == nil {
		opts.Level = OneToOne
	}
	if opts.Field == nil {
		opts.Field = func(key string, v slog.Value) zap.Field { return zap.Any(key, v.Any()) }
	}
	return &handler{log: log.WithOptions(zap.WithCaller(false)), opts: opts}
}

// OneToOne maps slog levels to the zap level of the same name.
func OneToOne(l slog.Level) zapcore.Level {
	switch {
	case l >= slog.LevelError:
		return zapcore.ErrorLevel
	case l >= slog.LevelWarn:
		return zapcore.WarnLevel
	case l >= slog.LevelInfo:
		return zapcore.InfoLevel
	}
	return zapcore.DebugLevel
}

type handler struct {
	log    *zap.Logger
	opts   Options
	fields []zap.Field
	group  string
}

func (h *handler) off() bool { return h.opts.Off != nil && h.opts.Off.Load() }

func (h *handler) Enabled(_ context.Context, l slog.Level) bool {
	return !h.off() && h.log.Core().Enabled(h.opts.Level(l))
}

func (h *handler) Handle(_ context.Context, r slog.Record) error {
	if h.off() {
		return nil
	}
	ce := h.log.Check(h.opts.Level(r.Level), r.Message)
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

func (h *handler) field(a slog.Attr) zap.Field {
	key := a.Key
	if h.group != "" {
		key = h.group + "." + key
	}
	return h.opts.Field(key, a.Value.Resolve())
}

func (h *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	n := *h
	n.fields = append([]zap.Field(nil), h.fields...)
	for _, a := range attrs {
		n.fields = append(n.fields, h.field(a))
	}
	return &n
}

func (h *handler) WithGroup(name string) slog.Handler {
	n := *h
	if n.group != "" {
		name = n.group + "." + name
	}
	n.group = name
	return &n
}
