package device

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device/internal/mcpclient"
	"github.com/devicebridge/devicebridge/envelope"
	"github.com/devicebridge/devicebridge/internal/argcheck"
	"github.com/devicebridge/devicebridge/internal/clip"
)

// Errors a caller branches on.
var (
	// ErrUnknownDevice: no session for that device id.
	ErrUnknownDevice = errors.New("unknown device")
	// ErrNotReady: the board is connected but has not finished initializing.
	ErrNotReady = errors.New("device not ready")
	// ErrNoMCP: the board's hello did not announce MCP support.
	ErrNoMCP = errors.New("device does not support MCP")
	// ErrOffline: the session closed (the board disconnected or was replaced).
	ErrOffline = errors.New("device offline")
	// ErrHubClosed: the Hub is shutting down and accepts no new sessions.
	ErrHubClosed = errors.New("device hub closed")
)

// Session is one connected board. All methods are safe for concurrent use.
type Session struct {
	hub  *Hub
	link Link
	log  *zap.Logger

	mu     sync.Mutex
	info   Info
	client *mcpclient.Client
	stream *envelope.Stream
	// schemas caches each tool's parsed input schema, filled on first call
	// and reset when the tool list changes.
	schemas map[string]*argcheck.Schema
	// ignored counts messages read from a board without MCP and dropped.
	ignored int64
	// peerCalls are the peer's requests in progress (ServePeer), so that
	// the peer's notifications/cancelled can find them.
	peerCalls []*peerCall

	// peer is the state of a second MCP client sharing the board (see
	// ServePeer); atomics, taken without mu.
	peer peerState

	ready chan struct{} // closed on reaching StateReady
	done  chan struct{} // closed on reaching StateClosed
}

// ID is the board's device id (its MAC).
func (s *Session) ID() string { return s.info.DeviceID }

// Info returns a snapshot of the session.
func (s *Session) Info() Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := s.info
	i.Tools = slices.Clone(s.info.Tools)
	return i
}

// Done is closed when the session has closed.
func (s *Session) Done() <-chan struct{} { return s.done }

// Close ends the session by closing its link with reason.
func (s *Session) Close(reason error) { s.link.Close(reason) }

// Stats reports the envelope counters of the session's MCP stream.
func (s *Session) Stats() envelope.StreamStats {
	s.mu.Lock()
	st := s.stream
	s.mu.Unlock()
	if st == nil {
		return envelope.StreamStats{}
	}
	return st.Stats()
}

// Pending reports the board's call queue depth: the request outstanding on
// the board (if any) plus those waiting behind it (at most
// devices.queue_size+1). It is 0 before initialization starts and for a
// board without MCP.
func (s *Session) Pending() int {
	s.mu.Lock()
	c := s.client
	s.mu.Unlock()
	if c == nil {
		return 0
	}
	return c.Pending()
}

// WaitReady blocks until the session is ready, closes, or ctx ends.
func (s *Session) WaitReady(ctx context.Context) error {
	if !s.info.HasMCP {
		return ErrNoMCP
	}
	select {
	case <-s.done:
		return s.offlineErr()
	default:
	}
	select {
	case <-s.ready:
		return nil
	case <-s.done:
		return s.offlineErr()
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Session) offlineErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.info.CloseReason == "" {
		return ErrOffline
	}
	return fmt.Errorf("%w: %s", ErrOffline, s.info.CloseReason)
}

func (s *Session) readyClient() (*mcpclient.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case !s.info.HasMCP:
		return nil, ErrNoMCP
	case s.info.State == StateClosed:
		return nil, fmt.Errorf("%w: %s", ErrOffline, s.info.CloseReason)
	case s.info.State != StateReady:
		return nil, fmt.Errorf("%w (state %s)", ErrNotReady, s.info.State)
	}
	return s.client, nil
}

// CallTool runs one board tool. The session must be ready. The tool must be
// one the board listed and args must match its input schema, or the call
// fails with an *UnknownToolError or *ArgumentsError before anything is
// sent; args may be empty (no arguments).
func (s *Session) CallTool(ctx context.Context, name string, args json.RawMessage) (*CallResult, error) {
	c, err := s.readyClient()
	if err != nil {
		return nil, err
	}
	fwd, err := s.checkCall(name, args)
	if err != nil {
		return nil, err
	}
	res, err := c.CallTool(ctx, name, fwd)
	if errors.Is(err, mcpclient.ErrDisconnected) {
		return nil, s.disconnected(name, err)
	}
	return res, err
}

// disconnected explains err, a request to the board (what) cut off by the
// link's end, with why the link went, e.g. "connection to the MQTT broker
// lost".
func (s *Session) disconnected(what string, err error) error {
	if reason := s.link.Err(); reason != nil {
		if errors.Is(reason, ErrShutdown) {
			return fmt.Errorf("%w before %s replied; its outcome is unknown: %w", ErrShutdown, what, err)
		}
		return fmt.Errorf("%w (%v): %w", ErrOffline, reason, err)
	}
	return fmt.Errorf("%w: %w", ErrOffline, err)
}

// checkCall finds the tool and validates args against its schema,
// returning the arguments to forward.
func (s *Session) checkCall(name string, args json.RawMessage) (json.RawMessage, error) {
	s.mu.Lock()
	i := slices.IndexFunc(s.info.Tools, func(t Tool) bool { return t.Name == name })
	if i < 0 {
		known := make([]string, len(s.info.Tools))
		for j, t := range s.info.Tools {
			known[j] = t.Name
		}
		s.mu.Unlock()
		return nil, &UnknownToolError{Tool: name, Known: known}
	}
	schema := s.schemas[name]
	if schema == nil {
		schema = argcheck.Shared(s.info.Tools[i].InputSchema)
		if err := schema.Err(); err != nil {
			s.log.Debug("tool schema not understood; checking only that arguments form an object",
				zap.String("tool", name), zap.Error(err))
		}
		if s.schemas == nil {
			s.schemas = map[string]*argcheck.Schema{}
		}
		s.schemas[name] = schema
	}
	s.mu.Unlock()
	fwd, bad := schema.Validate(args)
	if bad != nil {
		return nil, &ArgumentsError{Tool: name, Invalid: bad, Schema: schema}
	}
	return fwd, nil
}

// Call sends a raw request to the board (for example a liveness probe).
func (s *Session) Call(ctx context.Context, method string, params any, timeout time.Duration) (json.RawMessage, error) {
	c, err := s.readyClient()
	if err != nil {
		return nil, err
	}
	return c.Call(ctx, method, params, timeout)
}

// run owns the session from attach to close. The Hub waits for it.
func (s *Session) run() {
	s.log.Info("device connected", zap.String("remote", s.info.RemoteAddr), zap.Bool("mcp", s.info.HasMCP))
	if !s.info.HasMCP {
		s.discard()
		s.finish()
		s.hub.wg.Done()
		return
	}
	stopKeepalive := func() {}
	if s.initialize() {
		stopKeepalive = s.startKeepalive()
	}
	// An idle board costs no goroutine here: the link calls back on close.
	s.link.AfterClose(func() {
		stopKeepalive() // before finish: no probe outlives the session
		s.finish()
		s.hub.wg.Done()
	})
}

// discard reads a board without MCP until its link closes. Its messages
// (listen, abort, ...) have no reader above, but the link must be drained
// anyway: a transport whose inbound queue fills stops reading its socket,
// and then stops answering pings.
func (s *Session) discard() {
	for {
		if _, err := s.link.Receive(context.Background()); err != nil {
			return
		}
		s.mu.Lock()
		s.ignored++
		s.mu.Unlock()
	}
}

// initialize runs initialize and tools/list, and reports whether the
// session became ready.
func (s *Session) initialize() bool {
	cfg := s.hub.cfg
	streamOpts := cfg.Stream
	streamOpts.Logger = s.log
	stream := envelope.NewStream(s.link, streamOpts)
	clientOpts := cfg.Client
	clientOpts.Logger = s.log.Named("mcp")
	clientOpts.OnNotification = s.fromBoard
	client := mcpclient.New(stream, clientOpts)

	s.mu.Lock()
	s.client, s.stream = client, stream
	s.info.State = StateInitializing
	s.mu.Unlock()

	select {
	case s.hub.inits <- struct{}{}:
	case <-s.link.Done():
		return false // the board left while waiting its turn; finish reports why
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.InitTimeout)
	defer cancel()
	start := time.Now()
	res, err := client.Initialize(ctx)
	var tools []Tool
	var refused []RefusedTool
	if err == nil {
		var listed []Tool
		listed, err = client.ListTools(ctx)
		tools, refused = s.intake(listed)
		if len(listed) > 0 && len(tools) == 0 {
			err = fmt.Errorf("%w: all %d of its tools, the first because %s", errAllRefused, len(listed), refused[0].Reason)
		}
	}
	<-s.hub.inits
	if err != nil {
		select {
		case <-s.link.Done():
			return false // the board left; finish reports why
		default:
		}
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("device did not finish initializing within %v: %w", cfg.InitTimeout, err)
		}
		s.mu.Lock()
		s.info.InitError = err.Error()
		s.info.RefusedTools = refused
		s.mu.Unlock()
		// The error may quote the board (its JSON-RPC error, a tool's name).
		s.hub.initFailedLog.Warn(s.log, "device initialization failed; closing its connection", clip.Error(err))
		s.link.Close(fmt.Errorf("%w: %w", errInitFailed, err))
		return false
	}

	s.mu.Lock()
	s.info.State = StateReady
	s.info.ReadyAt = time.Now()
	// Shown in every tool description and listing: cut like tool names.
	s.info.Board = cutUTF8(res.ServerInfo.Name, s.hub.cfg.ToolLimits.MaxNameBytes)
	s.info.FirmwareVersion = cutUTF8(res.ServerInfo.Version, s.hub.cfg.ToolLimits.MaxNameBytes)
	s.info.Tools = tools
	s.info.RefusedTools = refused
	s.mu.Unlock()
	close(s.ready)
	s.log.Info("device ready", clip.Field("board", res.ServerInfo.Name),
		clip.Field("firmware", res.ServerInfo.Version), zap.Int("tools", len(tools)),
		zap.Duration("took", time.Since(start)))
	s.hub.publishIfCurrent(s, EventOnline)
	return true
}

// errAllRefused: every tool a board listed is past ToolLimits; a board
// with nothing to offer is closed, with the reason, as if its
// initialization had failed.
var errAllRefused = errors.New("the bridge refused every tool the board listed")

// intake checks a board's tool list against the Hub's ToolLimits before
// anything else sees it, and says which tools it refused.
func (s *Session) intake(listed []Tool) ([]Tool, []RefusedTool) {
	tools, refused := CheckTools(listed, s.hub.cfg.ToolLimits)
	if len(refused) == 0 {
		return tools, nil
	}
	for _, r := range refused {
		s.log.Debug("board tool refused", clip.Field("tool", r.Name), clip.Field("reason", r.Reason))
	}
	s.hub.refusedLog.Warn(s.log, "board tools refused: past the bounds on what a board may declare (devices.tool_limits); "+
		"its other tools are offered", zap.Int("refused", len(refused)), zap.Int("offered", len(tools)),
		clip.Field("tool", refused[0].Name), clip.Field("reason", refused[0].Reason))
	// Info travels in every event and directory record: the first few
	// say what is wrong with the board.
	return tools, refused[:min(len(refused), maxRefusedShown):min(len(refused), maxRefusedShown)]
}

// RefuseTool withdraws a tool of a connected board that a layer above
// could not offer (the MCP server's last line of defence, should a tool
// pass intake and still make a library fail), recording why in
// Info.RefusedTools as intake does. The board's other tools stay; false
// when the board or the tool is not there.
func (h *Hub) RefuseTool(deviceID, tool, reason string) bool {
	s, ok := h.Session(deviceID)
	if !ok {
		return false
	}
	s.mu.Lock()
	i := slices.IndexFunc(s.info.Tools, func(t Tool) bool { return t.Name == tool })
	if i < 0 {
		s.mu.Unlock()
		return false
	}
	// Tools may be shared with earlier snapshots: never edit in place.
	s.info.Tools = slices.Delete(slices.Clone(s.info.Tools), i, i+1)
	s.schemas = nil
	if len(s.info.RefusedTools) < maxRefusedShown {
		s.info.RefusedTools = append(slices.Clip(s.info.RefusedTools), RefusedTool{Name: cutUTF8(tool, maxShownName), Reason: cutUTF8(reason, maxShownReason)})
	}
	s.mu.Unlock()
	h.refusedLog.Warn(s.log, "board tool withdrawn: it passed intake but could not be offered", zap.String("tool", cutUTF8(tool, maxShownName)),
		zap.String("reason", reason))
	h.publishIfCurrent(s, EventToolsChanged)
	return true
}

// maxRefusedShown bounds Info.RefusedTools.
const maxRefusedShown = 32

func (s *Session) finish() {
	s.mu.Lock()
	client := s.client
	s.info.State = StateClosed
	s.info.ClosedAt = time.Now()
	if err := s.link.Err(); err != nil {
		s.info.CloseReason = err.Error()
	} else {
		s.info.CloseReason = "closed"
	}
	s.info.CloseCause = CauseOf(s.link.Err())
	reason, cause := s.info.CloseReason, s.info.CloseCause
	connected := s.info.ConnectedAt
	ignored := s.ignored
	s.mu.Unlock()
	if client != nil {
		_ = client.Close() // fails anything still pending at once
	}
	close(s.done)
	st := s.Stats()
	s.log.Info("device disconnected", clip.Field("reason", reason), zap.String("cause", string(cause)),
		zap.Int64("ignored_messages", ignored),
		zap.Duration("connected_for", time.Since(connected)),
		zap.Int64("mcp_in", st.MCPIn), zap.Int64("mcp_out", st.MCPOut),
		zap.Int64("other_messages", st.Other), zap.Int64("dropped", st.Dropped))
	if obs := s.hub.cfg.Observer; obs != nil {
		obs.SessionClosed(s.Info())
	}
	s.hub.remove(s)
}
