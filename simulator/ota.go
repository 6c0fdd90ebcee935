package simulator

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/internal/ctxtime"
)

// The OTA boot of the firmware (Application::CheckNewVersion, Ota::CheckVersion,
// Ota::Activate): POST the system information to the OTA URL with the
// board's headers, store every member of the answer's websocket and mqtt
// objects in "NVS", run the activation loop while the answer carries an
// activation, then use the transport the last answer named.

// Defaults for OTAConfig, the firmware's own waits.
const (
	DefaultActivationPending = 3 * time.Second
	DefaultActivationRetry   = 10 * time.Second
	// otaRequestTimeout bounds one HTTP exchange.
	otaRequestTimeout = 10 * time.Second
	// otaMaxAnswer bounds the answer the simulator reads.
	otaMaxAnswer = 1 << 20
	// activationAttempts is the firmware's number of /activate polls per
	// round before it repeats the whole OTA check.
	activationAttempts = 10
	// nvsMaxKey and nvsMaxValue are the NVS limits past which the
	// firmware's ESP_ERROR_CHECK aborts.
	nvsMaxKey   = 15
	nvsMaxValue = 4000
)

// Errors of the OTA boot.
var (
	// ErrOTAStatus: the OTA endpoint answered something other than 200.
	ErrOTAStatus = errors.New("simulator: OTA answer status is not 200")
	// ErrOTAAnswer: the answer is not JSON the firmware can parse.
	ErrOTAAnswer = errors.New("simulator: OTA answer is not a JSON object")
	// ErrOTAAbort: something in the answer makes a real board abort (and,
	// since the check repeats at every boot, reboot in a loop).
	ErrOTAAbort = errors.New("simulator: OTA answer would abort a real board")
	// ErrOTAUpgrade: the answer names a newer firmware; a real board would
	// download and flash it.
	ErrOTAUpgrade = errors.New("simulator: OTA answer asks the board to flash new firmware")
	// ErrNoTransport: the answer named no transport and nothing was stored
	// before; the firmware falls back to MQTT with an empty endpoint.
	ErrNoTransport = errors.New("simulator: no transport in the OTA answer or in NVS")
)

// otaStatusError is an OTA answer other than 200; it is ErrOTAStatus and
// keeps the status, so the fleet can tell "busy, retry" from a refusal.
type otaStatusError struct {
	status int
	body   string
}

func (e *otaStatusError) Error() string {
	return fmt.Sprintf("%v: HTTP %d: %s", ErrOTAStatus, e.status, e.body)
}

func (e *otaStatusError) Is(target error) bool { return target == ErrOTAStatus }

// OTAConfig is a board's OTA URL and the waits of its activation loop
// (tests shorten them).
type OTAConfig struct {
	// URL is the OTA URL, e.g. http://192.168.1.10:8000/xiaozhi/ota/.
	URL string
	// ActivationPending is the wait after a 202 (default 3 s);
	// ActivationRetry after any other answer (default 10 s).
	ActivationPending, ActivationRetry time.Duration
	// HelloOnConnect makes Fleet.RunOTA open the audio channel after each
	// MQTT connect, as MQTTConfig.HelloOnConnect does for Fleet.RunMQTT:
	// a bridge behind an external broker learns of a board only when it
	// speaks.
	HelloOnConnect bool
}

// OTAResult is what a boot through the OTA URL decided.
type OTAResult struct {
	// Transport is "mqtt" or "websocket".
	Transport string
	// WebSocketURL and WebSocketToken are the stored websocket settings.
	WebSocketURL, WebSocketToken string
	// MQTT is the stored mqtt settings.
	MQTT MQTTConfig
	// Activations counts the activation rounds the board went through.
	Activations int
	// ActivationCode is the last code shown on the board's screen.
	ActivationCode string
}

// CheckOTA runs the board's boot-time OTA exchange: the OTA POST, then,
// while the answer carries an activation, the activation loop and another
// OTA POST. It returns the transport the last answer selects.
func (b *Board) CheckOTA(ctx context.Context, oc OTAConfig) (*OTAResult, error) {
	oc.ActivationPending = cmp.Or(oc.ActivationPending, DefaultActivationPending)
	oc.ActivationRetry = cmp.Or(oc.ActivationRetry, DefaultActivationRetry)
	if len(oc.URL) < 10 {
		return nil, fmt.Errorf("simulator: OTA URL %q is shorter than the firmware accepts", oc.URL)
	}
	res := &OTAResult{}
	for {
		root, err := b.otaPost(ctx, oc.URL, []byte(b.SystemInfoJSON()))
		if err != nil {
			return nil, err
		}
		if err := b.applyOTA(root); err != nil {
			return nil, err
		}
		act := root.get("activation")
		code, challenge := act.get("code"), act.get("challenge")
		if !code.isString() && !challenge.isString() {
			return b.selectTransport(root, res)
		}
		res.Activations++
		if code.isString() {
			res.ActivationCode = code.str
			// The board shows the code on its screen and reads it aloud.
			b.log.Info("activation code on screen", zap.String("code", code.str))
		}
		if err := b.activationLoop(ctx, oc, challenge.isString()); err != nil {
			return nil, err
		}
	}
}

// activationLoop polls <url>/activate up to ten times: 200 ends it, 202
// waits ActivationPending, anything else ActivationRetry. Without a
// challenge the firmware does not even post, and waits ActivationRetry.
func (b *Board) activationLoop(ctx context.Context, oc OTAConfig, haveChallenge bool) error {
	url := oc.URL
	if !strings.HasSuffix(url, "/") {
		url += "/"
	}
	url += "activate"
	for i := 0; i < activationAttempts; i++ {
		wait := oc.ActivationRetry
		if haveChallenge {
			status, _, err := b.otaExchange(ctx, url, []byte("{}"))
			switch {
			case err != nil && ctx.Err() != nil:
				return ctx.Err()
			case err != nil:
				b.log.Debug("activation request failed", zap.Error(err))
			case status == http.StatusOK:
				b.log.Info("activated")
				return nil
			case status == http.StatusAccepted:
				wait = oc.ActivationPending
			}
		}
		if !ctxtime.Sleep(ctx, wait) {
			return ctx.Err()
		}
	}
	return nil
}

// otaPost sends one OTA request and parses the answer as the firmware
// does: status exactly 200, a body cJSON can parse.
func (b *Board) otaPost(ctx context.Context, url string, body []byte) (*jsonValue, error) {
	status, answer, err := b.otaExchange(ctx, url, body)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, &otaStatusError{status: status, body: strings.TrimSpace(string(answer))}
	}
	root, ok := parseCJSON(answer)
	if !ok || !root.isObject() {
		return nil, ErrOTAAnswer
	}
	return root, nil
}

// otaExchange POSTs body with the firmware's headers (§2.2): no gzip, no
// keep-alive, Host with the port only when it is not the default.
func (b *Board) otaExchange(ctx context.Context, url string, body []byte) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, otaRequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, fmt.Errorf("simulator: OTA URL: %w", err)
	}
	req.Close = true
	p := b.profile
	req.Header = http.Header{
		"Activation-Version": {"1"},
		"Device-Id":          {b.mac},
		"Client-Id":          {b.clientID},
		"User-Agent":         {p.Board + "/" + p.Firmware},
		"Accept-Language":    {p.Language},
		"Content-Type":       {"application/json"},
	}
	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig:    b.cfg.TLS,
		DisableCompression: true,
		DisableKeepAlives:  true,
	}}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("simulator: OTA request: %w", err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, otaMaxAnswer))
	if err != nil {
		return 0, nil, fmt.Errorf("simulator: OTA answer: %w", err)
	}
	return resp.StatusCode, answer, nil
}

// applyOTA does what Ota::CheckVersion does with an answer: store every
// string or number member of websocket and mqtt in NVS (aborting on a key
// or value NVS refuses), and compare firmware.version with std::stoi.
func (b *Board) applyOTA(root *jsonValue) error {
	for _, ns := range []string{"websocket", "mqtt"} {
		obj := root.get(ns)
		if !obj.isObject() {
			continue
		}
		for i, k := range obj.keys {
			v := obj.items[i]
			var s string
			switch {
			case v.isString():
				s = v.str
			case v.isNumber():
				s = strconv.Itoa(v.valueInt())
			default:
				continue // booleans, nulls and objects are ignored
			}
			if len(k) > nvsMaxKey {
				return fmt.Errorf("%w: key %s.%s is longer than %d characters (NVS)", ErrOTAAbort, ns, k, nvsMaxKey)
			}
			if len(s) >= nvsMaxValue {
				return fmt.Errorf("%w: value of %s.%s is %d bytes (NVS)", ErrOTAAbort, ns, k, len(s))
			}
			b.nvsSet(ns, k, s)
		}
	}
	fw := root.get("firmware")
	if v, u := fw.get("version"), fw.get("url"); v.isString() && u.isString() {
		newer, err := versionNewer(v.str, b.profile.Firmware)
		if err != nil {
			return fmt.Errorf("%w: firmware.version %q: %v", ErrOTAAbort, v.str, err)
		}
		if newer {
			return fmt.Errorf("%w: %q over %q", ErrOTAUpgrade, v.str, b.profile.Firmware)
		}
	}
	return nil
}

// versionNewer compares dotted versions part by part with std::stoi's
// rules: a part must start with a digit (after optional spaces and sign),
// or stoi throws and the board aborts.
func versionNewer(candidate, current string) (bool, error) {
	a, err := stoiParts(candidate)
	if err != nil {
		return false, err
	}
	c, err := stoiParts(current)
	if err != nil {
		return false, err
	}
	for i := 0; i < min(len(a), len(c)); i++ {
		if a[i] != c[i] {
			return a[i] > c[i], nil
		}
	}
	return len(a) > len(c), nil
}

func stoiParts(v string) ([]int, error) {
	var out []int
	for _, p := range strings.Split(v, ".") {
		s := strings.TrimLeft(p, " \t")
		j := 0
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			j++
		}
		k := j
		for k < len(s) && s[k] >= '0' && s[k] <= '9' {
			k++
		}
		if k == j {
			return nil, fmt.Errorf("std::stoi(%q) throws", p)
		}
		n, err := strconv.Atoi(s[:k])
		if err != nil {
			return nil, fmt.Errorf("std::stoi(%q) throws", p)
		}
		out = append(out, n)
	}
	return out, nil
}

// selectTransport is Application::InitializeProtocol: mqtt if the last
// answer had an mqtt object, else websocket if it had one, else MQTT with
// whatever NVS holds.
func (b *Board) selectTransport(root *jsonValue, res *OTAResult) (*OTAResult, error) {
	res.Transport = "mqtt"
	if !root.get("mqtt").isObject() && root.get("websocket").isObject() {
		res.Transport = "websocket"
	}
	if res.Transport == "websocket" {
		res.WebSocketURL = b.nvsGet("websocket", "url")
		res.WebSocketToken = b.nvsGet("websocket", "token")
		if res.WebSocketURL == "" {
			return nil, ErrNoTransport
		}
		return res, nil
	}
	mc := MQTTConfig{
		Endpoint:       b.nvsGet("mqtt", "endpoint"),
		ClientID:       b.nvsGet("mqtt", "client_id"),
		Username:       b.nvsGet("mqtt", "username"),
		Password:       b.nvsGet("mqtt", "password"),
		PublishTopic:   b.nvsGet("mqtt", "publish_topic"),
		SubscribeTopic: b.nvsGet("mqtt", "subscribe_topic"),
		TLS:            b.cfg.TLS,
	}
	if ka, err := strconv.Atoi(b.nvsGet("mqtt", "keepalive")); err == nil && ka > 0 {
		mc.KeepAlive = time.Duration(ka) * time.Second
	}
	if mc.Endpoint == "" {
		return nil, ErrNoTransport
	}
	res.MQTT = mc
	return res, nil
}

func (b *Board) nvsSet(ns, key, value string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.nvs == nil {
		b.nvs = map[string]map[string]string{}
	}
	if b.nvs[ns] == nil {
		b.nvs[ns] = map[string]string{}
	}
	b.nvs[ns][key] = value
}

func (b *Board) nvsGet(ns, key string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.nvs[ns][key]
}

// wsToken is the token the board sends: the one its OTA answer stored, or
// Config.Token.
func (b *Board) wsToken() string {
	if t := b.nvsGet("websocket", "token"); t != "" {
		return t
	}
	return b.cfg.Token
}

// BootOTA boots the board through its OTA URL and connects with the
// transport the answer named, with the credentials it carried. It returns
// the OTA result and, on MQTT, the connection; on WebSocket the board's
// own connection is up (use Serve).
func (b *Board) BootOTA(ctx context.Context, oc OTAConfig) (*OTAResult, *MQTTConn, error) {
	res, err := b.CheckOTA(ctx, oc)
	if err != nil {
		return nil, nil, err
	}
	if res.Transport == "mqtt" {
		c, err := b.ConnectMQTT(ctx, res.MQTT)
		return res, c, err
	}
	return res, nil, b.ConnectWebSocket(ctx, res.WebSocketURL)
}

// RunOTA keeps every board of the fleet booted through its OTA URL and
// connected with the transport the answer named, rebooting (a new OTA
// check) after a connection ends, until ctx ends. FleetConfig.URL is not
// used.
func (f *Fleet) RunOTA(ctx context.Context, oc OTAConfig) error {
	return f.runAll(ctx, func(ctx context.Context, b *Board) error {
		defer b.Close()
		return f.keepConnected(ctx, b, func(ctx context.Context) error {
			res, c, err := b.BootOTA(ctx, oc)
			if err != nil {
				return err
			}
			if c != nil {
				if oc.HelloOnConnect {
					if herr := c.OpenAudioChannel(ctx); herr != nil {
						b.log.Warn("opening the audio channel failed", zap.Error(herr))
					}
				}
				return f.serveConversing(ctx, b, c.Serve)
			}
			b.log.Debug("booted through OTA", zap.String("transport", res.Transport))
			return f.serveConversing(ctx, b, b.Serve)
		})
	})
}
