package app

// This file wires the upstream MCP server (package tools) into the app:
// its configuration section (mcp:), its flags, and serving /mcp on the
// control listener.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/tools"
)

// MCPConfig configures the upstream MCP server on /mcp (control listener).
type MCPConfig struct {
	// Enabled serves /mcp. Default true.
	Enabled bool `yaml:"enabled"`
	// Aliases maps a board's MAC to the alias its tool names start with,
	// e.g. "aa:bb:cc:dd:ee:ff": kitchen gives kitchen_audio_speaker_set_volume.
	// Boards without an alias get dev_ and the last three bytes of the MAC
	// (dev_ddeeff).
	Aliases map[string]string `yaml:"aliases"`
	// ShowUserOnlyTools also publishes the tools boards reserve for people
	// (annotations.audience ["user"], e.g. reboot). Default false: hidden
	// from the model.
	ShowUserOnlyTools bool `yaml:"show_user_only_tools"`
	// Compact publishes three fixed tools (list_devices, describe_device,
	// call_device_tool) instead of every board tool, for hosts that cap the
	// number of tools. Default false.
	Compact bool `yaml:"compact"`
	// PageSize is the number of tools per tools/list page. Default 100.
	PageSize int `yaml:"page_size"`
	// Tokens are the bearer tokens accepted on /mcp. Empty means the
	// control API's tokens (control.tokens) apply; if both are empty /mcp
	// is open to whoever reaches the control listener (loopback by
	// default).
	Tokens []string `yaml:"tokens"`
	// AllowedOrigins lists the browser origins admitted ("*", exact
	// origins, or scheme://host:* for any port). Requests without an
	// Origin header are always admitted; any other Origin gets 403.
	// Default: localhost, 127.0.0.1 and [::1] on any port.
	AllowedOrigins []string `yaml:"allowed_origins"`
	// MaxBodyBytes bounds a request body (413 beyond it). Default 4 MiB.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// RateLimit is the sustained requests per second allowed per session
	// (per client address outside a session); RateBurst the burst. Beyond
	// it requests get 429. Defaults 20 and 40; a negative rate disables it.
	RateLimit float64 `yaml:"rate_limit"`
	RateBurst int     `yaml:"rate_burst"`
	// SessionTimeout closes legacy (2025-era) sessions idle this long.
	// Default 30m; negative never.
	SessionTimeout time.Duration `yaml:"session_timeout"`
	// ProgressInterval is how often a call still waiting for its board
	// sends a progress notification (when the client asked for progress).
	// Default 10s; negative disables.
	ProgressInterval time.Duration `yaml:"progress_interval"`
}

func defaultMCPConfig() MCPConfig {
	return MCPConfig{
		Enabled:          true,
		AllowedOrigins:   append([]string(nil), tools.DefaultAllowedOrigins...),
		PageSize:         tools.DefaultPageSize,
		MaxBodyBytes:     tools.DefaultMaxBodyBytes,
		RateLimit:        tools.DefaultRateLimit,
		RateBurst:        tools.DefaultRateBurst,
		SessionTimeout:   tools.DefaultSessionTimeout,
		ProgressInterval: tools.DefaultProgressInterval,
	}
}

func (c MCPConfig) validate() error {
	if !c.Enabled {
		return nil
	}
	var errs []error
	if c.MaxBodyBytes < 0 {
		errs = append(errs, errors.New("mcp.max_body_bytes must not be negative"))
	}
	if err := c.options("", nil, nil).Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// options maps the configuration onto tools.Options. Without MCP tokens
// of its own, /mcp takes the control API's.
func (c MCPConfig) options(version string, controlTokens []string, log *zap.Logger) tools.Options {
	tokens := c.Tokens
	if len(tokens) == 0 {
		tokens = controlTokens
	}
	origins := c.AllowedOrigins
	if origins == nil {
		origins = []string{} // an explicit empty list: no browser origin
	}
	return tools.Options{
		Version:           version,
		Aliases:           c.Aliases,
		ShowUserOnlyTools: c.ShowUserOnlyTools,
		Compact:           c.Compact,
		PageSize:          c.PageSize,
		Tokens:            tokens,
		AllowedOrigins:    origins,
		MaxBodyBytes:      c.MaxBodyBytes,
		RateLimit:         c.RateLimit,
		RateBurst:         c.RateBurst,
		SessionTimeout:    c.SessionTimeout,
		ProgressInterval:  c.ProgressInterval,
		Logger:            log,
	}
}

func registerMCPFlags(fs *flag.FlagSet, c *MCPConfig) {
	fs.BoolVar(&c.Enabled, "mcp", c.Enabled, "serve the upstream MCP server on /mcp of the control listener")
	fs.BoolVar(&c.Compact, "mcp-compact", c.Compact, "publish three fixed tools (list_devices, describe_device, call_device_tool) instead of every board tool")
	fs.BoolVar(&c.ShowUserOnlyTools, "mcp-show-user-tools", c.ShowUserOnlyTools, "also publish the tools boards reserve for people (hidden from the model by default)")
	fs.Var(stringList{&c.Tokens}, "mcp-token", "bearer token accepted on /mcp (repeatable); none means the control tokens apply")
	fs.Var(stringList{&c.AllowedOrigins}, "mcp-allowed-origin", "browser Origin admitted on /mcp, added to the defaults (repeatable; scheme://host[:port|:*] or *)")
	fs.Var(aliasFlag{&c.Aliases}, "mcp-alias", "MAC=alias: name a board's tools alias_<tool> (repeatable)")
	fs.Float64Var(&c.RateLimit, "mcp-rate-limit", c.RateLimit, "requests per second per MCP session (negative disables)")
}

// aliasFlag parses repeatable MAC=alias pairs.
type aliasFlag struct{ m *map[string]string }

func (f aliasFlag) String() string {
	if f.m == nil || *f.m == nil {
		return ""
	}
	parts := make([]string, 0, len(*f.m))
	for k, v := range *f.m {
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, ",")
}

func (f aliasFlag) Set(v string) error {
	mac, alias, ok := strings.Cut(v, "=")
	if !ok || strings.TrimSpace(mac) == "" || strings.TrimSpace(alias) == "" {
		return fmt.Errorf("want MAC=alias, got %q", v)
	}
	if *f.m == nil {
		*f.m = map[string]string{}
	}
	(*f.m)[strings.TrimSpace(mac)] = strings.TrimSpace(alias)
	return nil
}

// startMCP mounts /mcp on the control mux. The catalogue follows the Hub in
// an owned goroutine; when ctx ends (or on Shutdown) every MCP session and
// stream is closed, so that long-lived SSE streams do not hold up the
// control listener's drain.
func (a *App) startMCP(ctx context.Context, mux *http.ServeMux) error {
	c := a.cfg.MCP
	if !c.Enabled {
		return nil
	}
	log := a.log.Named("mcp")
	opts := c.options(Version, a.cfg.Control.Tokens, log)
	opts.Observer = a.Metrics
	srv, err := tools.New(a.Hub, opts)
	if err != nil {
		return err
	}
	a.Metrics.WatchMCPSessions(srv.SessionCount)
	mux.Handle("/mcp", srv.Handler())
	runCtx, cancel := context.WithCancel(ctx)
	a.goOwned(func() { srv.Run(runCtx) })
	a.goOwned(func() {
		<-runCtx.Done()
		srv.Close()
	})
	a.onDrain(cancel)
	log.Info("MCP server on /mcp", zap.Bool("compact", c.Compact), zap.Bool("auth", len(c.Tokens) > 0 || len(a.cfg.Control.Tokens) > 0),
		zap.Bool("user_only_tools", c.ShowUserOnlyTools))
	return nil
}
