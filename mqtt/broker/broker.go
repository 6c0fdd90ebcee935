// Package broker is the bridge's embedded MQTT broker: mochi-mqtt with the
// policy real xiaozhi boards need, written as mochi hooks.
//
//   - Identity: a board's client id must be GID_xxx@@@<mac>[@@@<uuid>]
//     (CONNACK "identifier rejected" otherwise, unless AllowAnyClientID).
//   - Authentication: static username/password pairs and/or an HMAC secret
//     (password = base64(HMAC-SHA256(secret, client_id|username))), and
//     anonymous boards only when configured or when nothing else is.
//     Refused boards get CONNACK "not authorized".
//   - Attribution: an MQTT 3.1.1 PUBLISH does not name its sender, and
//     boards usually all publish to "device-server". The broker knows the
//     connection, so it moves each board's publish to that board's own
//     uplink topic (devices/up/<mac>) before routing it.
//   - Delivery: current firmware never subscribes. When a board connects
//     the broker subscribes it to its own downlink topic (devices/p2p/<mac>)
//     on its behalf, so the bridge's messages reach it through mochi's
//     ordinary, bounded delivery path. Old firmware that subscribes itself
//     ends up with the same single subscription.
//   - Isolation: a board may publish only to the shared topics and its own
//     uplink topic, and read only its own downlink topic.
//   - Presence: connects and disconnects are reported to the bridge through
//     the mqtt.Presence interface, so boards are initialized as soon as
//     they connect and marked offline as soon as they leave.
//   - Floods: a board's publish is routed only within its rate
//     (mqtt.BoardLimits) and its share of the queue towards the gateway; a
//     board over its rate for the flood grace is disconnected and refused
//     for as long (flood.go).
//
// Locks: Broker.mu and connListener.mu are never held together; the log
// throttles' locks are leaves.
//
// The bridge's own gateway connects like any client, over a loopback-only
// listener, with credentials generated at start-up; nothing on the board
// listener can claim that identity.
package broker

import (
	"errors"
	"fmt"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/internal/randid"
	"github.com/devicebridge/devicebridge/mqtt"
)

// Listener ids inside mochi.
const (
	boardListener  = "boards"
	bridgeListener = "bridge"
)

// ErrListen wraps a failure to bind the board listener; errors.Is also
// matches the underlying cause (syscall.EADDRINUSE for a taken port).
var ErrListen = errors.New("mqtt broker: cannot listen")

// Credentials are what the bridge's gateway presents to the broker.
type Credentials struct {
	URL      string
	ClientID string
	Username string
	Password string
}

// Stats are the broker's policy counters since it started.
type Stats struct {
	// Boards is how many boards are connected now.
	Boards int
	// Connects and Disconnects count board connections.
	Connects, Disconnects int64
	// RefusedClientID and RefusedAuth count refused CONNECTs.
	RefusedClientID, RefusedAuth int64
	// DeniedPublish counts publishes outside a board's own topics;
	// DeniedRead subscriptions (or deliveries) to other boards' topics.
	DeniedPublish, DeniedRead int64
	// Attributed counts shared-topic publishes moved to the sender's
	// uplink topic.
	Attributed int64
	// Dropped counts messages dropped because a client's outbound queue
	// was full.
	Dropped int64
	// RateLimited counts board publishes dropped for going over the
	// board's rate (mqtt.board_limits); QueueFull those dropped because the
	// board already had its share of the queue to the gateway waiting.
	RateLimited, QueueFull int64
	// CutOff counts boards disconnected for flooding past the grace;
	// RefusedCutOff their reconnects refused while cut off.
	CutOff, RefusedCutOff int64
	// RefusedSockets counts sockets closed on arrival because the board
	// listener held max_connections sockets, or max_pending_connects not
	// yet admitted.
	RefusedSockets int64
}

// Broker is the embedded MQTT broker. It implements mqtt.Presence.
type Broker struct {
	cfg  Config
	log  *zap.Logger
	srv  *mochi.Server
	hook *policy

	up, down mqtt.Template
	public   *listeners.Net
	conns    *connListener // the board listener, under public
	internal *listeners.TCP
	gateway  Credentials

	mu      sync.Mutex
	boards  map[string]*boardEntry
	gen     uint64
	changed chan struct{}

	closeOnce sync.Once
	started   bool
	quiet     atomic.Bool // silences mochi's own logging after Close

	connects, disconnects, refusedID, refusedAuth  atomic.Int64
	deniedPub, deniedRead, attributed, dropped     atomic.Int64
	rateLimited, queueFull, cutOffs, refusedCutOff atomic.Int64
	refusedSockets                                 atomic.Int64

	cut   map[string]cutOffEntry // boards cut off for flooding (under mu)
	warns warnings
}

type boardEntry struct {
	board mqtt.Board
	cl    *mochi.Client
}

var _ mqtt.Presence = (*Broker)(nil)

// New prepares a broker; nothing listens until Start.
func New(cfg Config, logger *zap.Logger) (*Broker, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	b := &Broker{
		cfg:     cfg,
		log:     logger,
		up:      mqtt.MustTemplate(cfg.Topics.Uplink),
		down:    mqtt.MustTemplate(cfg.Topics.Downlink),
		boards:  map[string]*boardEntry{},
		cut:     map[string]cutOffEntry{},
		changed: make(chan struct{}, 1),
		gateway: Credentials{
			ClientID: "devicebridge-gateway-" + randid.Hex(4),
			Username: "devicebridge-gateway",
			Password: randid.Hex16(),
		},
	}
	return b, nil
}

// clientNetBufferSize is each client's socket read and write buffer.
const clientNetBufferSize = 512

// Start binds the board listener and a loopback listener for the bridge's
// gateway, and starts serving. A taken port comes back as an error that
// matches both ErrListen and syscall.EADDRINUSE.
func (b *Broker) Start() error {
	caps := mochi.NewDefaultServerCapabilities()
	caps.MaximumPacketSize = uint32(b.cfg.MaxPacketSize)
	caps.MaximumClientWritesPending = int32(b.cfg.ClientWritesPending)
	// Nothing a board or the bridge sends is meant to be kept: refusing
	// retained messages stops a client from planting one for later boards.
	caps.RetainAvailable = 0
	b.srv = mochi.New(&mochi.Options{
		Capabilities: caps,
		Logger:       newSlog(b.log.Named("mochi"), &b.quiet),
		// $SYS statistics are of no use to boards; publish them rarely.
		SysTopicResendInterval: 3600,
		// Boards send a few small messages a minute: 512-byte socket
		// buffers per client rather than mochi's 2 KiB each way (larger
		// packets still pass, read and written in pieces).
		ClientNetReadBufferSize:  clientNetBufferSize,
		ClientNetWriteBufferSize: clientNetBufferSize,
	})
	b.hook = &policy{b: b}
	if err := b.srv.AddHook(b.hook, nil); err != nil {
		return fmt.Errorf("mqtt broker: %w", err)
	}
	ln, err := net.Listen("tcp", b.cfg.Listen)
	if err != nil {
		_ = b.srv.Close()
		return fmt.Errorf("%w on %s: %w", ErrListen, b.cfg.Listen, err)
	}
	b.conns = newConnListener(ln, b.cfg.ConnectPacketTimeout, b.cfg.MaxConnections, b.cfg.MaxPendingConnects, b.refusedSocket)
	b.public = listeners.NewNet(boardListener, b.conns)
	if err := b.srv.AddListener(b.public); err != nil {
		_ = b.conns.Close()
		_ = b.srv.Close()
		return fmt.Errorf("%w on %s: %w", ErrListen, b.cfg.Listen, err)
	}
	b.internal = listeners.NewTCP(listeners.Config{ID: bridgeListener, Address: "127.0.0.1:0"})
	if err := b.srv.AddListener(b.internal); err != nil {
		_ = b.srv.Close()
		return fmt.Errorf("%w (bridge listener): %w", ErrListen, err)
	}
	b.gateway.URL = "tcp://" + b.internal.Address()
	if err := b.srv.Serve(); err != nil {
		_ = b.srv.Close()
		return fmt.Errorf("mqtt broker: %w", err)
	}
	b.started = true
	b.log.Info("embedded mqtt broker listening", zap.String("listen", b.public.Address()),
		zap.String("uplink", b.cfg.Topics.Uplink), zap.String("downlink", b.cfg.Topics.Downlink),
		zap.Strings("shared", b.cfg.Topics.Shared), zap.Bool("anonymous", b.cfg.Auth.anonymous() && !b.cfg.RequireCredentials), zap.Bool("issued_credentials", b.cfg.Issued != nil),
		zap.Int("static_users", len(b.cfg.Auth.Users)), zap.Bool("hmac", b.cfg.Auth.HMACSecret != ""))
	return nil
}

// Addr is the bound board listener address (useful with port 0).
func (b *Broker) Addr() net.Addr {
	a, err := net.ResolveTCPAddr("tcp", b.public.Address())
	if err != nil {
		return nil
	}
	return a
}

// GatewayCredentials is how the bridge's gateway connects.
func (b *Broker) GatewayCredentials() Credentials { return b.gateway }

// Close disconnects every client and stops the listeners. It is idempotent.
func (b *Broker) Close() error {
	b.closeOnce.Do(func() {
		if b.srv != nil && b.started {
			b.shutdown()
			b.log.Info("embedded mqtt broker stopped")
		}
		b.quiet.Store(true)
	})
	return nil
}

// shutdown stops mochi without two of its races at Close (v2.7.9):
//
//   - its listeners disconnect their clients through Clients.GetByListener,
//     which read-locks the client list twice; a client connecting or
//     leaving in between queues a write lock and both wait for good, so
//     the bridge would hang on SIGTERM (mochi-mqtt/server#488). Each
//     listener is closed here with a closer that reads the list once,
//     which leaves mochi's own Close nothing to disconnect.
//   - a socket accepted just before Close adds itself to the wait group
//     Close waits on, which the race detector reports and which may let
//     Close return early. Accepting stops first, and Close waits (briefly)
//     until mochi reads every socket it was handed.
func (b *Broker) shutdown() {
	b.conns.stopAccepting()
	deadline := time.Now().Add(shutdownSettle)
	for !b.conns.allRead() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // mochi's serving goroutines start at once
	}
	disconnect := func(listener string) {
		for _, cl := range b.srv.Clients.GetAll() {
			if cl.Net.Listener == listener && !cl.Closed() {
				_ = b.srv.DisconnectClient(cl, packets.ErrServerShuttingDown)
			}
		}
	}
	b.public.Close(disconnect)
	b.internal.Close(disconnect)
	_ = b.conns.Close() // anything left, such as a socket mochi never read
	_ = b.srv.Close()
}

// shutdownSettle bounds the wait for mochi to start reading the sockets
// it was handed before Close.
const shutdownSettle = 2 * time.Second

// Boards lists the connected boards, sorted by device id.
func (b *Broker) Boards() []mqtt.Board {
	b.mu.Lock()
	out := make([]mqtt.Board, 0, len(b.boards))
	for _, e := range b.boards {
		out = append(out, e.board)
	}
	b.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].DeviceID < out[j].DeviceID })
	return out
}

// Board looks up one connected board.
func (b *Broker) Board(deviceID string) (mqtt.Board, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.boards[deviceID]
	if !ok {
		return mqtt.Board{}, false
	}
	return e.board, true
}

// Changed is signalled whenever a board connects or disconnects.
func (b *Broker) Changed() <-chan struct{} { return b.changed }

// Stats returns the policy counters.
func (b *Broker) Stats() Stats {
	b.mu.Lock()
	n := len(b.boards)
	b.mu.Unlock()
	return Stats{
		Boards: n, Connects: b.connects.Load(), Disconnects: b.disconnects.Load(),
		RefusedClientID: b.refusedID.Load(), RefusedAuth: b.refusedAuth.Load(),
		DeniedPublish: b.deniedPub.Load(), DeniedRead: b.deniedRead.Load(),
		Attributed: b.attributed.Load(), Dropped: b.dropped.Load(),
		RateLimited: b.rateLimited.Load(), QueueFull: b.queueFull.Load(),
		CutOff: b.cutOffs.Load(), RefusedCutOff: b.refusedCutOff.Load(),
		RefusedSockets: b.refusedSockets.Load(),
	}
}

func (b *Broker) signal() {
	select {
	case b.changed <- struct{}{}:
	default:
	}
}

// boardConnected records a board's new connection. A board has one
// connection: an older one under another client id (the same MAC with a
// new UUID) is closed. The same client id is already handled by MQTT's own
// session takeover.
func (b *Broker) boardConnected(cl *mochi.Client, ci mqtt.ClientIdentity) {
	board := mqtt.Board{
		DeviceID: ci.DeviceID, Key: ci.Key, UUID: ci.UUID, ClientID: cl.ID,
		RemoteAddr: cl.Net.Remote,
	}
	if cl.Net.Conn != nil {
		board.LocalAddr = cl.Net.Conn.LocalAddr().String()
	}
	b.mu.Lock()
	b.gen++
	board.Gen = b.gen
	old := b.boards[ci.DeviceID]
	b.boards[ci.DeviceID] = &boardEntry{board: board, cl: cl}
	b.mu.Unlock()
	b.connects.Add(1)
	if old != nil && old.cl != cl {
		// Stop only closes the socket: it cannot block on a stalled peer.
		old.cl.Stop(errReplacedByNewConnection)
	}
	b.signal()
	b.log.Info("board connected", zap.String("device_id", ci.DeviceID), zap.String("transport", mqtt.TransportName),
		clip.Field("client_id", cl.ID), zap.String("remote", cl.Net.Remote))
}

func (b *Broker) boardDisconnected(cl *mochi.Client, ci mqtt.ClientIdentity, err error) {
	b.mu.Lock()
	e := b.boards[ci.DeviceID]
	current := e != nil && e.cl == cl
	if current {
		delete(b.boards, ci.DeviceID)
	}
	b.mu.Unlock()
	b.disconnects.Add(1)
	if current {
		b.signal()
	}
	fields := []zap.Field{zap.String("device_id", ci.DeviceID), zap.String("transport", mqtt.TransportName),
		clip.Field("client_id", cl.ID), zap.String("remote", cl.Net.Remote)}
	if err != nil {
		fields = append(fields, zap.String("reason", err.Error()))
	}
	if cause := cl.StopCause(); cause != nil && !errors.Is(cause, err) {
		fields = append(fields, zap.String("cause", cause.Error()))
	}
	if !current {
		fields = append(fields, zap.Bool("superseded", true))
	}
	b.log.Info("board disconnected", fields...)
}

var errReplacedByNewConnection = errors.New("board connected again under another client id")

// refusedSocket counts and reports a socket the board listener turned away.
func (b *Broker) refusedSocket(limit string) {
	b.refusedSockets.Add(1)
	b.warns.refusedSocket.Warn(b.log, "refused an MQTT connection: the board listener is full",
		zap.String("limit", limit), zap.Int("max_connections", b.cfg.MaxConnections),
		zap.Int("max_pending_connects", b.cfg.MaxPendingConnects))
}
