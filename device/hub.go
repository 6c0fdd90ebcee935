package device

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/envelope"
	"github.com/devicebridge/devicebridge/mcpclient"
)

// Defaults for HubConfig.
const (
	// DefaultInitTimeout bounds initialize plus every tools/list page.
	DefaultInitTimeout = 60 * time.Second
	// DefaultReadyWait is how long a call waits for a board that is still
	// initializing before it fails with ErrNotReady.
	DefaultReadyWait = 15 * time.Second
)

// HubConfig configures a Hub. The zero value is usable.
type HubConfig struct {
	// Client configures each board's MCP client (its Logger is set per
	// session).
	Client mcpclient.Options
	// Stream configures each board's envelope stream.
	Stream      envelope.StreamOptions
	InitTimeout time.Duration
	ReadyWait   time.Duration
	// SubscriptionBuffer bounds each subscriber's backlog.
	SubscriptionBuffer int
}

// Hub holds one Session per board.
type Hub struct {
	cfg HubConfig
	log *zap.Logger

	mu       sync.Mutex
	sessions map[string]*Session
	subs     map[*Subscription]struct{}
	gen      uint64
	closed   bool
	wg       sync.WaitGroup // one per running session
}

// NewHub creates an empty Hub. logger may be nil.
func NewHub(cfg HubConfig, logger *zap.Logger) *Hub {
	if cfg.InitTimeout <= 0 {
		cfg.InitTimeout = DefaultInitTimeout
	}
	if cfg.ReadyWait <= 0 {
		cfg.ReadyWait = DefaultReadyWait
	}
	if cfg.SubscriptionBuffer <= 0 {
		cfg.SubscriptionBuffer = DefaultSubscriptionBuffer
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	return &Hub{cfg: cfg, log: logger, sessions: map[string]*Session{}, subs: map[*Subscription]struct{}{}}
}

// Attach starts a session for a board whose handshake is done. A session
// already open for the same device id is closed with ErrReplaced first.
func (h *Hub) Attach(link Link, id Identity) (*Session, error) {
	if id.DeviceID == "" {
		link.Close(errors.New("no device id"))
		return nil, errors.New("device: attach without a device id")
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		link.Close(ErrShutdown)
		return nil, ErrHubClosed
	}
	h.gen++
	s := &Session{
		hub:   h,
		link:  link,
		log:   h.log.With(zap.String("device_id", id.DeviceID), zap.String("transport", id.Transport)),
		info:  Info{Identity: id, State: StateConnected, ConnectedAt: time.Now(), Generation: h.gen},
		ready: make(chan struct{}),
		done:  make(chan struct{}),
	}
	old := h.sessions[id.DeviceID]
	h.sessions[id.DeviceID] = s
	if old != nil {
		gone := old.Info()
		gone.State, gone.CloseReason = StateClosed, ErrReplaced.Error()
		h.publishLocked(Event{Type: EventOffline, DeviceID: id.DeviceID, Info: gone})
	}
	h.wg.Add(1)
	h.mu.Unlock()

	if old != nil {
		old.log.Info("device reconnected; closing the older session")
		old.link.Close(ErrReplaced)
	}
	go s.run()
	return s, nil
}

// Session returns the current session of a device.
func (h *Hub) Session(deviceID string) (*Session, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.sessions[deviceID]
	return s, ok
}

// Devices returns a snapshot of every current session, sorted by device id.
func (h *Hub) Devices() []Info {
	h.mu.Lock()
	list := make([]*Session, 0, len(h.sessions))
	for _, s := range h.sessions {
		list = append(list, s)
	}
	h.mu.Unlock()
	out := make([]Info, 0, len(list))
	for _, s := range list {
		out = append(out, s.Info())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].DeviceID < out[j].DeviceID })
	return out
}

// CallTool calls a tool on a device, waiting (up to ReadyWait, and within
// ctx) for a board that is still initializing. If the board reconnects while
// the call waits, the call follows it to the new session.
func (h *Hub) CallTool(ctx context.Context, deviceID, tool string, args json.RawMessage) (*mcpclient.CallResult, error) {
	s, err := h.readySession(ctx, deviceID)
	if err != nil {
		return nil, err
	}
	return s.CallTool(ctx, tool, args)
}

func (h *Hub) readySession(ctx context.Context, deviceID string) (*Session, error) {
	waitCtx, cancel := context.WithTimeout(ctx, h.cfg.ReadyWait)
	defer cancel()
	for attempt := 0; ; attempt++ {
		s, ok := h.Session(deviceID)
		if !ok {
			return nil, fmt.Errorf("%w: %s", ErrUnknownDevice, deviceID)
		}
		err := s.WaitReady(waitCtx)
		switch {
		case err == nil:
			return s, nil
		case errors.Is(err, ErrOffline) && attempt < 3:
			if next, ok := h.Session(deviceID); ok && next != s {
				continue // replaced: follow the newer session
			}
			return nil, err
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.Is(err, context.DeadlineExceeded):
			return nil, fmt.Errorf("%w: still %s after %v", ErrNotReady, s.Info().State, h.cfg.ReadyWait)
		default:
			return nil, err
		}
	}
}

// Subscribe returns a subscription to the Hub's events. Close it when done.
func (h *Hub) Subscribe() *Subscription {
	sub := &Subscription{hub: h, max: h.cfg.SubscriptionBuffer, signal: make(chan struct{}, 1)}
	h.mu.Lock()
	h.subs[sub] = struct{}{}
	h.mu.Unlock()
	return sub
}

func (h *Hub) unsubscribe(sub *Subscription) {
	h.mu.Lock()
	delete(h.subs, sub)
	h.mu.Unlock()
}

// publishIfCurrent publishes an event about s unless a newer session has
// replaced it, under the Hub lock so events stay in order with Attach.
func (h *Hub) publishIfCurrent(s *Session, t EventType) {
	info := s.Info()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sessions[info.DeviceID] == s {
		h.publishLocked(Event{Type: t, DeviceID: info.DeviceID, Info: info})
	}
}

func (h *Hub) publishLocked(ev Event) {
	for sub := range h.subs {
		sub.push(ev)
	}
}

// remove forgets a closed session, publishing EventOffline if it was still
// the device's current one (a replaced session was announced by Attach).
func (h *Hub) remove(s *Session) {
	info := s.Info()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sessions[info.DeviceID] == s {
		delete(h.sessions, info.DeviceID)
		h.publishLocked(Event{Type: EventOffline, DeviceID: info.DeviceID, Info: info})
	}
}

// Close closes every session with ErrShutdown and waits for them to end,
// or for ctx. Later Attach calls fail with ErrHubClosed.
func (h *Hub) Close(ctx context.Context) error {
	h.mu.Lock()
	h.closed = true
	list := make([]*Session, 0, len(h.sessions))
	for _, s := range h.sessions {
		list = append(list, s)
	}
	h.mu.Unlock()
	for _, s := range list {
		s.link.Close(ErrShutdown)
	}
	done := make(chan struct{})
	go func() { h.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("device hub: sessions still closing: %w", ctx.Err())
	}
}
