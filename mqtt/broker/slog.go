package broker

import (
	"log/slog"
	"strconv"
	"sync/atomic"

	"github.com/mochi-mqtt/server/v2/packets"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/internal/zapslog"
)

// newSlog routes mochi's slog output into zap. mochi's info lines are
// lifecycle chatter and its warnings concern single clients that the policy
// hook already reports with better context, so both go to debug; its
// errors become warnings. Packets mochi attaches to its records are
// reduced to type, topic and size: payloads never reach the log.
//
// off silences it once the broker has closed: mochi's listener goroutines
// may still log a connection's end after Close returned, and the bridge's
// logger (a test's, in particular) must not be written to by then.
func newSlog(l *zap.Logger, off *atomic.Bool) *slog.Logger {
	return zapslog.New(l, zapslog.Options{Level: level, Field: field, Off: off})
}

func level(l slog.Level) zapcore.Level {
	if l >= slog.LevelError {
		return zapcore.WarnLevel
	}
	return zapcore.DebugLevel
}

func field(key string, v slog.Value) zap.Field {
	switch x := v.Any().(type) {
	case packets.Packet:
		return zap.String(key, packetSummary(&x))
	case *packets.Packet:
		return zap.String(key, packetSummary(x))
	case error:
		return clip.NamedError(key, x)
	case string: // a client id, a topic: the client's own
		return clip.Field(key, x)
	}
	return zap.Any(key, v.Any())
}

func packetSummary(p *packets.Packet) string {
	if p == nil {
		return "<nil>"
	}
	s := packets.PacketNames[p.FixedHeader.Type]
	if p.TopicName != "" {
		s += " " + clip.String(p.TopicName)
	}
	if len(p.Payload) > 0 {
		s += " (" + strconv.Itoa(len(p.Payload)) + " bytes)"
	}
	return s
}
