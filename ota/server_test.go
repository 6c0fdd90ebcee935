package ota

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

type fixture struct {
	srv     *Server
	url     string // OTA URL
	control string // base URL of the control routes
	logs    *observer.ObservedLogs
	net     Network
}

func embedded() Network {
	return Network{DevicePort: "8000", WebSocketPath: "/xiaozhi/v1/", MQTT: true, MQTTEmbedded: true, MQTTPort: "18830",
		Uplink: "devices/up/{mac}", Downlink: "devices/p2p/{mac}"}
}

func newFixture(t *testing.T, cfg Config, n Network) *fixture {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	f := &fixture{logs: logs, net: n}
	srv, err := New(cfg, func() Network { return f.net }, zap.New(core))
	require.NoError(t, err)
	f.srv = srv
	// Registered first, so it runs after the listeners have closed.
	t.Cleanup(func() { assert.NoError(t, srv.Close()) })
	dev, ctl := http.NewServeMux(), http.NewServeMux()
	srv.Register(dev)
	srv.RegisterControl(ctl)
	d, c := httptest.NewServer(dev), httptest.NewServer(ctl)
	t.Cleanup(func() { d.Close(); c.Close() })
	f.url, f.control = d.URL+srv.Path(), c.URL
	return f
}

// clientID is the Client-Id of boardHeaders.
const clientID = "1f0a0b0c-0000-4000-8000-000000000001"

// wsOK and mqttOK are the transports' checks, for a board presenting
// boardHeaders' Client-Id.
func (f *fixture) wsOK(id, token string) bool {
	ok, _ := f.srv.CheckWebSocketToken(id, clientID, token)
	return ok
}

func (f *fixture) mqttOK(id, user, pass string) bool {
	ok, _ := f.srv.CheckMQTT(id, clientID, user, pass)
	return ok
}

func (f *fixture) post(t *testing.T, path string, h http.Header, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header = h.Clone()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (f *fixture) boot(t *testing.T, h http.Header) (int, map[string]json.RawMessage, string) {
	t.Helper()
	code, body := f.post(t, f.url, h, systemInfoBody)
	var m map[string]json.RawMessage
	if code == http.StatusOK {
		require.NoError(t, json.Unmarshal([]byte(body), &m), body)
		require.NoError(t, CheckAnswer([]byte(body), "2.4.2"), "every answer passes the crash rules")
	}
	return code, m, body
}

func TestAnswerMQTTWhenEmbeddedBrokerRuns(t *testing.T) {
	f := newFixture(t, Config{Secret: "0123456789abcdef0123"}, embedded())
	code, m, _ := f.boot(t, boardHeaders())
	require.Equal(t, http.StatusOK, code)
	assert.NotContains(t, m, "websocket", "an answer with mqtt never carries websocket")
	var mq MQTT
	require.NoError(t, json.Unmarshal(m["mqtt"], &mq))
	assert.Equal(t, "127.0.0.1:18830", mq.Endpoint, "host from the request, port from the broker")
	assert.Equal(t, "GID_devicebridge@@@aa_bb_cc_dd_ee_ff@@@1f0a0b0c-0000-4000-8000-000000000001", mq.ClientID)
	assert.Equal(t, "devices/up/aa_bb_cc_dd_ee_ff", mq.PublishTopic)
	assert.Equal(t, "devices/p2p/aa_bb_cc_dd_ee_ff", mq.SubscribeTopic)
	assert.Equal(t, 240, mq.KeepAlive)
	assert.True(t, f.mqttOK("aa:bb:cc:dd:ee:ff", mq.Username, mq.Password))
	assert.False(t, f.mqttOK("aa:bb:cc:dd:ee:01", mq.Username, mq.Password), "another board cannot use them")
	assert.JSONEq(t, `{"version":"2.4.2","url":""}`, string(m["firmware"]))
	var st ServerTime
	require.NoError(t, json.Unmarshal(m["server_time"], &st))
	assert.Greater(t, st.Timestamp, int64(1_700_000_000_000), "milliseconds")
	rec, ok := f.srv.Store().Get("aa:bb:cc:dd:ee:ff")
	require.True(t, ok)
	assert.Equal(t, "mqtt", rec.Transport)
	assert.Equal(t, "bread-compact-wifi", rec.Board)
}

func TestAnswerWebSocket(t *testing.T) {
	n := embedded()
	n.MQTT, n.MQTTEmbedded = false, false
	f := newFixture(t, Config{Secret: "0123456789abcdef0123"}, n)
	code, m, _ := f.boot(t, boardHeaders())
	require.Equal(t, http.StatusOK, code)
	assert.NotContains(t, m, "mqtt", "a WebSocket answer never carries mqtt: the board would take it")
	var ws WebSocket
	require.NoError(t, json.Unmarshal(m["websocket"], &ws))
	assert.Equal(t, "ws://127.0.0.1:8000/xiaozhi/v1/", ws.URL)
	assert.Equal(t, 1, ws.Version)
	assert.True(t, f.wsOK("aa:bb:cc:dd:ee:ff", ws.Token))
	assert.False(t, f.wsOK("aa:bb:cc:dd:ee:01", ws.Token))

	// TLS listener: wss.
	f.net.DeviceTLS = true
	_, m, _ = f.boot(t, boardHeaders())
	require.NoError(t, json.Unmarshal(m["websocket"], &ws))
	assert.Equal(t, "wss://127.0.0.1:8000/xiaozhi/v1/", ws.URL)
}

func TestTransportChoice(t *testing.T) {
	f := newFixture(t, Config{Secret: "0123456789abcdef0123", Transport: "websocket",
		Transports:   map[string]string{"AA-BB-CC-DD-EE-01": "mqtt"},
		WebSocketURL: "wss://bridge.example.com/xiaozhi/v1/", MQTTEndpoint: "mqtt.example.com:1884"}, embedded())
	_, m, _ := f.boot(t, boardHeaders())
	assert.Contains(t, m, "websocket", "configured transport wins over the embedded broker")
	assert.Contains(t, string(m["websocket"]), "wss://bridge.example.com/xiaozhi/v1/")
	h := boardHeaders()
	h.Set("Device-Id", "aa:bb:cc:dd:ee:01")
	_, m, _ = f.boot(t, h)
	assert.Contains(t, m, "mqtt", "per-device override")
	assert.Contains(t, string(m["mqtt"]), `"endpoint":"mqtt.example.com:1884"`)

	// MQTT asked for but no broker running: WebSocket rather than a
	// broker that is not there.
	f.net.MQTT, f.net.MQTTEmbedded = false, false
	_, m, _ = f.boot(t, h)
	assert.Contains(t, m, "websocket")
}

func TestMalformedStoresNothing(t *testing.T) {
	f := newFixture(t, Config{Secret: "0123456789abcdef0123"}, embedded())
	for _, body := range []string{"", "{", "[]", `{"application":"x"}`} {
		code, text := f.post(t, f.url, boardHeaders(), body)
		assert.Equal(t, http.StatusBadRequest, code, body)
		assert.Contains(t, text, "bad OTA request", body)
	}
	assert.Empty(t, f.srv.Store().List(time.Now()))
}

func TestAllowlist(t *testing.T) {
	f := newFixture(t, Config{Secret: "0123456789abcdef0123", Allow: []string{"aa:bb:cc:dd:ee:ff"}}, embedded())
	assert.True(t, f.srv.RequireCredentials())
	code, _, _ := f.boot(t, boardHeaders())
	assert.Equal(t, http.StatusOK, code)
	h := boardHeaders()
	h.Set("Device-Id", "aa:bb:cc:dd:ee:02")
	code, _, body := f.boot(t, h)
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "allowlist")
	assert.False(t, f.srv.Admitted("aa:bb:cc:dd:ee:02"))
	tok := f.srv.Credentials().WebSocketToken("aa:bb:cc:dd:ee:02")
	assert.False(t, f.wsOK("aa:bb:cc:dd:ee:02", tok), "derived credentials alone do not admit a board")
}

func TestApprovalModeAndRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{DataDir: dir, Approval: true}
	f := newFixture(t, cfg, embedded())
	code, m, _ := f.boot(t, boardHeaders())
	require.Equal(t, http.StatusOK, code)
	assert.NotContains(t, m, "mqtt", "no credentials before approval")
	assert.NotContains(t, m, "websocket")
	var act Activation
	require.NoError(t, json.Unmarshal(m["activation"], &act))
	assert.Regexp(t, `^\d{6}$`, act.Code)
	assert.NotEmpty(t, act.Challenge, "without a challenge the board never polls")

	activate := f.url + "activate"
	code, _ = f.post(t, activate, boardHeaders(), `{}`)
	assert.Equal(t, http.StatusAccepted, code)
	// The same code on every boot until approved.
	_, m2, _ := f.boot(t, boardHeaders())
	assert.JSONEq(t, string(m["activation"]), string(m2["activation"]))

	// Approval by code, on the control routes.
	code, body := f.post(t, f.control+"/api/ota/devices/"+act.Code+"/approve", nil, "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"approved": true`)
	code, _ = f.post(t, activate, boardHeaders(), `{}`)
	assert.Equal(t, http.StatusOK, code)
	_, m, _ = f.boot(t, boardHeaders())
	assert.NotContains(t, m, "activation")
	require.Contains(t, m, "mqtt")
	var mq MQTT
	require.NoError(t, json.Unmarshal(m["mqtt"], &mq))

	code, body = f.post(t, f.control+"/api/ota/devices/aa:bb:cc:dd:ee:09/approve", nil, "")
	assert.Equal(t, http.StatusNotFound, code)
	assert.Contains(t, body, "unknown_device")

	// A restart: a new server over the same directory keeps the approval
	// and the secret, so the credentials issued before still work.
	info, err := os.Stat(filepath.Join(dir, SecretFile))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	require.NoError(t, f.srv.Close())
	f2 := newFixture(t, cfg, embedded())
	assert.True(t, f2.srv.Admitted("aa:bb:cc:dd:ee:ff"))
	assert.True(t, f2.mqttOK("aa:bb:cc:dd:ee:ff", mq.Username, mq.Password))
	_, m, _ = f2.boot(t, boardHeaders())
	assert.NotContains(t, m, "activation")

	// A pending board stays pending across the restart, with its code.
	h := boardHeaders()
	h.Set("Device-Id", "aa:bb:cc:dd:ee:03")
	_, m, _ = f2.boot(t, h)
	require.NoError(t, f2.srv.Close())
	f3 := newFixture(t, cfg, embedded())
	_, m3, _ := f3.boot(t, h)
	assert.JSONEq(t, string(m["activation"]), string(m3["activation"]))
}

func TestStatusPage(t *testing.T) {
	f := newFixture(t, Config{Secret: "0123456789abcdef0123"}, embedded())
	resp, err := http.Get(f.url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, string(b), "devicebridge OTA endpoint: OK")
	assert.Contains(t, string(b), "transport for new boards: mqtt")
	assert.Contains(t, string(b), "mqtt endpoint: 127.0.0.1:18830")
}

func TestSecretsNeverLogged(t *testing.T) {
	secret := "0123456789abcdef-very-secret"
	f := newFixture(t, Config{Secret: secret, Approval: true}, embedded())
	_, m, _ := f.boot(t, boardHeaders())
	var act Activation
	require.NoError(t, json.Unmarshal(m["activation"], &act))
	f.post(t, f.control+"/api/ota/devices/aa:bb:cc:dd:ee:ff/approve", nil, "")
	_, m, _ = f.boot(t, boardHeaders())
	var mq MQTT
	require.NoError(t, json.Unmarshal(m["mqtt"], &mq))
	f.net.MQTT, f.net.MQTTEmbedded = false, false
	_, m, _ = f.boot(t, boardHeaders())
	var ws WebSocket
	require.NoError(t, json.Unmarshal(m["websocket"], &ws))

	require.NotZero(t, f.logs.Len())
	for _, e := range f.logs.All() {
		line := e.Message
		for k, v := range e.ContextMap() {
			line += " " + k + "=" + strings.TrimSpace(toString(v))
		}
		for _, s := range []string{secret, mq.Password, ws.Token, act.Code, act.Challenge} {
			assert.NotContains(t, line, s)
		}
	}
}

func toString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestPlacement: with balance least_loaded the answer points the board at
// the node the Placement picks, for its transport; without balance, or
// when the pick offers nothing for the transport, at this node.
func TestPlacement(t *testing.T) {
	n := embedded()
	n.MQTT, n.MQTTEmbedded = false, false
	f := newFixture(t, Config{Secret: "0123456789abcdef0123", Balance: BalanceLeastLoaded}, n)
	var asked []string
	target := Target{Node: "b", WebSocketURL: "ws://10.0.0.2:8000/xiaozhi/v1/"}
	f.srv.SetPlacement(func(transport string) (Target, bool) { asked = append(asked, transport); return target, true })
	_, m, _ := f.boot(t, boardHeaders())
	var ws WebSocket
	require.NoError(t, json.Unmarshal(m["websocket"], &ws))
	assert.Equal(t, "ws://10.0.0.2:8000/xiaozhi/v1/", ws.URL)
	assert.Equal(t, []string{TransportWebSocket}, asked)
	assert.True(t, f.wsOK("aa:bb:cc:dd:ee:ff", ws.Token), "the token is the fleet secret's, not the node's")

	// The pick offers no MQTT endpoint: an MQTT board stays here.
	f.net = embedded()
	_, m, _ = f.boot(t, boardHeaders())
	assert.Contains(t, string(m["mqtt"]), `"endpoint":"127.0.0.1:18830"`)
	target.MQTTEndpoint = "10.0.0.2:1883"
	_, m, _ = f.boot(t, boardHeaders())
	assert.Contains(t, string(m["mqtt"]), `"endpoint":"10.0.0.2:1883"`)

	// Without balance the Placement is never asked.
	g := newFixture(t, Config{Secret: "0123456789abcdef0123"}, n)
	g.srv.SetPlacement(func(string) (Target, bool) { t.Fatal("asked"); return Target{}, false })
	_, m, _ = g.boot(t, boardHeaders())
	assert.Contains(t, string(m["websocket"]), "ws://127.0.0.1:8000/xiaozhi/v1/")

	assert.ErrorContains(t, Config{Balance: "random"}.Validate(), "ota.balance")
}

func TestAdvertised(t *testing.T) {
	n := embedded()
	f := newFixture(t, Config{Secret: "0123456789abcdef0123"}, n)
	ws, mq := f.srv.Advertised()
	assert.Empty(t, ws, "a listener on every interface has no address to offer")
	assert.Empty(t, mq)
	f.net.DeviceHost, f.net.MQTTBindHost = "192.168.1.5", "192.168.1.5"
	ws, mq = f.srv.Advertised()
	assert.Equal(t, "ws://192.168.1.5:8000/xiaozhi/v1/", ws)
	assert.Equal(t, "192.168.1.5:18830", mq)
	f.net.MQTTEmbedded = false
	_, mq = f.srv.Advertised()
	assert.Empty(t, mq, "an external broker is not this node's to offer")
	g := newFixture(t, Config{Secret: "0123456789abcdef0123", WebSocketURL: "wss://b.example.com/xiaozhi/v1/", MQTTEndpoint: "b.example.com:8883"}, embedded())
	ws, mq = g.srv.Advertised()
	assert.Equal(t, "wss://b.example.com/xiaozhi/v1/", ws)
	assert.Equal(t, "b.example.com:8883", mq)
}
