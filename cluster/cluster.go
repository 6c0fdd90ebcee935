package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/audit"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/logthrottle"
	"github.com/devicebridge/devicebridge/internal/randid"
	"github.com/devicebridge/devicebridge/policy"
)

// DefaultOfflineAfter is how soon the other nodes show a dead node's boards
// offline.
const DefaultOfflineAfter = 15 * time.Second

// DefaultPrefix names the buckets and subjects of one fleet.
const DefaultPrefix = "devicebridge"

// Config configures one node of a fleet.
type Config struct {
	// URL is the NATS server (or comma-separated servers) to join.
	URL string
	// NodeID names this node in the fleet; it must be unique among the
	// nodes alive at once. Empty means DefaultNodeID().
	NodeID string
	// Auth are the node's NATS credentials and TLS trust. Without
	// credentials the node refuses to start unless Insecure.
	Auth Auth
	// Insecure lets the node join a NATS that lets clients in without
	// credentials (it then warns at start): with no credentials in Auth,
	// or when a probe connection without them is let in. Off, the node
	// refuses both (ErrNoCredentials, ErrOpenNATS).
	Insecure bool
	// Options are extra nats.go options (timeouts, handlers); credentials
	// go in Auth, so that the node knows whether it has any.
	Options []nats.Option
	// OfflineAfter bounds how long after a node dies its boards are still
	// shown by the others (default 15 s). Heartbeats go out every fifth of
	// it; a node missing about three is dead.
	OfflineAfter time.Duration
	// Prefix names the fleet's buckets and subjects (default
	// "devicebridge"); two fleets on one NATS use two prefixes.
	Prefix string
	// RemoteCallLimit bounds a remote call whose caller set no deadline
	// (default 6 minutes, a minute past device.MaxToolTimeout): the holder
	// still applies the board's own call timeouts.
	RemoteCallLimit time.Duration
	// CatalogGCInterval is how often the node with the lowest id among the
	// live nodes looks for tool catalogs no board record references
	// (default 10 minutes).
	CatalogGCInterval time.Duration
	// CatalogGrace is how long a catalog must stay unreferenced, at an
	// unchanged revision, before it is deleted (default 30 minutes). It
	// must be well above opTimeout: a node stores a catalog shortly before
	// the board record that references it.
	CatalogGrace time.Duration
	// Observer, when set, is told about routed calls and failed directory
	// writes (metrics.Metrics implements it).
	Observer Observer
	// Advertise, when set, says where boards reach this node; every
	// heartbeat carries it, so that another node's OTA answer can send a
	// board here (Nodes).
	Advertise func() Endpoints
	// Interactions, when set, serves the requests other nodes forward to
	// the control-API interactions this node holds, on
	// <prefix>.interaction.<node> (ForwardInteraction): it gets the
	// request body and returns the reply body.
	Interactions func(ctx context.Context, req []byte) []byte
	// Tasks, when set, serves the requests other nodes forward for the
	// MCP tasks this node holds, on <prefix>.task.<node> (ForwardTask):
	// it gets the request body and returns the reply body.
	Tasks func(ctx context.Context, req []byte) []byte
	// Policy is this node's policy, which it applies to the calls other
	// nodes route to its boards, as the identity of the caller each call
	// carries (a call without one is refused); nil allows every caller,
	// as locally. Alias names a board as the policy's patterns may (nil:
	// by MAC only); the board records this node writes carry it too, so
	// that the fleet names a board as its holder does.
	Policy *policy.Gate
	Alias  func(deviceID string) string
	// Audit, when set, records every routed call this node answers or
	// refuses (via "fleet", with the calling node).
	Audit *audit.Log
	// SpentTTL is how long the <prefix>_spent bucket (Spent: flow tokens
	// and requestStates already used) keeps an entry; at least the longest
	// life of a flow token, i.e. flow.max_duration (default
	// DefaultSpentTTL).
	SpentTTL time.Duration
}

// Endpoints are a node's public device endpoints, as a board dials them.
// An empty one is not offered.
type Endpoints struct {
	// WebSocketURL is the ws:// or wss:// URL of the device listener.
	WebSocketURL string `json:"websocket_url,omitempty"`
	// MQTTEndpoint is host:port of the node's own (embedded) broker.
	MQTTEndpoint string `json:"mqtt_endpoint,omitempty"`
}

// Observer receives what a node does, for metrics. Its methods are called
// on the node's paths, so they must be quick.
type Observer interface {
	// RoutedCallDone: a routed call ended. direction is DirectionOut (this
	// node called a board another node holds) or DirectionIn (this node
	// answered a call for one of its boards); code is "" on success.
	RoutedCallDone(direction string, code device.Code, took time.Duration)
	// RoutedCallNoResponder: an outgoing call found no node answering on
	// the holder's subject (it counts as offline in RoutedCallDone too).
	RoutedCallNoResponder()
	// DirectoryWriteFailed: a write to one of the fleet's buckets
	// ("boards", "catalogs", "nodes") failed.
	DirectoryWriteFailed(bucket string)
}

// Directions of a routed call, as Observer.RoutedCallDone reports them.
const (
	DirectionOut = "out"
	DirectionIn  = "in"
)

type nopObserver struct{}

func (nopObserver) RoutedCallDone(string, device.Code, time.Duration) {}
func (nopObserver) RoutedCallNoResponder()                            {}
func (nopObserver) DirectoryWriteFailed(string)                       {}

// DefaultNodeID is the host name plus a short random suffix, so that two
// bridges on one machine (or a restarted one) never share an id.
func DefaultNodeID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "node"
	}
	return sanitize(host) + "-" + randid.Hex(3)
}

// sanitize keeps a node id usable as one NATS subject token and KV key.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		}
		return '-'
	}, s)
}

// Record is one board's entry in the fleet directory. It changes only when
// the board comes online, its tools change or it goes offline: a node
// never rewrites its boards periodically; liveness is per node.
type Record struct {
	Node            string    `json:"node"`
	DeviceID        string    `json:"device_id"`
	ClientID        string    `json:"client_id,omitempty"`
	Transport       string    `json:"transport"`
	HasMCP          bool      `json:"has_mcp"`
	State           string    `json:"state"`
	Board           string    `json:"board,omitempty"`
	FirmwareVersion string    `json:"firmware_version,omitempty"`
	Catalog         string    `json:"catalog,omitempty"` // digest of the tool list in the catalogs bucket
	ConnectedAt     time.Time `json:"connected_at"`
	ReadyAt         time.Time `json:"ready_at,omitzero"`
	Generation      uint64    `json:"generation"`
	// Claimed: the board reaches every node (MQTT through a shared
	// broker) and this node holds it by claim; no other node serves it
	// while this one is alive (see Node.ShareBoards).
	Claimed bool `json:"claimed,omitempty"`
	// Released: the holder gave the board up while it is still connected
	// (the holder is stopping); a survivor adopts it.
	Released bool `json:"released,omitempty"`
	// Alias is the alias the holder shows the board under (the one its
	// /mcp tools start with); the other nodes show it by the same one when
	// they can (mcpserver's naming).
	Alias string `json:"alias,omitempty"`
}

// Heartbeat is a node's liveness key. It also says how loaded the node is
// and where boards reach it, as of the beat.
type Heartbeat struct {
	Node    string    `json:"node"`
	Started time.Time `json:"started"`
	// Boards is how many boards are connected to the node (its local
	// sessions, in any state).
	Boards int `json:"boards"`
	Endpoints
}

// Node joins a Hub to a fleet: it publishes the Hub's boards to the
// directory, answers calls other nodes route to them, and gives the Hub
// the boards other nodes hold (device.Remote).
type Node struct {
	cfg Config
	hub *device.Hub
	log *zap.Logger
	// badRecords throttles the warning for directory records that do not
	// match their key, unreadable and missing the warnings for records
	// that do not decode and catalogs a record names but the bucket lacks:
	// whoever can write to the buckets can repeat them.
	badRecords, unreadable, missing logthrottle.Throttle

	nc                             *nats.Conn
	boards, catalogs, nodes, spent jetstream.KeyValue
	subs                           []*nats.Subscription

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	resync chan struct{}
	// dirty: a directory write failed; the next heartbeat resyncs.
	dirty atomic.Bool
	// reconnected: NATS came back; heartbeats beats at once, then resyncs.
	reconnected chan struct{}
	// repairs: another node deleted records of boards this node still
	// holds (it took this node for dead); publishLocal writes them again.
	repairs chan struct{}
	// synced: the boards watch has delivered the directory's current
	// values since it last (re)started, so the remote view is complete.
	synced atomic.Bool
	obs    Observer
	// refusals throttles the warning about requests without a caller,
	// which whoever can publish on the fleet's subjects can repeat, and
	// denied the line about routed calls the policy refuses, which a
	// caller on another node can repeat. Their locks are leaves (as are
	// the other throttles'): never taken with another lock held.
	refusals, denied logthrottle.Throttle

	// started: when Start ran (never changes after).
	started time.Time
	// halted: halt ran or runs (Stop or Abandon).
	halted atomic.Bool

	// The node's state, in three parts that each have their own lock; no
	// method holds two of them at once (doc.go).
	dir    *directory  // the fleet directory as this node sees it
	router *router     // routed calls in flight, both ways
	claims *claimState // boards held by claim (ShareBoards)

	// rewatch holds one channel per bucket watcher, signalled on reconnect:
	// a server restart can end a watch without closing it. rewatchMu
	// guards it: it grows while Start runs and is read on reconnect.
	rewatchMu sync.Mutex
	rewatch   []chan struct{}
}

// Start connects to NATS, creates the fleet's buckets if needed and joins
// the Hub to the fleet. Stop (or Abandon) ends it.
func Start(ctx context.Context, cfg Config, hub *device.Hub, logger *zap.Logger) (*Node, error) {
	cfg, authOpts, err := cfg.checked()
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	n := &Node{cfg: cfg, hub: hub, log: logger.With(zap.String("node", cfg.NodeID)), obs: cfg.Observer,
		started: time.Now(), resync: make(chan struct{}, 1), reconnected: make(chan struct{}, 1),
		repairs: make(chan struct{}, 1), dir: newDirectory(), router: newRouter(), claims: newClaims()}
	if err := n.connect(ctx, authOpts); err != nil {
		return nil, err
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	// Heartbeat first: a peer must never see this node's boards before it
	// sees the node alive, or it would clean them up as orphans.
	n.beat(opTimeout)
	sub := hub.Subscribe()
	n.goOwned(func() { n.publishLocal(sub) })
	// The Hub lists the other nodes' boards before the watches start: the
	// events they announce must find those boards in Hub.Devices, or a
	// subscriber that re-reads the Hub on an event (the /mcp catalogue)
	// would miss the boards announced before.
	hub.SetRemote(n)
	if err := n.subscribe(); err != nil {
		n.Abandon()
		return nil, err
	}
	n.goOwned(n.heartbeats)
	n.goOwned(n.reaper)
	n.goOwned(n.catalogGC)
	n.log.Info("joined the fleet", zap.String("nats", n.nc.ConnectedUrlRedacted()),
		zap.Duration("offline_after", cfg.OfflineAfter))
	return n, nil
}

// checked refuses a Config the node cannot start with, fills in its
// defaults and returns the nats.go options of its credentials.
func (cfg Config) checked() (Config, []nats.Option, error) {
	if cfg.URL == "" {
		return cfg, nil, errors.New("cluster: no NATS URL")
	}
	if err := CheckURL(cfg.URL); err != nil {
		return cfg, nil, err
	}
	if !cfg.Auth.HasCredentials() && !cfg.Insecure {
		return cfg, nil, ErrNoCredentials
	}
	authOpts, err := cfg.Auth.options()
	if err != nil {
		return cfg, nil, err
	}
	if cfg.NodeID == "" {
		cfg.NodeID = DefaultNodeID()
	}
	if s := sanitize(cfg.NodeID); s != cfg.NodeID {
		return cfg, nil, fmt.Errorf("cluster: node id %q: use letters, digits, '-' and '_' only (e.g. %q)", cfg.NodeID, s)
	}
	cfg = cfg.withDefaults()
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	return cfg, authOpts, nil
}

// connect joins NATS, refuses an open one unless Insecure, and opens the
// fleet's buckets; on error nothing is left open.
func (n *Node) connect(ctx context.Context, authOpts []nats.Option) error {
	cfg := n.cfg
	opts := append([]nats.Option{nats.Name("devicebridge " + cfg.NodeID), nats.MaxReconnects(-1),
		// Nothing is buffered while NATS is away: a routed call or a
		// directory write fails at once (the call as offline) instead of
		// waiting for its deadline and then reaching NATS late, when its
		// caller has given up or the write is stale.
		nats.ReconnectBufSize(-1),
		// A partition that drops packets without closing the connection is
		// noticed within about the offline window, not the default 4 min.
		nats.PingInterval(max(cfg.OfflineAfter/3, time.Second)), nats.MaxPingsOutstanding(2),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			n.log.Debug("NATS asynchronous error", zap.String("subject", subject), zap.Error(err))
		}),
		nats.ReconnectHandler(func(*nats.Conn) {
			n.log.Info("reconnected to NATS; registering this node's boards again")
			wake(n.reconnected)
			n.rewatchMu.Lock()
			rewatch := n.rewatch
			n.rewatchMu.Unlock()
			for _, c := range rewatch {
				wake(c)
			}
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				n.log.Warn("lost NATS; local boards keep working, remote boards are unreachable until it returns", zap.Error(err))
			}
			n.router.fail("", fmt.Errorf("%w: this node lost NATS while the call ran; its outcome is unknown", device.ErrOffline))
		})}, authOpts...)
	opts = append(opts, cfg.Options...)
	nc, err := nats.Connect(cfg.URL, opts...)
	if err != nil {
		return fmt.Errorf("cluster: connect %s: %w", cfg.URL, err)
	}
	// Without credentials, being in proves NATS open; with them, a second
	// connection without them tells.
	if !cfg.Auth.HasCredentials() || letsAnyoneIn(cfg.URL, cfg.Auth, n.log) {
		at := nc.ConnectedUrlRedacted()
		if !cfg.Insecure {
			nc.Close()
			return fmt.Errorf("%w (%s)", ErrOpenNATS, at)
		}
		n.log.Warn(insecureWarning, zap.String("nats", at))
	}
	n.nc = nc
	if err := n.open(ctx); err != nil {
		nc.Close()
		return err
	}
	return nil
}

// subscribe starts the bucket watches and the call subjects. Once it
// returns, NATS knows this node's subscriptions: a request sent to it
// right away finds a responder.
func (n *Node) subscribe() error {
	if err := n.watch("nodes", n.nodes, n.onHeartbeat, nil); err != nil {
		return err
	}
	if err := n.watch("boards", n.boards, n.onBoard, &n.synced); err != nil {
		return err
	}
	if err := n.serveCalls(); err != nil {
		return err
	}
	if err := n.nc.FlushTimeout(opTimeout); err != nil {
		return fmt.Errorf("cluster: subscribe: %w", err)
	}
	return nil
}

// ID is this node's id.
func (n *Node) ID() string { return n.cfg.NodeID }

// Connected reports whether the node is connected to NATS now.
func (n *Node) Connected() bool { return n.nc.IsConnected() }

func (n *Node) bucket(name string) string { return n.cfg.Prefix + "_" + name }

func (n *Node) subject(parts ...string) string {
	return n.cfg.Prefix + "." + strings.Join(parts, ".")
}

func (n *Node) open(ctx context.Context) error {
	js, err := jetstream.New(n.nc)
	if err != nil {
		return fmt.Errorf("cluster: jetstream: %w", err)
	}
	create := func(name, desc string, ttl time.Duration) (jetstream.KeyValue, error) {
		kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: n.bucket(name), Description: desc,
			History: 1, TTL: ttl, Storage: jetstream.FileStorage})
		if err != nil {
			return nil, fmt.Errorf("cluster: key-value bucket %s: %w", n.bucket(name), err)
		}
		return kv, nil
	}
	if n.boards, err = create("boards", "devicebridge fleet directory: which node holds which board", 0); err != nil {
		return err
	}
	if n.catalogs, err = create("catalogs", "devicebridge tool catalogs by digest", 0); err != nil {
		return err
	}
	if n.nodes, err = create("nodes", "devicebridge node heartbeats", n.cfg.OfflineAfter); err != nil {
		return err
	}
	n.spent, err = create("spent", "devicebridge flow tokens and MRTR requestStates already used (replay protection)", n.cfg.SpentTTL)
	return err
}

func (n *Node) goOwned(f func()) {
	n.wg.Add(1)
	go func() { defer n.wg.Done(); f() }()
}

func (n *Node) askResync() { wake(n.resync) }

// wake signals a goroutine that waits on c (buffered, one slot) without
// blocking: a signal already pending covers this one.
func wake(c chan<- struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Stop leaves the fleet cleanly: this node's boards and heartbeat are
// deleted from the directory (the others show them offline at once), calls
// in flight from other nodes are cancelled, and the connection closes.
// Boards held by claim are handed over instead: a survivor adopts each at
// once.
func (n *Node) Stop(ctx context.Context) {
	if !n.halt() {
		return
	}
	owned, claimed := n.dir.leave()
	if !n.nc.IsConnected() {
		// Cut off from NATS: the others clean up when the heartbeat lapses.
		n.nc.Close()
		n.log.Info("left the fleet without NATS; the other nodes clean up after offline_after", zap.Int("boards", len(owned)))
		return
	}
	for key, o := range owned {
		if id, ok := claimed[key]; ok {
			n.handOver(ctx, key, id, o.rev)
			continue
		}
		_ = n.boards.Delete(ctx, key, jetstream.LastRevision(o.rev))
	}
	_ = n.nodes.Delete(ctx, n.cfg.NodeID)
	// Subscriptions ended in halt; flush the deletes, then close (Drain
	// would leave a goroutine finishing in the background).
	_ = n.nc.FlushTimeout(opTimeout)
	n.nc.Close()
	n.log.Info("left the fleet", zap.Int("boards", len(owned)))
}

// Abandon stops the node as a crash would: nothing is deleted, so the
// others notice only when its heartbeat lapses. Tests use it; Stop is the
// way out otherwise.
func (n *Node) Abandon() {
	if !n.halt() {
		return
	}
	n.nc.Close()
}

// halt stops every goroutine and the remote view; false if already done.
func (n *Node) halt() bool {
	if !n.halted.CompareAndSwap(false, true) {
		return false
	}
	n.router.stop(device.ErrShutdown)
	n.dir.stop()
	n.claims.stop()
	n.hub.SetRemote(nil)
	for _, s := range n.subs {
		_ = s.Unsubscribe()
	}
	if n.cancel != nil {
		n.cancel()
	}
	n.wg.Wait()
	return true
}

// keyFor is the directory key of a device id: the MAC's 12 hex digits, or
// the hex of any other id (KV keys allow few characters).
func keyFor(deviceID string) string {
	if d, ok := device.MACDigits(deviceID); ok {
		return d
	}
	return "x" + hex.EncodeToString([]byte(deviceID))
}

// digest names a tool list in the catalogs bucket; identical boards share it.
func digest(tools []device.Tool) (string, []byte) {
	data, _ := json.Marshal(tools)
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:16]), data
}
