package voicestub

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"regexp"
	"strings"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/internal/randid"
)

// activation is one device's progress through the activation loop.
type activation struct {
	challenge string
	calls     int // /activate calls so far
	activated bool
}

type otaResponse struct {
	ServerTime serverTime     `json:"server_time"`
	Firmware   *otaFirmware   `json:"firmware,omitempty"`
	WebSocket  otaWebSocket   `json:"websocket"`
	Activation *otaActivation `json:"activation,omitempty"`
}

type (
	serverTime struct {
		Timestamp      int64 `json:"timestamp"`
		TimezoneOffset int   `json:"timezone_offset"`
	}
	otaFirmware struct {
		Version string `json:"version"`
		URL     string `json:"url"`
	}
	otaWebSocket struct {
		URL   string `json:"url"`
		Token string `json:"token"`
	}
	otaActivation struct {
		Code      string `json:"code"`
		Message   string `json:"message"`
		Challenge string `json:"challenge"`
	}
)

// numericVersion is what boards can compare without crashing (std::stoi
// on every dot-separated part).
var numericVersion = regexp.MustCompile(`^[0-9]{1,9}(\.[0-9]{1,9}){0,7}$`)

// maxHostLen keeps the websocket.url we echo within what NVS stores.
const maxHostLen = 255

// otaRequest reads an OTA or activate request: POST only, body bounded,
// Device-Id required. On failure it has answered and returns ok false.
func (s *Server) otaRequest(w http.ResponseWriter, r *http.Request) (rec OTARequest, ok bool) {
	rec = OTARequest{Path: r.URL.Path, DeviceID: r.Header.Get("Device-Id"), ClientID: r.Header.Get("Client-Id")}
	fail := func(status int, msg string) (OTARequest, bool) {
		rec.Status = status
		s.recordOTA(rec)
		http.Error(w, msg, status)
		return rec, false
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return fail(http.StatusMethodNotAllowed, "POST only")
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxOTABody))
	rec.Body = body
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return fail(http.StatusRequestEntityTooLarge, "body over 64 KiB")
	}
	if err != nil {
		return fail(http.StatusBadRequest, "reading body failed")
	}
	if rec.DeviceID == "" {
		return fail(http.StatusBadRequest, "Device-Id header is required")
	}
	return rec, true
}

func (s *Server) recordOTA(rec OTARequest) {
	s.mu.Lock()
	if len(s.ota) >= s.cfg.MaxHistory {
		s.ota = append(s.ota[:0], s.ota[1:]...)
	}
	s.ota = append(s.ota, rec)
	s.changedLocked()
	s.mu.Unlock()
}

// serveOTA answers a board's boot call: server time, its own version
// echoed (so it never upgrades), the WebSocket URL and token, and an
// activation block while the device's activation is pending.
func (s *Server) serveOTA(w http.ResponseWriter, r *http.Request) {
	if !s.enter() {
		http.Error(w, "server closing", http.StatusServiceUnavailable)
		return
	}
	defer s.wg.Done()
	rec, ok := s.otaRequest(w, r)
	if !ok {
		return
	}
	if len(r.Host) > maxHostLen {
		rec.Status = http.StatusBadRequest
		s.recordOTA(rec)
		http.Error(w, "Host too long", http.StatusBadRequest)
		return
	}
	var sys struct {
		Application struct {
			Version string `json:"version"`
		} `json:"application"`
	}
	_ = json.Unmarshal(rec.Body, &sys) // a body we cannot read gets no firmware block

	resp := otaResponse{
		ServerTime: serverTime{Timestamp: s.cfg.Now().UnixMilli()},
		WebSocket:  otaWebSocket{URL: s.cfg.WebSocketURL, Token: s.otaToken(rec)},
	}
	if resp.WebSocket.URL == "" {
		resp.WebSocket.URL = "ws://" + r.Host + WebSocketPath
	}
	if numericVersion.MatchString(sys.Application.Version) {
		resp.Firmware = &otaFirmware{Version: sys.Application.Version}
	}
	if s.cfg.ActivationCode != "" {
		s.mu.Lock()
		a, full := s.activationLocked(rec.DeviceID)
		if a != nil && !a.activated {
			resp.Activation = &otaActivation{
				Code:      s.cfg.ActivationCode,
				Message:   "voicestub: activation code " + s.cfg.ActivationCode,
				Challenge: a.challenge,
			}
		}
		s.mu.Unlock()
		if full {
			rec.Status = http.StatusServiceUnavailable
			s.recordOTA(rec)
			http.Error(w, "too many devices", http.StatusServiceUnavailable)
			return
		}
	}
	body := mustJSON(resp)
	rec.Status, rec.Response = http.StatusOK, body
	s.recordOTA(rec)
	s.log.Debug("ota", zap.String("device_id", rec.DeviceID), zap.Bool("activation", resp.Activation != nil))
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

// otaToken is the token OTA hands out: the first static token, else an
// HMAC token for the request's Client-Id and Device-Id, else none.
func (s *Server) otaToken(rec OTARequest) string {
	switch {
	case len(s.cfg.Tokens) > 0:
		return s.cfg.Tokens[0]
	case s.cfg.Secret != "":
		return Token(s.cfg.Secret, rec.ClientID, rec.DeviceID, s.cfg.Now())
	}
	return ""
}

// activationLocked returns deviceID's activation state, creating it; full
// is set (and a nil) when MaxHistory devices are already tracked.
func (s *Server) activationLocked(deviceID string) (a *activation, full bool) {
	key := strings.ToLower(deviceID)
	if a = s.devices[key]; a != nil {
		return a, false
	}
	if len(s.devices) >= s.cfg.MaxHistory {
		return nil, true
	}
	a = &activation{challenge: randid.Hex(8)}
	s.devices[key] = a
	return a, false
}

// serveActivate answers the activation loop: 202 (pending) the first time
// a device calls, 200 (activated) afterwards; from then on OTA answers
// carry no activation. Without an activation code it always answers 200.
func (s *Server) serveActivate(w http.ResponseWriter, r *http.Request) {
	if !s.enter() {
		http.Error(w, "server closing", http.StatusServiceUnavailable)
		return
	}
	defer s.wg.Done()
	rec, ok := s.otaRequest(w, r)
	if !ok {
		return
	}
	status := http.StatusOK
	if s.cfg.ActivationCode != "" {
		s.mu.Lock()
		a, full := s.activationLocked(rec.DeviceID)
		switch {
		case full:
			status = http.StatusServiceUnavailable
		case a.calls == 0 && !a.activated:
			status = http.StatusAccepted
		default:
			a.activated = true
		}
		if a != nil {
			a.calls++
		}
		s.mu.Unlock()
	}
	rec.Status = status
	s.recordOTA(rec)
	s.log.Debug("activate", zap.String("device_id", rec.DeviceID), zap.Int("status", status))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(`{}`))
}
