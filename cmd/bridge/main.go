// Command bridge runs devicebridge: boards connect over WebSocket or MQTT,
// and their tools are served to LLM hosts over MCP and to scripts over the
// control API. With no flags it runs with sane defaults; --simulate N also
// starts N simulated boards so the tools show up at once.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/app"
)

func main() {
	cfg, err := app.ParseArgs("bridge", os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if errors.Is(err, app.ErrVersion) {
		fmt.Println("devicebridge", app.Version)
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bridge:", err)
		os.Exit(2)
	}
	logger, err := app.NewLogger(cfg.Log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bridge:", err)
		os.Exit(2)
	}
	defer func() { _ = logger.Sync() }()

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go watchSignals(sigs, cancel, logger, func(code int) { _ = logger.Sync(); os.Exit(code) })

	a, err := app.New(cfg, logger)
	if err == nil {
		err = a.Run(ctx)
	}
	if err != nil {
		logger.Error("bridge failed: " + err.Error())
		_ = logger.Sync()
		os.Exit(1)
	}
}

// watchSignals starts an orderly shutdown on the first signal and exits at
// once on the second, for an operator who will not wait.
func watchSignals(sigs <-chan os.Signal, shutdown func(), log *zap.Logger, exit func(int)) {
	sig := <-sigs
	log.Info("shutting down; send the signal again to exit at once", zap.String("signal", sig.String()))
	shutdown()
	sig = <-sigs
	log.Warn("second signal: exiting without finishing the shutdown", zap.String("signal", sig.String()))
	exit(130)
}
