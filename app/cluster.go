package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/api"
	"github.com/devicebridge/devicebridge/cluster"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/observe"
	"github.com/devicebridge/devicebridge/ota"
)

// ClusterConfig joins this bridge to a fleet of bridges over NATS
// JetStream (docs/scaling.md). Without NATSURL the bridge runs alone, as
// before.
type ClusterConfig struct {
	// NATSURL is the NATS server (or comma-separated servers); "" is off.
	NATSURL string `yaml:"nats_url"`
	// NodeID names this node; default: host name plus a short random suffix.
	NodeID string `yaml:"node_id"`
	// OfflineAfter: how soon the other nodes show a dead node's boards
	// offline (default 15s).
	OfflineAfter time.Duration `yaml:"offline_after"`
	// Prefix names the fleet's buckets and subjects (default devicebridge).
	Prefix string `yaml:"prefix"`
	// CredsFile is a NATS credentials file (JWT and NKey seed).
	CredsFile string `yaml:"creds_file"`
	// User and Password authenticate with NATS user/password.
	User     string `yaml:"user"`
	Password string `yaml:"password"`
	// CAFile verifies the NATS server's TLS certificate; CertFile and
	// KeyFile present a client certificate.
	CAFile   string `yaml:"ca_file"`
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

func registerClusterFlags(fs *flag.FlagSet, c *ClusterConfig) {
	fs.StringVar(&c.NATSURL, "nats", c.NATSURL, "join a fleet of bridges through this NATS server (nats://host:4222); default: run alone")
	fs.StringVar(&c.NodeID, "node-id", c.NodeID, "this bridge's name in the fleet (default: host name plus a random suffix)")
}

func (c ClusterConfig) validate() error {
	if c.NATSURL == "" {
		return nil
	}
	var errs []error
	if c.OfflineAfter < 0 {
		errs = append(errs, errors.New("cluster.offline_after must not be negative"))
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		errs = append(errs, errors.New("cluster.cert_file and cluster.key_file go together"))
	}
	if c.CredsFile != "" && c.User != "" {
		errs = append(errs, errors.New("cluster: use creds_file or user/password, not both"))
	}
	if strings.ContainsAny(c.NodeID, " .*>") {
		errs = append(errs, fmt.Errorf("cluster.node_id %q: use letters, digits, '-' and '_'", c.NodeID))
	}
	return errors.Join(errs...)
}

func (c ClusterConfig) natsOptions() []nats.Option {
	var opts []nats.Option
	if c.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(c.CredsFile))
	}
	if c.User != "" {
		opts = append(opts, nats.UserInfo(c.User, c.Password))
	}
	if c.CAFile != "" {
		opts = append(opts, nats.RootCAs(c.CAFile))
	}
	if c.CertFile != "" {
		opts = append(opts, nats.ClientCert(c.CertFile, c.KeyFile))
	}
	return opts
}

// startCluster joins the fleet when cluster.nats_url is set. The node
// leaves cleanly on Shutdown, before the Hub closes its sessions.
func (a *App) startCluster(ctx context.Context) error {
	c := a.cfg.Cluster
	if c.NATSURL == "" {
		return nil
	}
	cc := cluster.Config{URL: c.NATSURL, NodeID: c.NodeID, OfflineAfter: c.OfflineAfter,
		Prefix: c.Prefix, Options: c.natsOptions(), SpentTTL: a.cfg.Flow.spentTTL(), Observer: a.Metrics}
	if a.ota != nil {
		cc.Advertise = func() cluster.Endpoints {
			ws, mq := a.ota.Advertised()
			return cluster.Endpoints{WebSocketURL: ws, MQTTEndpoint: mq}
		}
	}
	if a.apiSrv != nil {
		cc.Interactions = a.apiSrv.ServeForwardedInteraction
	}
	n, err := cluster.Start(ctx, cc, a.Hub, a.log.Named("cluster"))
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.cluster = n
	a.mu.Unlock()
	a.onShutdown(n.Stop)
	if a.spent != nil {
		a.spent.store.Store(n.Spent())
		a.log.Info("flow tokens are spent fleet-wide", zap.Duration("spent_ttl", a.cfg.Flow.spentTTL()))
	}
	if a.ota != nil && a.ota.Balanced() {
		a.ota.SetPlacement(func(transport string) (ota.Target, bool) { return leastLoaded(n, transport) })
		a.onShutdown(func(context.Context) { a.ota.SetPlacement(nil) })
		if ws, mq := a.ota.Advertised(); ws == "" && mq == "" {
			a.log.Warn("ota.balance is on but this node offers no public device endpoint, so no other node sends boards here: " +
				"set ota.websocket_url (and ota.mqtt_endpoint), or bind the device listener to one IP")
		}
		if a.cfg.OTA.Secret == "" {
			a.log.Warn("ota.balance is on without ota.secret: a board sent to another node is refused there if that node requires credentials, " +
				"since each node derives them from its own secret; give every node the same ota.secret")
		}
	}
	if err := a.Metrics.Registry().Register(&fleetCollector{hub: a.Hub.Devices, self: n.ID()}); err != nil {
		a.log.Warn("fleet metrics not registered", zap.Error(err))
	}
	a.Metrics.WatchCluster(n.Connected)
	a.log.Info("bridge is a node of a fleet", zap.String("node", n.ID()))
	return nil
}

// The metrics registry records what the fleet node does.
var _ cluster.Observer = (*observe.Metrics)(nil)

// leastLoaded is the OTA placement of ota.balance least_loaded: the live
// node with the fewest boards that offers the transport; on a tie this
// node, then the first by id. ok false keeps the board here.
func leastLoaded(n *cluster.Node, transport string) (ota.Target, bool) {
	var best *cluster.Heartbeat
	nodes := n.Nodes()
	for i := range nodes {
		hb := &nodes[i]
		offers := hb.WebSocketURL != ""
		if transport == ota.TransportMQTT {
			offers = hb.MQTTEndpoint != ""
		}
		if hb.Node != n.ID() && !offers {
			continue
		}
		if best == nil || hb.Boards < best.Boards || (hb.Boards == best.Boards && hb.Node == n.ID()) {
			best = hb
		}
	}
	if best == nil || best.Node == n.ID() {
		return ota.Target{}, false
	}
	n.Placed(best.Node)
	return ota.Target{Node: best.Node, WebSocketURL: best.WebSocketURL, MQTTEndpoint: best.MQTTEndpoint}, true
}

// forwardInteraction hands a control-API interaction request to the node
// that holds the interaction (api.InteractionOptions.Forward).
func (a *App) forwardInteraction(ctx context.Context, node string, req []byte) ([]byte, error) {
	n := a.Cluster()
	if n == nil {
		return nil, fmt.Errorf("%w: this bridge is not in a fleet", api.ErrHolderGone)
	}
	data, err := n.ForwardInteraction(ctx, node, req)
	if errors.Is(err, cluster.ErrNodeGone) {
		return nil, fmt.Errorf("%w: %v", api.ErrHolderGone, err)
	}
	return data, err
}

// Cluster returns the fleet node, or nil when the bridge runs alone.
func (a *App) Cluster() *cluster.Node {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cluster
}

// fleetCollector reports which node holds how many boards, as this node
// sees the fleet, read from the Hub at scrape time.
type fleetCollector struct {
	hub  func() []device.Info
	self string
}

var fleetBoardsDesc = prometheus.NewDesc("devicebridge_fleet_boards",
	"Boards of the whole fleet by the node that holds them, as this node sees the directory (read at scrape time).",
	[]string{"node"}, nil)

func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) { ch <- fleetBoardsDesc }

func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	count := map[string]int{c.self: 0}
	for _, i := range c.hub() {
		node := i.Node
		if node == "" {
			node = c.self
		}
		count[node]++
	}
	for node, n := range count {
		ch <- prometheus.MustNewConstMetric(fleetBoardsDesc, prometheus.GaugeValue, float64(n), node)
	}
}
