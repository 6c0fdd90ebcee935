package ota

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/mqtt"
)

// Defaults for Config.
const (
	DefaultPath = "/xiaozhi/ota/"
	// DefaultMQTTKeepAlive is the firmware's own default, in seconds.
	DefaultMQTTKeepAlive = 240
	// DefaultActivationMessage is shown on the board's screen above the code.
	DefaultActivationMessage = "Approve this code on the bridge"
)

// Transports a board can be told to use.
const (
	TransportWebSocket = "websocket"
	TransportMQTT      = "mqtt"
)

// Config configures the OTA endpoint and admission. It carries its own
// yaml keys (the bridge's ota: section).
type Config struct {
	// Path is the OTA URL's path on the device listener; boards POST to it
	// and to Path+"activate".
	Path string `yaml:"path"`
	// DataDir holds the admission state and the generated secret; "" keeps
	// both in memory (approvals and issued credentials are then lost on
	// restart).
	DataDir string `yaml:"data_dir"`
	// Secret is the key credentials are derived from (at least 16 bytes);
	// "" uses DataDir/ota-secret, created on first start.
	Secret string `yaml:"secret"`
	// Transport is what boards are told to use: websocket, mqtt, or "" for
	// mqtt when the embedded broker runs and websocket otherwise.
	Transport string `yaml:"transport"`
	// Transports overrides Transport per board (MAC → websocket|mqtt).
	Transports map[string]string `yaml:"transports"`
	// WebSocketURL is the websocket.url handed out; "" builds it from the
	// Host the board used, the device listener's port and path.
	WebSocketURL string `yaml:"websocket_url"`
	// MQTTEndpoint is the mqtt.endpoint handed out (host:port); "" builds it
	// from the Host the board used and the broker's port.
	MQTTEndpoint string `yaml:"mqtt_endpoint"`
	// MQTTKeepAlive is mqtt.keepalive in seconds (default 240).
	MQTTKeepAlive int `yaml:"mqtt_keepalive"`
	// TimezoneOffset, in minutes, is sent in server_time when set.
	TimezoneOffset *int `yaml:"timezone_offset"`
	// Allow, when not empty, lists the only MACs admitted without approval.
	Allow []string `yaml:"allow"`
	// Approval makes an unknown board show an activation code and wait
	// until an operator approves it through the control API.
	Approval bool `yaml:"approval"`
	// RequireCredentials makes the transports refuse boards without valid
	// credentials (issued or static) even when no static ones are
	// configured. Implied by Allow and Approval, which would mean nothing
	// if a board could skip the OTA call.
	RequireCredentials bool `yaml:"require_credentials"`
	// ActivationMessage is shown on the board above the code.
	ActivationMessage string `yaml:"activation_message"`
	// MaxBodyBytes bounds a request body (default 64 KiB).
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// Balance, with several bridges in a fleet, is how the answer picks
	// the node a board connects to: "" (this node, the default) or
	// least_loaded (the live node with the fewest boards, through the
	// Placement the bridge sets).
	Balance string `yaml:"balance"`
}

// BalanceLeastLoaded sends each board to the live node with the fewest
// boards (Config.Balance).
const BalanceLeastLoaded = "least_loaded"

// Target is the node a Placement sends a board to, with its public
// endpoint for the transport asked.
type Target struct {
	Node         string
	WebSocketURL string // for websocket
	MQTTEndpoint string // for mqtt: host:port
}

// Placement picks the node a board connects to, for a transport
// (TransportWebSocket or TransportMQTT). ok false keeps the board on this
// node (this node is the best pick, or no other node offers the
// transport). The bridge wires it to its fleet; package ota knows nothing
// about how nodes are found.
type Placement func(transport string) (t Target, ok bool)

// WithDefaults fills zero fields.
func (c Config) WithDefaults() Config {
	if c.Path == "" {
		c.Path = DefaultPath
	}
	if c.MQTTKeepAlive <= 0 {
		c.MQTTKeepAlive = DefaultMQTTKeepAlive
	}
	if c.ActivationMessage == "" {
		c.ActivationMessage = DefaultActivationMessage
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	return c
}

// Validate reports settings that could never produce an answer a board
// accepts.
func (c Config) Validate() error {
	var errs []error
	if c.Path != "" && c.Path[0] != '/' {
		errs = append(errs, errors.New("ota.path must start with /"))
	}
	if c.Secret != "" && len(c.Secret) < minSecretLen {
		errs = append(errs, ErrShortSecret)
	}
	if err := checkTransport(c.Transport, true); err != nil {
		errs = append(errs, fmt.Errorf("ota.transport: %w", err))
	}
	for mac, t := range c.Transports {
		if _, ok := device.MACDigits(mac); !ok {
			errs = append(errs, fmt.Errorf("ota.transports: %q is not a MAC", mac))
		}
		if err := checkTransport(t, false); err != nil {
			errs = append(errs, fmt.Errorf("ota.transports[%s]: %w", mac, err))
		}
	}
	for _, mac := range c.Allow {
		if _, ok := device.MACDigits(mac); !ok {
			errs = append(errs, fmt.Errorf("ota.allow: %q is not a MAC", mac))
		}
	}
	if c.WebSocketURL != "" {
		u, err := url.Parse(c.WebSocketURL)
		if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" || len(c.WebSocketURL) > MaxValueLen {
			errs = append(errs, fmt.Errorf("ota.websocket_url %q: want ws://host[:port]/path or wss://", c.WebSocketURL))
		}
	}
	if c.MQTTEndpoint != "" {
		if strings.Contains(c.MQTTEndpoint, "://") || checkEndpoint(c.MQTTEndpoint) != nil || len(c.MQTTEndpoint) > MaxValueLen {
			errs = append(errs, fmt.Errorf("ota.mqtt_endpoint %q: want host or host:port with a numeric port (no scheme)", c.MQTTEndpoint))
		}
	}
	if c.Balance != "" && c.Balance != BalanceLeastLoaded {
		errs = append(errs, fmt.Errorf("ota.balance %q: want least_loaded, or nothing to keep boards on the node they asked", c.Balance))
	}
	if len(c.ActivationMessage) > 200 {
		errs = append(errs, errors.New("ota.activation_message: at most 200 bytes"))
	}
	return errors.Join(errs...)
}

func checkTransport(t string, emptyOK bool) error {
	switch t {
	case TransportWebSocket, TransportMQTT:
		return nil
	case "":
		if emptyOK {
			return nil
		}
	}
	return fmt.Errorf("%q: want websocket or mqtt", t)
}

// Network is what the OTA answer needs to know about the bridge's
// listeners; the bridge hands a function returning it, because ports are
// known only once bound and the embedded broker may fail to bind.
type Network struct {
	// DevicePort is the device listener's port; DeviceTLS says it serves
	// https and wss.
	DevicePort string
	DeviceTLS  bool
	// WebSocketPath is the device WebSocket path (/xiaozhi/v1/).
	WebSocketPath string
	// MQTT says a broker is available to boards; MQTTEmbedded that it is
	// the bridge's own.
	MQTT, MQTTEmbedded bool
	// MQTTHost and MQTTPort are the broker's address as boards dial it;
	// an empty host means the host the board used to reach the bridge.
	MQTTHost, MQTTPort string
	// Uplink and Downlink are the gateway's topic templates ({mac}).
	Uplink, Downlink string
	// DeviceHost and MQTTBindHost are the device listener's and the
	// embedded broker's own IPs when bound to one (not 0.0.0.0 or ::):
	// what Advertised offers the fleet when no public URL is configured.
	DeviceHost, MQTTBindHost string
}

// Server serves the OTA endpoint and decides admission.
type Server struct {
	cfg      Config
	network  func() Network
	store    *Store
	creds    *Credentials
	log      *zap.Logger
	allow    map[string]bool
	override map[string]string
	now      func() time.Time
	place    atomic.Pointer[Placement]
}

// New opens the store and the secret. network is called on every request.
func New(cfg Config, network func() Network, logger *zap.Logger) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	store, err := OpenStore(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	var secret []byte
	switch {
	case cfg.Secret != "":
		secret = []byte(cfg.Secret)
	case cfg.DataDir != "":
		if secret, err = LoadOrCreateSecret(cfg.DataDir); err != nil {
			return nil, err
		}
	default:
		secret = make([]byte, 32)
		_, _ = rand.Read(secret)
		logger.Warn("ota: no data_dir and no secret configured; board credentials and approvals last only until the bridge restarts (set ota.data_dir)")
	}
	creds, err := NewCredentials(secret)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, network: network, store: store, creds: creds, log: logger,
		allow: map[string]bool{}, override: map[string]string{}, now: time.Now}
	for _, m := range cfg.Allow {
		s.allow[device.NormalizeID(m)] = true
	}
	for m, t := range cfg.Transports {
		s.override[device.NormalizeID(m)] = t
	}
	return s, nil
}

// SetPlacement sets how boards are spread over a fleet's nodes; it is used
// only with Config.Balance set. nil keeps every board on this node.
func (s *Server) SetPlacement(p Placement) {
	if p == nil {
		s.place.Store(nil)
		return
	}
	s.place.Store(&p)
}

// Balanced reports whether answers may send boards to other nodes.
func (s *Server) Balanced() bool { return s.cfg.Balance == BalanceLeastLoaded }

// placeFor asks the Placement where a board should go; ok false: here.
func (s *Server) placeFor(transport string) (Target, bool) {
	p := s.place.Load()
	if p == nil || !s.Balanced() {
		return Target{}, false
	}
	t, ok := (*p)(transport)
	switch {
	case !ok:
		return Target{}, false
	case transport == TransportMQTT && t.MQTTEndpoint == "", transport == TransportWebSocket && t.WebSocketURL == "":
		return Target{}, false
	}
	return t, true
}

// Advertised is where boards reach this node, for the other nodes of a
// fleet to hand out: the configured websocket_url, else the device
// listener's own address when it is bound to one IP; the configured
// mqtt_endpoint, else the embedded broker's address when bound to one IP.
// An external broker is not advertised (it is not this node's). Empty
// means not offered.
func (s *Server) Advertised() (websocketURL, mqttEndpoint string) {
	n := s.network()
	websocketURL = s.cfg.WebSocketURL
	if websocketURL == "" && n.DeviceHost != "" && n.DevicePort != "" {
		websocketURL = n.webSocketURL(n.DeviceHost)
	}
	if n.MQTTEmbedded {
		mqttEndpoint = s.cfg.MQTTEndpoint
		if mqttEndpoint == "" && n.MQTTBindHost != "" && n.MQTTPort != "" {
			mqttEndpoint = net.JoinHostPort(n.MQTTBindHost, n.MQTTPort)
		}
	}
	return websocketURL, mqttEndpoint
}

// Path is the OTA path; ActivatePath where boards poll for approval.
func (s *Server) Path() string { return s.cfg.Path }

// ActivatePath is Path with "activate" appended the way the firmware does.
func (s *Server) ActivatePath() string {
	if strings.HasSuffix(s.cfg.Path, "/") {
		return s.cfg.Path + "activate"
	}
	return s.cfg.Path + "/activate"
}

// Store returns the admission store.
func (s *Server) Store() *Store { return s.store }

// Credentials returns the credential deriver.
func (s *Server) Credentials() *Credentials { return s.creds }

// RequireCredentials reports whether transports must refuse boards that
// present no valid credentials.
func (s *Server) RequireCredentials() bool {
	return s.cfg.RequireCredentials || s.cfg.Approval || len(s.allow) > 0
}

// Admitted reports whether a board may use the bridge now: admission off,
// on the allowlist, or approved.
func (s *Server) Admitted(deviceID string) bool {
	id := device.NormalizeID(deviceID)
	if s.allow[id] {
		return true
	}
	if s.cfg.Approval {
		r, ok := s.store.Get(id)
		return ok && r.Approved
	}
	return len(s.allow) == 0
}

// VerifyWebSocketToken is the WebSocket listener's check: the token issued
// to this board, and the board still admitted.
func (s *Server) VerifyWebSocketToken(deviceID, token string) bool {
	id := device.NormalizeID(deviceID)
	return s.creds.VerifyWebSocketToken(id, token) && s.Admitted(id)
}

// VerifyMQTT is the embedded broker's check, for the board its client id
// names.
func (s *Server) VerifyMQTT(deviceID, username, password string) bool {
	id := device.NormalizeID(deviceID)
	return s.creds.VerifyMQTT(id, username, password) && s.Admitted(id)
}

// Register mounts the OTA and activation paths on the device mux.
func (s *Server) Register(mux *http.ServeMux) {
	mux.HandleFunc(s.cfg.Path, s.serveOTA)
	mux.HandleFunc(s.ActivatePath(), s.serveActivate)
}

// RegisterControl mounts the operator routes on the control listener. mux
// must authenticate what it mounts, as the control API's routes are (the
// app's front door does): the list shows pending activation codes, and
// approve admits a board.
func (s *Server) RegisterControl(mux interface {
	Handle(pattern string, h http.Handler)
}) {
	mux.Handle("GET /api/ota/devices", http.HandlerFunc(s.listDevices))
	mux.Handle("POST /api/ota/devices/{id}/approve", http.HandlerFunc(s.approve))
}

func (s *Server) serveOTA(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != s.cfg.Path {
		http.NotFound(w, r)
		return
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		s.status(w, r)
	case http.MethodPost:
		s.answer(w, r)
	default:
		w.Header().Set("Allow", "GET, POST")
		http.Error(w, "use POST (boards) or GET (a status page)", http.StatusMethodNotAllowed)
	}
}

// status is the page a person sees when opening the OTA URL in a browser.
func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	n := s.network()
	var pending, approved int
	records := s.store.List()
	for _, rec := range records {
		if rec.Pending() {
			pending++
		}
		if rec.Approved {
			approved++
		}
	}
	admission := "open (every board is admitted)"
	switch {
	case s.cfg.Approval:
		admission = fmt.Sprintf("approval mode: %d approved, %d waiting for an operator", approved, pending)
		if len(s.allow) > 0 {
			admission += fmt.Sprintf("; %d boards on the allowlist", len(s.allow))
		}
	case len(s.allow) > 0:
		admission = fmt.Sprintf("allowlist of %d boards", len(s.allow))
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, "devicebridge OTA endpoint: OK\n\n")
	fmt.Fprintf(w, "Boards POST their system information here at every boot and get their connection settings back.\n")
	fmt.Fprintf(w, "Set this URL as the board's OTA URL: %s\n\n", s.selfURL(r, n))
	fmt.Fprintf(w, "transport for new boards: %s\n", s.defaultTransport(n))
	if s.defaultTransport(n) == TransportMQTT {
		fmt.Fprintf(w, "mqtt endpoint: %s\n", s.mqttEndpoint(r, n))
	}
	fmt.Fprintf(w, "websocket url: %s\n", s.websocketURL(r, n))
	fmt.Fprintf(w, "admission: %s\n", admission)
	fmt.Fprintf(w, "boards seen: %d\n", len(records))
}

func (s *Server) selfURL(r *http.Request, n Network) string {
	scheme := "http"
	if n.DeviceTLS {
		scheme = "https"
	}
	return scheme + "://" + r.Host + s.cfg.Path
}

func (s *Server) answer(w http.ResponseWriter, r *http.Request) {
	req, err := ParseRequest(r, s.cfg.MaxBodyBytes)
	if err != nil {
		s.log.Info("refused OTA request", zap.String("remote", r.RemoteAddr), zap.Error(err))
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	log := s.log.With(zap.String("device_id", req.DeviceID), zap.String("remote", r.RemoteAddr))
	allowed := s.allow[req.DeviceID]
	if len(s.allow) > 0 && !allowed && !s.cfg.Approval {
		log.Warn("refused board: not on the OTA allowlist (add it to ota.allow)")
		http.Error(w, "this board is not on the bridge's allowlist", http.StatusForbidden)
		return
	}
	needsApproval := s.cfg.Approval && !allowed
	rec, err := s.store.Seen(req, s.now(), needsApproval)
	if err != nil {
		log.Error("could not record the board", zap.Error(err))
		http.Error(w, "the bridge could not record this board", http.StatusInternalServerError)
		return
	}
	ans := Answer{ServerTime: &ServerTime{Timestamp: s.now().UnixMilli(), TimezoneOffset: s.cfg.TimezoneOffset},
		Firmware: firmwareEcho(req.Firmware)}
	n := s.network()
	transport := ""
	if needsApproval && !rec.Approved {
		ans.Activation = &Activation{Message: s.cfg.ActivationMessage, Code: rec.Code, Challenge: rec.Challenge}
		log.Info("board waits for approval: approve it with POST /api/ota/devices/{id}/approve on the control listener",
			zap.String("board", req.Board), zap.String("firmware", req.Firmware))
	} else {
		transport = s.transportFor(req.DeviceID, n)
		target, elsewhere := s.placeFor(transport)
		if elsewhere {
			log = log.With(zap.String("node", target.Node))
		}
		switch transport {
		case TransportMQTT:
			login := s.creds.MQTT(req.DeviceID, req.ClientID)
			key := mqtt.TopicKey(req.DeviceID)
			endpoint := s.mqttEndpoint(r, n)
			if elsewhere {
				endpoint = target.MQTTEndpoint
			}
			ans.MQTT = &MQTT{
				Endpoint: endpoint, ClientID: login.ClientID, Username: login.Username, Password: login.Password,
				PublishTopic: mqtt.MustTemplate(n.Uplink).Topic(key), SubscribeTopic: mqtt.MustTemplate(n.Downlink).Topic(key),
				KeepAlive: s.cfg.MQTTKeepAlive,
			}
		default:
			u := s.websocketURL(r, n)
			if elsewhere {
				u = target.WebSocketURL
			}
			ans.WebSocket = &WebSocket{URL: u, Token: s.creds.WebSocketToken(req.DeviceID), Version: 1}
		}
	}
	body, err := ans.Marshal(req.Firmware)
	if err != nil {
		// Sending it could crash or brick the board; a 500 only makes it
		// retry. The error names the rule and the key, never a value.
		log.Error("OTA answer would break the board; not sent", zap.Error(err))
		http.Error(w, "the bridge could not build a safe answer for this board", http.StatusInternalServerError)
		return
	}
	if transport != "" {
		if err := s.store.SetTransport(req.DeviceID, transport); err != nil {
			log.Warn("could not record the board's transport", zap.Error(err))
		}
		log.Info("OTA answered", zap.String("transport", transport), zap.String("board", req.Board),
			zap.String("firmware", req.Firmware), zap.String("client_id", req.ClientID))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// serveActivate answers the board's activation polls: 202 while it waits
// for an operator, 200 once admitted.
func (s *Server) serveActivate(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		http.Error(w, "boards POST here while they wait for approval", http.StatusMethodNotAllowed)
		return
	}
	// The body is {} or a serial-number HMAC over the challenge; the
	// bridge cannot check the latter (the key is in the board's eFuse),
	// so approval by an operator is what admits a board.
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, s.cfg.MaxBodyBytes))
	mac := r.Header.Get("Device-Id")
	if _, ok := device.MACDigits(mac); !ok {
		http.Error(w, "missing or invalid Device-Id header", http.StatusBadRequest)
		return
	}
	id := device.NormalizeID(mac)
	if _, ok := s.store.Get(id); !ok && !s.allow[id] {
		http.Error(w, "unknown board: call the OTA endpoint first", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if !s.Admitted(id) {
		w.WriteHeader(http.StatusAccepted)
		_, _ = io.WriteString(w, `{"status":"pending"}`)
		return
	}
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, `{"status":"activated"}`)
}

// transportFor picks a board's transport: its override, else the
// configured one, else mqtt when the embedded broker runs. MQTT with no
// broker available falls back to websocket, so the board is never sent to
// a broker that is not there.
func (s *Server) transportFor(id string, n Network) string {
	t := s.override[id]
	if t == "" {
		t = s.defaultTransport(n)
	}
	if t == TransportMQTT && !n.MQTT {
		return TransportWebSocket
	}
	return t
}

func (s *Server) defaultTransport(n Network) string {
	switch {
	case s.cfg.Transport == TransportMQTT && n.MQTT:
		return TransportMQTT
	case s.cfg.Transport != "":
		return TransportWebSocket
	case n.MQTTEmbedded:
		return TransportMQTT
	}
	return TransportWebSocket
}

// requestHost is the host the board used to reach the bridge, without the
// port: the address that worked for it is the best guess for the others.
func requestHost(r *http.Request) string {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if host == "" {
		if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			host, _, _ = net.SplitHostPort(a.String())
		}
	}
	return host
}

func (s *Server) websocketURL(r *http.Request, n Network) string {
	if s.cfg.WebSocketURL != "" {
		return s.cfg.WebSocketURL
	}
	return n.webSocketURL(requestHost(r))
}

// webSocketURL is the device listener's WebSocket URL on host.
func (n Network) webSocketURL(host string) string {
	scheme := "ws"
	if n.DeviceTLS {
		scheme = "wss"
	}
	return scheme + "://" + net.JoinHostPort(host, n.DevicePort) + n.WebSocketPath
}

func (s *Server) mqttEndpoint(r *http.Request, n Network) string {
	if s.cfg.MQTTEndpoint != "" {
		return s.cfg.MQTTEndpoint
	}
	host := n.MQTTHost
	if host == "" {
		host = requestHost(r)
	}
	return net.JoinHostPort(host, n.MQTTPort)
}

// DeviceView is one row of GET /api/ota/devices.
type DeviceView struct {
	Record
	Pending  bool `json:"pending"`
	Admitted bool `json:"admitted"`
}

func (s *Server) listDevices(w http.ResponseWriter, _ *http.Request) {
	records := s.store.List()
	out := make([]DeviceView, 0, len(records))
	for _, r := range records {
		out = append(out, DeviceView{Record: r, Pending: r.Pending(), Admitted: s.Admitted(r.DeviceID)})
	}
	writeJSON(w, http.StatusOK, map[string]any{"approval": s.cfg.Approval, "devices": out})
}

func (s *Server) approve(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if _, ok := device.MACDigits(id); ok {
		id = device.NormalizeID(id)
	}
	rec, err := s.store.Approve(id, s.now())
	switch {
	case errors.Is(err, ErrUnknownDevice):
		writeJSON(w, http.StatusNotFound, errorBody("unknown_device", "no board with this MAC or activation code has called the OTA endpoint"))
		return
	case err != nil:
		s.log.Error("could not store an approval", zap.Error(err))
		writeJSON(w, http.StatusInternalServerError, errorBody("internal", "could not store the approval"))
		return
	}
	s.log.Info("board approved", zap.String("device_id", rec.DeviceID))
	writeJSON(w, http.StatusOK, DeviceView{Record: rec, Admitted: s.Admitted(rec.DeviceID)})
}

func errorBody(code, msg string) map[string]any {
	return map[string]any{"error": map[string]string{"code": code, "message": msg}}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
