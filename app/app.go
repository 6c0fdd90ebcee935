package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/api"
	"github.com/devicebridge/devicebridge/cluster"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/frontdoor"
	"github.com/devicebridge/devicebridge/internal/connlimit"
	"github.com/devicebridge/devicebridge/mcpserver"
	"github.com/devicebridge/devicebridge/metrics"
	"github.com/devicebridge/devicebridge/ota"
	"github.com/devicebridge/devicebridge/voice"
	"github.com/devicebridge/devicebridge/ws"
)

// Version is the bridge version reported to boards and MCP clients.
var Version = "0.1.0-dev"

// App is one running bridge.
type App struct {
	cfg Config
	log *zap.Logger

	// Hub holds every board's session.
	Hub *device.Hub
	WS  *ws.Server
	// mcp is the upstream MCP server; nil when MCP is off.
	mcp *mcpserver.Server
	// aliases are mcp.aliases, checked: the operator's names for boards.
	aliases mcpserver.Aliases
	// ota is the OTA endpoint and admission; nil when OTA is off.
	ota *ota.Server
	// voice relays conversations to the voice upstream; nil when off.
	voice *voice.Relay
	// apiSrv is the control API, kept to serve interactions other nodes
	// forward here.
	apiSrv *api.Server
	// deviceTLS and controlTLS say whether the listeners serve TLS.
	deviceTLS, controlTLS bool
	// Metrics owns the Prometheus registry served on /metrics.
	Metrics *metrics.Metrics
	obs     observability

	deviceLn, controlLn   net.Listener
	deviceSrv, controlSrv *http.Server
	// listeners are the connection caps of every HTTP listener (http.go),
	// guarded by mu.
	listeners []*connlimit.Listener

	mu sync.Mutex
	// drain steps run first in Shutdown, before the listeners drain: they
	// end long-lived streams (MCP SSE) that would otherwise hold a drain up
	// for its whole timeout.
	drain    []func()
	shutdown []func(context.Context) // run in reverse order of registration
	wg       sync.WaitGroup          // serve loops and background workers
	// mqtt is the MQTT side startMQTT built; nil when MQTT is off.
	mqtt *mqttSide
	// mqttPortTaken: the embedded broker's port was taken at start, so
	// the bridge runs without MQTT (readiness).
	mqttPortTaken bool
	// stopSimulators ends in-process boards; it runs after the Hub closed,
	// so their sessions end with the bridge's reason, not theirs.
	stopSimulators context.CancelFunc
	// access: OAuth, policy and audit log (access.go).
	access access
	// cluster joins the fleet over NATS (cluster.go); nil when alone.
	cluster *cluster.Node
	// spent is the flow replay store of a fleet node with a flow secret.
	spent *fleetSpent
	// controlMux is the control listener's front door (front.go).
	controlMux *frontdoor.Mux
}

// New builds an App; nothing listens until Start.
func New(cfg Config, logger *zap.Logger) (*App, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	metrics := newMetrics(logger)
	// Every component's logger descends from this one: the sampler is
	// the whole log's backstop, and the metrics count what it drops.
	logger = sampled(logger, cfg.Log.Sampling, metrics.LogSampled)
	a := &App{cfg: cfg, log: logger, aliases: mcpserver.MustAliases(cfg.MCP.Aliases), Metrics: metrics}
	hubCfg := cfg.hubConfig(Version)
	hubCfg.Observer = a.Metrics
	a.Hub = device.NewHub(hubCfg, logger.Named("device"))
	if err := a.newOTA(); err != nil {
		return nil, err
	}
	if err := a.newVoice(); err != nil {
		if a.ota != nil {
			_ = a.ota.Close()
		}
		return nil, err
	}
	if err := a.openAccess(); err != nil {
		if a.ota != nil {
			_ = a.ota.Close() // frees the data directory for another try
		}
		return nil, err
	}
	a.WS = ws.NewServer(a.cfg.WebSocket, a.Hub, logger.Named("ws"))
	a.watchMetrics()
	return a, nil
}

// Config returns the configuration the App runs with.
func (a *App) Config() Config { return a.cfg }

// MCP returns the upstream MCP server, or nil when MCP is off or the App
// has not started.
func (a *App) MCP() *mcpserver.Server { return a.mcp }

// Logger returns the App's root logger.
func (a *App) Logger() *zap.Logger { return a.log }

// DeviceAddr is the bound device listener address (useful with port 0).
func (a *App) DeviceAddr() net.Addr { return a.deviceLn.Addr() }

// ControlAddr is the bound control listener address.
func (a *App) ControlAddr() net.Addr { return a.controlLn.Addr() }

// DeviceURL is the WebSocket URL boards on this machine can use.
func (a *App) DeviceURL() string {
	return fmt.Sprintf("%s://%s%s", secureScheme("ws", a.deviceTLS), loopbackFor(a.DeviceAddr()), a.WS.Path())
}

// OTAURL is the OTA URL boards on this machine can use; "" when OTA is off.
func (a *App) OTAURL() string {
	if a.ota == nil {
		return ""
	}
	return fmt.Sprintf("%s://%s%s", secureScheme("http", a.deviceTLS), loopbackFor(a.DeviceAddr()), a.ota.Path())
}

// secureScheme is scheme ("ws", "http") or, on a TLS listener, its secure
// form ("wss", "https").
func secureScheme(scheme string, secure bool) string {
	if secure {
		return scheme + "s"
	}
	return scheme
}

// onShutdown registers f to run during Shutdown, before the Hub closes;
// functions run in reverse order of registration.
func (a *App) onShutdown(f func(context.Context)) {
	a.mu.Lock()
	a.shutdown = append(a.shutdown, f)
	a.mu.Unlock()
}

// onDrain registers f to run at the very start of Shutdown.
func (a *App) onDrain(f func()) {
	a.mu.Lock()
	a.drain = append(a.drain, f)
	a.mu.Unlock()
}

// goOwned runs f in a goroutine the App waits for on Shutdown.
func (a *App) goOwned(f func()) {
	a.wg.Add(1)
	go func() { defer a.wg.Done(); f() }()
}

// Start binds the listeners and starts serving. ctx bounds start-up and is
// handed to long-running parts, which stop when it ends or on Shutdown.
func (a *App) Start(ctx context.Context) error {
	deviceTLS, err := a.cfg.TLS.Device.load("device")
	if err != nil {
		return err
	}
	controlTLS, err := a.cfg.TLS.Control.load("control")
	if err != nil {
		return err
	}
	hc := a.cfg.HTTP
	if a.deviceLn, err = a.listen("device", a.cfg.DeviceListen, hc.DeviceMaxConnections, "http.device_max_connections", deviceTLS); err != nil {
		return err
	}
	if a.controlLn, err = a.listen("control", a.cfg.ControlListen, hc.ControlMaxConnections, "http.control_max_connections", controlTLS); err != nil {
		_ = a.deviceLn.Close()
		return err
	}
	a.deviceTLS, a.controlTLS = deviceTLS != nil, controlTLS != nil
	deviceMux := http.NewServeMux()
	deviceMux.Handle(a.WS.Path(), a.WS)
	if a.ota != nil {
		a.ota.Register(deviceMux)
	}
	a.deviceSrv = a.httpServer(deviceMux, a.log)

	if err := a.startAccess(ctx); err != nil {
		a.closeListeners()
		return fmt.Errorf("auth: %w", err)
	}
	// Every control route is mounted behind the front door (front.go).
	controlMux, err := a.newControlMux()
	if err != nil {
		a.closeListeners()
		a.closeAccess(context.WithoutCancel(ctx))
		return fmt.Errorf("control listener: %w", err)
	}
	a.mountMetadata(controlMux)
	apiSrv := api.New(a.Hub, a.apiOptions(), a.log.Named("api"))
	apiSrv.Register(controlMux)
	a.apiSrv = apiSrv
	if a.ota != nil {
		a.ota.RegisterControl(controlMux)
	}
	a.onDrain(apiSrv.Close) // ends /api/events streams
	if err := a.startMCP(ctx, controlMux); err != nil {
		a.closeListeners()
		a.closeAccess(context.WithoutCancel(ctx))
		return fmt.Errorf("mcp: %w", err)
	}
	a.watchPolicy(ctx)
	a.controlSrv = a.httpServer(api.JSONErrors(controlMux), a.log)

	a.serve(a.deviceSrv, a.deviceLn, "device")
	a.serve(a.controlSrv, a.controlLn, "control")
	a.logListening()
	if err := a.startObservability(); err != nil {
		a.Shutdown(context.Background())
		return err
	}

	if err := a.startCluster(ctx); err != nil {
		a.Shutdown(context.Background())
		return fmt.Errorf("cluster: %w", err)
	}
	if err := a.startMQTT(ctx); err != nil {
		a.Shutdown(context.Background())
		return fmt.Errorf("mqtt: %w", err)
	}
	if err := a.startSimulators(ctx); err != nil {
		a.Shutdown(context.Background())
		return fmt.Errorf("simulate: %w", err)
	}
	return nil
}

// logListening says where the bridge listens, at addresses a board or a
// client can use: a listener on every interface is shown at the machine's
// LAN address (and every other one it has, as device_hosts).
func (a *App) logListening() {
	deviceHosts := publicHosts(a.DeviceAddr())
	device := hostPortFor(deviceHosts[0], a.DeviceAddr())
	fields := []zap.Field{
		zap.String("devices", fmt.Sprintf("%s://%s%s", secureScheme("ws", a.deviceTLS), device, a.WS.Path())),
	}
	if a.ota != nil {
		fields = append(fields, zap.String("ota", fmt.Sprintf("%s://%s%s", secureScheme("http", a.deviceTLS), device, a.ota.Path())))
	}
	if len(deviceHosts) > 1 {
		fields = append(fields, zap.Strings("device_hosts", deviceHosts))
	}
	control := hostPortFor(publicHosts(a.ControlAddr())[0], a.ControlAddr())
	fields = append(fields,
		zap.String("control", secureScheme("http", a.controlTLS)+"://"+control),
		zap.Bool("device_auth", len(a.cfg.WebSocket.Tokens) > 0 || a.cfg.WebSocket.RequireToken))
	a.log.Info("bridge listening", fields...)
}

func (a *App) serve(srv *http.Server, ln net.Listener, name string) {
	a.goOwned(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("listener stopped", zap.String("listener", name), zap.Error(err))
		}
	})
}

func (a *App) closeListeners() {
	_ = a.deviceLn.Close()
	_ = a.controlLn.Close()
}

// Shutdown stops the bridge in order: answer calls in flight with a
// shutting-down error, end long-lived upstream streams, stop
// accepting devices and upstream requests (in-flight control requests may
// finish), run the registered
// shutdown steps (upstream server, MQTT, simulators), close every device
// session with a reason, then wait for all goroutines. It is bounded by ctx.
func (a *App) Shutdown(ctx context.Context) error {
	var errs []error
	// First answer every call in flight ("bridge shutting down") and refuse
	// new ones, so that draining the listeners below does not wait for
	// boards to finish long tools.
	a.Hub.Drain()
	a.mu.Lock()
	drain := a.drain
	a.drain = nil
	a.mu.Unlock()
	for _, f := range drain {
		f()
	}
	if a.deviceSrv != nil {
		errs = append(errs, a.deviceSrv.Shutdown(ctx))
	}
	if a.controlSrv != nil {
		if err := a.controlSrv.Shutdown(ctx); err != nil {
			_ = a.controlSrv.Close()
			errs = append(errs, fmt.Errorf("control listener: %w", err))
		}
	}
	a.mu.Lock()
	steps := a.shutdown
	a.shutdown = nil
	a.mu.Unlock()
	for i := len(steps) - 1; i >= 0; i-- {
		steps[i](ctx)
	}
	errs = append(errs, a.Hub.Close(ctx))
	a.WS.Close(device.ErrShutdown)
	if a.voice != nil {
		// After both transports: their boards' conversations have ended.
		a.voice.Close()
	}
	a.mu.Lock()
	stopSims := a.stopSimulators
	a.mu.Unlock()
	if stopSims != nil {
		stopSims()
	}
	a.wg.Wait()
	a.closeAccess(ctx)
	a.log.Info("bridge stopped")
	return errors.Join(errs...)
}

// Run starts the bridge and serves until ctx ends, then shuts down within
// the configured timeout.
func (a *App) Run(ctx context.Context) error {
	if err := a.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	a.log.Info("shutting down", zap.Duration("timeout", a.cfg.ShutdownTimeout))
	sctx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
	defer cancel()
	return a.Shutdown(sctx)
}

// loopbackFor turns a wildcard bind address into one a local client can dial.
func loopbackFor(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}
