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

	"github.com/devicebridge/devicebridge/envelope"
	"github.com/devicebridge/devicebridge/mcpclient"
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

// CallTool runs one board tool. The session must be ready.
func (s *Session) CallTool(ctx context.Context, name string, args json.RawMessage) (*mcpclient.CallResult, error) {
	c, err := s.readyClient()
	if err != nil {
		return nil, err
	}
	res, err := c.CallTool(ctx, name, args)
	if errors.Is(err, mcpclient.ErrDisconnected) {
		// Say why the link went, e.g. "connection to the MQTT broker lost".
		if reason := s.link.Err(); reason != nil {
			return nil, fmt.Errorf("%w (%v): %w", ErrOffline, reason, err)
		}
		return nil, fmt.Errorf("%w: %w", ErrOffline, err)
	}
	return res, err
}

// Call sends a raw request to the board (for example a liveness probe).
func (s *Session) Call(ctx context.Context, method string, params any, timeout time.Duration) (json.RawMessage, error) {
	c, err := s.readyClient()
	if err != nil {
		return nil, err
	}
	return c.Call(ctx, method, params, timeout)
}

// Refresh lists the board's tools again and publishes EventToolsChanged if
// they differ from what the session had.
func (s *Session) Refresh(ctx context.Context) error {
	c, err := s.readyClient()
	if err != nil {
		return err
	}
	tools, err := c.ListTools(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	changed := !toolsEqual(s.info.Tools, tools)
	if changed {
		s.info.Tools = tools
	}
	s.mu.Unlock()
	if changed {
		s.log.Info("device tools changed", zap.Int("tools", len(tools)))
		s.hub.publishIfCurrent(s, EventToolsChanged)
	}
	return nil
}

func toolsEqual(a, b []mcpclient.Tool) bool {
	return slices.EqualFunc(a, b, func(x, y mcpclient.Tool) bool {
		return x.Name == y.Name && x.Description == y.Description &&
			string(x.InputSchema) == string(y.InputSchema) && string(x.Annotations) == string(y.Annotations)
	})
}

// run owns the session from attach to close. The Hub waits for it.
func (s *Session) run() {
	defer s.hub.wg.Done()
	s.log.Info("device connected", zap.String("remote", s.info.RemoteAddr), zap.Bool("mcp", s.info.HasMCP))
	if s.info.HasMCP {
		s.initialize()
	}
	<-s.link.Done()
	s.finish()
}

func (s *Session) initialize() {
	cfg := s.hub.cfg
	streamOpts := cfg.Stream
	streamOpts.Logger = s.log
	stream := envelope.NewStream(s.link, streamOpts)
	clientOpts := cfg.Client
	clientOpts.Logger = s.log.Named("mcp")
	client := mcpclient.New(stream, clientOpts)

	s.mu.Lock()
	s.client, s.stream = client, stream
	s.info.State = StateInitializing
	s.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), cfg.InitTimeout)
	defer cancel()
	start := time.Now()
	res, err := client.Initialize(ctx)
	var tools []mcpclient.Tool
	if err == nil {
		tools, err = client.ListTools(ctx)
	}
	if err != nil {
		select {
		case <-s.link.Done():
			return // the board left; finish reports why
		default:
		}
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("device did not finish initializing within %v: %w", cfg.InitTimeout, err)
		}
		s.mu.Lock()
		s.info.InitError = err.Error()
		s.mu.Unlock()
		s.log.Warn("device initialization failed; closing its connection", zap.Error(err))
		s.link.Close(fmt.Errorf("initialization failed: %w", err))
		return
	}

	s.mu.Lock()
	s.info.State = StateReady
	s.info.ReadyAt = time.Now()
	s.info.Board = res.ServerInfo.Name
	s.info.FirmwareVersion = res.ServerInfo.Version
	s.info.Tools = tools
	s.mu.Unlock()
	close(s.ready)
	s.log.Info("device ready", zap.String("board", res.ServerInfo.Name),
		zap.String("firmware", res.ServerInfo.Version), zap.Int("tools", len(tools)),
		zap.Duration("took", time.Since(start)))
	s.hub.publishIfCurrent(s, EventOnline)
}

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
	reason := s.info.CloseReason
	connected := s.info.ConnectedAt
	s.mu.Unlock()
	if client != nil {
		_ = client.Close() // fails anything still pending at once
	}
	close(s.done)
	st := s.Stats()
	s.log.Info("device disconnected", zap.String("reason", reason),
		zap.Duration("connected_for", time.Since(connected)),
		zap.Int64("mcp_in", st.MCPIn), zap.Int64("mcp_out", st.MCPOut),
		zap.Int64("other_messages", st.Other), zap.Int64("dropped", st.Dropped))
	s.hub.remove(s)
}
