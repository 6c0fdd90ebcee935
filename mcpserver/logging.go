package mcpserver

import (
	"log/slog"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/devicebridge/devicebridge/internal/zapslog"
)

// sdkLogger routes the go-sdk's slog output into the bridge's zap logger.
// The SDK logs every session start and end at info, and in the modern era
// every request is a session, so its info becomes debug here; its warnings
// and errors keep their level, without a stack trace: a client can make the
// SDK log an error (a method of another protocol era, for one), and the
// trace would be the SDK's own frames, many times the line's size.
func sdkLogger(log *zap.Logger) *slog.Logger {
	log = log.WithOptions(zap.AddStacktrace(zapcore.FatalLevel))
	return zapslog.New(log, zapslog.Options{Level: func(l slog.Level) zapcore.Level {
		if l < slog.LevelWarn {
			return zapcore.DebugLevel
		}
		return zapslog.OneToOne(l)
	}})
}
