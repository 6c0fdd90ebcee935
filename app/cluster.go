package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/api"
	"github.com/devicebridge/devicebridge/cluster"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/mcpserver"
	"github.com/devicebridge/devicebridge/metrics"
	"github.com/devicebridge/devicebridge/ota"
)

// ClusterConfig joins this bridge to a fleet of bridges over NATS
// JetStream (docs/scaling.md). Without NATSURL the bridge runs alone, as
// before.
//
// Whoever can publish on the fleet's NATS can call every board, so a node
// joins only with credentials (one of user/password, token, creds_file
// or nkey_seed_file, and/or a client certificate) on a NATS that requires
// them, unless Insecure. Secrets come from files or the environment
// rather than the command line, and are never logged.
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
	// User authenticates with NATS user/password; the password is
	// Password, or the content of PasswordFile, or else the environment
	// variable DEVICEBRIDGE_NATS_PASSWORD.
	User         string `yaml:"user"`
	Password     string `yaml:"password"`
	PasswordFile string `yaml:"password_file"`
	// Token authenticates with a NATS token: Token, the content of
	// TokenFile, or else (with no other credential) the environment
	// variable DEVICEBRIDGE_NATS_TOKEN.
	Token     string `yaml:"token"`
	TokenFile string `yaml:"token_file"`
	// CredsFile is a NATS credentials file (user JWT and nkey seed).
	CredsFile string `yaml:"creds_file"`
	// NKeySeedFile holds a NATS user nkey seed (SU...).
	NKeySeedFile string `yaml:"nkey_seed_file"`
	// CAFile verifies the NATS server's TLS certificate; CertFile and
	// KeyFile present a client certificate.
	CAFile   string `yaml:"ca_file"`
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// Insecure joins a NATS that lets clients in without credentials
	// (without credentials here, or when NATS lets a probe without them
	// in), with a warning at start: anyone who reaches that NATS controls
	// every board. Off, the bridge refuses to start on one.
	Insecure bool `yaml:"insecure"`
}

// Environment variables the NATS secrets may come from.
const (
	envNATSPassword = "DEVICEBRIDGE_NATS_PASSWORD"
	envNATSToken    = "DEVICEBRIDGE_NATS_TOKEN"
)

func registerClusterFlags(fs *flag.FlagSet, c *ClusterConfig) {
	fs.StringVar(&c.NATSURL, "nats", c.NATSURL, "join a fleet of bridges through this NATS server (nats://127.0.0.1:4333); default: run alone")
	fs.StringVar(&c.NodeID, "node-id", c.NodeID, "this bridge's name in the fleet (default: host name plus a random suffix)")
	fs.StringVar(&c.User, "nats-user", c.User, "NATS user; the password from --nats-password-file or $"+envNATSPassword)
	fs.StringVar(&c.PasswordFile, "nats-password-file", c.PasswordFile, "file holding the NATS user's password")
	fs.StringVar(&c.TokenFile, "nats-token-file", c.TokenFile, "file holding a NATS token (or $"+envNATSToken+")")
	fs.StringVar(&c.CredsFile, "nats-creds", c.CredsFile, "NATS credentials file (.creds: user JWT and nkey seed)")
	fs.StringVar(&c.NKeySeedFile, "nats-nkey", c.NKeySeedFile, "file holding a NATS user nkey seed (SU...)")
	fs.StringVar(&c.CAFile, "nats-ca", c.CAFile, "CA certificate that verifies the NATS server (TLS)")
	fs.StringVar(&c.CertFile, "nats-cert", c.CertFile, "client certificate for NATS (with --nats-key)")
	fs.StringVar(&c.KeyFile, "nats-key", c.KeyFile, "client certificate's key for NATS")
	fs.BoolVar(&c.Insecure, "nats-insecure", c.Insecure,
		"join a NATS that lets clients in without credentials (anyone who reaches it then controls every board)")
}

func (c ClusterConfig) validate() error {
	if c.NATSURL == "" {
		return nil
	}
	var errs []error
	if strings.ContainsAny(c.NodeID, " .*>") {
		errs = append(errs, fmt.Errorf("cluster.node_id %q: use letters, digits, '-' and '_'", c.NodeID))
	}
	if err := cluster.CheckURL(c.NATSURL); err != nil {
		errs = append(errs, fmt.Errorf("cluster.nats_url: %w", err))
	}
	if _, err := c.auth(os.Getenv); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// auth resolves the node's NATS credentials (reading the secret files,
// and the environment through getenv) and checks that they make sense.
// Errors name the key at fault, never a secret.
func (c ClusterConfig) auth(getenv func(string) string) (cluster.Auth, error) {
	a := cluster.Auth{User: c.User, CredsFile: c.CredsFile, NKeySeedFile: c.NKeySeedFile,
		CAFile: c.CAFile, CertFile: c.CertFile, KeyFile: c.KeyFile}
	var errs []error
	secret := func(value, file, key, env string) string {
		if value != "" && file != "" {
			errs = append(errs, fmt.Errorf("cluster: give %s or %s_file, not both", key, key))
		}
		if file != "" {
			data, err := os.ReadFile(file)
			if err != nil {
				errs = append(errs, fmt.Errorf("cluster.%s_file: %w", key, err))
				return ""
			}
			if value = strings.TrimRight(string(data), "\r\n"); value == "" {
				errs = append(errs, fmt.Errorf("cluster.%s_file %s is empty", key, file))
			}
			return value
		}
		if value == "" && env != "" {
			value = getenv(env)
		}
		return value
	}
	if c.User != "" {
		a.Password = secret(c.Password, c.PasswordFile, "password", envNATSPassword)
		if a.Password == "" {
			errs = append(errs, fmt.Errorf("cluster.user %q needs a password: cluster.password, cluster.password_file "+
				"(--nats-password-file) or $%s", c.User, envNATSPassword))
		}
	} else if c.Password != "" || c.PasswordFile != "" {
		errs = append(errs, errors.New("cluster.password goes with cluster.user (--nats-user)"))
	}
	env := envNATSToken
	if c.User != "" || c.CredsFile != "" || c.NKeySeedFile != "" {
		env = "" // another credential is configured: the variable is not this node's
	}
	a.Token = secret(c.Token, c.TokenFile, "token", env)
	methods := 0
	for _, set := range []bool{a.User != "", a.Token != "", a.CredsFile != "", a.NKeySeedFile != ""} {
		if set {
			methods++
		}
	}
	if methods > 1 {
		errs = append(errs, errors.New("cluster: give one of user/password, token, creds_file or nkey_seed_file "+
			"(a client certificate may go with any)"))
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		errs = append(errs, errors.New("cluster.cert_file and cluster.key_file go together"))
	}
	for key, path := range map[string]string{"creds_file": c.CredsFile, "nkey_seed_file": c.NKeySeedFile,
		"ca_file": c.CAFile, "cert_file": c.CertFile, "key_file": c.KeyFile} {
		if path == "" {
			continue
		}
		if _, err := os.Stat(path); err != nil {
			errs = append(errs, fmt.Errorf("cluster.%s: %w", key, err))
		}
	}
	if len(errs) == 0 && !a.HasCredentials() && !c.Insecure {
		errs = append(errs, fmt.Errorf("cluster: no NATS credentials: whoever reaches NATS could call every board of the fleet; "+
			"set cluster.user with a password (--nats-user, --nats-password-file or $%s), a token (--nats-token-file or $%s), "+
			"cluster.creds_file (--nats-creds), cluster.nkey_seed_file (--nats-nkey) or a client certificate (--nats-cert, --nats-key), "+
			"on a NATS that requires them (configs/nats-fleet.conf); or cluster.insecure (--nats-insecure) to join an open NATS anyway",
			envNATSPassword, envNATSToken))
	}
	return a, errors.Join(errs...)
}

// startCluster joins the fleet when cluster.nats_url is set. The node
// leaves cleanly on Shutdown, before the Hub closes its sessions.
func (a *App) startCluster(ctx context.Context) error {
	c := a.cfg.Cluster
	if c.NATSURL == "" {
		return nil
	}
	auth, err := c.auth(os.Getenv)
	if err != nil {
		return err
	}
	// The calls other nodes route here meet this node's policy and audit
	// log, with the boards named as the control API names them.
	cc := cluster.Config{URL: c.NATSURL, NodeID: c.NodeID, OfflineAfter: c.OfflineAfter, Prefix: c.Prefix,
		Auth: auth, Insecure: c.Insecure, SpentTTL: a.cfg.Flow.spentTTL(), Observer: a.Metrics,
		Policy: a.access.gate, Audit: a.access.audit, Alias: a.apiAccess().Alias}
	if a.ota != nil {
		cc.Advertise = func() cluster.Endpoints {
			ws, mq := a.ota.Advertised()
			return cluster.Endpoints{WebSocketURL: ws, MQTTEndpoint: mq}
		}
	}
	if a.apiSrv != nil {
		cc.Interactions = a.apiSrv.ServeForwardedInteraction
	}
	if a.mcp != nil {
		cc.Tasks = a.mcp.ServeForwardedTask
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
var _ cluster.Observer = (*metrics.Metrics)(nil)

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

// forwardTask hands a tasks/* request to the node that holds the task
// (mcpserver.TaskOptions.Forward).
func (a *App) forwardTask(ctx context.Context, node string, req []byte) ([]byte, error) {
	n := a.Cluster()
	if n == nil {
		return nil, fmt.Errorf("%w: this bridge is not in a fleet", mcpserver.ErrTaskHolderGone)
	}
	data, err := n.ForwardTask(ctx, node, req)
	if errors.Is(err, cluster.ErrNodeGone) {
		return nil, fmt.Errorf("%w: %v", mcpserver.ErrTaskHolderGone, err)
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
