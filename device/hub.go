package device

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device/internal/mcpclient"
	"github.com/devicebridge/devicebridge/envelope"
	"github.com/devicebridge/devicebridge/internal/logthrottle"
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
	// Flapping decides when two live connections that keep replacing each
	// other under one device id are stopped.
	Flapping FlapPolicy
	// Observer, when set, is told about sessions and calls (for metrics).
	Observer Observer
	// MaxProbes bounds keepalive probes in flight across all sessions (see
	// KeepaliveLink); 0 means DefaultMaxProbes.
	MaxProbes int
	// MaxInitializing bounds boards exchanging initialize and tools/list
	// at once; others wait their turn (their InitTimeout starts with it).
	// It keeps a burst of thousands of boards (a restart, a power cut)
	// from flooding the transport with replies all at once: the MQTT
	// gateway's queue at the broker, in particular. 0 means
	// DefaultMaxInitializing.
	MaxInitializing int
	// ToolLimits bound what a board may declare about each tool (see
	// ToolLimits); zero fields take the defaults.
	ToolLimits ToolLimits
	// EventHistory is how many recent events the Hub keeps so that a
	// subscriber can resume after the last one it saw (SubscribeAfter); 0
	// keeps none. With a history, call outcomes are recorded even while
	// no subscriber asks for them.
	EventHistory int
	// PeerMaxPending bounds the requests of a peer MCP client (see
	// Session.ServePeer) admitted at once on one board, queued or running;
	// past it the peer is refused at once. 0 means DefaultPeerMaxPending.
	// It is held to half the board's places (Client.QueueSize+1, the one
	// running included), so that the bridge's own calls always keep the
	// other half.
	PeerMaxPending int
}

// DefaultPeerMaxPending is HubConfig.PeerMaxPending's default.
const DefaultPeerMaxPending = 4

// DefaultMaxInitializing is HubConfig.MaxInitializing's default.
const DefaultMaxInitializing = 64

// FlapPolicy: when a live session is replaced more than Limit times within
// Window, the next newcomers with that device id are refused for Backoff
// (doubling while the flapping goes on, up to 16×). A board that merely
// reconnects after losing its connection replaces a dead session, which
// never counts.
type FlapPolicy struct {
	Limit   int           `yaml:"limit"`
	Window  time.Duration `yaml:"window"`
	Backoff time.Duration `yaml:"backoff"`
}

// Defaults for FlapPolicy.
const (
	DefaultFlapLimit   = 3
	DefaultFlapWindow  = time.Minute
	DefaultFlapBackoff = 30 * time.Second
)

// Observer receives what the Hub does. Calls happen on the Hub's paths, so
// implementations must be quick and must not call back into the Hub.
type Observer interface {
	// SessionOpened: a board attached.
	SessionOpened(id Identity)
	// SessionClosed: a session ended; info carries CloseCause.
	SessionClosed(info Info)
	// CallDone: a tool call ended; code is "" on success.
	CallDone(transport string, code Code, took time.Duration)
}

// Hub holds one Session per board.
type Hub struct {
	cfg HubConfig
	log *zap.Logger

	mu       sync.Mutex
	sessions map[string]*Session
	subs     map[*Subscription]struct{}
	// callSubs counts subscriptions that receive EventCall, so calls skip
	// the lock while nobody listens.
	callSubs atomic.Int32
	// seq numbers the published events (Event.Seq); epoch names this Hub's
	// numbering (Epoch); history holds the last EventHistory of them.
	seq     uint64
	epoch   string
	history eventRing
	gen     uint64
	closed  bool
	wg      sync.WaitGroup // one per running session and per keepalive loop
	// flaps tracks device ids whose live sessions keep being replaced;
	// stale entries are swept and the map is capped (maxFlapStates), as a
	// board with auth off may name itself with any MAC.
	flaps map[string]*flapState
	// replaceLog and flapLog throttle the replacement warnings: any board
	// can claim a connected board's MAC again and again.
	replaceLog, flapLog logthrottle.Throttle
	// probes holds one token per keepalive probe in flight.
	probes chan struct{}
	// remote is the rest of the fleet (see SetRemote); nil for one node.
	remote atomic.Pointer[remoteBox]
	// results is told about every successful call (see OnResult).
	results atomic.Pointer[func(deviceID, tool string, res *CallResult)]
	// inits holds one token per board initializing (MaxInitializing).
	inits chan struct{}
	// refusedLog throttles the warning about refused tools: a board can
	// reconnect and list them again at will; initFailedLog the warning
	// about a failed initialization, the same way.
	refusedLog, initFailedLog logthrottle.Throttle

	// draining ends when Drain is called: calls in flight are answered
	// with ErrShutdown and new ones refused.
	draining context.Context
	drain    context.CancelCauseFunc
}

type flapState struct {
	replaced     []time.Time // recent replacements of a live session
	refusedUntil time.Time
	strikes      int // consecutive back-offs, doubling the next
}

// maxFlapStates caps the flap guard's memory. An entry lives for a window
// (and a back-off) after a replacement, so the map only fills when
// outsiders replace thousands of boards a minute; past the cap the guard
// stops tracking new ids (replacements still work) and says so.
const maxFlapStates = 1 << 16

// stale: nothing recent to remember, and no refusal or strike that still
// matters (strikes are forgiven after a quiet window, as below).
func (f *flapState) stale(now time.Time, window time.Duration) bool {
	recent := len(f.replaced) > 0 && now.Sub(f.replaced[len(f.replaced)-1]) <= window
	return !recent && now.After(f.refusedUntil.Add(window))
}

// sweepFlapsLocked drops stale entries, once the map holds more of them
// than the live sessions account for (so the sweep's cost is amortized).
func (h *Hub) sweepFlapsLocked(now time.Time) {
	if len(h.flaps) < len(h.sessions)+1024 {
		return
	}
	for id, f := range h.flaps {
		if f.stale(now, h.cfg.Flapping.Window) {
			delete(h.flaps, id)
		}
	}
}

// withDefaults returns c with unset fields set to their defaults.
func (c HubConfig) withDefaults() HubConfig {
	c.Flapping.Limit = cmp.Or(c.Flapping.Limit, DefaultFlapLimit)
	c.Flapping.Window = cmp.Or(c.Flapping.Window, DefaultFlapWindow)
	c.Flapping.Backoff = cmp.Or(c.Flapping.Backoff, DefaultFlapBackoff)
	// max(x, 0): a negative value here has always meant the default too.
	c.InitTimeout = cmp.Or(max(c.InitTimeout, 0), DefaultInitTimeout)
	c.ReadyWait = cmp.Or(max(c.ReadyWait, 0), DefaultReadyWait)
	c.SubscriptionBuffer = cmp.Or(max(c.SubscriptionBuffer, 0), DefaultSubscriptionBuffer)
	c.MaxProbes = cmp.Or(max(c.MaxProbes, 0), DefaultMaxProbes)
	c.MaxInitializing = cmp.Or(max(c.MaxInitializing, 0), DefaultMaxInitializing)
	c.ToolLimits = c.ToolLimits.WithDefaults()
	slots := cmp.Or(max(c.Client.QueueSize, 0), mcpclient.DefaultQueueSize) + 1
	c.PeerMaxPending = min(cmp.Or(max(c.PeerMaxPending, 0), DefaultPeerMaxPending), max(slots/2, 1))
	return c
}

// NewHub creates an empty Hub. logger may be nil.
func NewHub(cfg HubConfig, logger *zap.Logger) *Hub {
	cfg = cfg.withDefaults()
	if logger == nil {
		logger = zap.NewNop()
	}
	h := &Hub{cfg: cfg, log: logger, sessions: map[string]*Session{}, subs: map[*Subscription]struct{}{},
		flaps: map[string]*flapState{}, probes: make(chan struct{}, cfg.MaxProbes),
		inits: make(chan struct{}, cfg.MaxInitializing), epoch: newEpoch(),
		history: eventRing{buf: make([]Event, 0, max(cfg.EventHistory, 0))}}
	h.draining, h.drain = context.WithCancelCause(context.Background())
	return h
}

// Attach starts a session for a board whose handshake is done. A session
// already open for the same device id is closed with ErrReplaced first,
// unless the two have been replacing each other (see FlapPolicy): then the
// newcomer is refused with ErrFlapping and the current session stays.
//
// Transports hand over ids already checked (BoardID); a MAC is keyed in
// its canonical form here too, so that no spelling of it can sit beside
// the board as a second one.
func (h *Hub) Attach(link Link, id Identity) (*Session, error) {
	id.DeviceID = NormalizeID(id.DeviceID)
	if id.DeviceID == "" {
		link.Close(errors.New("no device id"))
		return nil, errors.New("device: attach without a device id")
	}
	h.mu.Lock()
	if h.closed || h.draining.Err() != nil {
		h.mu.Unlock()
		link.Close(ErrShutdown)
		return nil, ErrHubClosed
	}
	old := h.sessions[id.DeviceID]
	if old != nil {
		if err := h.checkFlapLocked(old, id); err != nil {
			h.mu.Unlock()
			link.Close(err)
			return nil, err
		}
	}
	h.gen++
	s := &Session{
		hub:   h,
		link:  link,
		log:   h.log.WithLazy(zap.String("device_id", id.DeviceID), zap.String("transport", id.Transport)),
		info:  Info{Identity: id, State: StateConnected, ConnectedAt: time.Now(), Generation: h.gen},
		ready: make(chan struct{}),
		done:  make(chan struct{}),
	}
	h.sessions[id.DeviceID] = s
	if old != nil {
		gone := old.Info()
		gone.State, gone.CloseReason, gone.CloseCause = StateClosed, ErrReplaced.Error(), CauseReplaced
		h.publishLocked(Event{Type: EventOffline, DeviceID: id.DeviceID, Info: gone})
	}
	h.wg.Add(1)
	h.mu.Unlock()

	if h.cfg.Observer != nil {
		h.cfg.Observer.SessionOpened(id)
	}
	if old != nil {
		old.link.Close(ErrReplaced)
	}
	go s.run()
	return s, nil
}

// checkFlapLocked decides whether a newcomer may replace the live or dead
// session old. Replacing a dead session (a board back after losing its
// link) is always fine; replacing a live one is logged as a warning naming
// both ends, and refused once it happens too often.
func (h *Hub) checkFlapLocked(old *Session, id Identity) error {
	select {
	case <-old.link.Done():
		old.log.Info("device reconnected; its previous connection had already closed")
		return nil
	default:
	}
	now := time.Now()
	p := h.cfg.Flapping
	f := h.flaps[id.DeviceID]
	if f == nil {
		h.sweepFlapsLocked(now)
		if len(h.flaps) >= maxFlapStates {
			h.flapLog.Warn(h.log, "the flap guard tracks as many device ids as it may; this replacement is not counted",
				zap.String("device_id", id.DeviceID), zap.Int("tracked", len(h.flaps)))
			return nil
		}
		f = &flapState{}
		h.flaps[id.DeviceID] = f
	}
	oldAddr := old.Info().RemoteAddr
	if now.Before(f.refusedUntil) {
		h.log.Debug("refusing a connection for a flapping device id", zap.String("device_id", id.DeviceID),
			zap.String("remote", id.RemoteAddr), zap.Time("until", f.refusedUntil))
		return fmt.Errorf("%w: %s is held by %s; retry after %s", ErrFlapping, id.DeviceID, oldAddr,
			f.refusedUntil.Format(time.RFC3339))
	}
	f.replaced = slices.DeleteFunc(f.replaced, func(t time.Time) bool { return now.Sub(t) > p.Window })
	f.replaced = append(f.replaced, now)
	if len(f.replaced) > p.Limit {
		backoff := p.Backoff << min(f.strikes, 4)
		f.strikes++
		f.refusedUntil = now.Add(backoff)
		f.replaced = f.replaced[:0]
		h.flapLog.Warn(h.log, "two live connections keep replacing each other under one device id (a cloned MAC, or a board "+
			"reconnecting through two networks); refusing newcomers for a while",
			zap.String("device_id", id.DeviceID), zap.String("kept_remote", oldAddr),
			zap.String("refused_remote", id.RemoteAddr), zap.Duration("backoff", backoff))
		return fmt.Errorf("%w: %s is held by %s; retry in %v", ErrFlapping, id.DeviceID, oldAddr, backoff)
	}
	if len(f.replaced) == 1 && now.After(f.refusedUntil.Add(p.Window)) {
		f.strikes = 0 // quiet for a while: forgive earlier back-offs
	}
	h.replaceLog.Warn(h.log, "a second live connection claims this device id; replacing the older one",
		zap.String("device_id", id.DeviceID), zap.String("old_remote", oldAddr),
		zap.String("new_remote", id.RemoteAddr), zap.String("old_transport", old.info.Transport),
		zap.String("new_transport", id.Transport))
	return nil
}

// Session returns the current session of a device, named by its id (a
// MAC in any spelling).
func (h *Hub) Session(deviceID string) (*Session, bool) {
	deviceID = NormalizeID(deviceID)
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.sessions[deviceID]
	return s, ok
}

// Sessions returns every current session, sorted by device id, for
// callers that need more than the Info snapshot (for example Pending).
func (h *Hub) Sessions() []*Session {
	h.mu.Lock()
	list := make([]*Session, 0, len(h.sessions))
	for _, s := range h.sessions {
		list = append(list, s)
	}
	h.mu.Unlock()
	sort.Slice(list, func(i, j int) bool { return list[i].info.DeviceID < list[j].info.DeviceID })
	return list
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
	out = h.withRemote(out)
	sort.Slice(out, func(i, j int) bool { return out[i].DeviceID < out[j].DeviceID })
	return out
}

// CallTool calls a tool on a device, waiting (up to ReadyWait, and within
// ctx) for a board that is still initializing. If the board reconnects while
// the call waits, the call follows it to the new session.
//
// While the Hub drains (see Drain), calls are refused, and calls in flight
// return at once with an error wrapping ErrShutdown.
func (h *Hub) CallTool(ctx context.Context, deviceID, tool string, args json.RawMessage) (*CallResult, error) {
	return h.call(ctx, deviceID, tool, args, true)
}

// OnResult has f told about every call through the Hub that returned a
// result (CallTool and CallLocal, whoever the caller: /mcp, the control API,
// interactions, another node), after the call and with no lock held; nil
// stops it. There is one such observer (the upstream MCP server keeps each
// board's last status from it); f must be quick, must not modify res, and
// must not call back into the Hub.
func (h *Hub) OnResult(f func(deviceID, tool string, res *CallResult)) {
	if f == nil {
		h.results.Store(nil)
		return
	}
	h.results.Store(&f)
}

func (h *Hub) call(ctx context.Context, deviceID, tool string, args json.RawMessage, remote bool) (*CallResult, error) {
	deviceID = NormalizeID(deviceID)
	start := time.Now()
	transport := ""
	res, err := h.callTool(ctx, deviceID, tool, args, &transport, remote)
	took, code := time.Since(start), CodeOf(err)
	if h.cfg.Observer != nil {
		h.cfg.Observer.CallDone(transport, code, took)
	}
	if f := h.results.Load(); f != nil && err == nil && res != nil {
		(*f)(deviceID, tool, res)
	}
	if h.callSubs.Load() > 0 || h.cfg.EventHistory > 0 {
		h.mu.Lock()
		h.publishLocked(Event{Type: EventCall, DeviceID: deviceID,
			Call: CallOutcome{Transport: transport, Tool: tool, Code: code, Duration: took}})
		h.mu.Unlock()
	}
	return res, err
}

func (h *Hub) callTool(ctx context.Context, deviceID, tool string, args json.RawMessage, transport *string, remote bool) (*CallResult, error) {
	if h.draining.Err() != nil {
		return nil, fmt.Errorf("%w: %s was not sent", ErrShutdown, tool)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(h.draining, func() { cancel(ErrShutdown) })
	defer stop()

	if info, ok := h.remoteDevice(deviceID, remote); ok {
		*transport = info.Transport
		mcpclient.Report(ctx, mcpclient.StageForwarded, 0)
		res, err := h.remoteOf().CallTool(ctx, info, tool, args)
		if err != nil && errors.Is(context.Cause(ctx), ErrShutdown) && !errors.Is(err, ErrShutdown) {
			return nil, cutOff(tool, err)
		}
		return res, err
	}
	s, err := h.readySession(ctx, deviceID)
	if err == nil {
		*transport = s.info.Transport
		var res *CallResult
		res, err = s.CallTool(ctx, tool, args)
		if err == nil {
			return res, nil
		}
	}
	if errors.Is(context.Cause(ctx), ErrShutdown) && !errors.Is(err, ErrShutdown) {
		return nil, cutOff(tool, err)
	}
	return nil, err
}

// cutOff is the error of a call that shutdown cut off while it ran, err
// being what the call returned: "bridge shutting down while self.x ran;
// its outcome is unknown". err stays in the chain (errors.Is), and in the
// text unless it is only the cancellation itself ("context canceled"),
// which would tell the caller nothing.
func cutOff(tool string, err error) error {
	msg := fmt.Sprintf("%v while %s ran; its outcome is unknown", ErrShutdown, tool)
	if !errors.Is(err, context.Canceled) {
		msg += ": " + err.Error()
	}
	return &cutOffError{msg: msg, err: err}
}

type cutOffError struct {
	msg string
	err error
}

func (e *cutOffError) Error() string   { return e.msg }
func (e *cutOffError) Unwrap() []error { return []error{ErrShutdown, e.err} }

// Drain starts shutting down: new calls and new boards are refused, and
// every call in flight returns at once with an error wrapping ErrShutdown,
// so callers get an answer instead of waiting for their boards. Sessions
// stay open until Close. It is idempotent.
func (h *Hub) Drain() {
	h.drain(ErrShutdown)
}

func (h *Hub) readySession(ctx context.Context, deviceID string) (*Session, error) {
	waitCtx, cancel := context.WithTimeout(ctx, h.cfg.ReadyWait)
	defer cancel()
	for attempt := 0; ; attempt++ {
		s, ok := h.Session(deviceID)
		if !ok {
			return nil, fmt.Errorf("%w: %s", ErrUnknownDevice, deviceID)
		}
		select {
		case <-s.ready:
		case <-s.done:
		default:
			if attempt == 0 {
				mcpclient.Report(ctx, mcpclient.StageWaitReady, 0)
			}
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

// Subscribe returns a subscription to the Hub's board events. Close it
// when done.
func (h *Hub) Subscribe() *Subscription { return h.SubscribeWith(SubscribeOptions{}) }

// SubscribeWith returns a subscription to the Hub's events, with call
// outcomes too if opts ask for them. Close it when done.
func (h *Hub) SubscribeWith(opts SubscribeOptions) *Subscription {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.subscribeLocked(opts)
}

// subscribeLocked registers a new subscription (h.mu held).
func (h *Hub) subscribeLocked(opts SubscribeOptions) *Subscription {
	sub := &Subscription{hub: h, calls: opts.Calls, max: h.cfg.SubscriptionBuffer, signal: make(chan struct{}, 1)}
	h.subs[sub] = struct{}{}
	if sub.calls {
		h.callSubs.Add(1)
	}
	return sub
}

func (h *Hub) unsubscribe(sub *Subscription) {
	h.mu.Lock()
	if _, ok := h.subs[sub]; ok {
		delete(h.subs, sub)
		if sub.calls {
			h.callSubs.Add(-1)
		}
	}
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

// PublishVoice records a relayed conversation's change in the event feed.
func (h *Hub) PublishVoice(deviceID string, n VoiceNote) {
	if h.callSubs.Load() == 0 && h.cfg.EventHistory <= 0 {
		return // nobody would see it
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.publishLocked(Event{Type: EventVoice, DeviceID: deviceID, Voice: n})
}

func (h *Hub) publishLocked(ev Event) {
	h.seq++
	ev.Seq = h.seq
	ev.At = time.Now()
	h.history.add(ev)
	for sub := range h.subs {
		if ev.activity() && !sub.calls {
			continue
		}
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
	h.Drain()
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
