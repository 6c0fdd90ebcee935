package app

// This file wires the upstream MCP server (package mcpserver) into the app:
// its configuration section (mcp:), its flags, and serving /mcp on the
// control listener.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sort"
	"strings"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/frontdoor"
	"github.com/devicebridge/devicebridge/mcpserver"
	"github.com/devicebridge/devicebridge/metrics"
)

// MCPConfig configures the upstream MCP server on /mcp (control listener):
// whether it runs, and the server's own options (mcpserver.Options, whose yaml
// keys sit directly under mcp:). With no tokens of its own /mcp takes the
// control API's.
type MCPConfig struct {
	// Enabled serves /mcp. Default true.
	Enabled bool `yaml:"enabled"`
	// AllowedOrigins is the old name of control.allowed_origins, from when
	// only /mcp checked Origin; set (even empty), it replaces that list.
	AllowedOrigins    []string `yaml:"allowed_origins"`
	mcpserver.Options `yaml:",inline"`
}

func defaultMCPConfig() MCPConfig {
	return MCPConfig{Enabled: true, Options: mcpserver.Options{
		PageSize:             mcpserver.DefaultPageSize,
		MaxBodyBytes:         mcpserver.DefaultMaxBodyBytes,
		RateLimit:            mcpserver.DefaultRateLimit,
		RateBurst:            mcpserver.DefaultRateBurst,
		SessionTimeout:       mcpserver.DefaultSessionTimeout,
		ProgressInterval:     mcpserver.DefaultProgressInterval,
		EventStoreBytes:      mcpserver.DefaultEventStoreBytes,
		MaxSessions:          mcpserver.DefaultMaxSessions,
		MaxSessionsPerClient: mcpserver.DefaultMaxSessionsPerClient,
		Tasks: mcpserver.TaskOptions{TTL: mcpserver.DefaultTaskTTL, PollInterval: mcpserver.DefaultTaskPollInterval,
			MaxTasks: mcpserver.DefaultMaxTasks, MaxPerCaller: mcpserver.DefaultMaxTasksPerCall},
		MaxSubscriptions: mcpserver.DefaultMaxSubscriptions,
	}}
}

func (c MCPConfig) validate() error {
	if !c.Enabled {
		return nil
	}
	var errs []error
	if err := c.options("", nil, nil).Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// options maps the configuration onto mcpserver.Options. Without MCP tokens
// of its own, /mcp takes the control API's.
func (c MCPConfig) options(version string, controlTokens []string, log *zap.Logger) mcpserver.Options {
	o := c.Options
	o.Version, o.Logger = version, log
	if len(o.Tokens) == 0 {
		o.Tokens = controlTokens
	}
	return o
}

func registerMCPFlags(fs *flag.FlagSet, c *MCPConfig) {
	fs.BoolVar(&c.Enabled, "mcp", c.Enabled, "serve the upstream MCP server on /mcp of the control listener")
	fs.BoolVar(&c.Compact, "mcp-compact", c.Compact, "publish three fixed tools (list_devices, describe_device, call_device_tool) instead of every board tool")
	fs.BoolVar(&c.ShowUserOnlyTools, "mcp-show-user-tools", c.ShowUserOnlyTools, "also publish the tools boards reserve for people (hidden from the model by default)")
	fs.Var(stringList{&c.Tokens}, "mcp-token", "bearer token accepted on /mcp (repeatable); none means the control tokens apply")
	fs.Var(aliasFlag{&c.Aliases}, "mcp-alias", "MAC=alias: name a board's tools alias_<tool>; MAC= (empty alias) publishes them without a prefix (repeatable)")
	fs.Float64Var(&c.RateLimit, "mcp-rate-limit", c.RateLimit, "requests per second per MCP session, else per identity or address (bursts of mcp.rate_burst); "+
		"the default is far above any well-behaved client, a conformance-suite run included; past it 429 with a JSON-RPC error; negative disables")
	fs.IntVar(&c.MaxSessions, "mcp-max-sessions", c.MaxSessions, "most MCP sessions open at once; past it initialize gets 503")
	fs.IntVar(&c.MaxSessionsPerClient, "mcp-max-sessions-per-client", c.MaxSessionsPerClient,
		"most MCP sessions of one client (identity, else address); past it initialize gets 429")
	fs.DurationVar(&c.SessionTimeout, "mcp-session-timeout", c.SessionTimeout,
		"close an MCP session with no request in flight and no stream open for this long")
	fs.Var(stringList{&c.Tasks.Tools}, "mcp-task-tool",
		"board tool (name or pattern like *photo*) that runs as an MCP task for clients that take tasks (repeatable)")
}

// taskTools are the board tools that run as tasks: those mcp.tasks.tools
// names, and every tool whose devices.tool_timeouts is longer than
// devices.call_timeout (a tool given more time than the others is a tool
// a caller may not want to wait for).
func taskTools(c Config) []string {
	out := append([]string(nil), c.MCP.Tasks.Tools...)
	for tool, d := range c.Devices.ToolTimeouts {
		if d > c.Devices.CallTimeout {
			out = append(out, tool)
		}
	}
	sort.Strings(out)
	return out
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
	if !ok || strings.TrimSpace(mac) == "" {
		return fmt.Errorf("want MAC=alias (or MAC= for no prefix), got %q", v)
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
func (a *App) startMCP(ctx context.Context, mux *frontdoor.Mux) error {
	c := a.cfg.MCP
	if !c.Enabled {
		return nil
	}
	var err error
	log := a.log.Named("mcp")
	opts := c.options(Version, a.cfg.Control.Tokens, log)
	opts.Observer = a.Metrics
	opts.Tasks.Tools = taskTools(a.cfg)
	// In a fleet, task ids name their node, and the others forward to it
	// (the cluster starts after /mcp: both are read when used).
	opts.Tasks.Node = func() string {
		if n := a.Cluster(); n != nil {
			return n.ID()
		}
		return ""
	}
	opts.Tasks.Forward = a.forwardTask
	guard := a.mcpGuard(opts.Tokens)
	opts.Access = a.mcpAccess(guard.Verifier != nil)
	if opts.Flow, err = a.cfg.Flow.options(); err != nil {
		return err
	}
	if a.cfg.Cluster.NATSURL != "" && a.cfg.Flow.stateless() {
		// Tokens and requestStates are good on every node: so must be the
		// record of which were used (startCluster attaches the bucket).
		a.spent = &fleetSpent{}
		opts.Flow.Spent = a.spent
	}
	srv, err := mcpserver.New(a.Hub, opts)
	if err != nil {
		return err
	}
	a.mcp = srv
	a.Metrics.WatchMCPSessions(srv.SessionCount)
	a.Metrics.WatchMCPSessionLimits(func() metrics.MCPSessionStats {
		st := srv.SessionStats()
		return metrics.MCPSessionStats{RefusedTotal: st.RefusedTotal, RefusedPerClient: st.RefusedClient, IdleClosed: st.IdleClosed}
	})
	if a.cfg.Flow.Enabled {
		a.Metrics.WatchInteractions(srv.InteractionCounts)
	}
	// /mcp takes its own tokens, and answers refusals in plain text.
	mux.Mount("/mcp", frontdoor.Door{Auth: guard.Middleware(), Refuse: frontdoor.PlainText}, srv.Handler())
	runCtx, cancel := context.WithCancel(ctx)
	a.goOwned(func() { srv.Run(runCtx) })
	a.goOwned(func() {
		<-runCtx.Done()
		srv.Close()
	})
	a.onDrain(cancel)
	log.Info("MCP server on /mcp", zap.Bool("compact", c.Compact), zap.Bool("auth", guard.Verifier != nil),
		zap.Bool("user_only_tools", c.ShowUserOnlyTools), zap.Bool("flow", a.cfg.Flow.Enabled),
		zap.Bool("flow_stateless", a.cfg.Flow.stateless()))
	return nil
}
