package mcpclient

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/sourcegraph/jsonrpc2"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/internal/logthrottle"
)

// Defaults for Options. They are generous because a board runs one request at
// a time and every reply waits behind a running tool.
const (
	DefaultRequestTimeout = 10 * time.Second
	DefaultCallTimeout    = 30 * time.Second
	DefaultQueueSize      = 16
	DefaultMaxPages       = 32
	DefaultMaxTools       = 512
	// DefaultMaxListBytes bounds a board's whole tool list, all pages
	// together: the firmware's own pages stay under 8000 bytes, and a
	// board with every common and board tool lists about 10 KB.
	DefaultMaxListBytes = 256 << 10
)

// DefaultToolTimeouts lists the board tools known to be slow: the camera
// captures, encodes and uploads before it replies; a screen snapshot uploads
// too; a firmware upgrade downloads first.
func DefaultToolTimeouts() map[string]time.Duration {
	return map[string]time.Duration{
		"self.camera.take_photo": 60 * time.Second,
		"self.screen.snapshot":   60 * time.Second,
		"self.upgrade_firmware":  120 * time.Second,
	}
}

// DefaultRestartingTools lists tools after which the board drops its link on
// purpose (reboot, firmware upgrade): it never replies, so the disconnect is
// the outcome, reported as success.
func DefaultRestartingTools() map[string]bool {
	return map[string]bool{"self.reboot": true, "self.upgrade_firmware": true}
}

// Vision is the photo-explain endpoint handed to camera boards in initialize.
type Vision struct {
	URL   string `json:"url" yaml:"url"`
	Token string `json:"token,omitempty" yaml:"token"`
}

// Options configure a Client. Zero values take the defaults above.
type Options struct {
	ClientName    string
	ClientVersion string
	// Vision, when set, is sent as capabilities.vision in initialize.
	Vision *Vision
	// WithUserTools asks the board to list its user-only tools too.
	WithUserTools bool
	MaxPages      int
	MaxTools      int
	// MaxListBytes bounds the tools/list replies of one listing, pages
	// together.
	MaxListBytes int
	// RequestTimeout bounds initialize and each tools/list page.
	RequestTimeout time.Duration
	// CallTimeout bounds tools/call unless ToolTimeouts names the tool.
	CallTimeout  time.Duration
	ToolTimeouts map[string]time.Duration
	// RestartingTools treat a disconnect during the call as success.
	RestartingTools map[string]bool
	// QueueSize is how many requests may wait behind the running one.
	QueueSize int
	Logger    *zap.Logger
	// OnNotification, when set, receives each notification the board
	// sends, as a JSON-RPC message. It is called on the connection's read
	// goroutine, which reads the board's replies too: it must return at
	// once (hand the message to a bounded queue that drops when full).
	// Requests from the board (with an id) are never passed on.
	OnNotification func(msg json.RawMessage)
}

// withDefaults returns o with unset fields set to their defaults.
func (o Options) withDefaults() Options {
	o.ClientName = cmp.Or(o.ClientName, "devicebridge")
	o.Logger = cmp.Or(o.Logger, zap.NewNop())
	// max(x, 0): a negative value here has always meant the default too.
	o.MaxPages = cmp.Or(max(o.MaxPages, 0), DefaultMaxPages)
	o.MaxTools = cmp.Or(max(o.MaxTools, 0), DefaultMaxTools)
	o.MaxListBytes = cmp.Or(max(o.MaxListBytes, 0), DefaultMaxListBytes)
	o.RequestTimeout = cmp.Or(max(o.RequestTimeout, 0), DefaultRequestTimeout)
	o.CallTimeout = cmp.Or(max(o.CallTimeout, 0), DefaultCallTimeout)
	o.QueueSize = cmp.Or(max(o.QueueSize, 0), DefaultQueueSize)
	// Maps: cmp.Or cannot compare them. An empty non-nil map is kept.
	if o.ToolTimeouts == nil {
		o.ToolTimeouts = DefaultToolTimeouts()
	}
	if o.RestartingTools == nil {
		o.RestartingTools = DefaultRestartingTools()
	}
	return o
}

// Client talks MCP to one board over a JSON-RPC object stream.
type Client struct {
	conn *jsonrpc2.Conn
	opts Options
	log  *zap.Logger
	// slots admits the running request plus QueueSize waiting ones; turn
	// lets exactly one request be outstanding on the board.
	slots chan struct{}
	turn  chan struct{}
	ids   atomic.Int32
}

// New starts a client on stream. The client owns the stream: Close closes it.
func New(stream jsonrpc2.ObjectStream, opts Options) *Client {
	opts = opts.withDefaults()
	c := &Client{
		opts:  opts,
		log:   opts.Logger,
		slots: make(chan struct{}, opts.QueueSize+1),
		turn:  make(chan struct{}, 1),
	}
	// jsonrpc2 logs stray replies (ids the bridge never issued, which some
	// boards produce) through a std logger; keep that at debug.
	stdLog, _ := zap.NewStdLogAt(c.log, zap.DebugLevel)
	c.conn = jsonrpc2.NewConn(context.Background(), stream, boardMessages{opts.OnNotification}, jsonrpc2.SetLogger(stdLog))
	return c
}

// boardMessages handles what the board sends that is not a reply. Requests
// are dropped: mainline firmware never sends any, and an answer would only
// be dropped by the board again. Notifications (none in mainline firmware
// either) go to notify, if set.
type boardMessages struct{ notify func(json.RawMessage) }

func (h boardMessages) Handle(_ context.Context, _ *jsonrpc2.Conn, req *jsonrpc2.Request) {
	if !req.Notif || h.notify == nil {
		return
	}
	msg, err := json.Marshal(notification{JSONRPC: "2.0", Method: req.Method, Params: req.Params})
	if err != nil {
		return // params came from the decoder: valid JSON, so never
	}
	h.notify(msg)
}

// notification is a JSON-RPC notification on the wire.
type notification struct {
	JSONRPC string           `json:"jsonrpc"`
	Method  string           `json:"method"`
	Params  *json.RawMessage `json:"params,omitempty"`
}

// Close ends the JSON-RPC connection; pending requests fail with
// ErrDisconnected. It is idempotent.
func (c *Client) Close() error {
	if err := c.conn.Close(); err != nil && !errors.Is(err, jsonrpc2.ErrClosed) {
		return err
	}
	return nil
}

// Pending reports how many requests the client holds: the one outstanding
// on the board (if any) plus those queued behind it. It is at most
// QueueSize+1.
func (c *Client) Pending() int { return len(c.slots) }

// Done is closed when the connection ends.
func (c *Client) Done() <-chan struct{} { return c.conn.DisconnectNotify() }

// Initialize sends initialize and returns the board's identity.
func (c *Client) Initialize(ctx context.Context) (InitializeResult, error) {
	params := map[string]any{
		"protocolVersion": ProtocolVersion,
		"capabilities":    map[string]any{},
		"clientInfo":      map[string]string{"name": c.opts.ClientName, "version": c.opts.ClientVersion},
	}
	if c.opts.Vision != nil && c.opts.Vision.URL != "" {
		params["capabilities"] = map[string]any{"vision": c.opts.Vision}
	}
	var res InitializeResult
	err := c.timed(ctx, "initialize", params, &res, c.opts.RequestTimeout)
	return res, err
}

// ListTools pages through tools/list until the board stops returning a
// cursor, and returns the tools in device order.
func (c *Client) ListTools(ctx context.Context) ([]Tool, error) {
	var tools []Tool
	seenCursor := map[string]bool{}
	seenTool := map[string]bool{}
	cursor := ""
	size, listed, dups := 0, 0, 0
	firstDup := ""
	for page := 0; ; page++ {
		if page >= c.opts.MaxPages {
			return nil, fmt.Errorf("%w (%d pages)", ErrTooManyPages, c.opts.MaxPages)
		}
		var raw json.RawMessage
		params := listToolsParams{Cursor: cursor, WithUserTools: c.opts.WithUserTools}
		if err := c.timed(ctx, "tools/list", params, &raw, c.opts.RequestTimeout); err != nil {
			return nil, fmt.Errorf("tools/list page %d: %w", page+1, err)
		}
		// Counted before decoding the page: a board's tool list stays in
		// memory as long as it is connected.
		if size += len(raw); size > c.opts.MaxListBytes {
			return nil, fmt.Errorf("%w (%d bytes by page %d, limit %d)", ErrListTooLarge, size, page+1, c.opts.MaxListBytes)
		}
		var res listToolsResult
		if err := json.Unmarshal(raw, &res); err != nil {
			return nil, fmt.Errorf("tools/list page %d: %w: %v", page+1, ErrBadReply, err)
		}
		for _, t := range res.Tools {
			if t.Name == "" {
				return nil, fmt.Errorf("%w: tool without a name on page %d", ErrBadReply, page+1)
			}
			// Every entry counts against MaxTools, repeats included, so a
			// board cannot make the bridge read (and log) without end.
			if listed++; listed > c.opts.MaxTools {
				return nil, fmt.Errorf("%w (%d tools)", ErrTooManyTools, c.opts.MaxTools)
			}
			if seenTool[t.Name] {
				// An inclusive cursor must never repeat a tool; if a board
				// does, keep the first copy rather than list it twice.
				if dups++; dups == 1 {
					firstDup = t.Name
				}
				continue
			}
			seenTool[t.Name] = true
			tools = append(tools, intern(t))
		}
		if res.NextCursor == nil || *res.NextCursor == "" {
			if dups > 0 {
				duplicateLog.Warn(c.log, "device listed tools more than once; the first copy of each is kept",
					zap.Int("repeats", dups), zap.String("first", cut(firstDup, 64)))
			}
			return tools, nil
		}
		next := *res.NextCursor
		if seenCursor[next] {
			return nil, fmt.Errorf("%w: cursor %q returned twice", ErrCursorLoop, cut(next, 64))
		}
		seenCursor[next] = true
		cursor = next
	}
}

// duplicateLog throttles the warning about tools listed twice, across
// every board: a board can repeat it at each connection.
var duplicateLog logthrottle.Throttle

// cut shortens a board's string for an error or a log field, at a rune
// boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// CallTool runs one tool. args may be nil (no arguments). A board-side
// failure is a *DeviceError.
func (c *Client) CallTool(ctx context.Context, name string, args json.RawMessage) (*CallResult, error) {
	if len(args) == 0 {
		args = json.RawMessage(`{}`)
	}
	var res CallResult
	err := c.timed(ctx, "tools/call", callParams{Name: name, Arguments: args}, &res, c.callTimeout(name))
	if errors.Is(err, ErrDisconnected) && c.opts.RestartingTools[name] {
		return restarted(), nil
	}
	if err != nil {
		return nil, err
	}
	return &res, nil
}

// restarted is the result of a call whose tool restarts the board: the
// disconnect is its outcome (RestartingTools).
func restarted() *CallResult {
	return &CallResult{Content: []Content{{Type: "text",
		Text: "the device closed its connection, as it does when this tool restarts it"}}}
}

// callTimeout is the timeout of a tools/call of tool.
func (c *Client) callTimeout(tool string) time.Duration {
	if t, ok := c.opts.ToolTimeouts[tool]; ok && t > 0 {
		return t
	}
	return c.opts.CallTimeout
}

// Forward sends a request another MCP client wrote (params raw, nil for
// none) through the same queue as the client's own requests, under an id
// the client picks, and returns the board's result raw, byte for byte as
// the board sent it. Its deadline is the one the client's own request of
// that kind gets, running from now: a tool's (ToolTimeouts, CallTimeout)
// for tools/call, RequestTimeout for anything else. A board error is a
// *DeviceError carrying the board's code and data too.
func (c *Client) Forward(ctx context.Context, method string, params json.RawMessage) (json.RawMessage, error) {
	timeout, tool := c.opts.RequestTimeout, ""
	if method == "tools/call" {
		var p struct {
			Name string `json:"name"`
		}
		_ = json.Unmarshal(params, &p) // a bad name is the board's to refuse
		tool = p.Name
		timeout = c.callTimeout(tool)
	}
	// A nil RawMessage in an interface is not nil: jsonrpc2 would send
	// "params":null, which the board drops without a reply.
	var p any
	if len(params) > 0 {
		p = params
	}
	var res json.RawMessage
	err := c.timed(ctx, method, p, &res, timeout)
	if errors.Is(err, ErrDisconnected) && tool != "" && c.opts.RestartingTools[tool] {
		return json.Marshal(restarted())
	}
	if err != nil {
		return nil, err
	}
	if len(res) == 0 {
		res = json.RawMessage("null")
	}
	return res, nil
}

// Notify sends a notification to the board. It takes no turn in the queue:
// it has no reply to wait for, and the board handles (drops) notifications
// on its receive path, even while a tool runs. The write is bounded by the
// stream's write timeout.
func (c *Client) Notify(ctx context.Context, method string, params json.RawMessage) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var p any
	if len(params) > 0 {
		p = params
	}
	err := c.conn.Notify(ctx, method, p)
	if errors.Is(err, jsonrpc2.ErrClosed) {
		return ErrDisconnected
	}
	return err
}

// Call sends any other request (for example a liveness probe). The result
// is returned raw. Unlike the methods above, timeout bounds only the wait
// for the reply once the request is sent, and ctx alone bounds the wait for
// its turn: a liveness probe measures the board, not the queue ahead of it.
func (c *Client) Call(ctx context.Context, method string, params any, timeout time.Duration) (json.RawMessage, error) {
	timeout = cmp.Or(max(timeout, 0), c.opts.RequestTimeout)
	var res json.RawMessage
	err := c.request(ctx, method, params, &res, timeout, time.Time{})
	return res, err
}

// errDeadline is the cause of a deadline set by timed, which tells the
// request's own timeout apart from the caller's context ending.
var errDeadline = errors.New("mcpclient: request deadline")

// timed runs request under a deadline that starts now: time spent waiting
// behind other requests counts against timeout, so a silent board answers
// every queued caller within one timeout of its call, not N timeouts.
func (c *Client) timed(ctx context.Context, method string, params, result any, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	ctx, cancel := context.WithDeadlineCause(ctx, deadline, errDeadline)
	defer cancel()
	return c.request(ctx, method, params, result, timeout, deadline)
}

// request runs one JSON-RPC request under the one-at-a-time rule. ctx and
// deadline (zero for none) bound the wait for the request's turn; timeout
// and ctx the wait for the reply once sent.
func (c *Client) request(ctx context.Context, method string, params, result any, timeout time.Duration, deadline time.Time) error {
	select {
	case c.slots <- struct{}{}:
	default:
		return ErrBusy
	}
	defer func() { <-c.slots }()
	select {
	case c.turn <- struct{}{}:
	default:
		// Another request has the board: say how many are ahead, then wait.
		Report(ctx, StageQueued, len(c.slots)-1)
		select {
		case c.turn <- struct{}{}:
		case <-ctx.Done():
			return givenUp(ctx, method, timeout, deadline)
		case <-c.conn.DisconnectNotify():
			return ErrDisconnected
		}
	}
	defer func() { <-c.turn }()
	// The turn may come as the caller's time runs out: a request whose
	// caller has given up is never sent to the board.
	if err := givenUp(ctx, method, timeout, deadline); err != nil {
		return err
	}

	// On timeout jsonrpc2 keeps the call's pending entry until a late reply
	// or the connection's end; a board either answers eventually or its
	// session ends, so that memory is bounded by the session.
	callCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	Report(ctx, StageSent, 0)
	err := c.conn.Call(callCtx, method, params, result, jsonrpc2.PickID(jsonrpc2.ID{Num: c.nextID()}))
	if err == nil {
		if ce := c.log.Check(zap.DebugLevel, "device request done"); ce != nil {
			ce.Write(zap.String("method", method), zap.Duration("took", time.Since(start)))
		}
		return nil
	}
	var rpcErr *jsonrpc2.Error
	switch {
	case errors.As(err, &rpcErr):
		de := &DeviceError{Method: method, Message: rpcErr.Message, Code: rpcErr.Code}
		if rpcErr.Data != nil {
			de.Data = *rpcErr.Data
		}
		return de
	case errors.Is(err, jsonrpc2.ErrClosed):
		return ErrDisconnected
	case ctx.Err() != nil && !errors.Is(context.Cause(ctx), errDeadline):
		return ctx.Err()
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s after %v: %w", method, timeout, ErrTimeout)
	}
	var syntaxErr *json.SyntaxError
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &syntaxErr) || errors.As(err, &typeErr) {
		return fmt.Errorf("%w: %s: %v", ErrBadReply, method, err)
	}
	select {
	case <-c.conn.DisconnectNotify():
		return ErrDisconnected
	default:
	}
	return fmt.Errorf("%s: %w", method, err)
}

// givenUp says why a request not yet sent must not be: its own deadline
// has passed, or its caller's context has ended. The clock is read as well
// as ctx.Err because a context's timer may fire a moment after its
// deadline, when the turn has already been handed over.
func givenUp(ctx context.Context, method string, timeout time.Duration, deadline time.Time) error {
	now := time.Now()
	if !deadline.IsZero() && !now.Before(deadline) {
		return fmt.Errorf("%s after %v: %w", method, timeout, ErrQueueTimeout)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !now.Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// nextID returns ids 1..MaxInt32: boards echo ids through a C int cast.
func (c *Client) nextID() uint64 {
	for {
		id := c.ids.Add(1)
		if id > 0 && id < math.MaxInt32 {
			return uint64(id)
		}
		c.ids.CompareAndSwap(id, 0)
	}
}
