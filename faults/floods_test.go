//go:build faults

package faults

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/internal/bridgetest"
	"github.com/devicebridge/devicebridge/simulator"
)

// The HTTP side's floods: MCP sessions, OTA requests and approvals,
// connections that stay idle or send slowly. Each runs against caps
// configured small, so that reaching them takes a few dozen requests.

// fromAddr is an HTTP client whose connections come from the loopback
// address ip, so that one test can be several callers.
func fromAddr(t *testing.T, ip string) *http.Client {
	t.Helper()
	tr := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}).DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: wait}
}

// send makes one request through c and returns the status, the body and
// the headers; a transport error is status 0 and the error text.
func send(c *http.Client, method, url string, h http.Header, body string) (int, []byte, http.Header) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return 0, []byte(err.Error()), nil
	}
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, []byte(err.Error()), nil
	}
	return resp.StatusCode, readAll(resp), resp.Header
}

var initializeBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",` +
	`"capabilities":{},"clientInfo":{"name":"faults","version":"1"}}}`

// mcpHeaders are what a host sends with every POST to /mcp.
func mcpHeaders() http.Header {
	return http.Header{"Content-Type": {"application/json"}, "Accept": {"application/json, text/event-stream"}}
}

// sessionRefusal checks a refused initialize: status, Retry-After and a
// JSON-RPC error naming the setting.
func sessionRefusal(code int, body []byte, h http.Header) error {
	var e struct {
		ID    json.RawMessage `json:"id"`
		Error struct {
			Code int `json:"code"`
			Data struct {
				Setting    string `json:"setting"`
				RetryAfter int    `json:"retryAfter"`
			} `json:"data"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		return fmt.Errorf("%d, not a JSON-RPC error: %s", code, clip(body))
	}
	want := map[int]string{http.StatusTooManyRequests: "mcp.max_sessions_per_client", http.StatusServiceUnavailable: "mcp.max_sessions"}[code]
	switch {
	case want == "" || e.Error.Data.Setting != want:
		return fmt.Errorf("%d naming %q", code, e.Error.Data.Setting)
	case string(e.ID) != "1" || e.Error.Code != -32000 || e.Error.Data.RetryAfter <= 0 || h.Get("Retry-After") == "":
		return fmt.Errorf("refusal without an id, code or retry time: %s", clip(body))
	}
	return nil
}

// TestMCPSessionFlood: one caller initializes 5 MCP sessions, then four
// more callers (loopback addresses) 60 concurrently, against
// mcp.max_sessions 8 and mcp.max_sessions_per_client 3. Every initialize is admitted or refused
// with a JSON-RPC error naming the setting (429 for the caller's cap, 503
// for the bridge's); the live sessions never exceed the cap (growth); the
// admitted ones work, and ended ones make room. A second bridge, with a
// short mcp.session_timeout, closes sessions left idle (growth otherwise).
func TestMCPSessionFlood(t *testing.T) {
	s := scenario(t, "MCP session flood")
	const total, perClient, callers, tries = 8, 3, 5, 60
	cfg := baseConfig()
	cfg.MCP.MaxSessions, cfg.MCP.MaxSessionsPerClient = total, perClient
	b := startBridge(t, cfg, nil)
	ref := b.board(simulator.Config{MAC: mac(20, 0)}).MAC()
	clients := make([]*http.Client, callers)
	for i := range clients {
		clients[i] = fromAddr(t, fmt.Sprintf("127.0.0.%d", i+1))
	}

	var mu sync.Mutex
	var sessions []string
	var peak atomic.Int64
	admitted := map[int]int{}
	initialize := func(i, c int) {
		code, body, h := send(clients[c], http.MethodPost, b.Base+"/mcp", mcpHeaders(), initializeBody)
		live := int64(b.App.MCP().SessionStats().Live)
		for p := peak.Load(); live > p && !peak.CompareAndSwap(p, live); p = peak.Load() {
		}
		if live > total {
			s.growth("%d live MCP sessions, more than mcp.max_sessions %d", live, total)
			return
		}
		switch {
		case code == http.StatusOK && h.Get("Mcp-Session-Id") != "":
			mu.Lock()
			sessions = append(sessions, h.Get("Mcp-Session-Id"))
			admitted[c]++
			over := admitted[c] > perClient
			mu.Unlock()
			if over {
				s.bypass("caller %d: a session past mcp.max_sessions_per_client", c)
				return
			}
			s.ok()
		case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
			s.check(fmt.Sprintf("initialize %d", i), sessionRefusal(code, body, h))
		default:
			s.lose(answerLoss(code, body), "initialize %d: %d %s", i, code, clip(body))
		}
	}
	// One caller alone reaches its own cap, then all of them at once the
	// bridge's.
	for i := range perClient + 2 {
		initialize(i, 0)
	}
	parallel(t, s, tries, 12, func(i int) { initialize(perClient+2+i, 1+i%(callers-1)) })
	t.Logf("sessions: %d admitted (%v by caller), peak %d live, stats %+v", len(sessions), admitted, peak.Load(), b.App.MCP().SessionStats())
	if n := b.App.MCP().SessionStats().Live; n > total || len(sessions) > total {
		s.growth("%d live, %d admitted: more than mcp.max_sessions %d", n, len(sessions), total)
	} else {
		s.ok()
	}

	// The admitted sessions work; ending them makes room again.
	list := mcpHeaders()
	list.Set("Mcp-Protocol-Version", "2025-06-18")
	for _, sid := range sessions {
		h := list.Clone()
		h.Set("Mcp-Session-Id", sid)
		code, body, _ := send(b.HTTP, http.MethodPost, b.Base+"/mcp", h, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
		if code != http.StatusAccepted {
			s.lose(answerLoss(code, body), "an admitted session: %d %s", code, clip(body))
			continue
		}
		code, body, _ = send(b.HTTP, http.MethodDelete, b.Base+"/mcp", h, "")
		s.checkAs(answerLoss(code, body), "DELETE of an admitted session", statusErr(code, body, http.StatusNoContent))
	}
	if assertEventually(func() bool { return b.App.MCP().SessionStats().Live == 0 }) {
		s.ok()
	} else {
		s.growth("%d sessions live after every one was deleted", b.App.MCP().SessionStats().Live)
	}
	code, body, h := send(clients[0], http.MethodPost, b.Base+"/mcp", mcpHeaders(), initializeBody)
	s.check("initialize once room is back", statusErr(code, body, http.StatusOK))
	if sid := h.Get("Mcp-Session-Id"); sid != "" {
		del := mcpHeaders()
		del.Set("Mcp-Session-Id", sid)
		send(clients[0], http.MethodDelete, b.Base+"/mcp", del, "")
	}
	b.requireHealthy(t, s, ref)

	// Idle sessions are closed after mcp.session_timeout.
	cfg.MCP.SessionTimeout = time.Second // the shortest allowed
	idle := startBridge(t, cfg, nil)
	for i := range total {
		code, body, _ := send(clients[i%callers], http.MethodPost, idle.Base+"/mcp", mcpHeaders(), initializeBody)
		s.check("initialize on the idle bridge", statusErr(code, body, http.StatusOK))
	}
	if assertEventually(func() bool { return idle.App.MCP().SessionStats().Live == 0 }) {
		s.ok()
	} else {
		s.growth("%d idle sessions still open past mcp.session_timeout", idle.App.MCP().SessionStats().Live)
	}
}

// otaAnswer is what the campaign reads of an OTA answer.
type otaAnswer struct {
	WebSocket struct {
		Token string `json:"token"`
	} `json:"websocket"`
	MQTT struct {
		Password string `json:"password"`
	} `json:"mqtt"`
	Activation struct {
		Code string `json:"code"`
	} `json:"activation"`
}

func (a otaAnswer) credentials() bool { return a.WebSocket.Token != "" || a.MQTT.Password != "" }

// otaBoot POSTs sb's boot call through c, with the headers the firmware
// sends, and the Device-Id spelled as given.
func otaBoot(c *http.Client, url string, sb *simulator.Board, deviceID string) (int, otaAnswer, http.Header, []byte) {
	h := http.Header{"Activation-Version": {"1"}, "Device-Id": {deviceID}, "Client-Id": {sb.ClientID()},
		"User-Agent": {"bread-compact-wifi/1.6.0"}, "Content-Type": {"application/json"}}
	code, body, hdr := send(c, http.MethodPost, url, h, sb.SystemInfoJSON())
	var a otaAnswer
	_ = json.Unmarshal(body, &a)
	return code, a, hdr, body
}

// otaListing reads GET /api/ota/devices.
type otaListing struct {
	Pending    int `json:"pending"`
	MaxPending int `json:"max_pending"`
	Devices    []struct {
		DeviceID string `json:"device_id"`
		Code     string `json:"code"`
	} `json:"devices"`
}

func (b *bridge) otaListing() (otaListing, error) {
	var l otaListing
	code, body := b.do(http.MethodGet, "/api/ota/devices", nil, nil)
	if code != http.StatusOK {
		return l, fmt.Errorf("GET /api/ota/devices: %d %s", code, clip(body))
	}
	return l, json.Unmarshal(body, &l)
}

// TestOTAFlood: with approval on, a board registers (its code on screen),
// then one address POSTs 80 boot calls, each claiming a new MAC, against
// ota.requests_per_second 1 (burst 20) and ota.max_pending 5. Past the
// burst the answer is 429, past the list 503, both with Retry-After; no
// more requests are served than the limit allows (bypass) and the pending
// list never grows past its bound (growth). Three callers then guess
// activation codes against ota.code_guesses_per_caller_per_hour 36 and
// ota.code_guesses_per_hour 60 (bursts 6 and 10): no more guesses are
// evaluated than that (bypass). The real board is approved by MAC and gets
// its credentials; the same MAC with another Client-Id, in any spelling,
// gets none (bypass), and cannot use the board's token either.
func TestOTAFlood(t *testing.T) {
	s := scenario(t, "OTA flood")
	const flood, maxPending, rps, burst = 80, 5, 1, 20
	cfg := baseConfig()
	cfg.OTA.Approval = true
	cfg.OTA.Secret = "faults-ota-secret-0123456789"
	cfg.OTA.MaxPending = maxPending
	cfg.OTA.RequestsPerSecond, cfg.OTA.RequestBurst = rps, burst
	cfg.OTA.CodeGuessesPerHour, cfg.OTA.CodeGuessesPerCallerPerHour = 60, 36
	b := startBridge(t, cfg, nil)
	url := b.App.OTAURL()

	real, err := simulator.NewBoard(simulator.Config{MAC: mac(21, 1), Profile: profile(t, "breadboard")})
	require.NoError(t, err)
	boardClient := fromAddr(t, "127.0.0.3")
	code, first, _, body := otaBoot(boardClient, url, real, real.MAC())
	require.Equal(t, http.StatusOK, code, "%s", body)
	require.NotEmpty(t, first.Activation.Code, "approval on: the board shows a code")
	require.False(t, first.credentials(), "no credentials before approval")

	pendingOK := func(what string) {
		l, err := b.otaListing()
		switch {
		case err != nil:
			s.fail("%s: %v", what, err)
		case l.Pending > maxPending || len(l.Devices) > maxPending:
			s.growth("%s: %d pending, %d listed, more than ota.max_pending %d", what, l.Pending, len(l.Devices), maxPending)
		default:
			s.ok()
		}
	}

	flooder := fromAddr(t, "127.0.0.1")
	counts := map[int]int{}
	start := time.Now()
	for i := range flood {
		sb, err := simulator.NewBoard(simulator.Config{MAC: mac(21, 100+i), Profile: profile(t, "breadboard")})
		require.NoError(t, err)
		code, a, h, body := otaBoot(flooder, url, sb, sb.MAC())
		counts[code]++
		switch {
		case code == http.StatusOK && a.Activation.Code != "" && !a.credentials():
			s.ok()
		case code == http.StatusOK:
			s.bypass("flood %d: admitted without approval: %s", i, clip(body))
		case (code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable) && h.Get("Retry-After") != "":
			s.ok()
		default:
			s.lose(answerLoss(code, body), "flood %d: %d %s", i, code, clip(body))
		}
		if i%10 == 9 {
			pendingOK(fmt.Sprintf("after %d boot calls", i+1))
		}
	}
	// The limit allows the burst, plus what the rate refilled meanwhile.
	allowed := burst + int(math.Floor(time.Since(start).Seconds()*rps))
	t.Logf("OTA flood: answers %v; at most %d could be served", counts, allowed)
	if served := flood - counts[http.StatusTooManyRequests]; served > allowed {
		s.bypass("%d boot calls from one address served, the limit allows %d", served, allowed)
	} else if counts[http.StatusTooManyRequests] == 0 {
		s.bypass("no boot call was rate-limited")
	} else {
		s.ok()
	}

	// Guessing codes: three callers, 15 wrong codes each.
	l, err := b.otaListing()
	require.NoError(t, err)
	taken := map[string]bool{}
	for _, d := range l.Devices {
		taken[d.Code] = true
	}
	evaluated := map[int]int{}
	start = time.Now()
	for c := range 3 {
		caller := fromAddr(t, fmt.Sprintf("127.0.0.%d", 10+c))
		for g := range 15 {
			guess := fmt.Sprintf("%06d", (c*15+g)*7919%1_000_000)
			if taken[guess] {
				continue
			}
			code, body, h := send(caller, http.MethodPost, b.Base+"/api/ota/devices/"+guess+"/approve", nil, "")
			switch {
			case code == http.StatusNotFound:
				evaluated[c]++
				s.ok()
			case code == http.StatusTooManyRequests && h.Get("Retry-After") != "":
				s.ok()
			case code == http.StatusOK:
				s.bypass("guess %s approved a board", guess)
			default:
				s.lose(answerLoss(code, body), "guess %s: %d %s", guess, code, clip(body))
			}
		}
	}
	hours := time.Since(start).Hours()
	perCaller, all := 6+int(math.Floor(36*hours)), 10+int(math.Floor(60*hours))
	sum := 0
	for c, n := range evaluated {
		sum += n
		if n > perCaller {
			s.bypass("caller %d: %d guesses evaluated, the limit allows %d", c, n, perCaller)
		}
	}
	if sum > all {
		s.bypass("%d guesses evaluated in all, the limit allows %d", sum, all)
	} else {
		s.ok()
	}
	t.Logf("code guesses evaluated: %v (limits %d per caller, %d in all)", evaluated, perCaller, all)

	// The real board, approved by MAC, gets its credentials; its MAC with
	// another Client-Id gets none.
	code, body = b.do(http.MethodPost, "/api/ota/devices/"+real.MAC()+"/approve", nil, nil)
	require.Equal(t, http.StatusOK, code, "%s", body)
	code, approved, _, body := otaBoot(boardClient, url, real, real.MAC())
	if code != http.StatusOK || approved.WebSocket.Token == "" {
		s.fail("the approved board: %d %s", code, clip(body))
	} else {
		s.ok()
	}
	impostorClient := fromAddr(t, "127.0.0.4")
	for _, spelling := range []string{real.MAC(), strings.ToUpper(strings.ReplaceAll(real.MAC(), ":", "-")), strings.ReplaceAll(real.MAC(), ":", "")} {
		impostor, err := simulator.NewBoard(simulator.Config{MAC: real.MAC(), Profile: profile(t, "breadboard")})
		require.NoError(t, err)
		code, a, _, body := otaBoot(impostorClient, url, impostor, spelling)
		switch {
		case a.credentials() || strings.Contains(string(body), approved.WebSocket.Token):
			s.bypass("the MAC as %s with another Client-Id got credentials", spelling)
		case code == http.StatusConflict:
			s.ok()
		default:
			s.fail("the MAC as %s with another Client-Id: %d %s, want 409", spelling, code, clip(body))
		}
	}
	// Nor does the board's own token let another Client-Id in.
	if approved.WebSocket.Token != "" {
		c, resp, err := dialDevice(b.App.DeviceURL(), real.MAC(), approved.WebSocket.Token,
			http.Header{"Client-Id": {"0badbadb-0000-4000-8000-000000000009"}})
		if err == nil {
			_ = c.Close()
			s.bypass("the board's token admitted another Client-Id")
		} else {
			s.check("the board's token with another Client-Id", statusErr(statusOf(resp), nil, http.StatusUnauthorized))
		}
	}
	pendingOK("at the end")
	b.requireHealthy(t, s, "")
}

// keepAlive opens a connection, completes one request on it and leaves
// it open, idle, as a keep-alive client does. It returns nil when the
// listener refused the connection (a 503 that closes it, or a close
// before any answer), and an error when the server neither answered nor
// closed.
func keepAlive(addr net.Addr, path string) (net.Conn, error) {
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(wait))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, addr); err != nil {
		_ = c.Close()
		return nil, nil
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		_ = c.Close()
		if isTimeout(err.Error()) {
			return nil, errors.New("the server neither answered nor closed the connection")
		}
		return nil, nil
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode == http.StatusServiceUnavailable && resp.Close {
		_ = c.Close()
		return nil, nil
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// closedByServer reports whether the server closes c (EOF or reset)
// within wait, reading and dropping whatever it answers first.
func closedByServer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(wait))
	_, err := io.Copy(io.Discard, c)
	return err == nil || !isTimeout(err.Error())
}

// dribble starts a request on addr that sends head and then one byte of
// filler every 20 ms for as long as the server takes it.
func dribble(t *testing.T, addr net.Addr, head string) net.Conn {
	return bridgetest.Dribble(t, addr, head, 'x')
}

// TestConnectionFlood: 60 keep-alive connections held idle against a
// control listener capped at 8 (http.control_max_connections): the cap's
// worth is held, the rest refused at once, never all held (growth); room
// comes back when they close. Slow requests on the device listener (OTA
// bodies and headers sent a byte every 20 ms) are cut off by
// http.read_timeout (hang otherwise). On a bridge with a short
// http.idle_timeout, idle keep-alives are closed (growth otherwise).
func TestConnectionFlood(t *testing.T) {
	s := scenario(t, "connection flood")
	const capacity, idlers, slow = 8, 60, 10
	cfg := baseConfig()
	cfg.HTTP.ControlMaxConnections = capacity
	cfg.HTTP.ReadTimeout = 500 * time.Millisecond
	cfg.HTTP.ReadHeaderTimeout = 500 * time.Millisecond
	b := startBridge(t, cfg, nil)
	ref := b.board(simulator.Config{MAC: mac(22, 0)}).MAC()
	b.HTTP.CloseIdleConnections() // the harness's own keep-alives count too

	var held []net.Conn
	for i := range idlers {
		c, err := keepAlive(b.App.ControlAddr(), "/healthz")
		switch {
		case err != nil:
			s.hang("idle connection %d: %v", i, err)
		case c != nil:
			held = append(held, c)
			if len(held) > capacity {
				s.growth("idle connection %d held past http.control_max_connections %d", i, capacity)
				continue
			}
			s.ok()
		default:
			s.ok()
		}
	}
	t.Logf("idle keep-alives: %d held, %d refused", len(held), idlers-len(held))
	for _, c := range held {
		_ = c.Close()
	}
	served := func() bool {
		c, err := keepAlive(b.App.ControlAddr(), "/healthz")
		if c != nil {
			_ = c.Close()
		}
		return c != nil && err == nil
	}
	if assertEventually(served) {
		s.ok()
	} else {
		s.hang("the control listener did not serve again after the idle connections closed")
	}

	// Slow bodies and slow headers on the OTA endpoint.
	dev := b.App.DeviceAddr()
	path := strings.TrimPrefix(b.App.OTAURL(), "http://"+dev.String())
	var conns []net.Conn
	for i := range slow {
		head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nDevice-Id: %s\r\n"+
			"Client-Id: 5b1c2a3e-0000-4000-8000-%012d\r\nContent-Length: 100000\r\n\r\n{", path, dev, mac(22, 10+i), i)
		if i%2 == 1 {
			head = fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nX-Slow: ", path, dev)
		}
		conns = append(conns, dribble(t, dev, head))
	}
	for i, c := range conns {
		if closedByServer(c) {
			s.ok()
		} else {
			s.hang("slow request %d still held past http.read_timeout", i)
		}
	}
	b.requireHealthy(t, s, ref)

	// Idle keep-alives are closed after http.idle_timeout.
	cfg.HTTP.IdleTimeout = 200 * time.Millisecond
	idle := startBridge(t, cfg, nil)
	for i := range capacity {
		c, err := keepAlive(idle.App.ControlAddr(), "/healthz")
		switch {
		case err != nil || c == nil:
			s.fail("idle bridge, connection %d: not served: %v", i, err)
		case closedByServer(c):
			_ = c.Close()
			s.ok()
		default:
			_ = c.Close()
			s.growth("idle bridge, connection %d: held past http.idle_timeout", i)
		}
	}
}
