package broker

import (
	"context"
	"log/slog"
	"strconv"
	"sync/atomic"

	"github.com/mochi-mqtt/server/v2/packets"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// zapHandler routes mochi's slog output into zap. mochi's info lines are
// lifecycle chatter and its warnings concern single clients that the policy
// hook already reports with better context, so both go to debug; its
// errors become warnings. Packets mochi attaches to its records are
// reduced to type, topic and size: payloads never reach the log.
//
// off silences it once the broker has closed: mochi's listener goroutines
// may still log a connection's end after Close returned, and the bridge's
// logger (a test's, in particular) must not be written to by then.
type zapHandler struct {
	log    *zap.Logger
	fields []zap.Field
	group  string
	off    *atomic.Bool
}

func newSlog(l *zap.Logger, off *atomic.Bool) *slog.Logger {
	return slog.New(&zapHandler{log: l, off: off})
}

func level(l slog.Level) zapcore.Level {
	if l >= slog.LevelError {
		return zapcore.WarnLevel
	}
	return zapcore.DebugLevel
}

func (h *zapHandler) Enabled(_ context.Context, l slog.Level) bool {
	return !h.off.Load() && h.log.Core().Enabled(level(l))
}

func (h *zapHandler) Handle(_ context.Context, r slog.Record) error {
	if h.off.Load() {
		return nil
	}
	ce := h.log.Check(level(r.Level), r.Message)
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

func (h *zapHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	n := &zapHandler{log: h.log, group: h.group, off: h.off, fields: append([]zap.Field(nil), h.fields...)}
	for _, a := range attrs {
		n.fields = append(n.fields, h.field(a))
	}
	return n
}

func (h *zapHandler) WithGroup(name string) slog.Handler {
	g := name
	if h.group != "" {
		g = h.group + "." + name
	}
	return &zapHandler{log: h.log, fields: h.fields, group: g, off: h.off}
}

func (h *zapHandler) field(a slog.Attr) zap.Field {
	key := a.Key
	if h.group != "" {
		key = h.group + "." + key
	}
	v := a.Value.Resolve()
	switch x := v.Any().(type) {
	case packets.Packet:
		return zap.String(key, packetSummary(&x))
	case *packets.Packet:
		return zap.String(key, packetSummary(x))
	case error:
		return zap.NamedError(key, x)
	}
	return zap.Any(key, v.Any())
}

func packetSummary(p *packets.Packet) string {
	if p == nil {
		return "<nil>"
	}
	s := packets.PacketNames[p.FixedHeader.Type]
	if p.TopicName != "" {
		s += " " + p.TopicName
	}
	if len(p.Payload) > 0 {
		s += " (" + strconv.Itoa(len(p.Payload)) + " bytes)"
	}
	return s
}
