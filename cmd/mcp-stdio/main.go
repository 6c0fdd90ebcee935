// Command mcp-stdio lets an MCP host that only launches stdio servers use a
// running bridge: it speaks MCP on stdin/stdout and relays everything to the
// bridge's /mcp endpoint over Streamable HTTP (tools, calls, progress,
// cancellation, list_changed). Logs go to stderr.
//
//	mcp-stdio --url http://127.0.0.1:8080/mcp [--token T]
//
// The token may also come from DEVICEBRIDGE_MCP_TOKEN, which keeps it out
// of the host's process list. A bridge that is not up yet is retried; a
// bridge that refuses the token (401 or 403) ends the command with exit
// status 1, since retrying cannot fix that.
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

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/devicebridge/devicebridge/stdioproxy"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

// tokenEnv is where the token comes from when --token is not given.
const tokenEnv = "DEVICEBRIDGE_MCP_TOKEN"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// Like mcp.StdioTransport, the proxy never closes the real stdout.
	code := run(ctx, os.Args[1:], os.Stdin, nopCloser{os.Stdout}, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// run is the whole command, with its environment passed in so that tests
// can drive it; it returns the exit status.
func run(ctx context.Context, args []string, stdin io.ReadCloser, stdout io.WriteCloser, stderr io.Writer,
	getenv func(string) string) int {
	fs := flag.NewFlagSet("mcp-stdio", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "http://127.0.0.1:8080/mcp", "the bridge's MCP endpoint")
	token := fs.String("token", getenv(tokenEnv), "bearer token for the bridge (default $"+tokenEnv+")")
	protoVersion := fs.String("protocol-version", "", "pin the protocol version spoken to the bridge, e.g. 2025-11-25 (default: newest, with fallback)")
	startupWait := fs.Duration("startup-wait", 8*time.Second, "how long the host's first tools/list or tools/call waits for the bridge's tool list")
	level := fs.String("log-level", "info", "log level on stderr: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	lvl, err := zapcore.ParseLevel(*level)
	if err != nil {
		fmt.Fprintln(stderr, "mcp-stdio:", err)
		return 2
	}
	// stdout carries the protocol, so every log line goes to stderr.
	logger := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()),
		zapcore.Lock(zapcore.AddSync(stderr)), lvl))
	defer func() { _ = logger.Sync() }()

	p, err := stdioproxy.New(stdioproxy.Options{
		URL: *url, Token: *token, ProtocolVersion: *protoVersion, StartupWait: *startupWait,
		Version: version, Logger: logger.Named("stdio"),
	})
	if err == nil {
		err = p.Run(ctx, &mcp.IOTransport{Reader: stdin, Writer: stdout})
	}
	var rej *stdioproxy.TokenRejectedError
	switch {
	case errors.As(err, &rej):
		// A plain sentence, not a JSON log line: this is what a user
		// looking at the host's server log needs to act on.
		fmt.Fprintf(stderr, "mcp-stdio: %v\n", rej)
		fmt.Fprintf(stderr, "mcp-stdio: set the token with --token or the %s environment variable; "+
			"it must be one the bridge accepts on /mcp (its --mcp-token, or --control-token when no MCP token is set)\n",
			tokenEnv)
		return 1
	case err != nil:
		logger.Error("mcp-stdio failed", zap.Error(err))
		return 1
	}
	return 0
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }
