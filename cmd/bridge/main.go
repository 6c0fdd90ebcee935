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

	"github.com/devicebridge/devicebridge/app"
)

func main() {
	cfg, err := app.ParseArgs("bridge", os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
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

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
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
