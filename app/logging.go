package app

import (
	"fmt"
	"log"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// NewLogger builds the root logger from the log config.
func NewLogger(c LogConfig) (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(c.Level)
	if err != nil {
		return nil, fmt.Errorf("log.level %q: %w", c.Level, err)
	}
	var zc zap.Config
	if c.Format == "json" {
		zc = zap.NewProductionConfig()
	} else {
		zc = zap.NewDevelopmentConfig()
		zc.Development = false
		zc.EncoderConfig.EncodeLevel = zapcore.CapitalColorLevelEncoder
		zc.DisableStacktrace = true
	}
	zc.Level = zap.NewAtomicLevelAt(level)
	return zc.Build()
}

// httpErrorLog routes net/http's own messages (TLS handshake errors, bad
// requests) to zap at warn level.
func httpErrorLog(l *zap.Logger) *log.Logger {
	std, _ := zap.NewStdLogAt(l.Named("http"), zap.WarnLevel)
	return std
}
