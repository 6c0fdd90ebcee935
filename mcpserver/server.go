package mcpserver

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/flow"
	"github.com/devicebridge/devicebridge/internal/ctxtime"
	"github.com/devicebridge/devicebridge/internal/logthrottle"
	"github.com/devicebridge/devicebridge/internal/mcpera"
	"github.com/devicebridge/devicebridge/internal/randid"
	"github.com/devicebridge/devicebridge/mcpserver/mcphttp"
)

// Defaults for Options fields left at zero.
const (
	DefaultPageSize     = 100
	DefaultMaxBodyBytes = 4 << 20
	// DefaultRateLimit and DefaultRateBurst are mcp.rate_limit and
	// mcp.rate_burst: requests per second per session, verified identity
	// or address (mcphttp's rateLimit), and the burst allowed on top. No
	// well-behaved client comes near them: a host calls tools at the pace
	// of its model (a few a second at most), and the burst covers a whole
	// run of the official conformance suite from one address (about 125
	// requests within seconds, docs/mcp.md) several times over. They stop
	// a runaway or hostile client, not a busy one.
	DefaultRateLimit        = 50
	DefaultRateBurst        = 500
	DefaultSessionTimeout   = 10 * time.Minute // see Options.SessionTimeout
	DefaultProgressInterval = 10 * time.Second
	DefaultEventStoreBytes  = 10 << 20
	// tombstoneTTL is how long the name of a withdrawn tool is remembered,
	// so that a call to it gets a clear "board offline" answer rather than
	// "unknown tool".
	tombstoneTTL   = time.Hour
	maxTombstones  = 4096
	serverInfoName = "devicebridge"
	// modernVersion is the first protocol version of the stateless era.
	modernVersion = mcphttp.ModernVersion
)

// DefaultMaxSessions and DefaultMaxSessionsPerClient bound the legacy
// sessions open at once (a goroutine and some memory each), in all and per
// client. Hosts open one per conversation or connection and end it, or
// leave it to SessionTimeout.
const (
	DefaultMaxSessions          = 1024
	DefaultMaxSessionsPerClient = 128
)

// Options configure the upstream MCP server. Zero values take the
// defaults above. The yaml tags are the keys of the bridge config file's
// mcp: section, which embeds Options.
type Options struct {
	// Version is reported as serverInfo.version.
	Version string `yaml:"-"`
	// Aliases maps a board's MAC (in any case or separator style) to the
	// alias its tool names start with: see ValidAlias for what an alias
	// may be. Boards without one get DefaultAlias.
	Aliases map[string]string `yaml:"aliases"`
	// ShowUserOnlyTools publishes tools that boards reserve for people
	// (annotations.audience ["user"]); by default they are hidden from
	// the model.
	ShowUserOnlyTools bool `yaml:"show_user_only_tools"`
	// Compact replaces the per-board tools by three fixed tools
	// (list_devices, describe_device, call_device_tool), for hosts that
	// cap the number of tools.
	Compact bool `yaml:"compact"`
	// PageSize is the number of tools per tools/list page.
	PageSize int `yaml:"page_size"`
	// Tokens, when non-empty, are the bearer tokens accepted on /mcp;
	// requests without one get 401 from the front door that checks them
	// (the app's authn.Guard). Here they mean /mcp is authenticated.
	Tokens []string `yaml:"tokens"`
	// MaxBodyBytes bounds a request body (413 beyond it).
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// RateLimit is the sustained number of requests per second allowed per
	// legacy session, and outside a session (stateless 2026-07-28 clients,
	// initialize) per verified identity, else per client address; bursts
	// go up to RateBurst. Beyond it a request gets 429 with Retry-After
	// and a JSON-RPC error. Negative disables rate limiting.
	RateLimit float64 `yaml:"rate_limit"`
	RateBurst int     `yaml:"rate_burst"`
	// SessionTimeout closes a legacy session idle for this long: no
	// request of it in flight and no stream of it open, so a host that
	// listens on a stream, or uses its session more often than this,
	// keeps it. Code that builds Options may pass a negative value to keep
	// sessions until the client ends them (the caps below still apply); the
	// bridge's configuration does not allow it.
	SessionTimeout time.Duration `yaml:"session_timeout"`
	// MaxSessions bounds the legacy sessions open at once; past it an
	// initialize gets 503 with Retry-After and a JSON-RPC error.
	MaxSessions int `yaml:"max_sessions"`
	// MaxSessionsPerClient bounds the legacy sessions of one client (its
	// verified identity, else its address); past it an initialize gets
	// 429 with Retry-After and a JSON-RPC error.
	MaxSessionsPerClient int `yaml:"max_sessions_per_client"`
	// ProgressInterval is how often a call still waiting for its board
	// sends notifications/progress, when the client gave a progress token
	// (and a debug log message, when it asked for those). Negative
	// disables the heartbeats; the call's steps are reported regardless
	// (notes.go).
	ProgressInterval time.Duration `yaml:"progress_interval"`
	// EventStoreBytes bounds the memory kept for resuming legacy streams.
	EventStoreBytes int `yaml:"event_store_bytes"`
	// MaxSubscriptions bounds the resource subscriptions of one session
	// (resources/subscribe, or the URIs of one subscriptions/listen).
	MaxSubscriptions int `yaml:"max_subscriptions"`
	// Logger receives the server's logs; name it "mcp". Nil discards.
	Logger *zap.Logger `yaml:"-"`
	// Observer, when set, is told about every request received (metrics).
	Observer Observer `yaml:"-"`
	// Flow configures interactions (the app's flow: section).
	Flow FlowOptions `yaml:"-"`
	// Access: authentication, policy and audit (access.go).
	Access Access `yaml:"-"`
	// Tasks: long calls as MCP tasks (tasks.go; the mcp.tasks: section).
	Tasks TaskOptions `yaml:"tasks"`
}

// withDefaults returns o with unset fields set to their defaults.
func (o Options) withDefaults() Options {
	o.Version = cmp.Or(o.Version, "dev")
	o.Logger = cmp.Or(o.Logger, zap.NewNop())
	// Only zero: a negative value is kept as given (see each field).
	o.RateLimit = cmp.Or(o.RateLimit, DefaultRateLimit)
	o.SessionTimeout = cmp.Or(o.SessionTimeout, DefaultSessionTimeout)
	o.MaxSessions = cmp.Or(o.MaxSessions, DefaultMaxSessions)
	o.MaxSessionsPerClient = cmp.Or(o.MaxSessionsPerClient, DefaultMaxSessionsPerClient)
	o.ProgressInterval = cmp.Or(o.ProgressInterval, DefaultProgressInterval)
	// max(x, 0): a negative value here has always meant the default too.
	o.PageSize = cmp.Or(max(o.PageSize, 0), DefaultPageSize)
	o.MaxBodyBytes = cmp.Or(max(o.MaxBodyBytes, 0), DefaultMaxBodyBytes)
	o.RateBurst = cmp.Or(max(o.RateBurst, 0), max(DefaultRateBurst, int(o.RateLimit))) // after RateLimit
	o.EventStoreBytes = cmp.Or(max(o.EventStoreBytes, 0), DefaultEventStoreBytes)
	o.Tasks = o.Tasks.withDefaults()
	o.MaxSubscriptions = cmp.Or(max(o.MaxSubscriptions, 0), DefaultMaxSubscriptions)
	return o
}

// Validate reports option mistakes in words a user can act on.
func (o Options) Validate() error {
	var errs []error
	if _, err := ParseAliases(o.Aliases); err != nil {
		errs = append(errs, err)
	}
	for i, t := range o.Tokens {
		if strings.TrimSpace(t) == "" || strings.ContainsAny(t, " \t\r\n") {
			errs = append(errs, fmt.Errorf("mcp.tokens[%d]: a token must be non-empty and contain no spaces", i))
		}
	}
	if o.RateLimit > 0 && o.RateBurst < 0 {
		errs = append(errs, errors.New("mcp.rate_burst must not be negative"))
	}
	if o.PageSize < 0 {
		errs = append(errs, errors.New("mcp.page_size must not be negative"))
	}
	if o.MaxSubscriptions < 0 {
		errs = append(errs, errors.New("mcp.max_subscriptions must not be negative"))
	}
	errs = append(errs, o.Flow.validate()...)
	errs = append(errs, o.Tasks.validate()...)
	return errors.Join(errs...)
}

// Server is the upstream MCP server: one go-sdk server whose tools follow
// the Hub, served over Streamable HTTP in both protocol eras.
type Server struct {
	hub     *device.Hub
	opts    Options
	aliases Aliases // opts.Aliases, checked
	log     *zap.Logger
	mcp     *mcp.Server
	http    *mcphttp.Front
	// throttled are the server's log lines a caller can repeat (logs.go).
	throttled callerLines

	cat atomic.Pointer[catalog]

	// Interactions (flow.go); flow is nil when they are off.
	flow        *flow.Engine
	confirm     []string // lower-case patterns of tools that need confirmation
	flowTimeout time.Duration
	stateKey    []byte // signs requestStates
	spent       flow.SpentStore

	syncMu sync.Mutex // serialises sync; guards remembered
	// applyMu is held for writing while sync removes and adds the go-sdk
	// server's tools, and for reading while tools/list is answered, so that
	// a host never lists half a change (a board with some of its tools).
	// go-sdk announces list_changed 10 ms after the last change, which a
	// loaded machine can take between two of one board's tools.
	applyMu    sync.RWMutex
	remembered map[string][]device.Tool
	// names remembers which alias each board holds (names.go); its mutex
	// is a leaf.
	names *aliasBook
	// uncheckedLog and unpublishedLog throttle warnings about a board's
	// tools: a board can reconnect and list the same tools again at will.
	uncheckedLog, unpublishedLog logthrottle.Throttle

	tombMu     sync.Mutex
	tombstones map[string]tombstone

	// res: board resources, subscriptions and statuses (resources.go).
	res *boardResources

	// logSessions are the legacy sessions that asked for log messages
	// (clientlog.go).
	logSessions logSessions
	tk          *taskState // tasks (tasks.go); nil when off

	// ctx ends when the server closes; every call and request is bound to it.
	ctx    context.Context
	cancel context.CancelFunc
}

// tombstone remembers a withdrawn tool name.
type tombstone struct {
	deviceID, alias, board, tool string
	at                           time.Time
}

// New builds the server over hub. Call Run to keep its tools in step with
// the Hub, serve Handler on /mcp, and Close on shutdown.
func New(hub *device.Hub, opts Options) (*Server, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	aliases := MustAliases(opts.Aliases) // Validate checked them

	s := &Server{
		hub:        hub,
		opts:       opts,
		aliases:    aliases,
		log:        opts.Logger,
		remembered: map[string][]device.Tool{},
		names:      newAliasBook(),
		tombstones: map[string]tombstone{},
		res:        newBoardResources(),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.cat.Store(emptyCatalog())

	instructions := "devicebridge relays the tools of physical xiaozhi-esp32 boards. " +
		"Each tool acts on one board: its name starts with the board's alias and its description names the board " +
		"(alias, board type and MAC). The list changes as boards connect and leave. A board runs one tool at a time; " +
		"a board that does not answer in time may still carry the action out, so check its state before repeating a call."
	if opts.Compact {
		instructions = "devicebridge relays the tools of physical xiaozhi-esp32 boards through three tools: " +
			"list_devices shows the boards, describe_device shows one board's tools and their arguments, and " +
			"call_device_tool runs one of them. A board runs one tool at a time."
	}
	caps := &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: !opts.Compact}}
	//lint:ignore SA1019 deprecated in 2026-07-28, still defined there (per request) and served in both eras (clientlog.go)
	caps.Logging = &mcp.LoggingCapabilities{}
	if !opts.Tasks.Disabled {
		caps.AddExtension(extTasks, nil) // legacy sessions see capabilities.tasks instead (tasks.go)
	}
	// Board resources, prompts and completions (resources.go, prompts.go,
	// complete.go); the prompts never change.
	caps.Resources = &mcp.ResourceCapabilities{Subscribe: true, ListChanged: true}
	caps.Prompts = &mcp.PromptCapabilities{}
	caps.Completions = &mcp.CompletionCapabilities{}
	if !opts.Flow.Disabled {
		// MCP Flow is not a standard capability; experimental is where
		// both eras let a server advertise one (initialize and
		// server/discover).
		caps.Experimental = map[string]any{capFlow: flowCapabilities(len(opts.Flow.Secret) > 0)}
		instructions += " Tools with missing or invalid arguments, and dangerous ones (reboot, firmware upgrade, Wi-Fi changes), " +
			"ask the user through elicitation when the client supports it."
	}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: serverInfoName, Title: "devicebridge", Version: opts.Version}, &mcp.ServerOptions{
		Instructions: instructions,
		Logger:       sdkLogger(s.log.Named("sdk")),
		PageSize:     opts.PageSize,
		// Advertise tools with listChanged even while no board is
		// connected, so clients subscribe from the start.
		// (This is what the deprecated ServerOptions.HasTools did.)
		Capabilities: caps,
		// Session ids: 128 bits from the OS's cryptographic source.
		GetSessionID: randid.Text,
		// Board resources (resources.go) and completion (complete.go).
		SubscribeHandler:   s.subscribe,
		UnsubscribeHandler: s.unsubscribe,
		CompletionHandler:  s.complete,
		// The tool list follows the boards: never cache it; and when
		// tokens guard the endpoint, only the requesting client may.
		SetCacheable: func(_ context.Context, _ mcp.Request, c *mcp.Cacheable) {
			c.TTLMs = 0
			if len(opts.Tokens) > 0 || opts.Access.Authenticated || opts.Access.Policy.Enabled() {
				c.CacheScope = "private"
			}
		},
	})
	s.mcp.AddReceivingMiddleware(s.notesMiddleware, s.setLevelMiddleware) // notes.go, clientlog.go
	s.mcp.AddReceivingMiddleware(s.withdrawnToolMiddleware, s.wholeListMiddleware)
	// Inside accessMiddleware, which gives it the caller's identity.
	s.mcp.AddReceivingMiddleware(s.resourcesMiddleware)
	s.mcp.AddReceivingMiddleware(s.accessMiddleware) // identity and policy (access.go)
	if err := s.setupTasks(); err != nil {           // tasks (tasks.go), outside access
		return nil, err
	}
	if opts.Observer != nil {
		s.mcp.AddReceivingMiddleware(s.observeMiddleware) // outermost
	}
	if err := s.setupFlow(); err != nil {
		return nil, err
	}
	if opts.Compact {
		s.addCompactTools()
	}
	s.addResources()
	s.addPrompts()
	hub.OnResult(s.noteResult)
	// Each protocol era sees only its own result shapes. Keep this the
	// last middleware added (the outermost): it wraps the results it
	// changes, which the middleware above must see as they are.
	s.mcp.AddReceivingMiddleware(mcpera.Middleware)
	s.http = mcphttp.New(s.mcp, mcphttp.Options{
		MaxBodyBytes:         opts.MaxBodyBytes,
		RateLimit:            opts.RateLimit,
		RateBurst:            opts.RateBurst,
		MaxSessions:          opts.MaxSessions,
		MaxSessionsPerClient: opts.MaxSessionsPerClient,
		SessionTimeout:       opts.SessionTimeout,
		EventStoreBytes:      opts.EventStoreBytes,
		Authenticated:        s.authenticated(),
		Lifetime:             s.ctx,
		CallerHeader:         headerCaller,
		TaskHeader:           headerTask,
		Caller:               statelessCaller,
		Logger:               s.log,
		SDKLogger:            sdkLogger(s.log.Named("http")),
	})
	return s, nil
}

// MCPServer is the underlying go-sdk server, e.g. to serve it over another
// transport in process.
func (s *Server) MCPServer() *mcp.Server { return s.mcp }

// Handler serves /mcp (POST, GET and DELETE): the HTTP front of package
// mcphttp. Mount it behind the control listener's front door: Host, Origin
// and credentials are checked there.
func (s *Server) Handler() http.Handler { return s.http }

// Run keeps the upstream tools in step with the Hub until ctx ends or the
// server closes. It syncs once before waiting for events.
func (s *Server) Run(ctx context.Context) {
	// One context that ends with either, for the loop and its pauses.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.ctx, cancel)()
	sub := s.hub.Subscribe()
	defer sub.Close()
	// Board news for the clients that asked for log messages
	// (boardnews.go), sent by a goroutine of its own.
	news := newBoardNews()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); s.runNews(ctx, news) }()
	// notifications/resources/updated (resources.go), sent by a goroutine
	// of its own too: a write to a slow client's stream must not hold up
	// the sync.
	wg.Add(1)
	go func() { defer wg.Done(); s.runResourceUpdates(ctx) }()
	defer func() { cancel(); wg.Wait() }()
	s.Sync()
	for {
		select {
		case <-sub.C():
			// The snapshot below is the truth; events only wake us, and
			// give the news.
			evs := sub.Next()
			before := s.cat.Load()
			start := time.Now()
			changed := s.sync()
			if s.logSessions.any() {
				news.add(evs, before, s.cat.Load())
			}
			// A sync costs time in proportion to the fleet. Under a burst
			// (thousands of boards connecting, or coming back after a
			// restart) leave as long again before the next one: events pile
			// up and are taken together, syncing takes at most about half a
			// core. After a sync that changed the tools, wait at least
			// minChangeGap: clients get at most a few list_changed per
			// second, not one per board.
			d := time.Since(start)
			pause := time.Duration(0)
			if d > syncPauseFrom {
				pause = min(d, maxSyncPause)
			}
			if changed {
				pause = max(pause, minChangeGap)
			}
			if pause > 0 && !ctxtime.Sleep(ctx, pause) {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// Syncs that take longer than syncPauseFrom are followed by a pause as
// long as they took, up to maxSyncPause (Run).
// A sync that changed the published tools is followed by at least
// minChangeGap.
const (
	syncPauseFrom = 2 * time.Millisecond
	maxSyncPause  = 250 * time.Millisecond
	minChangeGap  = 100 * time.Millisecond
)

// Close ends every MCP session and stream and stops in-flight calls from
// waiting. It does not wait for handlers the go-sdk still runs; they end as
// soon as their board call returns. It is idempotent.
func (s *Server) Close() {
	s.cancel()
	s.closeTasks()
	s.hub.OnResult(nil)
	s.http.Stop()
	if s.flow != nil {
		s.flow.Close()
	}
	var wg sync.WaitGroup
	for ss := range s.mcp.Sessions() {
		wg.Add(1)
		go func() { defer wg.Done(); _ = ss.Close() }()
	}
	wg.Wait()
}

// Sync recomputes the upstream catalogue from the Hub now and updates the
// published tools (clients are told through list_changed).
func (s *Server) Sync() { s.sync() }

// sync is Sync; it reports whether the published tools changed.
func (s *Server) sync() bool {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	mark := s.names.mark()
	infos := s.hub.Devices()
	present := make(map[string]bool, len(infos))
	for _, info := range infos {
		present[info.DeviceID] = true
		if info.State == device.StateReady {
			s.remembered[info.DeviceID] = info.Tools
		}
	}
	for id := range s.remembered {
		if !present[id] {
			delete(s.remembered, id)
		}
	}
	old := s.cat.Load()
	cur := buildCatalog(infos, s.remembered, catalogOptions{aliases: s.aliases, showUserOnly: s.opts.ShowUserOnlyTools,
		flow: s.flow != nil, confirm: s.needsConfirm, prev: old, names: s.names, mark: mark, now: time.Now()})
	s.cat.Store(cur)
	s.syncResources(old, cur)
	removed, added := diff(old, cur)
	for _, e := range added {
		if e.schemaErr != nil {
			s.uncheckedLog.Warn(s.log, "board tool has an input schema the bridge cannot check; arguments pass unchecked",
				zap.String("device_id", e.deviceID), zap.String("tool", e.tool.Name), zap.Error(e.schemaErr))
		}
	}
	if s.opts.Compact || (len(removed) == 0 && len(added) == 0) {
		return false
	}
	s.bury(old, removed)
	sort.Strings(removed)
	s.applyMu.Lock()
	if len(removed) > 0 {
		s.mcp.RemoveTools(removed...)
	}
	sort.Slice(added, func(i, j int) bool { return added[i].name < added[j].name })
	for _, e := range added {
		if err := s.publish(e); err != nil {
			s.unpublishedLog.Warn(s.log, "board tool could not be published; it is refused (its board passed the bounds of "+
				"devices.tool_limits, please report it)", zap.String("device_id", e.deviceID), zap.String("tool", e.tool.Name),
				zap.Error(err))
			// Withdrawn from the board's Info too, so that /api, compact
			// mode and the next catalogue no longer offer it.
			s.hub.RefuseTool(e.deviceID, e.tool.Name, err.Error())
		}
	}
	s.applyMu.Unlock()
	s.log.Info("upstream tools updated", zap.Int("tools", len(cur.byName)), zap.Int("devices", len(cur.devices)),
		zap.Int("added_or_changed", len(added)), zap.Int("removed", len(removed)))
	return true
}

// publish adds a board tool to the go-sdk server, which panics on a tool
// it does not accept. The intake bounds (device.ToolLimits) and argcheck's
// ceilings keep such tools out; this is the last line of defence should a
// board find a way past them: its tool is not published (a call to it is
// an unknown tool), instead of the process going down.
func (s *Server) publish(e *entry) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("the MCP server refused it: %v", r)
		}
	}()
	s.mcp.AddTool(e.mcpTool, s.toolHandler(e))
	return nil
}

// Published reports whether the tools served upstream show the board
// deviceID as ready: its tools are listed (in compact mode, list_devices
// shows it ready). The catalogue follows the Hub asynchronously, so a board
// the Hub has just reported ready may not be published yet.
func (s *Server) Published(deviceID string) bool {
	// Sync swaps the catalogue and then updates the go-sdk server's tools
	// under syncMu; holding it sees both in step.
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	v, ok := s.cat.Load().byDevice[device.NormalizeID(deviceID)]
	return ok && v.info.State == device.StateReady && !v.stale
}

// bury remembers withdrawn names.
func (s *Server) bury(old *catalog, names []string) {
	now := time.Now()
	s.tombMu.Lock()
	defer s.tombMu.Unlock()
	for _, n := range names {
		e := old.byName[n]
		s.tombstones[n] = tombstone{deviceID: e.deviceID, alias: e.alias, board: e.board, tool: e.tool.Name, at: now}
	}
	if len(s.tombstones) > maxTombstones {
		var oldest []string
		for n, t := range s.tombstones {
			if now.Sub(t.at) > tombstoneTTL {
				delete(s.tombstones, n)
			} else {
				oldest = append(oldest, n)
			}
		}
		if len(s.tombstones) > maxTombstones {
			sort.Slice(oldest, func(i, j int) bool { return s.tombstones[oldest[i]].at.Before(s.tombstones[oldest[j]].at) })
			for _, n := range oldest[:len(s.tombstones)-maxTombstones] {
				delete(s.tombstones, n)
			}
		}
	}
}

// wholeListMiddleware answers tools/list between two changes of the
// published tools, never during one (applyMu).
func (s *Server) wholeListMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method != "tools/list" {
			return next(ctx, method, req)
		}
		s.applyMu.RLock()
		defer s.applyMu.RUnlock()
		return next(ctx, method, req)
	}
}

// withdrawnToolMiddleware answers a call to a tool that was withdrawn (its
// board left, or the name changed) with a tool result that says so, rather
// than the bare "unknown tool" protocol error: a model that listed tools a
// moment ago can then tell the user what happened.
func (s *Server) withdrawnToolMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method != "tools/call" || s.opts.Compact {
			return next(ctx, method, req)
		}
		p, ok := req.GetParams().(*mcp.CallToolParamsRaw)
		if !ok || p == nil {
			return next(ctx, method, req)
		}
		if _, known := s.cat.Load().byName[p.Name]; known {
			return next(ctx, method, req)
		}
		s.tombMu.Lock()
		t, ok := s.tombstones[p.Name]
		s.tombMu.Unlock()
		if !ok || time.Since(t.at) > tombstoneTTL {
			return next(ctx, method, req)
		}
		cat := s.cat.Load()
		label := labelOf(t.alias, t.board, t.deviceID)
		s.log.Info("call to a withdrawn tool", zap.String("device_id", t.deviceID), zap.String("tool", t.tool),
			zap.String("name", p.Name))
		v, present := cat.byDevice[t.deviceID]
		switch {
		case !present:
			return offlineResult(label, t.tool), nil
		case v.findTool(t.tool) != nil:
			return errorResult("The tool %s is now published as %s (board %s); call it by that name.",
				p.Name, v.findTool(t.tool).name, boardLabel(v)), nil
		case v.info.State != device.StateReady:
			return errorResult("Board %s is reconnecting and its tools are not available yet, so %s was not run. "+
				"Refresh the tool list in a few seconds.", boardLabel(v), t.tool), nil
		default:
			return errorResult("Board %s no longer offers %s, so it was not run. Refresh the tool list to see what it offers now.",
				boardLabel(v), t.tool), nil
		}
	}
}

// toolHandler runs a published board tool.
func (s *Server) toolHandler(e *entry) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return s.guardedCall(ctx, req, e, req.Params.Arguments)
	}
}

// call validates the arguments, runs the tool on its board (telling the
// caller its steps, notes.go), and converts the outcome.
func (s *Server) call(ctx context.Context, req *mcp.CallToolRequest, e *entry, args json.RawMessage) *mcp.CallToolResult {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopOnClose := context.AfterFunc(s.ctx, cancel)
	defer stopOnClose()

	if res := s.denied(ctx, e, args); res != nil {
		return res
	}
	fields := []zap.Field{zap.String("device_id", e.deviceID), zap.String("tool", e.tool.Name)}
	if ce := s.log.Check(zap.DebugLevel, "tool call"); ce != nil {
		ce.Write(append(fields, zap.ByteString("arguments", args))...)
	}

	start := time.Now()
	notes := notesOf(ctx) // progress and log messages for the caller (notes.go)
	callCtx := ctx
	if notes != nil {
		notes.waiting(e)
		callCtx = device.WithCallStages(ctx, notes.stage(e))
	}
	// The Hub checks the tool and its arguments (one validation path for
	// every caller) before anything reaches the board.
	res, err := s.hub.CallTool(callCtx, e.deviceID, e.tool.Name, args)
	noteCallErr(ctx, err) // a task tells a board's error apart (tasks.go)
	took := time.Since(start)

	var out *mcp.CallToolResult
	outcome := outcomeOK
	if err != nil {
		var code device.Code
		out, code = callFailure(e, e.label(), err, took)
		outcome = string(code)
	} else {
		out = convertResult(res)
		if out.IsError {
			outcome = outcomeToolError
		}
	}
	notes.answered(e, outcome, took)
	s.auditCall(ctx, e, args, outcome, took)
	level := zap.InfoLevel
	switch device.Code(outcome) {
	case outcomeOK, outcomeToolError, device.CodeDeviceError, device.CodeCanceled, device.CodeInvalidArguments,
		device.CodeUnknownTool:
	default:
		level = zap.WarnLevel
	}
	if ce := s.log.Check(level, "tool call"); ce != nil {
		fs := append(fields, zap.String("outcome", outcome), zap.Duration("took", took))
		if err != nil {
			fs = append(fs, zap.Error(device.LogSafe(err)))
		}
		ce.Write(fs...)
	}
	return out
}

func (e *entry) label() string { return labelOf(e.alias, e.board, e.deviceID) }
