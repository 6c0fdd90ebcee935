package app

import (
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/internal/logthrottle"
)

// LogSampling is the log's backstop against floods (log.sampling): of
// the lines with one message and level, the first Initial of each Tick
// are written, then one in Thereafter. Warnings an outsider can repeat
// are throttled where they are written, with a count of what they leave
// out; the sampler catches whatever a client can still multiply (a line
// per connection, when connections are cycled at will), and
// devicebridge_log_lines_dropped_total counts what it drops.
type LogSampling struct {
	// Initial lines of one message are written each Tick; a negative
	// value turns sampling off.
	Initial int `yaml:"initial"`
	// Thereafter: past Initial, one line in Thereafter is written.
	Thereafter int `yaml:"thereafter"`
	// Tick is how often the counts start again.
	Tick time.Duration `yaml:"tick"`
}

// Defaults of log.sampling: those of zap's production logger, far above
// what a fleet of 10,000 boards writes of one message in a second.
const (
	DefaultLogSamplingInitial    = 100
	DefaultLogSamplingThereafter = 100
	DefaultLogSamplingTick       = time.Second
)

func defaultLogConfig() LogConfig {
	return LogConfig{Format: "console", Level: "info", Sampling: LogSampling{
		Initial: DefaultLogSamplingInitial, Thereafter: DefaultLogSamplingThereafter, Tick: DefaultLogSamplingTick}}
}

// NewLogger builds the root logger from the log config, writing to
// stderr. It does not sample: New wraps the logger it is given in
// log.sampling's sampler, in either format, so that the drops can be
// counted in the App's metrics.
func NewLogger(c LogConfig) (*zap.Logger, error) { return newLoggerTo(c, os.Stderr) }

// newLoggerTo is NewLogger writing to out. The console format colours the
// level only when out is a terminal (and NO_COLOR is unset), so that a log
// redirected to a file or a pipe holds no escape codes.
func newLoggerTo(c LogConfig, out *os.File) (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(c.Level)
	if err != nil {
		return nil, fmt.Errorf("log.level %q: %w", c.Level, err)
	}
	var enc zapcore.Encoder
	if c.Format == "json" {
		enc = zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	} else {
		ec := zap.NewDevelopmentEncoderConfig()
		ec.EncodeLevel = zapcore.CapitalLevelEncoder
		if colourFor(out) {
			ec.EncodeLevel = zapcore.CapitalColorLevelEncoder
		}
		enc = zapcore.NewConsoleEncoder(ec)
	}
	ws := zapcore.Lock(zapcore.AddSync(out))
	core := zapcore.NewCore(enc, ws, zap.NewAtomicLevelAt(level))
	opts := []zap.Option{zap.ErrorOutput(ws), zap.AddCaller()}
	if c.Format == "json" {
		opts = append(opts, zap.AddStacktrace(zapcore.ErrorLevel))
	}
	return zap.New(core, opts...), nil
}

// colourFor says whether a console log written to f may use colour: f is
// a terminal (a character device that is not /dev/null) and NO_COLOR
// (https://no-color.org) is not set.
func colourFor(f *os.File) bool {
	if os.Getenv("NO_COLOR") != "" || os.Getenv("TERM") == "dumb" {
		return false
	}
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	if null, err := os.Stat(os.DevNull); err == nil && os.SameFile(fi, null) {
		return false
	}
	return true
}

// sampled wraps logger in zap's sampler as s says (not at all when
// s.Initial is negative); hook sees every decision, dropped lines
// included.
func sampled(logger *zap.Logger, s LogSampling, hook func(zapcore.Entry, zapcore.SamplingDecision)) *zap.Logger {
	if s.Initial < 0 {
		return logger
	}
	return logger.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, s.Tick, s.Initial, s.Thereafter, zapcore.SamplerHook(hook))
	}))
}

// httpErrorLog routes net/http's own messages to zap at warn level. Most
// concern one connection (a failed TLS handshake, a panicking handler, a
// broken HTTP/2 preface), so a client can have them written at will; each
// kind goes through a throttle of its own, and the message, which quotes
// the client's address and sometimes its bytes, is kept cut as "detail".
func httpErrorLog(l *zap.Logger) *log.Logger {
	return log.New(&httpErrors{log: l.Named("http")}, "", 0)
}

// httpErrors is the writer behind httpErrorLog: one throttle per kind of
// message.
type httpErrors struct {
	log                              *zap.Logger
	handshake, panics, accept, http2 logthrottle.Throttle
	other                            logthrottle.Throttle
}

func (h *httpErrors) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	detail := clip.Field("detail", msg)
	switch {
	case strings.Contains(msg, "TLS handshake error"):
		h.handshake.Warn(h.log, "http: TLS handshake failed", detail)
	case strings.Contains(msg, "panic serving"):
		// The stack is what an operator needs: net/http bounds it (64 KiB).
		h.panics.Warn(h.log, "http: a handler panicked", zap.String("detail", msg))
	case strings.HasPrefix(msg, "http: Accept error"):
		h.accept.Warn(h.log, "http: accept failed", detail)
	case strings.HasPrefix(msg, "http2:"):
		h.http2.Warn(h.log, "http2: connection error", detail)
	default:
		h.other.Warn(h.log, "http: server error", detail)
	}
	return len(p), nil
}
