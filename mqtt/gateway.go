package mqtt

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device"
)

// TransportName is the device.Identity transport of MQTT boards.
const TransportName = "mqtt"

// Close reasons and errors of the MQTT side. Test with errors.Is.
var (
	// ErrBrokerConnectionLost closes every board's link when the bridge
	// loses its broker connection, so pending calls fail at once instead of
	// waiting for their timeouts.
	ErrBrokerConnectionLost = errors.New("connection to the MQTT broker lost")
	// ErrBrokerUnavailable is returned by sends while the bridge is not
	// connected to the broker.
	ErrBrokerUnavailable = errors.New("not connected to the MQTT broker")
	// ErrBoardDisconnected: the embedded broker reported that the board's
	// MQTT connection ended.
	ErrBoardDisconnected = errors.New("board disconnected from the MQTT broker")
	// ErrBoardReconnected: the board opened a new MQTT connection; the
	// session on the old one ends.
	ErrBoardReconnected = errors.New("board reconnected to the MQTT broker")
	// ErrUnresponsive: the board stopped answering liveness probes. The
	// device Session probes and closes; this is its sentinel.
	ErrUnresponsive = device.ErrUnresponsive
	// ErrNoAudioSession: the board has no open audio session to end.
	ErrNoAudioSession = errors.New("board has no open audio session")
	// ErrGatewayClosed: the gateway is shutting down or was never started.
	ErrGatewayClosed = errors.New("mqtt gateway closed")
)

// Board is one board connection as a presence source reports it.
type Board struct {
	// DeviceID is the board's MAC (lowercase, colons): the Hub key.
	DeviceID string
	// Key is the {mac} value of its topics (DeviceID with "_" for ":").
	Key string
	// UUID is the board's Client-Id, when its client id carries one.
	UUID string
	// ClientID is its MQTT client id.
	ClientID string
	// RemoteAddr is the board's address; LocalAddr is the address it
	// reached the broker on (a good UDP address to advertise back).
	RemoteAddr, LocalAddr string
	// Gen increases with every connection, so a reconnect is visible even
	// between two looks at the list.
	Gen uint64
}

// Presence is a source of truth about which boards are connected right
// now: the embedded broker implements it. Without one the gateway learns of
// a board when it first publishes, and its links ask the device Session to
// probe idle boards for liveness (see device.KeepaliveLink).
type Presence interface {
	// Boards lists the connected boards.
	Boards() []Board
	// Board looks one up by device id.
	Board(deviceID string) (Board, bool)
	// Changed is signalled (coalesced, never blocking the sender) whenever
	// the list changes. It has one reader: the gateway.
	Changed() <-chan struct{}
}

// Stats are the gateway's counters since it started.
type Stats struct {
	Connected bool
	// Connects counts successful broker connections (1 + reconnects).
	Connects int64
	Links    int
	// MessagesIn counts uplink messages accepted; MessagesOut downlink
	// publishes completed.
	MessagesIn, MessagesOut int64
	// Dropped uplink messages, by reason.
	Oversized, Malformed, InboxFull, UnknownTopic, Unattributed int64
	// Other counts valid non-MCP messages (listen, abort, ...).
	Other                             int64
	Hellos, BadHellos                 int64
	GoodbyesIn, GoodbyesOut           int64
	Probes, ProbeMisses, Unresponsive int64
	Discovered, Recovered, Reconciled int64
	UDP                               UDPStats
}

type counters struct {
	connects, in, out                                        atomic.Int64
	oversized, malformed, inboxFull, unknownTopic, unattrib  atomic.Int64
	other, hellos, badHellos, goodbyesIn, goodbyesOut        atomic.Int64
	probes, probeMisses, unresponsive, discovered, recovered atomic.Int64
	reconciled                                               atomic.Int64
}

// AudioSession describes a board's open audio session.
type AudioSession struct {
	ID      string
	SSRC    uint32
	Packets int64
	Bytes   int64
}

// discovery is an uplink message from a board without a live link.
type discovery struct {
	deviceID, key string
	payload       []byte
}

// Gateway connects the bridge to an MQTT broker with paho and turns each
// board's topics into a device.Link attached to the Hub. The same code runs
// against the embedded broker and an external one.
//
// Goroutines: paho's own; the supervisor (connection changes, presence,
// discovery, recovery); the UDP reader; and one per board link. Close
// waits for all of them. Liveness probes belong to each board's device
// Session, which the Hub waits for.
type Gateway struct {
	cfg      Config
	hub      *device.Hub
	presence Presence
	log      *zap.Logger
	up, down Template
	client   paho.Client
	udp      *udpServer
	defHost  string // UDP host advertised when the board gives no hint

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	links  map[string]*link
	closed bool

	discover chan discovery
	wake     chan struct{}
	ready    chan struct{}
	readyMu  sync.Once

	connects, losses atomic.Int64 // bumped by paho's handlers
	failing          atomic.Bool  // a connect attempt failed since the last success

	stats counters

	// Supervisor-owned state (only the supervisor goroutine touches it).
	handledLosses int64
	subscribedAt  int64 // value of connects when the last subscribe succeeded
	subscribed    bool
	attemptedGen  map[string]uint64
	lastDiscovery map[string]time.Time
	recovering    map[string]*recovery
	recoverUntil  time.Time
}

type recovery struct {
	next    time.Time
	backoff time.Duration
}

// NewGateway prepares a gateway; nothing connects until Start. presence
// may be nil (external broker).
func NewGateway(cfg Config, hub *device.Hub, presence Presence, logger *zap.Logger) (*Gateway, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	if cfg.ClientID == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		cfg.ClientID = "devicebridge-" + hex.EncodeToString(b[:])
	}
	g := &Gateway{
		cfg:           cfg,
		hub:           hub,
		presence:      presence,
		log:           logger,
		up:            MustTemplate(cfg.Topics.Uplink),
		down:          MustTemplate(cfg.Topics.Downlink),
		links:         map[string]*link{},
		discover:      make(chan discovery, DefaultDiscoveryQueue),
		wake:          make(chan struct{}, 1),
		ready:         make(chan struct{}),
		attemptedGen:  map[string]uint64{},
		lastDiscovery: map[string]time.Time{},
		recovering:    map[string]*recovery{},
	}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	return g, nil
}

// Start binds the UDP audio socket and starts connecting to the broker in
// the background (paho retries until it succeeds or Close). Use WaitReady
// to wait for the first connection and subscription.
func (g *Gateway) Start() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return ErrGatewayClosed
	}
	g.mu.Unlock()
	udp, err := listenUDP(g.cfg.UDP.Listen, g.cfg.UDP.Listen == DefaultUDPListen, g.log)
	if err != nil {
		return err
	}
	g.udp = udp
	g.defHost = g.defaultAdvertiseHost()

	opts := paho.NewClientOptions().
		AddBroker(g.cfg.Broker).
		SetClientID(g.cfg.ClientID).
		SetUsername(g.cfg.Username).
		SetPassword(g.cfg.Password).
		SetProtocolVersion(4). // MQTT 3.1.1, what every xiaozhi broker speaks
		SetCleanSession(true).
		SetResumeSubs(false).
		SetOrderMatters(true). // per-board ordering matters; onMessage never blocks
		SetAutoReconnect(true).
		SetConnectRetry(true).
		SetConnectRetryInterval(min(time.Second, g.cfg.MaxReconnectInterval)).
		SetMaxReconnectInterval(g.cfg.MaxReconnectInterval).
		SetKeepAlive(g.cfg.KeepAlive).
		SetPingTimeout(min(g.cfg.KeepAlive/2, 10*time.Second)).
		SetConnectTimeout(g.cfg.ConnectTimeout).
		SetWriteTimeout(g.cfg.WriteTimeout).
		SetOnConnectHandler(g.onConnect).
		SetConnectionLostHandler(g.onConnectionLost).
		SetConnectionNotificationHandler(g.onNotification)
	if g.cfg.TLS != nil {
		opts.SetTLSConfig(g.cfg.TLS)
	}
	g.client = paho.NewClient(opts)

	g.wg.Add(2)
	go func() { defer g.wg.Done(); g.udp.run() }()
	go func() { defer g.wg.Done(); g.supervise() }()
	g.client.Connect() // with ConnectRetry the token only completes on success; the handlers report progress
	g.log.Info("mqtt gateway started", zap.String("broker", redactURL(g.cfg.Broker)),
		zap.String("client_id", g.cfg.ClientID), zap.String("uplink", g.up.Filter()),
		zap.String("downlink", g.cfg.Topics.Downlink), zap.String("udp", g.udp.conn.LocalAddr().String()),
		zap.Bool("presence", g.presence != nil))
	return nil
}

// WaitReady blocks until the gateway has connected and subscribed once, or
// ctx ends.
func (g *Gateway) WaitReady(ctx context.Context) error {
	select {
	case <-g.ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("mqtt gateway: broker %s not reachable yet: %w", redactURL(g.cfg.Broker), ctx.Err())
	}
}

// Connected reports whether the broker connection is up.
func (g *Gateway) Connected() bool { return g.client != nil && g.client.IsConnectionOpen() }

// UDPAddr is the bound audio socket address.
func (g *Gateway) UDPAddr() net.Addr {
	if g.udp == nil {
		return nil
	}
	return g.udp.conn.LocalAddr()
}

func (g *Gateway) udpPort() int { return g.udp.port() }

// Close ends every board's link with device.ErrShutdown (boards with an
// open audio session get a goodbye), disconnects from the broker and waits
// for every goroutine. It is idempotent.
func (g *Gateway) Close() {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return
	}
	g.closed = true
	list := make([]*link, 0, len(g.links))
	for _, l := range g.links {
		list = append(list, l)
	}
	g.mu.Unlock()
	for _, l := range list {
		l.Close(device.Closing(device.CauseShutdown, device.ErrShutdown))
	}
	// Links finish (and send their goodbyes) before the connection goes.
	for _, l := range list {
		<-l.finished()
	}
	g.cancel()
	if g.client != nil {
		g.client.Disconnect(250)
	}
	if g.udp != nil {
		_ = g.udp.conn.Close()
	}
	g.wg.Wait()
	g.log.Info("mqtt gateway stopped")
}

// Goodbye ends a board's audio session from the bridge's side and returns
// the session id it ended. The MQTT connection and the MCP session stay.
func (g *Gateway) Goodbye(ctx context.Context, deviceID string) (string, error) {
	l := g.lookup(deviceID)
	if l == nil {
		return "", fmt.Errorf("%w: %s", device.ErrUnknownDevice, deviceID)
	}
	return l.goodbye(ctx)
}

// AudioSession reports a board's open audio session.
func (g *Gateway) AudioSession(deviceID string) (AudioSession, bool) {
	l := g.lookup(deviceID)
	if l == nil {
		return AudioSession{}, false
	}
	return l.audioInfo()
}

// Stats returns the gateway's counters.
func (g *Gateway) Stats() Stats {
	g.mu.Lock()
	n := len(g.links)
	g.mu.Unlock()
	s := &g.stats
	st := Stats{
		Connected: g.Connected(), Connects: s.connects.Load(), Links: n,
		MessagesIn: s.in.Load(), MessagesOut: s.out.Load(),
		Oversized: s.oversized.Load(), Malformed: s.malformed.Load(), InboxFull: s.inboxFull.Load(),
		UnknownTopic: s.unknownTopic.Load(), Unattributed: s.unattrib.Load(), Other: s.other.Load(),
		Hellos: s.hellos.Load(), BadHellos: s.badHellos.Load(),
		GoodbyesIn: s.goodbyesIn.Load(), GoodbyesOut: s.goodbyesOut.Load(),
		Probes: s.probes.Load(), ProbeMisses: s.probeMisses.Load(), Unresponsive: s.unresponsive.Load(),
		Discovered: s.discovered.Load(), Recovered: s.recovered.Load(), Reconciled: s.reconciled.Load(),
	}
	if g.udp != nil {
		st.UDP = g.udp.stats()
	}
	return st
}

// ---- paho callbacks: they only record and signal, never block ----

func (g *Gateway) onConnect(paho.Client) {
	g.connects.Add(1)
	g.stats.connects.Add(1)
	g.failing.Store(false)
	g.signal()
}

func (g *Gateway) onConnectionLost(_ paho.Client, err error) {
	g.losses.Add(1)
	if g.ctx.Err() != nil {
		return // closing: nobody to tell, and the logger may be gone
	}
	g.log.Warn("lost the MQTT broker connection; closing MQTT boards' sessions and reconnecting",
		zap.String("broker", redactURL(g.cfg.Broker)), zap.Error(err))
	g.signal()
}

func (g *Gateway) onNotification(_ paho.Client, n paho.ConnectionNotification) {
	f, ok := n.(paho.ConnectionNotificationFailed)
	if !ok || g.ctx.Err() != nil {
		return
	}
	// The first failure in a row is worth a warning (bad credentials, wrong
	// port); the retries after it are not.
	if g.failing.CompareAndSwap(false, true) {
		g.log.Warn("cannot connect to the MQTT broker; retrying", zap.String("broker", redactURL(g.cfg.Broker)), zap.Error(f.Reason))
	} else {
		g.log.Debug("mqtt connect attempt failed", zap.Error(f.Reason))
	}
}

func (g *Gateway) signal() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// onMessage receives every uplink publish. It runs on paho's router
// goroutine, so it does bounded work and hands the payload on.
func (g *Gateway) onMessage(_ paho.Client, m paho.Message) {
	key, ok := g.up.Key(m.Topic())
	if !ok {
		g.stats.unknownTopic.Add(1)
		return
	}
	id, ok := DeviceIDFromKey(key)
	if !ok {
		g.stats.unknownTopic.Add(1)
		if ce := g.log.Check(zap.WarnLevel, "dropped uplink message on a topic that names no device"); ce != nil {
			ce.Write(zap.String("topic", m.Topic()))
		}
		return
	}
	payload := m.Payload()
	if len(payload) > g.cfg.MaxMessageSize {
		g.stats.oversized.Add(1)
		g.log.Warn("dropped oversized uplink message", zap.String("device_id", id), zap.String("transport", TransportName),
			zap.Int("bytes", len(payload)), zap.Int("limit", g.cfg.MaxMessageSize))
		return
	}
	g.stats.in.Add(1)
	if l := g.lookup(id); l != nil && l.deliver(payload) {
		return
	}
	select {
	case g.discover <- discovery{deviceID: id, key: TopicKey(id), payload: payload}:
	default:
		g.stats.unattrib.Add(1)
		g.log.Warn("discovery queue full; dropped a message from an unknown board", zap.String("device_id", id))
	}
}

// ---- links ----

func (g *Gateway) lookup(deviceID string) *link {
	g.mu.Lock()
	defer g.mu.Unlock()
	l := g.links[deviceID]
	if l == nil || l.Closed() {
		return nil
	}
	return l
}

// forget removes a finished link, unless a newer one already took its place.
func (g *Gateway) forget(l *link) {
	g.mu.Lock()
	if g.links[l.board.DeviceID] == l {
		delete(g.links, l.board.DeviceID)
	}
	g.mu.Unlock()
	close(l.gone)
}

// attach creates a link for b and hands it to the Hub, which initializes
// the board (initialize + tools/list) straight away: MQTT boards answer MCP
// whether or not a conversation is open, so nobody waits for a hello.
func (g *Gateway) attach(b Board, why string) *link {
	adv := g.advertiseHost(b)
	l := newLink(g, b, adv)
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	old := g.links[b.DeviceID]
	g.links[b.DeviceID] = l
	g.wg.Add(1)
	g.mu.Unlock()
	go l.run()
	if old != nil {
		old.Close(device.Closing(device.CauseReplaced, ErrBoardReconnected))
	}
	id := device.Identity{
		DeviceID:   b.DeviceID,
		ClientID:   b.UUID,
		Transport:  TransportName,
		RemoteAddr: b.RemoteAddr,
		// MQTT boards speak MCP since firmware 1.6.6; the MQTT hello,
		// which would say so, only comes with a conversation.
		HasMCP: true,
	}
	s, err := g.hub.Attach(l, id)
	if err != nil {
		l.log.Info("board not attached", zap.Error(err))
		return l
	}
	l.setSession(s)
	l.log.Debug("board attached", zap.String("why", why), zap.Uint64("gen", b.Gen))
	return l
}

// keepalive is the liveness policy handed to every link's Session. With a
// presence source the broker reports disconnects itself, so nothing is
// probed; a negative interval turns probing off.
func (g *Gateway) keepalive() device.KeepalivePolicy {
	lv := g.cfg.Liveness
	if g.presence != nil || lv.Interval <= 0 {
		return device.KeepalivePolicy{}
	}
	return device.KeepalivePolicy{Interval: lv.Interval, Timeout: lv.Timeout, Misses: lv.Misses, OnProbe: g.countProbe}
}

// countProbe keeps the gateway's liveness counters.
func (g *Gateway) countProbe(o device.ProbeOutcome) {
	g.stats.probes.Add(1)
	switch o {
	case device.ProbeMissed:
		g.stats.probeMisses.Add(1)
	case device.ProbeUnresponsive:
		g.stats.probeMisses.Add(1)
		g.stats.unresponsive.Add(1)
	}
}

// ---- supervisor ----

func (g *Gateway) supervise() {
	tick := time.NewTicker(g.tickInterval())
	defer tick.Stop()
	var presenceC <-chan struct{}
	if g.presence != nil {
		presenceC = g.presence.Changed()
	}
	for {
		select {
		case <-g.ctx.Done():
			return
		case <-g.wake:
			g.syncConnection()
		case <-presenceC:
			if g.subscribed {
				g.reconcile(false)
			}
		case d := <-g.discover:
			g.handleDiscovery(d)
		case <-tick.C:
			g.syncConnection()
			g.housekeeping()
		}
	}
}

// tickInterval paces housekeeping: recovery needs no finer resolution
// than a fraction of the reconnect interval.
func (g *Gateway) tickInterval() time.Duration {
	t := time.Second
	if m := g.cfg.MaxReconnectInterval / 2; m < t {
		t = m
	}
	return max(t, 20*time.Millisecond)
}

// syncConnection reacts to connection changes. paho calls its handlers on
// fresh goroutines, so a loss can be reported after the reconnect it
// caused; counting both and comparing keeps the outcome right either way.
func (g *Gateway) syncConnection() {
	if n := g.losses.Load(); n != g.handledLosses {
		g.handledLosses = n
		g.subscribed = false
		g.dropAllLinks()
	}
	connects := g.connects.Load()
	if (g.subscribed && connects == g.subscribedAt) || !g.client.IsConnectionOpen() {
		return
	}
	tok := g.client.Subscribe(g.up.Filter(), 0, g.onMessage)
	if !tok.WaitTimeout(g.cfg.WriteTimeout) || tok.Error() != nil {
		g.log.Warn("subscribing to the uplink topics failed; will retry", zap.String("filter", g.up.Filter()), zap.Error(tok.Error()))
		return
	}
	first := g.subscribedAt == 0
	g.subscribed, g.subscribedAt = true, connects
	g.readyMu.Do(func() { close(g.ready) })
	if first {
		g.log.Info("connected to the MQTT broker", zap.String("broker", redactURL(g.cfg.Broker)), zap.String("subscribed", g.up.Filter()))
	} else {
		g.log.Info("reconnected to the MQTT broker; recovering boards", zap.String("broker", redactURL(g.cfg.Broker)),
			zap.Int("boards", len(g.recovering)))
	}
	if g.presence != nil {
		g.recovering = map[string]*recovery{}
		g.reconcile(true)
		return
	}
	g.recoverUntil = time.Now().Add(g.cfg.RecoverWindow)
	for _, r := range g.recovering {
		r.next, r.backoff = time.Time{}, 0
	}
	g.runRecovery()
}

// dropAllLinks closes every link because the broker connection is gone,
// remembering which boards to bring back.
func (g *Gateway) dropAllLinks() {
	g.mu.Lock()
	list := make([]*link, 0, len(g.links))
	for _, l := range g.links {
		list = append(list, l)
	}
	g.mu.Unlock()
	for _, l := range list {
		if l.Closed() {
			continue
		}
		g.recovering[l.board.DeviceID] = &recovery{}
		l.Close(device.Closing(device.CauseBrokerLost, ErrBrokerConnectionLost))
	}
}

// reconcile makes the links match the presence source: a link for every
// connected board (one attempt per connection, unless forced), none for a
// board that left.
func (g *Gateway) reconcile(force bool) {
	boards := g.presence.Boards()
	present := make(map[string]bool, len(boards))
	for _, b := range boards {
		present[b.DeviceID] = true
		l := g.lookup(b.DeviceID)
		if l != nil && l.board.Gen == b.Gen {
			continue
		}
		if !force && l == nil && g.attemptedGen[b.DeviceID] == b.Gen {
			continue // tried this connection already; it failed to initialize
		}
		g.attemptedGen[b.DeviceID] = b.Gen
		g.stats.reconciled.Add(1)
		g.attach(b, "connected to the broker")
	}
	for id := range g.attemptedGen {
		if !present[id] {
			delete(g.attemptedGen, id)
		}
	}
	g.mu.Lock()
	var gone []*link
	for id, l := range g.links {
		if !present[id] {
			gone = append(gone, l)
		}
	}
	g.mu.Unlock()
	for _, l := range gone {
		l.Close(device.Closing(device.CauseDisconnected, ErrBoardDisconnected))
	}
}

func (g *Gateway) handleDiscovery(d discovery) {
	if l := g.lookup(d.deviceID); l != nil && l.deliver(d.payload) {
		return
	}
	if !g.subscribed {
		return // the broker connection is being rebuilt; recovery takes over
	}
	b := Board{DeviceID: d.deviceID, Key: d.key}
	if g.presence != nil {
		pb, ok := g.presence.Board(d.deviceID)
		if !ok {
			g.stats.unattrib.Add(1)
			g.log.Debug("dropped a message from a board the broker does not list", zap.String("device_id", d.deviceID))
			return
		}
		b = pb
	}
	now := time.Now()
	if t, ok := g.lastDiscovery[d.deviceID]; ok && now.Sub(t) < g.cfg.RediscoverInterval {
		g.stats.unattrib.Add(1)
		return // it failed to initialize moments ago; do not hammer it
	}
	g.lastDiscovery[d.deviceID] = now
	g.pruneDiscoveries(now)
	g.stats.discovered.Add(1)
	if g.presence != nil {
		g.attemptedGen[b.DeviceID] = b.Gen
	}
	if l := g.attach(b, "first heard from"); l != nil {
		l.deliver(d.payload)
	}
}

func (g *Gateway) pruneDiscoveries(now time.Time) {
	if len(g.lastDiscovery) < 1024 {
		return
	}
	for id, t := range g.lastDiscovery {
		if now.Sub(t) >= g.cfg.RediscoverInterval {
			delete(g.lastDiscovery, id)
		}
	}
}

func (g *Gateway) housekeeping() {
	if !g.subscribed {
		return
	}
	if g.presence == nil {
		g.runRecovery()
	}
}

// runRecovery re-initializes boards that were online when the broker
// connection dropped. With an external broker nothing announces them when
// they come back, and a current-firmware board does not publish until a
// conversation starts, so the bridge reaches out, with back-off, for
// RecoverWindow.
func (g *Gateway) runRecovery() {
	if len(g.recovering) == 0 {
		return
	}
	now := time.Now()
	if now.After(g.recoverUntil) {
		for id := range g.recovering {
			g.log.Warn("gave up recovering a board after the broker reconnect; it returns when it next publishes",
				zap.String("device_id", id), zap.Duration("window", g.cfg.RecoverWindow))
		}
		g.recovering = map[string]*recovery{}
		return
	}
	for id, r := range g.recovering {
		if l := g.lookup(id); l != nil {
			if l.ready() {
				delete(g.recovering, id)
				g.stats.recovered.Add(1)
				l.log.Info("board recovered after the broker reconnect")
			}
			continue
		}
		if now.Before(r.next) {
			continue
		}
		r.backoff = min(max(2*r.backoff, 500*time.Millisecond), 30*time.Second)
		r.next = now.Add(r.backoff)
		g.attach(Board{DeviceID: id, Key: TopicKey(id)}, "recovering after reconnect")
	}
}

// ---- publishing and addresses ----

// publish sends one QoS 0 message (what boards expect) and waits until
// paho has written it, or ctx ends.
func (g *Gateway) publish(ctx context.Context, topic string, msg []byte) error {
	// While paho reconnects it reports QoS 0 publishes as done without
	// sending them; refuse instead, so callers learn the truth.
	if !g.client.IsConnectionOpen() {
		return ErrBrokerUnavailable
	}
	tok := g.client.Publish(topic, 0, false, msg)
	select {
	case <-tok.Done():
		if err := tok.Error(); err != nil {
			return fmt.Errorf("mqtt publish: %w", err)
		}
		g.stats.out.Add(1)
		return nil
	case <-ctx.Done():
		return fmt.Errorf("mqtt publish: %w", ctx.Err())
	}
}

// advertiseHost picks the UDP host handed to one board: the configured
// one; else the address the UDP socket is bound to, if it is a specific
// one; else the address the board reached the broker on (by construction
// one it can reach); else the gateway-wide default. Boards only resolve
// IPv4.
func (g *Gateway) advertiseHost(b Board) string {
	if g.cfg.UDP.Advertise != "" {
		h, _, _ := splitAdvertise(g.cfg.UDP.Advertise)
		return h
	}
	if ip := boundIPv4(g.udp.conn.LocalAddr()); ip != "" {
		return ip
	}
	if host, _, err := net.SplitHostPort(b.LocalAddr); err == nil {
		if ip := net.ParseIP(host); ip != nil && ip.To4() != nil && !ip.IsUnspecified() {
			return ip.To4().String()
		}
	}
	return g.defHost
}

// boundIPv4 is the socket's IPv4 address unless it is bound to all
// interfaces.
func boundIPv4(a net.Addr) string {
	ua, ok := a.(*net.UDPAddr)
	if !ok || ua.IP == nil || ua.IP.IsUnspecified() || ua.IP.To4() == nil {
		return ""
	}
	return ua.IP.To4().String()
}

// defaultAdvertiseHost is the UDP host for boards the gateway knows nothing
// about: the local IPv4 address that routes towards the broker (boards
// reach the broker, so they are likely to reach this host too).
func (g *Gateway) defaultAdvertiseHost() string {
	if g.cfg.UDP.Advertise != "" {
		h, _, _ := splitAdvertise(g.cfg.UDP.Advertise)
		return h
	}
	if ip := boundIPv4(g.udp.conn.LocalAddr()); ip != "" {
		return ip
	}
	if u, err := url.Parse(g.cfg.Broker); err == nil && u.Hostname() != "" {
		port := u.Port()
		if port == "" {
			port = "1883"
		}
		// Connecting a UDP socket sends nothing; it only asks the kernel
		// which local address it would use.
		if c, err := net.Dial("udp4", net.JoinHostPort(u.Hostname(), port)); err == nil {
			defer c.Close()
			if ua, ok := c.LocalAddr().(*net.UDPAddr); ok && ua.IP.To4() != nil {
				return ua.IP.To4().String()
			}
		}
	}
	return "127.0.0.1"
}

// udpAdvertisePort is the port handed to boards.
func (g *Gateway) udpAdvertisePort() int {
	if g.cfg.UDP.Advertise != "" {
		if _, p, _ := splitAdvertise(g.cfg.UDP.Advertise); p > 0 {
			return p
		}
	}
	return g.udp.port()
}

// redactURL drops credentials from a broker URL before it is logged.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparseable URL)"
	}
	return u.Redacted()
}
