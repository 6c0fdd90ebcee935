// Command mcp-stdio lets an MCP host that only launches stdio servers use a
// running bridge: it speaks MCP on stdin/stdout and relays everything to the
// bridge's /mcp endpoint over Streamable HTTP (tools, calls, progress,
// cancellation, list_changed). Logs go to stderr.
//
//	mcp-stdio --url http://127.0.0.1:8080/mcp [--token T]
//
// The token may also come from DEVICEBRIDGE_MCP_TOKEN, which keeps it out
// of the host's process list.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/devicebridge/devicebridge/tools"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	fs := flag.NewFlagSet("mcp-stdio", flag.ContinueOnError)
	url := fs.String("url", "http://127.0.0.1:8080/mcp", "the bridge's MCP endpoint")
	token := fs.String("token", os.Getenv("DEVICEBRIDGE_MCP_TOKEN"), "bearer token for the bridge (default $DEVICEBRIDGE_MCP_TOKEN)")
	protoVersion := fs.String("protocol-version", "", "pin the protocol version spoken to the bridge, e.g. 2025-11-25 (default: newest, with fallback)")
	level := fs.String("log-level", "info", "log level on stderr: debug, info, warn, error")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		os.Exit(2)
	}
	lvl, err := zapcore.ParseLevel(*level)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcp-stdio:", err)
		os.Exit(2)
	}
	zc := zap.NewProductionConfig()
	zc.Level = zap.NewAtomicLevelAt(lvl)
	zc.OutputPaths = []string{"stderr"} // stdout carries the protocol
	zc.ErrorOutputPaths = []string{"stderr"}
	logger, err := zc.Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcp-stdio:", err)
		os.Exit(2)
	}
	defer func() { _ = logger.Sync() }()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	p, err := tools.NewStdioProxy(tools.StdioProxyOptions{
		URL: *url, Token: *token, ProtocolVersion: *protoVersion, Version: version, Logger: logger.Named("stdio"),
	})
	if err == nil {
		err = p.Run(ctx, &mcp.StdioTransport{})
	}
	if err != nil {
		logger.Error("mcp-stdio failed", zap.Error(err))
		_ = logger.Sync()
		os.Exit(1)
	}
}
