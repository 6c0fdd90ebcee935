// Command voicestub runs a stand-in voice server that behaves like
// xiaozhi-esp32-server as far as a board sees it: OTA at /xiaozhi/ota/,
// WebSocket at /xiaozhi/v1/, a canned deterministic conversation and an
// MCP client that lists the board's tools. It is for trying the voice
// relay from a fresh clone and for tests (see package voice/voicestub).
//
//	voicestub --listen 127.0.0.1:8000 --token test-token
//	simulator --ota http://127.0.0.1:8000/xiaozhi/ota/
//
// SIGINT or SIGTERM closes every connection and exits.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/devicebridge/devicebridge/voice/voicestub"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	m := &Main{}
	if err := m.ParseFlags(os.Args[1:], os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "voicestub:", err)
		os.Exit(2)
	}
	err := m.Run(ctx)
	_ = m.log.Sync()
	if err != nil {
		fmt.Fprintln(os.Stderr, "voicestub:", err)
		os.Exit(1)
	}
}

// Main holds the parsed command line.
type Main struct {
	listen string
	cfg    voicestub.Config
	log    *zap.Logger
	// started, when set (tests), is called with the running server.
	started func(*voicestub.Server)
}

// ParseFlags parses args into m and builds the logger.
func (m *Main) ParseFlags(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("voicestub", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&m.listen, "listen", "127.0.0.1:8000", "address to serve /xiaozhi/v1/ and /xiaozhi/ota/ on")
	fs.Func("token", "accept this static token (repeatable; the first is handed out by OTA)", func(v string) error {
		m.cfg.Tokens = append(m.cfg.Tokens, v)
		return nil
	})
	fs.StringVar(&m.cfg.Secret, "secret", "", "accept HMAC gateway tokens made with this secret")
	fs.StringVar(&m.cfg.ActivationCode, "ota-activation-code", "", "digits: OTA answers ask each board to activate until it has called /activate")
	fs.IntVar(&m.cfg.TTSFrames, "frames", voicestub.DefaultTTSFrames, "audio frames in each answer")
	fs.IntVar(&m.cfg.AutoFrames, "auto-frames", voicestub.DefaultAutoFrames, "frames that end an auto-mode turn (stands in for voice-activity detection)")
	fs.DurationVar(&m.cfg.Pace, "pace", 0, "gap between answer frames (60ms is real time; 0 sends them back to back)")
	fs.BoolVar(&m.cfg.Stamp, "stamp", false, "put the send time (8 bytes, big-endian Unix nanoseconds) in front of each answer frame's payload, for latency measurements")
	level := fs.String("log-level", "info", "log level: debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if m.cfg.TTSFrames < 1 {
		return errors.New("--frames must be at least 1")
	}
	if m.cfg.AutoFrames < 1 {
		return errors.New("--auto-frames must be at least 1")
	}
	lvl, err := zapcore.ParseLevel(*level)
	if err != nil {
		return err
	}
	m.log = zap.New(zapcore.NewCore(
		zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()),
		zapcore.Lock(zapcore.AddSync(stderr)), lvl))
	m.cfg.Logger = m.log
	return nil
}

// Run serves until ctx ends, then closes every connection.
func (m *Main) Run(ctx context.Context) error {
	s, err := voicestub.New(m.cfg)
	if err != nil {
		return err
	}
	if err := s.Start(m.listen); err != nil {
		return err
	}
	m.log.Info("voicestub ready", zap.String("websocket", s.URL()), zap.String("ota", s.OTAURL()))
	if m.started != nil {
		m.started(s)
	}
	<-ctx.Done()
	start := time.Now()
	err = s.Close()
	m.log.Info("voicestub stopped", zap.Duration("close_took", time.Since(start)))
	return err
}
