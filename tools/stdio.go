package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"
)

// StdioProxyOptions configure a StdioProxy.
type StdioProxyOptions struct {
	// URL is the bridge's MCP endpoint, e.g. http://127.0.0.1:8080/mcp.
	URL string
	// Token is sent as a bearer token when set.
	Token string
	// ProtocolVersion pins the protocol version spoken to the bridge
	// (e.g. "2025-11-25" for the legacy era); empty lets the go-sdk choose
	// (the modern era, falling back to legacy).
	ProtocolVersion string
	// HTTPClient is used for the bridge; nil means a default client.
	HTTPClient *http.Client
	// Version is reported as the proxy's serverInfo.version.
	Version string
	// RetryInterval spaces reconnection attempts. Default 2s.
	RetryInterval time.Duration
	// Logger receives the proxy's logs (never stdout). Nil discards.
	Logger *zap.Logger
}

// StdioProxy lets a host that only launches stdio servers use a running
// bridge: it is an MCP server on its transport (stdin/stdout) whose tools
// mirror the bridge's, and an MCP client of the bridge over Streamable
// HTTP. Calls, progress and cancellation are relayed; list_changed from
// the bridge is passed on. If the bridge goes away the proxy withdraws the
// tools and reconnects.
type StdioProxy struct {
	opts   StdioProxyOptions
	log    *zap.Logger
	client *mcp.Client
	server *mcp.Server

	mu      sync.Mutex
	session *mcp.ClientSession // nil while disconnected
	tools   map[string]string  // published name → JSON of the tool

	resync chan struct{}

	progressMu sync.Mutex
	progress   map[string]progressTarget // token sent upstream → where to relay
	nextToken  atomic.Uint64
}

type progressTarget struct {
	ctx     context.Context
	session *mcp.ServerSession
	token   any
}

// NewStdioProxy builds a proxy; Run serves it.
func NewStdioProxy(opts StdioProxyOptions) (*StdioProxy, error) {
	if opts.URL == "" {
		return nil, errors.New("stdio proxy: the bridge URL is required")
	}
	if opts.RetryInterval <= 0 {
		opts.RetryInterval = 2 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Version == "" {
		opts.Version = "dev"
	}
	p := &StdioProxy{opts: opts, log: opts.Logger, tools: map[string]string{}, resync: make(chan struct{}, 1),
		progress: map[string]progressTarget{}}
	impl := &mcp.Implementation{Name: "devicebridge-stdio", Title: "devicebridge (stdio)", Version: opts.Version}
	p.client = mcp.NewClient(impl, &mcp.ClientOptions{
		ToolListChangedHandler:      func(context.Context, *mcp.ToolListChangedRequest) { p.poke() },
		ProgressNotificationHandler: p.relayProgress,
		// The bridge sends no server→client requests; declare nothing.
		Capabilities: &mcp.ClientCapabilities{},
	})
	p.server = mcp.NewServer(impl, &mcp.ServerOptions{
		Instructions: "Proxy to a devicebridge bridge at " + opts.URL + ". Each tool acts on one physical board; " +
			"its description names the board. The list follows the boards as they connect and leave.",
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}},
	})
	return p, nil
}

// Run serves the proxy on t (typically &mcp.StdioTransport{}) until the
// host closes it or ctx ends. It fails only if t cannot be served; an
// unreachable bridge is retried meanwhile (the host sees no tools).
func (p *StdioProxy) Run(ctx context.Context, t mcp.Transport) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); p.maintain(ctx) }()
	defer wg.Wait()
	defer cancel()

	ss, err := p.server.Connect(ctx, t, nil)
	if err != nil {
		return fmt.Errorf("stdio proxy: %w", err)
	}
	waitErr := make(chan error, 1)
	go func() { waitErr <- ss.Wait() }()
	select {
	case err = <-waitErr:
	case <-ctx.Done():
		_ = ss.Close()
		err = <-waitErr
	}
	// The session ends when the host closes stdin or ctx ends; whatever
	// was in flight at that moment fails, which is not the proxy's error.
	p.log.Debug("host session ended", zap.Error(err))
	return nil
}

func (p *StdioProxy) poke() {
	select {
	case p.resync <- struct{}{}:
	default:
	}
}

// maintain keeps a session with the bridge: connect, mirror its tools,
// follow list_changed, and start over when the session ends.
func (p *StdioProxy) maintain(ctx context.Context) {
	defer p.disconnect()
	for ctx.Err() == nil {
		cs, err := p.connect(ctx)
		if err != nil {
			p.log.Warn("cannot reach the bridge; retrying", zap.String("url", p.opts.URL), zap.Error(err))
			if !sleepCtx(ctx, p.opts.RetryInterval) {
				return
			}
			continue
		}
		p.log.Info("connected to the bridge", zap.String("url", p.opts.URL))
		p.mu.Lock()
		p.session = cs
		p.mu.Unlock()
		p.poke()

		ended := make(chan struct{})
		go func() { _ = cs.Wait(); close(ended) }()
	follow:
		for {
			select {
			case <-p.resync:
				if err := p.sync(ctx, cs); err != nil {
					p.log.Warn("listing the bridge's tools failed", zap.Error(err))
				}
			case <-ended:
				p.log.Warn("lost the bridge session; reconnecting", zap.String("url", p.opts.URL))
				break follow
			case <-ctx.Done():
				break follow
			}
		}
		p.disconnect()
		<-ended
		if !sleepCtx(ctx, p.opts.RetryInterval) {
			return
		}
	}
}

func (p *StdioProxy) connect(ctx context.Context) (*mcp.ClientSession, error) {
	hc := p.opts.HTTPClient
	if hc == nil {
		hc = &http.Client{}
	}
	if p.opts.Token != "" {
		c := *hc
		c.Transport = bearerTransport{token: p.opts.Token, next: hc.Transport}
		hc = &c
	}
	t := &mcp.StreamableClientTransport{Endpoint: p.opts.URL, HTTPClient: hc}
	var opts *mcp.ClientSessionOptions
	if p.opts.ProtocolVersion != "" {
		opts = &mcp.ClientSessionOptions{ProtocolVersion: p.opts.ProtocolVersion}
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return p.client.Connect(cctx, t, opts)
}

// disconnect closes the bridge session and withdraws every tool.
func (p *StdioProxy) disconnect() {
	p.mu.Lock()
	cs := p.session
	p.session = nil
	names := make([]string, 0, len(p.tools))
	for n := range p.tools {
		names = append(names, n)
	}
	p.tools = map[string]string{}
	p.mu.Unlock()
	if cs != nil {
		_ = cs.Close()
	}
	if len(names) > 0 {
		p.server.RemoveTools(names...)
	}
}

// sync mirrors the bridge's tool list, changing only what differs so that
// the host is not told about changes that did not happen.
func (p *StdioProxy) sync(ctx context.Context, cs *mcp.ClientSession) error {
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	want := map[string]*mcp.Tool{}
	for t, err := range cs.Tools(lctx, nil) {
		if err != nil {
			return err
		}
		want[t.Name] = t
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.session != cs {
		return nil // superseded
	}
	var removed []string
	for n := range p.tools {
		if _, ok := want[n]; !ok {
			removed = append(removed, n)
			delete(p.tools, n)
		}
	}
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(removed) > 0 {
		p.server.RemoveTools(removed...)
	}
	for _, n := range names {
		t := want[n]
		fp, _ := json.Marshal(t)
		if p.tools[n] == string(fp) {
			continue
		}
		p.tools[n] = string(fp)
		if t.InputSchema == nil {
			t.InputSchema = map[string]any{"type": "object"}
		}
		p.server.AddTool(t, p.forward)
	}
	return nil
}

// forward relays one call to the bridge.
func (p *StdioProxy) forward(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	p.mu.Lock()
	cs := p.session
	p.mu.Unlock()
	if cs == nil {
		return errorResult("The bridge at %s is not reachable right now, so %s was not run. Try again shortly.",
			p.opts.URL, req.Params.Name), nil
	}
	params := &mcp.CallToolParams{Name: req.Params.Name}
	if len(req.Params.Arguments) > 0 {
		params.Arguments = req.Params.Arguments
	}
	if token := req.Params.GetProgressToken(); token != nil {
		up := fmt.Sprintf("stdio-%d", p.nextToken.Add(1))
		p.progressMu.Lock()
		p.progress[up] = progressTarget{ctx: ctx, session: req.Session, token: token}
		p.progressMu.Unlock()
		defer func() {
			p.progressMu.Lock()
			delete(p.progress, up)
			p.progressMu.Unlock()
		}()
		params.SetProgressToken(up)
	}
	res, err := cs.CallTool(ctx, params)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return errorResult("Relaying %s to the bridge at %s failed: %v", req.Params.Name, p.opts.URL, err), nil
	}
	// Pass on the result itself, not the bridge's per-era envelope (its
	// serverInfo _meta and result type belong to the upstream hop).
	return &mcp.CallToolResult{Content: res.Content, StructuredContent: res.StructuredContent, IsError: res.IsError}, nil
}

func (p *StdioProxy) relayProgress(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
	up, _ := req.Params.ProgressToken.(string)
	p.progressMu.Lock()
	t, ok := p.progress[up]
	p.progressMu.Unlock()
	if !ok {
		return
	}
	_ = t.session.NotifyProgress(t.ctx, &mcp.ProgressNotificationParams{ProgressToken: t.token,
		Progress: req.Params.Progress, Total: req.Params.Total, Message: req.Params.Message})
}

// bearerTransport adds the bearer token to every request.
type bearerTransport struct {
	token string
	next  http.RoundTripper
}

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	next := b.next
	if next == nil {
		next = http.DefaultTransport
	}
	return next.RoundTrip(r)
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
