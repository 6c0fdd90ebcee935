//go:build faults

package faults

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/devicebridge/devicebridge/mqtt"
	"github.com/devicebridge/devicebridge/mqtt/broker"
	"github.com/devicebridge/devicebridge/simulator"
)

// Secrets of the security bridge; none may ever reach a log line.
const (
	deviceToken  = "dev-SECRET-token-4f1c"
	controlToken = "ctl-SECRET-token-9b2e"
	mcpTokenA    = "mcp-SECRET-token-a-77d0"
	mcpTokenB    = "mcp-SECRET-token-b-c3e5"
	mqttUser     = "board-user"
	mqttPassword = "mqtt-SECRET-pass-5a6b"
	// argCanary is a tool argument; it may be logged at debug, never at
	// info or above.
	argCanary = "CANARY-ARG-31d9"
)

// TestSecurity tries every listener with wrong and missing credentials,
// one MQTT board acting as another, foreign Host and Origin headers, a
// session id used with another token, sockets that never say hello, and
// then reads every log line the bridge wrote (at debug level) for
// secrets, and the info-and-above lines for tool arguments.
func TestSecurity(t *testing.T) {
	s := scenario(t, "security")
	core, logs := observer.New(zapcore.DebugLevel)
	cfg := baseConfig()
	cfg.WebSocket.Tokens = []string{deviceToken}
	cfg.WebSocket.HelloTimeout = 2 * time.Second
	cfg.WebSocket.MaxPendingHellos = 10
	cfg.Control.Tokens = []string{controlToken}
	cfg.MCP.Tokens = []string{mcpTokenA, mcpTokenB}
	cfg.MQTT.Listen = "127.0.0.1:0"
	no := false
	cfg.MQTT.Auth = broker.AuthConfig{Users: []broker.User{{Username: mqttUser, Password: mqttPassword}}, AllowAnonymous: &no}
	b := startBridge(t, cfg, zap.New(core))
	ref := b.board(simulator.Config{MAC: mac(12, 0), Token: deviceToken}).MAC()
	ctl := http.Header{"Authorization": {"Bearer " + controlToken}}
	call := func(mac, tool string, args string) (int, []byte) {
		return b.do(http.MethodPost, "/api/devices/"+mac+"/call", []byte(`{"name":"`+tool+`","arguments":`+args+`}`), ctl)
	}
	healthy := func() error {
		if code, body := call(ref, "self.get_device_status", "{}"); code != http.StatusOK {
			return fmt.Errorf("reference board: %d %s", code, body)
		}
		return nil
	}
	// A refusal answered with success is a bypass; any other unexpected
	// status a wrong answer.
	expect := func(what string, got, want int) {
		switch {
		case got == want:
			s.checkAs(lossCrash, what, healthy())
		case want >= 400 && got >= 200 && got < 400:
			s.bypass("%s: status %d, want %d", what, got, want)
		default:
			s.fail("%s: status %d, want %d", what, got, want)
		}
	}
	url := b.App.DeviceURL()

	// Device WebSocket: token.
	for _, tc := range []struct{ name, auth string }{{"no token", ""}, {"wrong token", "Bearer nope"},
		{"token without Bearer", deviceToken + "x"}, {"empty Bearer", "Bearer "}, {"other listener's token", "Bearer " + controlToken}} {
		h := http.Header{}
		if tc.auth != "" {
			h.Set("Authorization", tc.auth)
		}
		c, resp, _ := dialDevice(url, mac(12, 1), "", h)
		if c != nil {
			_ = c.Close()
		}
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		expect("device ws: "+tc.name, status, http.StatusUnauthorized)
	}
	// Control API and /mcp: bearer tokens.
	for _, tc := range []struct {
		name, path, auth string
		want             int
	}{
		{"api: no token", "/api/devices", "", http.StatusUnauthorized},
		{"api: wrong token", "/api/devices", "Bearer nope", http.StatusUnauthorized},
		{"api: /mcp token", "/api/devices", "Bearer " + mcpTokenA, http.StatusUnauthorized},
		{"api: token without Bearer", "/api/devices", controlToken, http.StatusUnauthorized},
		{"api: right token", "/api/devices", "Bearer " + controlToken, http.StatusOK},
		{"healthz stays open", "/healthz", "", http.StatusOK},
	} {
		h := http.Header{}
		if tc.auth != "" {
			h.Set("Authorization", tc.auth)
		}
		code, _ := b.do(http.MethodGet, tc.path, nil, h)
		expect(tc.name, code, tc.want)
	}
	// The control API's front door: the Host and Origin checks /mcp has,
	// and no state change from a request any page could send unasked.
	front := func(method, path, host string, h http.Header, body string) int {
		req, err := http.NewRequest(method, b.Base+path, strings.NewReader(body))
		if err != nil {
			return 0
		}
		req.Header = h
		if host != "" {
			req.Host = host
		}
		resp, err := b.HTTP.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	callPath, loud := "/api/devices/"+ref+"/call", `{"name":"self.audio_speaker.set_volume","arguments":{"volume":100}}`
	for _, tc := range []struct {
		name, method, path, host string
		h                        http.Header
		want                     int
	}{
		{"api: foreign Host", http.MethodGet, "/api/devices", "evil.example", ctl.Clone(), http.StatusForbidden},
		{"api: rebound Host, same origin", http.MethodGet, "/api/devices", "evil.example:80",
			http.Header{"Authorization": ctl["Authorization"], "Origin": {"http://evil.example:80"}, "Sec-Fetch-Site": {"same-origin"}}, http.StatusForbidden},
		{"api: foreign Origin", http.MethodPost, callPath, "",
			http.Header{"Authorization": ctl["Authorization"], "Origin": {"http://evil.example"}, "Content-Type": {"application/json"}}, http.StatusForbidden},
		{"api: cross-site text/plain", http.MethodPost, callPath, "",
			http.Header{"Sec-Fetch-Site": {"cross-site"}, "Content-Type": {"text/plain"}}, http.StatusForbidden},
		{"api: text/plain from a local page", http.MethodPost, callPath, "",
			http.Header{"Origin": {"http://localhost:5173"}, "Content-Type": {"text/plain"}}, http.StatusUnsupportedMediaType},
		{"api: OTA approvals without token", http.MethodGet, "/api/ota/devices", "", http.Header{}, http.StatusUnauthorized},
		{"api: metrics without token", http.MethodGet, "/metrics", "", http.Header{}, http.StatusUnauthorized},
		{"api: events without token", http.MethodGet, "/api/events", "", http.Header{}, http.StatusUnauthorized},
	} {
		expect(tc.name, front(tc.method, tc.path, tc.host, tc.h, loud), tc.want)
	}

	initBody := []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"faults","version":"1"}}}`)
	for _, tc := range []struct {
		name string
		h    http.Header
		want int
	}{
		{"mcp: no token", nil, http.StatusUnauthorized},
		{"mcp: wrong token", http.Header{"Authorization": {"Bearer nope"}}, http.StatusUnauthorized},
		{"mcp: control token", http.Header{"Authorization": {"Bearer " + controlToken}}, http.StatusUnauthorized},
		{"mcp: foreign Host", http.Header{"Authorization": {"Bearer " + mcpTokenA}, "Host": {"evil.example"}}, http.StatusForbidden},
		{"mcp: foreign Origin", http.Header{"Authorization": {"Bearer " + mcpTokenA}, "Origin": {"http://evil.example"}}, http.StatusForbidden},
		{"mcp: null Origin", http.Header{"Authorization": {"Bearer " + mcpTokenA}, "Origin": {"null"}}, http.StatusForbidden},
		{"mcp: local Origin", http.Header{"Authorization": {"Bearer " + mcpTokenA}, "Origin": {"http://localhost:5173"}}, http.StatusOK},
		{"mcp: right token", http.Header{"Authorization": {"Bearer " + mcpTokenA}}, http.StatusOK},
	} {
		code, _, _ := b.mcpPostHost(initBody, tc.h)
		expect(tc.name, code, tc.want)
	}

	// An Mcp-Session-Id used by the holder of another token.
	sessA := b.mcpSession(t, http.Header{"Authorization": {"Bearer " + mcpTokenA}})
	list := []byte(`{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}`)
	code, _, _ := b.mcpPost(list, sessA)
	expect("mcp: session used by its own token", code, http.StatusOK)
	stolen := sessA.Clone()
	stolen.Set("Authorization", "Bearer "+mcpTokenB)
	code, _, body := b.mcpPost(list, stolen)
	switch {
	case code == http.StatusOK:
		s.bypass("mcp: session reused by another token: %d %s", code, body)
	case code >= 500:
		s.fail("mcp: session reused by another token: %d %s", code, body)
	default:
		s.checkAs(lossCrash, "mcp: session reused by another token", healthy())
	}
	stolen.Del("Authorization")
	code, _, _ = b.mcpPost(list, stolen)
	expect("mcp: session reused without a token", code, http.StatusUnauthorized)

	// Device endpoint: Origin and Host.
	c, resp, _ := dialDevice(url, mac(12, 2), deviceToken, http.Header{"Origin": {"http://evil.example"}})
	if c != nil {
		_ = c.Close()
	}
	expect("device ws: foreign Origin", statusOf(resp), http.StatusForbidden)
	// Boards send Host without the port, and reach the bridge by any
	// address of the LAN: the device endpoint does not check Host.
	c, resp, err := dialDevice(url, mac(12, 3), deviceToken, http.Header{"Host": {"192.168.1.10"}})
	if err != nil {
		s.fail("device ws: a board's Host without port: %v %d", err, statusOf(resp))
	} else {
		_ = c.Close()
		s.ok()
	}

	// Sockets that never send their hello are closed with a reason.
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, _, err := dialDevice(url, mac(13, i), deviceToken, nil)
			if err != nil {
				s.fail("silent socket %d: %v", i, err)
				return
			}
			defer c.Close()
			switch kind, reason := outcome(c); {
			case kind == "closed" && strings.Contains(reason, "no hello"):
				s.ok()
			case kind == "hang":
				s.hang("silent socket %d: held past the hello timeout: %s", i, reason)
			default:
				s.fail("silent socket %d: %s %q", i, kind, reason)
			}
		}()
	}
	wg.Wait()
	// ... and are capped: past websocket.max_pending_hellos, 503.
	var held []*websocket.Conn
	for i := range 10 {
		c, _, err := dialDevice(url, mac(14, i), deviceToken, nil)
		require.NoError(t, err)
		held = append(held, c)
	}
	c, resp, _ = dialDevice(url, mac(14, 10), deviceToken, nil)
	if c != nil {
		_ = c.Close()
	}
	expect("device ws: past max_pending_hellos", statusOf(resp), http.StatusServiceUnavailable)
	for _, c := range held {
		_ = c.Close()
	}
	if assertEventually(func() bool {
		c, _, err := dialDevice(url, mac(14, 11), deviceToken, nil)
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	}) {
		s.ok()
	} else {
		s.hang("device ws: room did not come back after the held sockets closed")
	}

	// MQTT on the embedded broker: credentials.
	mq := "tcp://" + b.App.MQTTAddr().String()
	for _, tc := range []struct{ name, user, pass string }{{"mqtt: no credentials", "", ""},
		{"mqtt: wrong password", mqttUser, "nope"}, {"mqtt: unknown user", "someone", mqttPassword},
		{"mqtt: password of another listener", mqttUser, deviceToken}} {
		sb, err := simulator.NewBoard(simulator.Config{MAC: mac(15, 1), Profile: profile(t, "breadboard")})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		conn, err := sb.ConnectMQTT(ctx, simulator.MQTTConfig{Endpoint: mq, Username: tc.user, Password: tc.pass})
		cancel()
		if err == nil {
			_ = conn.Close()
			s.bypass("%s: admitted", tc.name)
			continue
		}
		if !errors.Is(err, simulator.ErrMQTTRefused) {
			s.fail("%s: %v, want a refusal", tc.name, err)
			continue
		}
		s.checkAs(lossCrash, tc.name, healthy())
	}
	// One board publishing as, and reading, another.
	connect := func(m string) (*simulator.Board, *simulator.MQTTConn) {
		sb, err := simulator.NewBoard(simulator.Config{MAC: m, Profile: profile(t, "breadboard")})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		conn, err := sb.ConnectMQTT(ctx, simulator.MQTTConfig{Endpoint: mq, Username: mqttUser, Password: mqttPassword})
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		b.waitReady(m)
		return sb, conn
	}
	victim, _ := connect(mac(15, 2))
	attacker, ac := connect(mac(15, 3))
	vkey := mqtt.TopicKey(victim.MAC())
	denied := b.App.MQTTBroker().Stats().DeniedPublish
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	fake := []byte(`{"session_id":"","type":"mcp","payload":{"jsonrpc":"2.0","id":1,"result":{}}}`)
	for _, topic := range []string{"devices/up/" + vkey, "devices/p2p/" + vkey} {
		require.NoError(t, ac.PublishRaw(ctx, topic, fake))
	}
	if assertEventually(func() bool { return b.App.MQTTBroker().Stats().DeniedPublish-denied == 2 }) {
		s.ok()
		s.ok()
	} else {
		s.bypass("mqtt: publishes as another board were not denied")
		s.bypass("mqtt: publishes to another board's downlink were not denied")
	}
	for _, filter := range []string{"devices/p2p/" + vkey, "devices/up/" + vkey, "devices/#", "#", "+/+/+", "device-server"} {
		granted, err := ac.SubscribeRaw(ctx, filter)
		switch {
		case err != nil:
			s.fail("mqtt: subscribe %s: %v", filter, err)
		case granted:
			s.bypass("mqtt: subscription to %s granted", filter)
		default:
			s.ok()
		}
	}
	before := attacker.Stats().TextReceived
	code, body = call(victim.MAC(), "self.screen.set_theme", `{"theme":"`+argCanary+`"}`)
	switch overheard := attacker.Stats().TextReceived - before; {
	case overheard != 0:
		s.bypass("mqtt: the attacker received %d messages of the victim's call", overheard)
	case code != http.StatusOK:
		s.lose(answerLoss(code, body), "mqtt: the victim's call: %d %s", code, body)
	default:
		s.ok()
	}

	// Tool arguments through every caller, good and bad.
	code, _ = call(ref, "self.screen.set_theme", `{"theme":"`+argCanary+`"}`)
	expect("api call with a canary argument", code, http.StatusOK)
	code, _ = call(ref, "self.audio_speaker.set_volume", `{"volume":"`+argCanary+`"}`)
	expect("api call with a bad canary argument", code, http.StatusUnprocessableEntity)
	sessA = b.mcpSession(t, http.Header{"Authorization": {"Bearer " + mcpTokenA}})
	prefix := "dev_" + strings.ReplaceAll(ref[9:], ":", "")
	for _, args := range []string{`{"theme":"` + argCanary + `"}`, `{"theme":5,"x":"` + argCanary + `"}`} {
		code, _, body := b.mcpPost([]byte(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"`+prefix+
			`_screen_set_theme","arguments":`+args+`}}`), sessA)
		if code != http.StatusOK {
			s.fail("mcp call %s: %d %s", args, code, body)
		} else {
			s.ok()
		}
	}

	// Every log line, debug included, is free of secrets; lines at info
	// and above are free of tool arguments.
	secrets := []string{deviceToken, controlToken, mcpTokenA, mcpTokenB, mqttPassword}
	leaks := 0
	entries := logs.All()
	for _, e := range entries {
		line := renderEntry(e)
		for _, sec := range secrets {
			if strings.Contains(line, sec) {
				leaks++
				s.bypass("secret in a %s log line: %s", e.Level, line)
			}
		}
		if e.Level >= zapcore.InfoLevel && strings.Contains(line, argCanary) {
			leaks++
			s.bypass("tool argument in a %s log line: %s", e.Level, line)
		}
	}
	if leaks == 0 {
		s.ok()
	}
	t.Logf("read %d log lines for secrets and arguments", len(entries))
}

func statusOf(resp *http.Response) int {
	if resp == nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// renderEntry renders a log entry with all its fields.
func renderEntry(e observer.LoggedEntry) string {
	var sb strings.Builder
	sb.WriteString(e.LoggerName + " " + e.Message)
	for k, v := range e.ContextMap() {
		fmt.Fprintf(&sb, " %s=%v", k, v)
	}
	return sb.String()
}

// mcpPostHost is mcpPost honouring a Host header.
func (b *bridge) mcpPostHost(body []byte, h http.Header) (int, http.Header, []byte) {
	if host := h.Get("Host"); host != "" {
		req, _ := http.NewRequest(http.MethodPost, b.Base+"/mcp", strings.NewReader(string(body)))
		req.Host = host
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		for k, v := range h {
			req.Header[k] = v
		}
		resp, err := b.HTTP.Do(req)
		if err != nil {
			return 0, nil, []byte(err.Error())
		}
		return resp.StatusCode, resp.Header, readAll(resp)
	}
	return b.mcpPost(body, h)
}
