// Package stdioproxy lets an MCP host that only launches stdio servers use a
// running bridge (cmd/mcp-stdio): a stdio MCP server whose tools mirror the
// bridge's, backed by an MCP client of the bridge's /mcp over Streamable
// HTTP. It shares no type with the bridge's own MCP server (mcpserver/).
//
// Lock order: Proxy.listing before Proxy.mu, both held while sync adds or
// removes the go-sdk server's tools; Proxy.progressMu is a leaf.
package stdioproxy

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/internal/ctxtime"
	"github.com/devicebridge/devicebridge/internal/mcpera"
)

// Options configure a Proxy.
type Options struct {
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
	// StartupWait bounds how long tools/list and tools/call from the host
	// wait for the proxy's first complete listing of the bridge's tools.
	// Default 8s: shorter than the 10-second request timeout some hosts
	// (the MCP Inspector) apply, so the host shows the proxy's explanation
	// rather than a bare timeout.
	StartupWait time.Duration
	// DrainWait bounds how long, once the host has closed its input (a
	// script piping its requests in), the proxy still waits for the
	// answers to requests it had read before it ends the session. Default
	// 30s, the bridge's default call timeout.
	DrainWait time.Duration
	// Logger receives the proxy's logs (never stdout). Nil discards.
	Logger *zap.Logger
}

// withDefaults returns o with unset fields set to their defaults.
func (o Options) withDefaults() Options {
	o.Version = cmp.Or(o.Version, "dev")
	o.Logger = cmp.Or(o.Logger, zap.NewNop())
	// max(x, 0): a negative value here has always meant the default too.
	o.RetryInterval = cmp.Or(max(o.RetryInterval, 0), 2*time.Second)
	o.StartupWait = cmp.Or(max(o.StartupWait, 0), 8*time.Second)
	o.DrainWait = cmp.Or(max(o.DrainWait, 0), 30*time.Second)
	return o
}

// Proxy lets a host that only launches stdio servers use a running
// bridge: it is an MCP server on its transport (stdin/stdout) whose tools
// mirror the bridge's, and an MCP client of the bridge over Streamable
// HTTP. Calls, progress and cancellation are relayed; list_changed from
// the bridge is passed on. If the bridge goes away the proxy withdraws the
// tools and reconnects.
//
// Until the first complete listing of the bridge's tools, the host's
// tools/list and tools/call wait (up to StartupWait): answering them
// earlier would hand the host an empty catalogue it has no reason to ask
// for again, and calls that fail as unknown tools.
type Proxy struct {
	opts   Options
	log    *zap.Logger
	client *mcp.Client
	server *mcp.Server

	mu      sync.Mutex
	session *mcp.ClientSession // nil while disconnected
	tools   map[string]string  // published name → JSON of the tool
	lastErr error              // why the latest connection attempt failed

	// listing is held for writing while sync applies a new tool list, and
	// for reading while the host's tools/list is answered, so the host
	// never sees a list that is half old and half new.
	listing sync.RWMutex

	ready     chan struct{} // closed after the first complete listing
	readyOnce sync.Once

	rejectOnce sync.Once
	rejected   chan struct{} // closed when the bridge refuses the token
	rejection  *TokenRejectedError

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

// New builds a proxy; Run serves it.
func New(opts Options) (*Proxy, error) {
	if opts.URL == "" {
		return nil, errors.New("stdio proxy: the bridge URL is required")
	}
	opts = opts.withDefaults()
	p := &Proxy{opts: opts, log: opts.Logger, tools: map[string]string{}, resync: make(chan struct{}, 1),
		ready: make(chan struct{}), rejected: make(chan struct{}), progress: map[string]progressTarget{}}
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
	p.server.AddReceivingMiddleware(p.holdUntilListed)
	// The host sees only its protocol era's result shapes (outermost).
	p.server.AddReceivingMiddleware(mcpera.Middleware)
	return p, nil
}

// TokenRejectedError reports that the bridge refused the proxy's
// credentials (HTTP 401 or 403). Retrying cannot help, unlike a bridge
// that is not up yet, so Run gives up with this error.
type TokenRejectedError struct {
	URL        string
	StatusCode int
	Status     string // e.g. "401 Unauthorized"
	Detail     string // the start of the bridge's explanation, if any
	TokenSent  bool
}

func (e *TokenRejectedError) Error() string {
	msg := "the bridge rejected the token: " + e.Status
	if e.Detail != "" {
		msg += " (" + e.Detail + ")"
	}
	if !e.TokenSent {
		msg += "; no token was sent"
	}
	return msg + " [" + e.URL + "]"
}

// Run serves the proxy on t (typically &mcp.StdioTransport{}) until the
// host closes it or ctx ends. An unreachable bridge is retried meanwhile;
// Run fails if t cannot be served, or with a *TokenRejectedError as soon
// as the bridge refuses the token. When the host closes its input, every
// request it had sent is answered first (waiting up to DrainWait).
func (p *Proxy) Run(ctx context.Context, t mcp.Transport) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fatal := make(chan error, 1)
	go func() { fatal <- p.maintain(ctx) }()

	ss, err := p.server.Connect(ctx, drainTransport{Transport: t, wait: p.opts.DrainWait, log: p.log}, nil)
	if err != nil {
		cancel()
		<-fatal
		return fmt.Errorf("stdio proxy: %w", err)
	}
	waitErr := make(chan error, 1)
	go func() { waitErr <- ss.Wait() }()
	var runErr error
	select {
	case err = <-waitErr:
	case <-ctx.Done():
		_ = ss.Close()
		err = <-waitErr
	case runErr = <-fatal:
		fatal = nil
		_ = ss.Close()
		err = <-waitErr
	}
	cancel()
	if fatal != nil {
		<-fatal
	}
	// The session ends when the host closes stdin or ctx ends; whatever
	// was in flight at that moment fails, which is not the proxy's error.
	p.log.Debug("host session ended", zap.Error(err))
	return runErr
}

// holdUntilListed is server middleware: the host's tools/list and
// tools/call wait for the first complete listing of the bridge's tools,
// and tools/list never runs while a new list is being applied.
func (p *Proxy) holdUntilListed(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method != "tools/list" && method != "tools/call" {
			return next(ctx, method, req)
		}
		if err := p.awaitFirstListing(ctx, method); err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if call, ok := req.(*mcp.CallToolRequest); ok {
				// A tool result rather than a protocol error, so that the
				// model reads why the call did not happen.
				return errorResult("%s was not run: %v.", call.Params.Name, err), nil
			}
			return nil, &jsonrpc.Error{Code: codeInternalError, Message: err.Error()}
		}
		if method == "tools/list" {
			p.listing.RLock()
			defer p.listing.RUnlock()
		}
		return next(ctx, method, req)
	}
}

// codeInternalError is JSON-RPC's "internal error".
const codeInternalError = -32603

// awaitFirstListing returns nil once the bridge's tools have been listed
// completely, or an error saying why they are not known yet.
func (p *Proxy) awaitFirstListing(ctx context.Context, method string) error {
	select {
	case <-p.ready:
		return nil
	default:
	}
	p.log.Debug("holding a request until the bridge's tools are known", zap.String("method", method))
	timer := time.NewTimer(p.opts.StartupWait)
	defer timer.Stop()
	select {
	case <-p.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-p.rejected:
		return p.rejection
	case <-timer.C:
		p.mu.Lock()
		last := p.lastErr
		p.mu.Unlock()
		msg := fmt.Sprintf("the bridge at %s is not reachable yet: no tool list after %s", p.opts.URL, p.opts.StartupWait)
		if last != nil {
			msg += " (last attempt: " + last.Error() + ")"
		}
		return errors.New(msg + "; the proxy keeps trying, retry shortly")
	}
}

// reject records the bridge's refusal of the token; the first one wins.
func (p *Proxy) reject(e *TokenRejectedError) {
	p.rejectOnce.Do(func() {
		p.rejection = e
		close(p.rejected)
	})
}

func (p *Proxy) poke() {
	select {
	case p.resync <- struct{}{}:
	default:
	}
}

// maintain keeps a session with the bridge: connect, mirror its tools,
// follow list_changed, and start over when the session ends. It returns
// nil when ctx ends, or the rejection if the bridge refuses the token:
// connection errors mean the bridge may yet come up, a 401 or 403 means
// it is up and will keep saying no.
func (p *Proxy) maintain(ctx context.Context) error {
	defer p.disconnect()
	for ctx.Err() == nil {
		cs, err := p.connect(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil // the proxy is stopping, the bridge is not at fault
			}
			select {
			case <-p.rejected:
				return p.rejection
			default:
			}
			p.mu.Lock()
			p.lastErr = err
			p.mu.Unlock()
			p.log.Warn("cannot reach the bridge; retrying", zap.String("url", p.opts.URL), zap.Error(err))
			if !ctxtime.Sleep(ctx, p.opts.RetryInterval) {
				return nil
			}
			continue
		}
		p.log.Info("connected to the bridge", zap.String("url", p.opts.URL))
		p.mu.Lock()
		p.session = cs
		p.lastErr = nil
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
					p.mu.Lock()
					p.lastErr = err
					p.mu.Unlock()
				}
			case <-p.rejected:
				p.disconnect()
				<-ended
				return p.rejection
			case <-ended:
				if ctx.Err() == nil {
					p.log.Warn("lost the bridge session; reconnecting", zap.String("url", p.opts.URL))
				}
				break follow
			case <-ctx.Done():
				break follow
			}
		}
		p.disconnect()
		<-ended
		if !ctxtime.Sleep(ctx, p.opts.RetryInterval) {
			return nil
		}
	}
	return nil
}

func (p *Proxy) connect(ctx context.Context) (*mcp.ClientSession, error) {
	hc := p.opts.HTTPClient
	if hc == nil {
		hc = &http.Client{}
	}
	// Always wrapped, even without a token: a bridge that requires one
	// answers 401 to a proxy that has none.
	c := *hc
	c.Transport = bearerTransport{token: p.opts.Token, next: hc.Transport, url: p.opts.URL, reject: p.reject}
	hc = &c
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
func (p *Proxy) disconnect() {
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
func (p *Proxy) sync(ctx context.Context, cs *mcp.ClientSession) error {
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// Every page is fetched before anything changes: a listing that fails
	// half-way leaves the previous list (or, at start, none) in place.
	want := map[string]*mcp.Tool{}
	for t, err := range cs.Tools(lctx, nil) {
		if err != nil {
			return err
		}
		want[t.Name] = t
	}
	p.listing.Lock()
	defer p.listing.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.session != cs {
		return nil // superseded
	}
	defer p.readyOnce.Do(func() { close(p.ready) })
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
func (p *Proxy) forward(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
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

func (p *Proxy) relayProgress(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
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

// bearerTransport adds the bearer token (if any) to every request, and
// reports a 401 or 403 answer: the go-sdk turns those into errors that
// read like any other failure, but for the proxy they are final.
type bearerTransport struct {
	token  string
	next   http.RoundTripper
	url    string
	reject func(*TokenRejectedError)
}

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if b.token != "" {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+b.token)
	}
	next := b.next
	if next == nil {
		next = http.DefaultTransport
	}
	resp, err := next.RoundTrip(r)
	if err != nil || (resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusForbidden) {
		return resp, err
	}
	// Keep the start of the explanation for the user, and hand the body on
	// intact for the go-sdk.
	head, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
	resp.Body = readCloser{io.MultiReader(bytes.NewReader(head), resp.Body), resp.Body}
	detail := strings.Join(strings.Fields(string(head)), " ")
	b.reject(&TokenRejectedError{URL: b.url, StatusCode: resp.StatusCode, Status: resp.Status, Detail: detail,
		TokenSent: b.token != ""})
	return resp, nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

// drainTransport wraps the host's transport so that the end of the host's
// input ends the session only once every request read from it has been
// answered (or cancelled by the host), waiting at most wait. Without it a
// host that writes its requests and closes stdin (printf … | mcp-stdio)
// would get the first answer only: go-sdk ends the session at EOF and
// cancels whatever is still running.
type drainTransport struct {
	mcp.Transport
	wait time.Duration
	log  *zap.Logger
}

func (t drainTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &drainConn{Connection: c, wait: t.wait, log: t.log, pending: map[jsonrpc.ID]struct{}{},
		answered: make(chan struct{}, 1), closed: make(chan struct{})}, nil
}

// drainConn counts the host's requests in flight: added when read,
// removed when their response is written or the host cancels them.
type drainConn struct {
	mcp.Connection
	wait time.Duration
	log  *zap.Logger

	mu       sync.Mutex
	pending  map[jsonrpc.ID]struct{}
	answered chan struct{} // poked whenever pending shrinks
	closed   chan struct{}
	once     sync.Once
}

func (c *drainConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if err != nil {
		if errors.Is(err, io.EOF) {
			c.drain(ctx)
		}
		return nil, err
	}
	if req, ok := msg.(*jsonrpc.Request); ok {
		switch {
		case req.ID.IsValid():
			c.mu.Lock()
			c.pending[req.ID] = struct{}{}
			c.mu.Unlock()
		case req.Method == "notifications/cancelled":
			var params struct {
				RequestID any `json:"requestId"`
			}
			if json.Unmarshal(req.Params, &params) == nil {
				if id, err := jsonrpc.MakeID(params.RequestID); err == nil {
					c.done(id)
				}
			}
		}
	}
	return msg, nil
}

func (c *drainConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	err := c.Connection.Write(ctx, msg)
	if resp, ok := msg.(*jsonrpc.Response); ok {
		c.done(resp.ID)
	}
	return err
}

func (c *drainConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Connection.Close()
}

func (c *drainConn) done(id jsonrpc.ID) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
	select {
	case c.answered <- struct{}{}:
	default:
	}
}

// drain waits until no request of the host is unanswered, for at most
// c.wait, or until the connection is closed or ctx ends.
func (c *drainConn) drain(ctx context.Context) {
	timer := time.NewTimer(c.wait)
	defer timer.Stop()
	for {
		c.mu.Lock()
		n := len(c.pending)
		c.mu.Unlock()
		if n == 0 {
			return
		}
		c.log.Debug("the host closed its input; answering what it sent first", zap.Int("requests", n))
		select {
		case <-c.answered:
		case <-timer.C:
			c.log.Warn("the host closed its input; requests left unanswered", zap.Int("requests", n),
				zap.Duration("waited", c.wait))
			return
		case <-c.closed:
			return
		case <-ctx.Done():
			return
		}
	}
}

// errorResult is a tool result that reports a failure to the host.
func errorResult(format string, args ...any) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(format, args...)}}}
}
