package ota

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"

	"github.com/devicebridge/devicebridge/device"
)

// DefaultMaxBodyBytes bounds an OTA request body. A board's system
// information is a few KB (the partition table is the bulk of it).
const DefaultMaxBodyBytes = 64 << 10

// ErrBadRequest wraps every reason a request is refused with 400.
var ErrBadRequest = errors.New("bad OTA request")

// clientIDPattern is what a Client-Id may be: boards send a UUID, and the
// value becomes part of an MQTT client id and of log lines, so nothing
// that could break either is let through.
var clientIDPattern = regexp.MustCompile(`^[A-Za-z0-9-]{1,64}$`)

// boardNamePattern matches BOARD_NAME as the firmware's build enforces it,
// and versions.
var boardNamePattern = regexp.MustCompile(`^[A-Za-z0-9._+-]{1,64}$`)

// Request is what a board says about itself in an OTA call.
type Request struct {
	// DeviceID is the board's MAC, lowercase with colons (Device-Id).
	DeviceID string
	// ClientID is the board's UUID (Client-Id), or "".
	ClientID string
	// Board is BOARD_NAME (User-Agent, else board.name in the body).
	Board string
	// Firmware is the application version the board runs.
	Firmware string
	// Chip is chip_model_name, e.g. esp32s3.
	Chip string
	// Language is Accept-Language (or the body's language).
	Language string
	// ActivationVersion is "1", or "2" for boards with an eFuse serial.
	ActivationVersion string
	// SerialNumber is sent only by boards that have one.
	SerialNumber string
}

// flexString decodes a JSON string, number or null into a string: the
// firmware sends minimum_free_heap_size as a string, and other builds or
// forks send other numbers either way.
type flexString string

func (f *flexString) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case len(b) == 0 || string(b) == "null":
		*f = ""
	case b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*f = flexString(s)
	case b[0] == '-' || (b[0] >= '0' && b[0] <= '9'):
		var n json.Number
		if err := json.Unmarshal(b, &n); err != nil {
			return err
		}
		*f = flexString(n.String())
	default:
		return fmt.Errorf("want a string or a number, got %.20s", b)
	}
	return nil
}

// systemInfo is the part of Board::GetSystemInfoJson the bridge reads.
type systemInfo struct {
	Version             flexString `json:"version"`
	Language            flexString `json:"language"`
	FlashSize           flexString `json:"flash_size"`
	MinimumFreeHeapSize flexString `json:"minimum_free_heap_size"`
	MACAddress          flexString `json:"mac_address"`
	UUID                flexString `json:"uuid"`
	ChipModelName       flexString `json:"chip_model_name"`
	Application         *struct {
		Name    flexString `json:"name"`
		Version flexString `json:"version"`
	} `json:"application"`
	Board *struct {
		Type flexString `json:"type"`
		Name flexString `json:"name"`
		MAC  flexString `json:"mac"`
	} `json:"board"`
}

func badRequest(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadRequest, fmt.Sprintf(format, args...))
}

// ParseRequest reads an OTA POST: its headers and its system-information
// body. It is lenient about what boards really send (numbers as strings,
// missing members, unknown members) and strict about what the bridge
// relies on: a MAC to name the board, an object body, sane identifiers.
// Errors wrap ErrBadRequest and say what is wrong.
func ParseRequest(r *http.Request, maxBody int64) (Request, error) {
	req, _, err := readRequest(r, maxBody)
	return req, err
}

// readRequest is ParseRequest that also returns the body as the board
// sent it (to pass it on to a voice upstream).
func readRequest(r *http.Request, maxBody int64) (Request, []byte, error) {
	body, err := readBody(r, maxBody)
	if err != nil {
		return Request{}, nil, err
	}
	req, err := parse(r.Header, body)
	return req, body, err
}

// readBody reads a request body of at most maxBody bytes (0: the default).
func readBody(r *http.Request, maxBody int64) ([]byte, error) {
	maxBody = cmp.Or(max(maxBody, 0), DefaultMaxBodyBytes)
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return nil, badRequest("reading the body: %v", err)
	}
	if int64(len(body)) > maxBody {
		return nil, badRequest("body larger than %d bytes", maxBody)
	}
	return body, nil
}

func parse(h http.Header, body []byte) (Request, error) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return Request{}, badRequest("empty body: boards send their system information as JSON")
	}
	if body[0] != '{' {
		return Request{}, badRequest("body is not a JSON object")
	}
	var info systemInfo
	if err := json.Unmarshal(body, &info); err != nil {
		return Request{}, badRequest("body is not valid system information: %v", err)
	}
	req := Request{
		ActivationVersion: strings.TrimSpace(h.Get("Activation-Version")),
		SerialNumber:      strings.TrimSpace(h.Get("Serial-Number")),
		Language:          strings.TrimSpace(h.Get("Accept-Language")),
		Chip:              string(info.ChipModelName),
	}
	mac := strings.TrimSpace(h.Get("Device-Id"))
	if mac == "" {
		mac = string(info.MACAddress)
	}
	if mac == "" {
		return Request{}, badRequest("no Device-Id header and no mac_address in the body")
	}
	if _, ok := device.MACDigits(mac); !ok {
		return Request{}, badRequest("Device-Id %q is not a MAC address", truncate(mac))
	}
	req.DeviceID = device.NormalizeID(mac)

	req.ClientID = strings.TrimSpace(h.Get("Client-Id"))
	if req.ClientID == "" {
		req.ClientID = string(info.UUID)
	}
	if req.ClientID != "" && !clientIDPattern.MatchString(req.ClientID) {
		return Request{}, badRequest("Client-Id %q is not a UUID", truncate(req.ClientID))
	}
	if req.SerialNumber != "" && !clientIDPattern.MatchString(req.SerialNumber) {
		return Request{}, badRequest("Serial-Number is not a plain identifier")
	}

	// User-Agent is "<BOARD_NAME>/<version>"; the body says the same in
	// board.name and application.version. Either may be missing.
	if name, version, ok := strings.Cut(strings.TrimSpace(h.Get("User-Agent")), "/"); ok {
		if boardNamePattern.MatchString(name) {
			req.Board = name
		}
		if boardNamePattern.MatchString(version) {
			req.Firmware = version
		}
	}
	if info.Application != nil && info.Application.Version != "" {
		req.Firmware = string(info.Application.Version)
	}
	if req.Board == "" && info.Board != nil {
		req.Board = string(cmp.Or(info.Board.Name, info.Board.Type))
	}
	if req.Language == "" {
		req.Language = string(info.Language)
	}
	for name, v := range map[string]string{"firmware version": req.Firmware, "board name": req.Board, "chip": req.Chip, "language": req.Language} {
		if v != "" && !boardNamePattern.MatchString(v) {
			return Request{}, badRequest("%s %q has characters boards never send", name, truncate(v))
		}
	}
	return req, nil
}

// truncate keeps error messages short and quoted values printable.
func truncate(s string) string {
	if len(s) > 40 {
		s = s[:40] + "..."
	}
	return s
}
