package ota

// This file is the OTA pass-through to a voice upstream: boards keep the
// voice assistant of the user's own server (xiaozhi-esp32-server or a
// compatible one) while they connect to the bridge, which relays their
// conversation and drives their tools. The bridge forwards the boot call
// of every board it admits to the upstream's OTA endpoint, and its
// activation polls to <upstream>/activate, so that the upstream can show
// its binding code on the board and learn of it; the board is still told
// to connect to the bridge, with the bridge's credentials.
//
//	board ── POST /xiaozhi/ota/ ──► bridge ── same request ──► upstream OTA
//	board ◄── bridge's transport + upstream's activation, firmware, server_time
//	board ── POST …/activate ──► bridge ── same request ──► upstream …/activate
//	board ◄── the upstream's 200 / 202 (or a status the board retries on)
//
// The upstream is the operator's, but its answer still goes to a board
// whose firmware aborts on some values, so every piece taken from it is
// checked against the crash rules (answer.go) and dropped when it fails
// them; an upstream that fails in any way leaves the board with the
// bridge's own answer, on which it boots.

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"
)

// Upstream configures the OTA pass-through (the bridge's voice: section).
type Upstream struct {
	// URL is the upstream's OTA endpoint, http:// or https://, e.g.
	// http://host:8002/xiaozhi/ota/; "" turns the pass-through off.
	URL string
	// Timeout bounds one call to the upstream, its answer included
	// (default 5 s). A board waits that long at most for its answer.
	Timeout time.Duration
	// MaxInFlight bounds the calls to the upstream at once (default 64);
	// past it a boot call gets the bridge's own answer and an activation
	// poll a 503, and both are counted as busy.
	MaxInFlight int
}

// Defaults and fixed bounds of the pass-through.
const (
	DefaultUpstreamTimeout     = 5 * time.Second
	DefaultUpstreamMaxInFlight = 64
	// MaxUpstreamAnswerBytes bounds an upstream answer; a real one is
	// well under 2 KB.
	MaxUpstreamAnswerBytes = 64 << 10
	// maxUpstreamURLLen keeps the URL a URL.
	maxUpstreamURLLen = 2048
)

// Reasons counted in UpstreamStats.Errors.
const (
	// UpstreamTimeout: no full answer within Upstream.Timeout.
	UpstreamTimeout = "timeout"
	// UpstreamUnreachable: the connection failed or broke.
	UpstreamUnreachable = "unreachable"
	// UpstreamStatus: a boot call answered other than 200, or an
	// activation poll other than 200 or 202 (redirects included: they
	// are not followed).
	UpstreamStatus = "status"
	// UpstreamInvalid: a boot call's answer is not a JSON object.
	UpstreamInvalid = "invalid"
	// UpstreamOversized: an answer larger than MaxUpstreamAnswerBytes.
	UpstreamOversized = "oversized"
	// UpstreamBusy: Upstream.MaxInFlight calls were in flight already.
	UpstreamBusy = "busy"
	// UpstreamUnsafe: a piece of an answer (activation, firmware,
	// server_time) that would break or flash the board, dropped.
	UpstreamUnsafe = "unsafe"
)

var upstreamReasons = []string{UpstreamTimeout, UpstreamUnreachable, UpstreamStatus, UpstreamInvalid,
	UpstreamOversized, UpstreamBusy, UpstreamUnsafe}

// forwardedHeaders are the headers the firmware sets on its OTA and
// activation requests (firmware-protocol §2.2); nothing else a caller
// sends is passed on.
var forwardedHeaders = []string{"Device-Id", "Client-Id", "Activation-Version", "Serial-Number",
	"User-Agent", "Accept-Language", "Content-Type"}

// UpstreamStats counts what the pass-through did.
type UpstreamStats struct {
	// Requests counts the calls sent to the upstream (boot calls and
	// activation polls).
	Requests int64
	// Errors counts failed calls and dropped pieces by reason (the
	// Upstream* reasons, every one present).
	Errors map[string]int64
}

func (u Upstream) withDefaults() Upstream {
	u.Timeout = cmp.Or(max(u.Timeout, 0), DefaultUpstreamTimeout)
	u.MaxInFlight = cmp.Or(max(u.MaxInFlight, 0), DefaultUpstreamMaxInFlight)
	return u
}

// Validate reports an upstream URL the pass-through cannot call. The
// error never quotes the URL whole: it may carry a password or a token.
func (u Upstream) Validate() error {
	if u.URL == "" {
		return nil
	}
	p, err := url.Parse(u.URL)
	if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" || p.Opaque != "" || len(u.URL) > maxUpstreamURLLen {
		return fmt.Errorf("voice.upstream_ota %s: want the upstream's OTA URL, http:// or https://, e.g. http://host:8002/xiaozhi/ota/", shownURL(p))
	}
	return nil
}

// shownURL is what logs and errors say of the upstream URL: scheme, host
// and path, without the user info or the query, either of which may hold
// a credential.
func shownURL(p *url.URL) string {
	if p == nil {
		return "(unreadable URL)"
	}
	return strconv.Quote((&url.URL{Scheme: p.Scheme, Host: p.Host, Path: p.Path}).String())
}

// upstream calls the voice upstream's OTA endpoint.
type upstream struct {
	cfg           Upstream
	ota, activate string
	shown         string
	client        *http.Client
	// slots bounds the calls in flight (Upstream.MaxInFlight).
	slots    chan struct{}
	requests atomic.Int64
	// errs has one counter per reason, made in newUpstream and never
	// changed after: read without a lock.
	errs map[string]*atomic.Int64
}

func newUpstream(cfg Upstream) (*upstream, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	p, _ := url.Parse(cfg.URL)
	act := *p
	// <ota>/activate as the firmware builds it: "activate" appended, with
	// a "/" only if the path does not end in one (on the path, so that a
	// query the URL may carry stays a query).
	sep := "/"
	if len(act.Path) > 0 && act.Path[len(act.Path)-1] == '/' {
		sep = ""
	}
	act.Path += sep + "activate"
	if act.RawPath != "" {
		act.RawPath += sep + "activate"
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = min(cfg.MaxInFlight, 16)
	tr.MaxConnsPerHost = cfg.MaxInFlight
	tr.IdleConnTimeout = 30 * time.Second
	tr.ResponseHeaderTimeout = cfg.Timeout
	u := &upstream{cfg: cfg, ota: p.String(), activate: act.String(), shown: shownURL(p),
		slots: make(chan struct{}, cfg.MaxInFlight), errs: map[string]*atomic.Int64{},
		client: &http.Client{Transport: tr,
			// A redirect is the upstream's answer, not followed: an
			// answer the board would not act on either.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
	}
	for _, r := range upstreamReasons {
		u.errs[r] = new(atomic.Int64)
	}
	return u, nil
}

func (u *upstream) close() { u.client.CloseIdleConnections() }

func (u *upstream) count(reason string) { u.errs[reason].Add(1) }

func (u *upstream) stats() UpstreamStats {
	st := UpstreamStats{Requests: u.requests.Load(), Errors: make(map[string]int64, len(u.errs))}
	for r, c := range u.errs {
		st.Errors[r] = c.Load()
	}
	return st
}

// upstreamError is a failed call: why, and for a status, which.
type upstreamError struct {
	reason string
	status int
	err    error
}

func (e *upstreamError) Error() string {
	switch {
	case e.status != 0:
		return fmt.Sprintf("%s: the upstream answered %d", e.reason, e.status)
	case e.err != nil:
		return e.reason + ": " + e.err.Error()
	}
	return e.reason
}

func (e *upstreamError) Unwrap() error { return e.err }

// errBoardGone: the board's request ended before the upstream answered;
// nothing is counted, and nobody is left to answer.
var errBoardGone = errors.New("the board's request ended")

// call sends the board's request r, with body, to target and returns the
// upstream's status and answer. Errors are an *upstreamError or
// errBoardGone.
func (u *upstream) call(r *http.Request, target string, body []byte) (int, []byte, error) {
	select {
	case u.slots <- struct{}{}:
		defer func() { <-u.slots }()
	default:
		return 0, nil, &upstreamError{reason: UpstreamBusy}
	}
	u.requests.Add(1)
	ctx, cancel := context.WithTimeout(r.Context(), u.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, r.Method, target, bytes.NewReader(body))
	if err != nil {
		return 0, nil, &upstreamError{reason: UpstreamUnreachable, err: err}
	}
	for _, h := range forwardedHeaders {
		if v := r.Header.Get(h); v != "" {
			req.Header.Set(h, v)
		}
	}
	if req.Header.Get("User-Agent") == "" {
		req.Header["User-Agent"] = []string{""} // not Go's own: the board sent none
	}
	// The board's address as the bridge sees it. One the caller sent is
	// not passed on: anyone can write that header.
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		req.Header.Set("X-Forwarded-For", host)
	}
	resp, err := u.client.Do(req)
	if err != nil {
		return 0, nil, u.failure(r.Context(), ctx, err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, MaxUpstreamAnswerBytes+1))
	if err != nil {
		return 0, nil, u.failure(r.Context(), ctx, err)
	}
	if len(answer) > MaxUpstreamAnswerBytes {
		return 0, nil, &upstreamError{reason: UpstreamOversized, err: fmt.Errorf("the answer is larger than %d bytes", MaxUpstreamAnswerBytes)}
	}
	return resp.StatusCode, answer, nil
}

// failure classifies a failed exchange: the board gone, the timeout, or
// the upstream out of reach. A *url.Error is unwrapped, as its text
// quotes the URL and so any token in its query.
func (u *upstream) failure(board, call context.Context, err error) error {
	if board.Err() != nil {
		return errBoardGone
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	if errors.Is(call.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
		return &upstreamError{reason: UpstreamTimeout, err: fmt.Errorf("no answer within %s", u.cfg.Timeout)}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return &upstreamError{reason: UpstreamTimeout, err: err}
	}
	return &upstreamError{reason: UpstreamUnreachable, err: err}
}

// fetchAnswer forwards a board's boot call and returns the members of
// the upstream's answer.
func (u *upstream) fetchAnswer(r *http.Request, body []byte) (map[string]json.RawMessage, error) {
	status, answer, err := u.call(r, u.ota, body)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		// The board itself would take nothing from a non-200 answer.
		return nil, &upstreamError{reason: UpstreamStatus, status: status}
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(answer, &top); err != nil || top == nil {
		return nil, &upstreamError{reason: UpstreamInvalid, err: errors.New("the answer is not a JSON object")}
	}
	return top, nil
}

// merge takes into ans, the bridge's answer, what the board may take from
// the upstream's: activation (the upstream's binding code, shown on the
// board), firmware and server_time. It returns why each piece it dropped
// was dropped.
//
// Every other member of the upstream's answer is dropped. Its websocket
// and mqtt would send the board to the upstream directly, past the bridge
// that must hold the board's connection; and the firmware stores every
// member inside them in NVS under the member's name, so an unknown long
// key there aborts the board at every boot. Other top-level keys mean
// nothing to the firmware.
func merge(ans *Answer, top map[string]json.RawMessage, boardVersion string, offset *int) []error {
	var dropped []error
	if raw, ok := top["activation"]; ok {
		a, err := upstreamActivation(raw)
		if err != nil {
			dropped = append(dropped, err)
		} else if a != nil {
			ans.Activation = a
		}
	}
	if raw, ok := top["firmware"]; ok {
		fw, err := upstreamFirmware(raw, boardVersion)
		if err != nil {
			dropped = append(dropped, err)
		} else if fw != nil {
			ans.Firmware = fw
		}
	}
	if raw, ok := top["server_time"]; ok {
		st, err := upstreamServerTime(raw, offset)
		if err != nil {
			dropped = append(dropped, err)
		} else if st != nil {
			ans.ServerTime = st
		}
	}
	return dropped
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

// upstreamActivation reads the upstream's activation: message, code and
// challenge, each a string if present (the firmware shows and reads
// them); timeout_ms, unused by the firmware, is dropped. nil when there is
// nothing to show: no code and no challenge.
func upstreamActivation(raw json.RawMessage) (*Activation, error) {
	if isNull(raw) {
		return nil, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, errors.New("activation is not an object")
	}
	var a Activation
	for _, f := range []struct {
		name string
		into *string
	}{{"message", &a.Message}, {"code", &a.Code}, {"challenge", &a.Challenge}} {
		v, ok := m[f.name]
		if !ok || isNull(v) {
			continue
		}
		if err := json.Unmarshal(v, f.into); err != nil {
			return nil, fmt.Errorf("activation.%s is not a string", f.name)
		}
		if len(*f.into) > MaxValueLen {
			return nil, fmt.Errorf("activation.%s is longer than %d bytes", f.name, MaxValueLen)
		}
	}
	if a.Code == "" && a.Challenge == "" {
		return nil, nil
	}
	return &a, nil
}

// upstreamFirmware reads the upstream's firmware and keeps it only when
// the board can parse its version and it is not newer than the board's
// (the crash and flash rules of CheckAnswer): the bridge never lets the
// upstream flash a board through it. force is dropped, as it would
// install url even when not newer. nil without a version.
func upstreamFirmware(raw json.RawMessage, boardVersion string) (*Firmware, error) {
	if isNull(raw) {
		return nil, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, errors.New("firmware is not an object")
	}
	v, ok := m["version"]
	if !ok || isNull(v) {
		return nil, nil
	}
	var fw Firmware
	if err := json.Unmarshal(v, &fw.Version); err != nil {
		return nil, errors.New("firmware.version is not a string")
	}
	if u, ok := m["url"]; ok && !isNull(u) {
		if err := json.Unmarshal(u, &fw.URL); err != nil || len(fw.URL) > MaxValueLen {
			return nil, errors.New("firmware.url is not a string of at most 1024 bytes")
		}
	}
	theirs, err := parseVersion(fw.Version)
	if err != nil {
		return nil, fmt.Errorf("firmware.version %q: %w", clipVersion(fw.Version), err)
	}
	mine, err := parseVersion(boardVersion)
	if err != nil || compareVersions(theirs, mine) > 0 {
		return nil, fmt.Errorf("firmware.version %q, board runs %q: %w", clipVersion(fw.Version), clipVersion(boardVersion), ErrNewerFirmware)
	}
	return &fw, nil
}

// clipVersion keeps a version quoted in a log line short.
func clipVersion(v string) string {
	if len(v) > 32 {
		return v[:32] + "…"
	}
	return v
}

// Bounds of server_time the pass-through accepts: milliseconds up to the
// year 9999, and the offsets of real time zones (as ota.timezone_offset).
const (
	maxTimestampMillis              = 253402300799999
	minOffsetMinutes, maxOffsetMins = -12 * 60, 14 * 60
)

// upstreamServerTime reads the upstream's server_time: an integer
// timestamp in milliseconds and an optional integer timezone_offset in
// minutes; without one, offset (the bridge's ota.timezone_offset) is
// kept. nil without a timestamp.
func upstreamServerTime(raw json.RawMessage, offset *int) (*ServerTime, error) {
	if isNull(raw) {
		return nil, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, errors.New("server_time is not an object")
	}
	ts, ok := m["timestamp"]
	if !ok || isNull(ts) {
		return nil, nil
	}
	// Integers as JSON numbers only: strconv refuses quotes, fractions
	// and exponents.
	n, err := strconv.ParseInt(string(bytes.TrimSpace(ts)), 10, 64)
	if err != nil || n <= 0 || n > maxTimestampMillis {
		return nil, errors.New("server_time.timestamp is not a number of milliseconds")
	}
	st := &ServerTime{Timestamp: n, TimezoneOffset: offset}
	if o, ok := m["timezone_offset"]; ok && !isNull(o) {
		mins, err := strconv.Atoi(string(bytes.TrimSpace(o)))
		if err != nil || mins < minOffsetMinutes || mins > maxOffsetMins {
			return nil, errors.New("server_time.timezone_offset is not a number of minutes from -720 to 840")
		}
		st.TimezoneOffset = &mins
	}
	return st, nil
}
