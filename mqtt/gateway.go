package mqtt

// This file holds the gateway's lifecycle and wiring: construction,
// Start/Close, paho's connection callbacks, and the board links it owns.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/randid"
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

// AudioSession describes a board's open audio session.
type AudioSession struct {
	ID      string
	SSRC    uint32
	Packets int64
	Bytes   int64
}

// Gateway connects the bridge to an MQTT broker with paho and turns each
// board's topics into a device.Link attached to the Hub. The same code runs
// against the embedded broker and an external one.
//
// Goroutines: paho's own; the supervisor (connection changes, presence,
// discovery, recovery); the UDP reader; and per board link, its close
// path (which waits for the link's reader, a goroutine that runs only
// while the link's inbox holds messages). Close waits for all of them. Liveness probes belong to each board's device
// Session, which the Hub waits for.
type Gateway struct {
	cfg      Config
	hub      *device.Hub
	presence Presence
	owner    Owner // nil: serve every board heard (set before Start)
	log      *zap.Logger
	up, down Template
	client   paho.Client
	udp      *udpServer
	tls      *tls.Config // built from cfg.TLS; nil for plain connections
	defHost  string      // UDP host advertised when the board gives no hint

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	links  map[string]*link
	closed bool
	// Work for the Owner, drained by the supervisor (sets: bounded by the
	// number of boards, one entry per board however often it is asked).
	adopt, release map[string]struct{}
	ownerC         chan struct{}

	discover *pending // first messages of boards without a link (pending.go)
	wake     chan struct{}
	ready    chan struct{}
	readyMu  sync.Once

	connects, losses atomic.Int64 // bumped by paho's handlers
	failing          atomic.Bool  // a connect attempt failed since the last success

	probe   *prober   // mosquitto-plugin mode only
	probeOK sync.Once // logs the first answer

	stats counters
	warns gatewayWarnings
	muted muteList // boards cut off for flooding (external broker)

	// Supervisor-owned state (only the supervisor goroutine touches it).
	handledLosses int64
	subscribedAt  int64 // value of connects when the last subscribe succeeded
	subscribed    bool
	attempted     map[string]attempt // boards attached from the presence source, by device id
	lastDiscovery map[string]time.Time
	recovering    map[string]*recovery
	recoverUntil  time.Time
	notOwned      map[string]time.Time // boards the Owner refused, until when
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
	tlsCfg, err := cfg.TLS.Build()
	if err != nil {
		return nil, err
	}
	if cfg.ClientID == "" {
		cfg.ClientID = "devicebridge-" + randid.Hex(4)
	}
	g := &Gateway{
		cfg:           cfg,
		tls:           tlsCfg,
		hub:           hub,
		presence:      presence,
		log:           logger,
		up:            MustTemplate(cfg.Topics.Uplink),
		down:          MustTemplate(cfg.Topics.Downlink),
		links:         map[string]*link{},
		discover:      newPending(DefaultDiscoveryBoards, DefaultDiscoveryBytes),
		wake:          make(chan struct{}, 1),
		ready:         make(chan struct{}),
		attempted:     map[string]attempt{},
		lastDiscovery: map[string]time.Time{},
		recovering:    map[string]*recovery{},
		adopt:         map[string]struct{}{},
		release:       map[string]struct{}{},
		ownerC:        make(chan struct{}, 1),
		notOwned:      map[string]time.Time{},
	}
	if cfg.Downlink == DownlinkMosquittoPlugin {
		g.probe = &prober{timeout: DefaultProbeTimeout}
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
	if g.tls != nil {
		opts.SetTLSConfig(g.tls)
	}
	if g.probe != nil {
		// The plugin's answer to a probe arrives on a topic the bridge
		// never subscribed to.
		opts.SetDefaultPublishHandler(g.onUnrouted)
	}
	g.client = paho.NewClient(opts)

	g.wg.Add(2)
	go func() { defer g.wg.Done(); g.udp.run() }()
	go func() { defer g.wg.Done(); g.supervise() }()
	g.client.Connect() // with ConnectRetry the token only completes on success; the handlers report progress
	g.log.Info("mqtt gateway started", zap.String("broker", redactURL(g.cfg.Broker)),
		zap.String("client_id", g.cfg.ClientID), zap.String("uplink", g.up.Filter()),
		zap.String("downlink", g.cfg.Topics.Downlink), zap.String("udp", g.udp.conn.LocalAddr().String()),
		zap.Bool("presence", g.presence != nil), zap.Bool("shared_broker", g.owner != nil), zap.String("downlink_mode", g.cfg.Downlink))
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
	g.warns.connLost.Warn(g.log, "lost the MQTT broker connection; closing MQTT boards' sessions and reconnecting",
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
		if g.owner != nil && !g.closed {
			g.released(l.board.DeviceID)
		}
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
	l.start()
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
		g.warns.notAttached.Info(g.log, "board not attached", zap.String("device_id", b.DeviceID),
			zap.String("transport", TransportName), zap.Error(err))
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
