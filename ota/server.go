package ota

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/time/rate"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/internal/keyrate"
	"github.com/devicebridge/devicebridge/internal/logthrottle"
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

	// What follows bounds what anyone who can reach the device listener
	// can make the bridge hold or do: before admission a board is just an
	// HTTP client that claims a MAC. Zero means the default.

	// MaxPending bounds boards waiting for approval (default 1000); past
	// it a new board is answered 503 and retries later.
	MaxPending int `yaml:"max_pending"`
	// PendingTTL is how long a pending board that stopped asking is kept
	// (default 1h); a waiting board asks every half minute or so.
	PendingTTL time.Duration `yaml:"pending_ttl"`
	// MaxDevices bounds the boards recorded (default 50,000); past it a
	// new board is answered 503 where credentials are required, and
	// answered but not recorded otherwise.
	MaxDevices int `yaml:"max_devices"`
	// RequestsPerSecond and RequestBurst limit OTA requests (boot calls,
	// activation polls, the status page) per source address (an IPv6
	// /64); past them the answer is 429. Defaults 10 and 100.
	RequestsPerSecond float64 `yaml:"requests_per_second"`
	RequestBurst      int     `yaml:"request_burst"`
	// MaxAddresses bounds the source addresses tracked for that limit
	// (default 16384); past it new addresses share one allowance.
	MaxAddresses int `yaml:"max_addresses"`
	// CodeDigits is the length of activation codes (6 to 10, default 6).
	CodeDigits int `yaml:"code_digits"`
	// CodeGuessesPerHour bounds wrong codes on the approve route, for all
	// callers together (default 60), and CodeGuessesPerCallerPerHour for
	// each caller address (default 20). Past them approval by code is
	// answered 429; approval by MAC still works.
	CodeGuessesPerHour          int `yaml:"code_guesses_per_hour"`
	CodeGuessesPerCallerPerHour int `yaml:"code_guesses_per_caller_per_hour"`

	// Upstream passes boot calls and activation polls through to a voice
	// upstream's OTA endpoint (upstream.go). Its keys live in the
	// bridge's voice: section, which sets it.
	Upstream Upstream `yaml:"-"`
}

// Defaults of the bounds in Config; the store's are DefaultMaxPending,
// DefaultPendingTTL, DefaultMaxDevices and DefaultCodeDigits.
const (
	// DefaultRequestsPerSecond and DefaultRequestBurst let a site of 500
	// boards behind one NAT boot together, and 10,000 within minutes (a
	// refused board retries after 10 s, 20 s, 40 s…), while a flood from
	// one address costs at most 50 small requests a second; the pending
	// and record caps bound what they leave behind.
	DefaultRequestsPerSecond = 50
	DefaultRequestBurst      = 500
	DefaultMaxAddresses      = 16384
	// With 6 digits and a full pending list, DefaultCodeGuessesPerHour
	// makes a guess hit some waiting board's code after about 17 hours on
	// average, and walking the whole code space take two years.
	DefaultCodeGuessesPerHour          = 60
	DefaultCodeGuessesPerCallerPerHour = 20
	minCodeDigits, maxCodeDigits       = 6, 10
	// minPendingTTL: a waiting board asks again within a minute.
	minPendingTTL = time.Minute
)

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
	c.Path = cmp.Or(c.Path, DefaultPath)
	c.ActivationMessage = cmp.Or(c.ActivationMessage, DefaultActivationMessage)
	lim := c.limits().withDefaults()
	c.MaxPending, c.MaxDevices, c.PendingTTL, c.CodeDigits = lim.MaxPending, lim.MaxDevices, lim.PendingTTL, lim.CodeDigits
	// max(x, 0): a negative value here has always meant the default too.
	c.MQTTKeepAlive = cmp.Or(max(c.MQTTKeepAlive, 0), DefaultMQTTKeepAlive)
	c.MaxBodyBytes = cmp.Or(max(c.MaxBodyBytes, 0), DefaultMaxBodyBytes)
	c.RequestsPerSecond = cmp.Or(max(c.RequestsPerSecond, 0), DefaultRequestsPerSecond)
	c.RequestBurst = cmp.Or(max(c.RequestBurst, 0), DefaultRequestBurst)
	c.MaxAddresses = cmp.Or(max(c.MaxAddresses, 0), DefaultMaxAddresses)
	c.CodeGuessesPerHour = cmp.Or(max(c.CodeGuessesPerHour, 0), DefaultCodeGuessesPerHour)
	c.CodeGuessesPerCallerPerHour = cmp.Or(max(c.CodeGuessesPerCallerPerHour, 0), DefaultCodeGuessesPerCallerPerHour)
	if c.Upstream.URL != "" {
		c.Upstream = c.Upstream.withDefaults()
	}
	return c
}

func (c Config) limits() Limits {
	return Limits{MaxPending: c.MaxPending, MaxDevices: c.MaxDevices, PendingTTL: c.PendingTTL, CodeDigits: c.CodeDigits}
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
	if err := c.Upstream.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(append(errs, c.validateBounds())...)
}

// validateBounds checks how the bounds fit together, as they will be
// once defaults are filled in. Each number's own range is checked by the
// bridge's configuration (app/configcheck.go).
func (c Config) validateBounds() error {
	var errs []error
	d := c.WithDefaults()
	if space := math.Pow10(d.CodeDigits); space < 1000*float64(d.MaxPending) {
		errs = append(errs, fmt.Errorf("ota.code_digits %d with ota.max_pending %d: a guessed code would name a waiting board more than once in 1000 tries; "+
			"use at least %d digits or at most %d pending boards", d.CodeDigits, d.MaxPending,
			int(math.Ceil(math.Log10(1000*float64(d.MaxPending)))), int(space/1000)))
	}
	if d.MaxDevices < d.MaxPending {
		errs = append(errs, fmt.Errorf("ota.max_devices %d is less than ota.max_pending %d: pending boards are records too", d.MaxDevices, d.MaxPending))
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
	// the bridge's own; MQTTDirect that it is an external broker that
	// reaches boards that never subscribe (mqtt.downlink mosquitto-plugin
	// or emqx-autosubscribe), so current firmware can be sent to it.
	MQTT, MQTTEmbedded, MQTTDirect bool
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

	// perAddress limits OTA requests per source address; callerGuesses
	// and allGuesses limit wrong activation codes per caller and in all.
	perAddress, callerGuesses, allGuesses *keyrate.Set
	// One throttle per line an outsider can repeat at will: refusals,
	// and the lines of every answer (a board asks again at every boot, and
	// while it waits for approval; anyone can ask as if a board).
	warnLimited, warnConflict, warnForeign, warnAllowlist, warnGuess, infoWrongCode, infoBadRequest logthrottle.Throttle
	warnPendingFull, warnStoreFull, warnUnrecorded, errUnsafeAnswer                                 logthrottle.Throttle
	infoWaiting, infoAnswered                                                                       logthrottle.Throttle

	// up is the voice upstream's OTA endpoint, nil without one; its
	// failures, busy refusals and dropped pieces have a throttle each, so
	// that a flood of one hides no line of another.
	up                                                       *upstream
	warnUpstreamFailed, warnUpstreamBusy, warnUpstreamUnsafe logthrottle.Throttle
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
	store, dropped, err := OpenStore(cfg.DataDir, cfg.limits(), time.Now())
	if err != nil {
		return nil, err
	}
	store.log = logger
	if dropped > 0 {
		logger.Warn("ota: boards left out of the stored state: pending ones that stopped asking, or past ota.max_pending / ota.max_devices",
			zap.Int("left_out", dropped), zap.Int("max_pending", cfg.MaxPending), zap.Int("max_devices", cfg.MaxDevices))
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
	const hour = float64(time.Hour / time.Second)
	s := &Server{cfg: cfg, network: network, store: store, creds: creds, log: logger,
		allow: map[string]bool{}, override: map[string]string{}, now: time.Now,
		perAddress: keyrate.New(cfg.RequestsPerSecond, cfg.RequestBurst, cfg.MaxAddresses),
		// A burst of a sixth of the hourly allowance: an operator's typos
		// pass, a script's loop does not.
		callerGuesses: keyrate.New(float64(cfg.CodeGuessesPerCallerPerHour)/hour, max(1, cfg.CodeGuessesPerCallerPerHour/6), cfg.MaxAddresses),
		allGuesses:    keyrate.New(float64(cfg.CodeGuessesPerHour)/hour, max(1, cfg.CodeGuessesPerHour/6), 1),
	}
	for _, m := range cfg.Allow {
		s.allow[device.NormalizeID(m)] = true
	}
	for m, t := range cfg.Transports {
		s.override[device.NormalizeID(m)] = t
	}
	if cfg.Upstream.URL != "" {
		if s.up, err = newUpstream(cfg.Upstream); err != nil {
			_ = store.Close()
			return nil, err
		}
	}
	return s, nil
}

// Close writes what the admission state holds that is not on disk yet
// (see Store) and stops the store's writer, and closes the idle
// connections to the voice upstream. Call it once the listeners no longer
// serve OTA requests; it may be called more than once.
func (s *Server) Close() error {
	if s.up != nil {
		s.up.close()
	}
	return s.store.Close()
}

// UpstreamStats reads the OTA pass-through's counters; ok is false when
// no voice upstream is configured.
func (s *Server) UpstreamStats() (st UpstreamStats, ok bool) {
	if s.up == nil {
		return UpstreamStats{}, false
	}
	return s.up.stats(), true
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

// CheckWebSocketToken is the WebSocket listener's check of a board's
// token: issued when it is the token issued to this board, the board is
// still admitted and, where credentials are required, it presents the
// Client-Id its credentials are bound to; foreign when it is recognisably
// a token the bridge issued to another board, which the listener refuses
// even where tokens are optional.
func (s *Server) CheckWebSocketToken(deviceID, clientID, token string) (issued, foreign bool) {
	id := device.NormalizeID(deviceID)
	if owner, ok := s.creds.WebSocketTokenOwner(token); ok && owner != id {
		s.refuseForeign(id, owner, "websocket")
		return false, true
	}
	if !s.creds.VerifyWebSocketToken(id, token) {
		return false, false
	}
	return s.Admitted(id) && s.boundTo(id, clientID, "websocket"), false
}

// BridgeMQTTPassword is the bridge's password on a Mosquitto with the
// devicebridge plugin, derived from the credential secret.
func (s *Server) BridgeMQTTPassword(username string) string {
	return s.creds.BridgeMQTTPassword(username)
}

// CheckMQTT is the embedded broker's check of a board's login, for the
// board its client id names (deviceID, and clientID, the UUID part): as
// CheckWebSocketToken.
func (s *Server) CheckMQTT(deviceID, clientID, username, password string) (issued, foreign bool) {
	id := device.NormalizeID(deviceID)
	if owner, ok := s.creds.MQTTOwner(username, password); ok && owner != id {
		s.refuseForeign(id, owner, "mqtt")
		return false, true
	}
	if !s.creds.VerifyMQTT(id, username, password) {
		return false, false
	}
	return s.Admitted(id) && s.boundTo(id, clientID, "mqtt"), false
}

func (s *Server) refuseForeign(id, owner, transport string) {
	s.warnForeign.Warn(s.log, "refused a board presenting credentials the bridge issued to another board",
		zap.String("device_id", id), zap.String("issued_to", owner), zap.String("transport", transport))
}

// boundTo reports whether clientID may use the credentials issued to id.
// Where credentials are required, the board's record names the Client-Id
// they are bound to (trust on first use, at the OTA call); any other is
// refused, and recorded for the operator. A node that holds no record of
// the board (another node of a fleet answered its OTA call) has no binding
// to check and trusts the credentials alone.
func (s *Server) boundTo(id, clientID, transport string) bool {
	if !s.RequireCredentials() {
		return true
	}
	r, ok := s.store.Get(id)
	if !ok || r.ClientID != "" && r.ClientID == clientID {
		return true
	}
	s.store.Reject(id, clientID, s.now())
	s.warnConflict.Warn(s.log, "refused a board: its credentials are bound to another Client-Id (reset with POST /api/ota/devices/{mac}/reset if its flash was erased)",
		zap.String("device_id", id), zap.String("client_id", clientID), zap.String("transport", transport))
	return false
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
	mux.Handle("POST /api/ota/devices/{id}/reset", http.HandlerFunc(s.reset))
}

// limited answers 429 when the request's source address has used up its
// allowance of OTA requests. A board retries a non-200 answer after 10 s,
// 20 s, 40 s...; Retry-After is for other clients.
func (s *Server) limited(w http.ResponseWriter, r *http.Request) bool {
	ok, wait := s.perAddress.Allow(keyrate.AddrKey(r.RemoteAddr), s.now())
	if ok {
		return false
	}
	s.warnLimited.Warn(s.log, "refused OTA requests: too many from one address (ota.requests_per_second, ota.request_burst)",
		zap.String("remote", r.RemoteAddr))
	w.Header().Set("Retry-After", retryAfter(wait))
	http.Error(w, "too many OTA requests from this address; retry later", http.StatusTooManyRequests)
	return true
}

// retryAfter is a Retry-After value: whole seconds, at least 1.
func retryAfter(d time.Duration) string {
	return strconv.Itoa(max(1, int(math.Ceil(d.Seconds()))))
}

func (s *Server) serveOTA(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != s.cfg.Path {
		http.NotFound(w, r)
		return
	}
	if s.limited(w, r) {
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
	c := s.store.Counts(s.now())
	approved, pending := c.Approved, c.Pending
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
	if s.up != nil {
		// Not where: the page is open to anyone who reaches the listener.
		fmt.Fprintf(w, "voice upstream: boot calls and activation polls of admitted boards are passed on to it\n")
	}
	fmt.Fprintf(w, "boards seen: %d\n", c.Devices)
}

func (s *Server) selfURL(r *http.Request, n Network) string {
	scheme := "http"
	if n.DeviceTLS {
		scheme = "https"
	}
	return scheme + "://" + r.Host + s.cfg.Path
}

func (s *Server) answer(w http.ResponseWriter, r *http.Request) {
	req, raw, err := readRequest(r, s.cfg.MaxBodyBytes)
	if err != nil {
		s.infoBadRequest.Info(s.log, "refused OTA request", zap.String("remote", r.RemoteAddr), clip.Error(err))
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	log := s.log.With(zap.String("device_id", req.DeviceID), zap.String("remote", r.RemoteAddr))
	// Where credentials are required they are bound to the Client-Id the
	// board first registers with: the protocol gives a board no secret
	// before this call, and its UUID is the one thing an impostor who
	// knows the MAC does not have by default.
	bind := s.RequireCredentials()
	if bind && req.ClientID == "" {
		s.infoBadRequest.Info(s.log, "refused OTA request: no Client-Id, and credentials are bound to it", zap.String("remote", r.RemoteAddr))
		http.Error(w, "bad OTA request: a Client-Id header is required (boards send their UUID)", http.StatusBadRequest)
		return
	}
	allowed := s.allow[req.DeviceID]
	if len(s.allow) > 0 && !allowed && !s.cfg.Approval {
		s.warnAllowlist.Warn(log, "refused board: not on the OTA allowlist (add it to ota.allow)")
		http.Error(w, "this board is not on the bridge's allowlist", http.StatusForbidden)
		return
	}
	needsApproval := s.cfg.Approval && !allowed
	rec, err := s.store.Seen(req, s.now(), SeenPolicy{Approval: needsApproval, Bind: bind})
	if !s.recorded(w, log, req, err) {
		return
	}
	if err != nil {
		rec = Record{DeviceID: req.DeviceID} // answered, not recorded
	}
	ans := Answer{ServerTime: &ServerTime{Timestamp: s.now().UnixMilli(), TimezoneOffset: s.cfg.TimezoneOffset},
		Firmware: firmwareEcho(req.Firmware)}
	n := s.network()
	transport := ""
	if needsApproval && !rec.Approved {
		ans.Activation = &Activation{Message: s.cfg.ActivationMessage, Code: rec.Code, Challenge: rec.Challenge}
		s.infoWaiting.Info(log, "board waits for approval: approve it with POST /api/ota/devices/{id}/approve on the control listener",
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
	// Only a board the bridge admits is passed on to the voice upstream:
	// one still waiting for the bridge's own approval is anyone who
	// claims a MAC, and shows the bridge's code.
	var upstreamFields []zap.Field
	if transport != "" && s.up != nil {
		var outcome string
		var gone bool
		if ans, outcome, gone = s.passThrough(r, raw, req, ans, log); gone {
			return
		}
		upstreamFields = append(upstreamFields, zap.String("voice_upstream", outcome))
	}
	body, err := ans.Marshal(req.Firmware)
	if err != nil {
		// Sending it could crash or brick the board; a 500 only makes it
		// retry. The error names the rule and the key, never a value.
		s.errUnsafeAnswer.Error(log, "OTA answer would break the board; not sent", zap.Error(err))
		http.Error(w, "the bridge could not build a safe answer for this board", http.StatusInternalServerError)
		return
	}
	if transport != "" {
		s.store.SetTransport(req.DeviceID, transport)
		s.infoAnswered.Info(log, "OTA answered", append([]zap.Field{zap.String("transport", transport), zap.String("board", req.Board),
			zap.String("firmware", req.Firmware), zap.String("client_id", req.ClientID)}, upstreamFields...)...)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// recorded turns Seen's error into the answer, and reports whether the
// board is to be answered: refusals are answered with statuses the
// firmware retries with growing waits (any non-200), never with a body it
// could store. A full store in open admission still answers the board,
// whose credentials need no record, and only leaves it unrecorded.
func (s *Server) recorded(w http.ResponseWriter, log *zap.Logger, req Request, err error) bool {
	lim := s.store.Limits()
	switch {
	case err == nil:
		return true
	case errors.Is(err, ErrClientIDConflict):
		s.warnConflict.Warn(log, "refused board: its credentials are bound to another Client-Id (reset with POST /api/ota/devices/{mac}/reset if its flash was erased)",
			zap.String("client_id", req.ClientID))
		http.Error(w, "this board's MAC is registered with another Client-Id; an operator must reset it on the bridge", http.StatusConflict)
	case errors.Is(err, ErrTooManyPending):
		s.warnPendingFull.Warn(log, "refused board: too many boards wait for approval (ota.max_pending); approve or wait for them to expire",
			zap.Int("max_pending", lim.MaxPending), zap.Duration("pending_ttl", lim.PendingTTL))
		w.Header().Set("Retry-After", retryAfter(time.Minute))
		http.Error(w, "too many boards are waiting for approval; retry later", http.StatusServiceUnavailable)
	case errors.Is(err, ErrStoreFull) && !s.RequireCredentials() && !s.cfg.Approval:
		s.warnUnrecorded.Warn(log, "board answered but not recorded: ota.max_devices boards are recorded already", zap.Int("max_devices", lim.MaxDevices))
		return true
	case errors.Is(err, ErrStoreFull):
		s.warnStoreFull.Warn(log, "refused board: ota.max_devices boards are recorded already", zap.Int("max_devices", lim.MaxDevices))
		w.Header().Set("Retry-After", retryAfter(time.Minute))
		http.Error(w, "the bridge records as many boards as it may; retry later", http.StatusServiceUnavailable)
	default:
		log.Error("could not record the board", zap.Error(err))
		http.Error(w, "the bridge could not record this board", http.StatusInternalServerError)
	}
	return false
}

// serveActivate answers the board's activation polls: 202 while it waits
// for an operator, 200 once admitted.
func (s *Server) serveActivate(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		http.Error(w, "boards POST here while they wait for approval", http.StatusMethodNotAllowed)
		return
	}
	if s.limited(w, r) {
		return
	}
	// The body is {} or a serial-number HMAC over the challenge; the
	// bridge cannot check the latter (the key is in the board's eFuse),
	// so approval by an operator is what admits a board. A voice upstream
	// gets it as sent: the challenge was its own.
	var body []byte
	if s.up != nil {
		var err error
		if body, err = readBody(r, s.cfg.MaxBodyBytes); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	} else {
		_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, s.cfg.MaxBodyBytes))
	}
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
	if s.up != nil {
		// Admitted here: the board polls for the upstream's activation.
		s.forwardActivate(w, r, body, s.log.With(zap.String("device_id", id), zap.String("remote", r.RemoteAddr)))
		return
	}
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, `{"status":"activated"}`)
}

// passThrough forwards a board's boot call to the voice upstream and
// returns own, the bridge's answer, with what the board may take from the
// upstream's merged in (see merge). Whatever fails, the board gets own and
// boots: outcome says what happened ("merged" or an Upstream* reason).
// gone reports that the board's request ended meanwhile.
func (s *Server) passThrough(r *http.Request, body []byte, req Request, own Answer, log *zap.Logger) (ans Answer, outcome string, gone bool) {
	top, err := s.up.fetchAnswer(r, body)
	if errors.Is(err, errBoardGone) {
		return own, "", true
	}
	if err != nil {
		return own, s.upstreamFailed(log, err, "the board gets the bridge's own answer"), false
	}
	merged := own
	if dropped := merge(&merged, top, req.Firmware, s.cfg.TimezoneOffset); len(dropped) > 0 {
		for range dropped {
			s.up.count(UpstreamUnsafe)
		}
		s.warnUpstreamUnsafe.Warn(log, "voice upstream OTA answer: pieces that would break or flash the board were dropped; the rest is passed on",
			zap.String("upstream", s.up.shown), clip.Error(errors.Join(dropped...)))
	}
	// merge checks each piece; this checks them together, as sent.
	if _, err := merged.Marshal(req.Firmware); err != nil {
		s.up.count(UpstreamUnsafe)
		s.warnUpstreamUnsafe.Warn(log, "voice upstream OTA answer would break the board once merged; the board gets the bridge's own answer",
			zap.String("upstream", s.up.shown), zap.Error(err))
		return own, UpstreamUnsafe, false
	}
	return merged, "merged", false
}

// forwardActivate passes an admitted board's activation poll to the
// voice upstream and the upstream's 200 or 202 back. When the upstream
// cannot say, the board gets a status it retries on (any but 200): 503
// when too many calls are in flight, 504 past the timeout, 502 otherwise.
func (s *Server) forwardActivate(w http.ResponseWriter, r *http.Request, body []byte, log *zap.Logger) {
	status, _, err := s.up.call(r, s.up.activate, body)
	if errors.Is(err, errBoardGone) {
		return
	}
	if err != nil {
		switch s.upstreamFailed(log, err, "the board polls again") {
		case UpstreamBusy:
			w.Header().Set("Retry-After", "10")
			http.Error(w, "the voice upstream has too many calls in flight; retry", http.StatusServiceUnavailable)
		case UpstreamTimeout:
			http.Error(w, "the voice upstream did not answer in time; retry", http.StatusGatewayTimeout)
		default:
			http.Error(w, "the voice upstream could not be asked; retry", http.StatusBadGateway)
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	switch {
	case status == http.StatusOK:
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"status":"activated"}`)
	case status == http.StatusAccepted:
		w.WriteHeader(http.StatusAccepted)
		_, _ = io.WriteString(w, `{"status":"pending"}`)
	default:
		s.upstreamFailed(log, &upstreamError{reason: UpstreamStatus, status: status}, "the board polls again")
		// An error status tells the board what the upstream said; any
		// other (a redirect, another 2xx) would mean nothing to it.
		code := status
		if code < 400 || code > 599 {
			code = http.StatusBadGateway
		}
		w.WriteHeader(code)
		_, _ = fmt.Fprintf(w, `{"status":"upstream_error","upstream_status":%d}`, status)
	}
}

// upstreamFailed counts a failed call to the voice upstream and says so,
// throttled, with what the board gets instead (then); it returns the
// reason.
func (s *Server) upstreamFailed(log *zap.Logger, err error, then string) string {
	var ue *upstreamError
	if !errors.As(err, &ue) {
		ue = &upstreamError{reason: UpstreamUnreachable, err: err}
	}
	s.up.count(ue.reason)
	if ue.reason == UpstreamBusy {
		s.warnUpstreamBusy.Warn(log, "voice upstream OTA not asked: voice.ota_max_in_flight calls are in flight already; "+then,
			zap.Int("max_in_flight", s.up.cfg.MaxInFlight))
		return ue.reason
	}
	fields := []zap.Field{zap.String("reason", ue.reason), zap.String("upstream", s.up.shown)}
	if ue.status != 0 {
		fields = append(fields, zap.Int("status", ue.status))
	}
	if ue.err != nil {
		fields = append(fields, clip.Error(ue.err))
	}
	s.warnUpstreamFailed.Warn(log, "voice upstream OTA failed; "+then, fields...)
	return ue.reason
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
	case n.MQTTEmbedded, n.MQTTDirect:
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
	// Admission says why the board is admitted or not: open (admission
	// is off, so Approved stays false), allowlist, approved, pending or
	// not_admitted.
	Admission string `json:"admission"`
	// Bound says its credentials are bound to ClientID: where credentials
	// are required, another Client-Id for its MAC is refused (and shown
	// in RejectedClientID) until the binding is reset.
	Bound bool `json:"bound"`
}

func (s *Server) view(r Record) DeviceView {
	v := DeviceView{Record: r, Pending: r.Pending(), Admitted: s.Admitted(r.DeviceID),
		Bound: s.RequireCredentials() && r.ClientID != ""}
	switch {
	case s.allow[r.DeviceID]:
		v.Admission = "allowlist"
	case r.Approved && s.cfg.Approval:
		v.Admission = "approved"
	case v.Pending && s.cfg.Approval:
		v.Admission = "pending"
	case v.Admitted:
		v.Admission = "open"
	default:
		v.Admission = "not_admitted"
	}
	return v
}

func (s *Server) listDevices(w http.ResponseWriter, _ *http.Request) {
	now := s.now()
	records := s.store.List(now)
	out := make([]DeviceView, 0, len(records))
	for _, r := range records {
		out = append(out, s.view(r))
	}
	c, lim := s.store.Counts(now), s.store.Limits()
	writeJSON(w, http.StatusOK, map[string]any{"approval": s.cfg.Approval, "require_credentials": s.RequireCredentials(),
		"pending": c.Pending, "max_pending": lim.MaxPending, "max_devices": lim.MaxDevices, "devices": out})
}

// approve admits a board named by its MAC, or by the activation code on
// its screen (a code has at most 10 digits, so it never reads as a MAC).
// Codes are a small space, so wrong ones are counted, per caller address
// and in all, and past either allowance approval by code is refused for a
// while; approval by MAC, which needs no guessing, stays open.
func (s *Server) approve(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	byCode := true
	if _, ok := device.MACDigits(id); ok {
		id, byCode = device.NormalizeID(id), false
	}
	var giveBack func()
	if byCode {
		now := s.now()
		mine, ok, wait := s.callerGuesses.Reserve(keyrate.AddrKey(r.RemoteAddr), now)
		if ok {
			var all *rate.Reservation
			if all, ok, wait = s.allGuesses.Reserve("", now); ok {
				giveBack = func() { mine.CancelAt(now); all.CancelAt(now) }
			} else {
				mine.CancelAt(now)
			}
		}
		if !ok {
			s.warnGuess.Warn(s.log, "refused approval by code: too many wrong codes (ota.code_guesses_per_hour, ota.code_guesses_per_caller_per_hour)",
				zap.String("remote", r.RemoteAddr))
			w.Header().Set("Retry-After", retryAfter(wait))
			writeJSON(w, http.StatusTooManyRequests, errorBody("too_many_guesses",
				"too many wrong activation codes; retry after "+retryAfter(wait)+" s, or approve the board by its MAC"))
			return
		}
	}
	rec, err := s.store.Approve(id, s.now())
	switch {
	case errors.Is(err, ErrUnknownDevice):
		if byCode {
			s.infoWrongCode.Info(s.log, "wrong activation code", zap.String("remote", r.RemoteAddr))
		}
		writeJSON(w, http.StatusNotFound, errorBody("unknown_device", "no board with this MAC or activation code has called the OTA endpoint"))
		return
	case err != nil:
		s.log.Error("could not store an approval", zap.Error(err))
		writeJSON(w, http.StatusInternalServerError, errorBody("internal", "could not store the approval"))
		return
	}
	if giveBack != nil {
		giveBack() // a right code is no guess
	}
	s.log.Info("board approved", zap.String("device_id", rec.DeviceID))
	writeJSON(w, http.StatusOK, s.view(rec))
}

// reset rebinds a board's credentials: to the client_id in the body, or,
// without one, to the Client-Id of its next OTA call. It is the way back
// for a board whose flash was erased (a new UUID), after an operator has
// checked that the rejected Client-Id is that board's.
func (s *Server) reset(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if _, ok := device.MACDigits(id); !ok {
		writeJSON(w, http.StatusBadRequest, errorBody("bad_request", "name the board by its MAC"))
		return
	}
	id = device.NormalizeID(id)
	var body struct {
		ClientID string `json:"client_id"`
	}
	raw, err := io.ReadAll(io.LimitReader(r.Body, 4<<10))
	if len(bytes.TrimSpace(raw)) > 0 && err == nil {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		err = dec.Decode(&body)
	}
	if err != nil || body.ClientID != "" && !clientIDPattern.MatchString(body.ClientID) {
		writeJSON(w, http.StatusBadRequest, errorBody("bad_request", `the body is empty, or {"client_id": "<the board's UUID>"}`))
		return
	}
	rec, err := s.store.Reset(id, body.ClientID)
	switch {
	case errors.Is(err, ErrUnknownDevice):
		writeJSON(w, http.StatusNotFound, errorBody("unknown_device", "no board with this MAC has called the OTA endpoint"))
		return
	case err != nil:
		s.log.Error("could not store a reset", zap.Error(err))
		writeJSON(w, http.StatusInternalServerError, errorBody("internal", "could not store the reset"))
		return
	}
	s.log.Info("board's Client-Id binding reset", zap.String("device_id", id), zap.String("bound_to", body.ClientID))
	writeJSON(w, http.StatusOK, s.view(rec))
}

func errorBody(code, msg string) map[string]any {
	return map[string]any{"error": map[string]string{"code": code, "message": msg}}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false) // as the control API's answers
	_ = enc.Encode(v)
}
