package app

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/ota"
	"github.com/devicebridge/devicebridge/simulator"
	"github.com/devicebridge/devicebridge/voice"
)

// otaBridge is a bridge whose every log line, debug included, is kept so
// that tests can check no secret ever reaches a log.
type otaBridge struct {
	*App
	logs *observer.ObservedLogs
}

func startOTABridge(t *testing.T, mutate func(*Config)) otaBridge {
	t.Helper()
	cfg := Default()
	cfg.DeviceListen = "127.0.0.1:0"
	cfg.ControlListen = "127.0.0.1:0"
	cfg.MQTT.Listen = "127.0.0.1:0"
	cfg.MQTT.UDP.Listen = "127.0.0.1:0"
	cfg.OTA.DataDir = t.TempDir()
	if mutate != nil {
		mutate(&cfg)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	logger := zap.New(zapcore.NewTee(core, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)).Core()))
	return otaBridge{App: runApp(t, cfg, logger), logs: logs}
}

// assertNoSecrets checks every log line, message and fields, for secrets.
func (b otaBridge) assertNoSecrets(t *testing.T, secrets ...string) {
	t.Helper()
	require.NotZero(t, b.logs.Len())
	for _, e := range b.logs.All() {
		fields, _ := json.Marshal(e.ContextMap())
		line := e.Message + " " + string(fields)
		for _, s := range secrets {
			require.NotEmpty(t, s)
			assert.NotContains(t, line, s, "secret in a log line")
		}
	}
}

func bootOTA(t *testing.T, b *simulator.Board, oc simulator.OTAConfig) (*simulator.OTAResult, *simulator.MQTTConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), mqttWait)
	defer cancel()
	res, conn, err := b.BootOTA(ctx, oc)
	require.NoError(t, err)
	t.Cleanup(func() {
		if conn != nil {
			_ = conn.Close()
		}
		_ = b.Close()
	})
	return res, conn
}

func TestOTABootIntoMQTT(t *testing.T) {
	leakCheck(t)
	a := startOTABridge(t, func(c *Config) { c.OTA.RequireCredentials = true })
	b := newBoard(t, "02:00:09:00:00:01", "breadboard")
	res, _ := bootOTA(t, b, simulator.OTAConfig{URL: a.OTAURL()})
	require.Equal(t, "mqtt", res.Transport, "the embedded broker runs: boards get MQTT")
	_, port, _ := net.SplitHostPort(a.MQTTAddr().String())
	assert.Equal(t, "127.0.0.1:"+port, res.MQTT.Endpoint, "the answer advertises the broker's real port")
	assert.Equal(t, "devices/up/02_00_09_00_00_01", res.MQTT.PublishTopic)
	d := apiOf(t, a.App).waitReady("02:00:09:00:00:01")
	assert.Equal(t, "mqtt", d.Transport)
	a.assertNoSecrets(t, res.MQTT.Password)
}

func TestOTABootIntoWebSocket(t *testing.T) {
	leakCheck(t)
	a := startOTABridge(t, func(c *Config) {
		c.OTA.RequireCredentials = true
		c.MQTT.Listen = "" // no broker: WebSocket by default
	})
	b := newBoard(t, "02:00:09:00:00:02", "breadboard")
	res, _ := bootOTA(t, b, simulator.OTAConfig{URL: a.OTAURL()})
	require.Equal(t, "websocket", res.Transport)
	assert.Equal(t, a.DeviceURL(), res.WebSocketURL)
	d := apiOf(t, a.App).waitReady("02:00:09:00:00:02")
	assert.Equal(t, "websocket", d.Transport)
	a.assertNoSecrets(t, res.WebSocketToken)
}

func TestOTATransportFlagAndOverride(t *testing.T) {
	leakCheck(t)
	a := startOTABridge(t, func(c *Config) {
		c.OTA.Transport = "websocket"
		c.OTA.Transports = map[string]string{"02:00:09:00:00:04": "mqtt"}
	})
	ws := newBoard(t, "02:00:09:00:00:03", "breadboard")
	res, _ := bootOTA(t, ws, simulator.OTAConfig{URL: a.OTAURL()})
	assert.Equal(t, "websocket", res.Transport)
	mq := newBoard(t, "02:00:09:00:00:04", "breadboard")
	res, _ = bootOTA(t, mq, simulator.OTAConfig{URL: a.OTAURL()})
	assert.Equal(t, "mqtt", res.Transport)
	api := apiOf(t, a.App)
	assert.Equal(t, "websocket", api.waitReady("02:00:09:00:00:03").Transport)
	assert.Equal(t, "mqtt", api.waitReady("02:00:09:00:00:04").Transport)
}

// TestOTACredentialsRefused: with credentials required, a board without
// them, with wrong ones or with another board's is refused on both
// transports.
func TestOTACredentialsRefused(t *testing.T) {
	leakCheck(t)
	a := startOTABridge(t, func(c *Config) { c.OTA.RequireCredentials = true; c.OTA.Transport = "websocket" })
	owner := newBoard(t, "02:00:09:00:00:05", "breadboard")
	res, _ := bootOTA(t, owner, simulator.OTAConfig{URL: a.OTAURL()})
	apiOf(t, a.App).waitReady("02:00:09:00:00:05")
	issued := a.OTA().Credentials().MQTT("02:00:09:00:00:05", owner.ClientID())

	ctx, cancel := context.WithTimeout(context.Background(), mqttWait)
	defer cancel()
	for name, token := range map[string]string{"none": "", "wrong": "nope", "another board's": res.WebSocketToken} {
		thief, err := simulator.NewBoard(simulator.Config{MAC: "02:00:09:00:00:06", Profile: loadProfile(t, "breadboard"), Token: token})
		require.NoError(t, err)
		err = thief.ConnectWebSocket(ctx, a.DeviceURL())
		var he *simulator.HandshakeError
		require.ErrorAs(t, err, &he, name)
		assert.Equal(t, http.StatusUnauthorized, he.StatusCode, name)
	}

	broker := "tcp://" + a.MQTTAddr().String()
	for name, mc := range map[string]simulator.MQTTConfig{
		"anonymous":       {Endpoint: broker},
		"wrong password":  {Endpoint: broker, Username: issued.Username, Password: "nope"},
		"another board's": {Endpoint: broker, Username: issued.Username, Password: issued.Password},
	} {
		thief := newBoard(t, "02:00:09:00:00:06", "breadboard")
		_, err := thief.ConnectMQTT(ctx, mc)
		require.ErrorIs(t, err, simulator.ErrMQTTRefused, name)
	}
	// The owner's own MQTT login works.
	mc := simulator.MQTTConfig{Endpoint: broker, ClientID: issued.ClientID, Username: issued.Username, Password: issued.Password}
	connectMQTT(t, a.App, newBoard(t, "02:00:09:00:00:05", "breadboard"), mc)
	a.assertNoSecrets(t, res.WebSocketToken, issued.Password)
}

// TestOTAApprovalAndRestart: an unknown board shows a code, polls until an
// operator approves it on the control API, then connects; after a bridge
// restart over the same data directory it is admitted at once.
func TestOTAApprovalAndRestart(t *testing.T) {
	leakCheck(t)
	dir := t.TempDir()
	mutate := func(c *Config) {
		c.OTA.Approval = true
		c.OTA.DataDir = dir
		c.Control.Tokens = []string{"ops"}
	}
	a := startOTABridge(t, mutate)
	b := newBoard(t, "02:00:09:00:00:07", "breadboard")
	oc := simulator.OTAConfig{URL: a.OTAURL(), ActivationPending: 20 * time.Millisecond, ActivationRetry: 20 * time.Millisecond}
	type boot struct {
		res  *simulator.OTAResult
		conn *simulator.MQTTConn
		err  error
	}
	done := make(chan boot, 1)
	ctx, cancel := context.WithTimeout(context.Background(), mqttWait)
	defer cancel()
	go func() {
		res, conn, err := b.BootOTA(ctx, oc)
		done <- boot{res, conn, err}
	}()

	control := "http://" + a.ControlAddr().String()
	var pending ota.DeviceView
	require.Eventually(t, func() bool {
		var list struct{ Devices []ota.DeviceView }
		if code := getWithToken(t, control+"/api/ota/devices", "ops", &list); code != http.StatusOK || len(list.Devices) != 1 {
			return false
		}
		pending = list.Devices[0]
		return pending.Pending
	}, mqttWait, 10*time.Millisecond)
	assert.Equal(t, "02:00:09:00:00:07", pending.DeviceID)
	assert.Regexp(t, `^\d{6}$`, pending.Code)
	assert.False(t, pending.Admitted)
	_, listed := apiOf(t, a.App).device("02:00:09:00:00:07")
	assert.False(t, listed, "not connected before approval")

	// The approval route takes the control tokens.
	assert.Equal(t, http.StatusUnauthorized, postWithToken(t, control+"/api/ota/devices/"+pending.Code+"/approve", ""))
	assert.Equal(t, http.StatusOK, postWithToken(t, control+"/api/ota/devices/"+pending.Code+"/approve", "ops"))

	var got boot
	select {
	case got = <-done:
	case <-ctx.Done():
		t.Fatal("board did not boot after approval")
	}
	require.NoError(t, got.err)
	assert.Equal(t, 1, got.res.Activations)
	assert.Equal(t, pending.Code, got.res.ActivationCode, "the code on the board's screen is the one the operator saw")
	require.Equal(t, "mqtt", got.res.Transport)
	require.NotNil(t, got.conn)
	// The control API needs the token now; waitReady goes through a plain
	// client, so check the Hub instead.
	require.Eventually(t, func() bool { return hubReady(a.App, "02:00:09:00:00:07") }, mqttWait, 10*time.Millisecond)
	a.assertNoSecrets(t, pending.Code, got.res.MQTT.Password)
	_ = got.conn.Close()
	_ = b.Close()
	ctxDown, cancelDown := context.WithTimeout(context.Background(), mqttWait)
	defer cancelDown()
	require.NoError(t, a.Shutdown(ctxDown))

	// Restart: the approval, the secret and the board's Client-Id binding
	// survive; the same board (the same UUID in its NVS) boots again.
	a2 := startOTABridge(t, mutate)
	b2, err := simulator.NewBoard(simulator.Config{MAC: "02:00:09:00:00:07", ClientID: b.ClientID(), Profile: loadProfile(t, "breadboard")})
	require.NoError(t, err)
	res, conn := bootOTA(t, b2, simulator.OTAConfig{URL: a2.OTAURL()})
	assert.Zero(t, res.Activations, "approved before the restart")
	assert.Equal(t, got.res.MQTT.Password, res.MQTT.Password, "same issued credentials")
	require.NotNil(t, conn)
	require.Eventually(t, func() bool { return hubReady(a2.App, "02:00:09:00:00:07") }, mqttWait, 10*time.Millisecond)
}

func hubReady(a *App, id string) bool {
	for _, d := range a.Hub.Devices() {
		if d.DeviceID == id {
			return d.State == device.StateReady
		}
	}
	return false
}

func getWithToken(t *testing.T, url, token string, into any) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	if into != nil {
		_ = json.NewDecoder(resp.Body).Decode(into)
	}
	return resp.StatusCode
}

func postWithToken(t *testing.T, url, token string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

// selfSigned writes a certificate for 127.0.0.1 and its key, and returns
// their paths and a pool that trusts it.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "devicebridge test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestTLSListeners: with certificates the device listener serves https
// (OTA) and wss, the control listener https; plain http is refused.
func TestTLSListeners(t *testing.T) {
	leakCheck(t)
	certFile, keyFile, pool := selfSigned(t)
	a := startOTABridge(t, func(c *Config) {
		c.MQTT.Listen = ""
		c.OTA.RequireCredentials = true
		c.TLS.Device = CertConfig{CertFile: certFile, KeyFile: keyFile}
		c.TLS.Control = CertConfig{CertFile: certFile, KeyFile: keyFile}
	})
	require.True(t, strings.HasPrefix(a.OTAURL(), "https://"))
	b, err := simulator.NewBoard(simulator.Config{MAC: "02:00:09:00:00:08", Profile: loadProfile(t, "breadboard"),
		TLS: &tls.Config{RootCAs: pool}})
	require.NoError(t, err)
	res, _ := bootOTA(t, b, simulator.OTAConfig{URL: a.OTAURL()})
	require.Equal(t, "websocket", res.Transport)
	assert.True(t, strings.HasPrefix(res.WebSocketURL, "wss://127.0.0.1:"), res.WebSocketURL)

	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer client.CloseIdleConnections()
	require.Eventually(t, func() bool {
		resp, err := client.Get("https://" + a.ControlAddr().String() + "/api/devices/02:00:09:00:00:08")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var d apiDevice
		_ = json.NewDecoder(resp.Body).Decode(&d)
		return d.State == "ready"
	}, mqttWait, 10*time.Millisecond)

	// Plain http on a TLS listener gets nowhere.
	resp, err := http.Get("http://" + a.ControlAddr().String() + "/healthz")
	if err == nil {
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		resp.Body.Close()
	}
}

// TestSimulatedBoardsWithRequiredCredentials: in-process boards have no
// static token to share, so they boot through OTA and use what it issues.
func TestSimulatedBoardsWithRequiredCredentials(t *testing.T) {
	leakCheck(t)
	a := startOTABridge(t, func(c *Config) {
		c.OTA.RequireCredentials = true
		c.MQTT.Listen = ""
		c.Simulate.Count = 1
	})
	d := apiOf(t, a.App).waitReady("02:00:00:00:00:01")
	assert.Equal(t, "websocket", d.Transport)
}

// postJSON POSTs body to url with a bearer token and returns the status
// and the answer.
func postJSON(t *testing.T, url, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// otaBody is a board's OTA request body, as the simulator builds it.
func otaBody(t *testing.T, mac string) string {
	t.Helper()
	return newBoard(t, mac, "breadboard").SystemInfoJSON()
}

// TestOTAFloodFromOneAddress: a flood of unauthenticated OTA POSTs from
// one address, each claiming a new MAC, is answered 429 once the address's
// burst is spent, so the pending list grows by at most that much. Before
// the fix all of them became pending boards.
func TestOTAFloodFromOneAddress(t *testing.T) {
	leakCheck(t)
	// A slow refill, so that no request of the flood is let through by
	// the clock, however slowly this machine sends them.
	const burst = 50
	a := startOTABridge(t, func(c *Config) {
		c.OTA.Approval, c.OTA.DataDir = true, ""
		c.OTA.RequestsPerSecond, c.OTA.RequestBurst = 0.01, burst
	})
	body := otaBody(t, "02:00:0b:00:00:01")
	const flood = 4 * burst
	counts := map[int]int{}
	for i := range flood {
		mac := fmt.Sprintf("02:00:0b:00:%02x:%02x", i>>8, i&0xff)
		req, err := http.NewRequest(http.MethodPost, a.OTAURL(), strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Device-Id", mac)
		req.Header.Set("Client-Id", fmt.Sprintf("1f0a0b0c-0000-4000-8000-%012d", i))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		counts[resp.StatusCode]++
		if resp.StatusCode == http.StatusTooManyRequests {
			assert.NotEmpty(t, resp.Header.Get("Retry-After"))
		}
	}
	assert.GreaterOrEqual(t, counts[http.StatusOK], burst)
	assert.LessOrEqual(t, counts[http.StatusOK], burst+1, "the flood is limited to the burst")
	assert.Equal(t, flood, counts[http.StatusOK]+counts[http.StatusTooManyRequests], counts)
	var list struct{ Devices []ota.DeviceView }
	require.Equal(t, http.StatusOK, getWithToken(t, "http://"+a.ControlAddr().String()+"/api/ota/devices", "", &list))
	assert.Len(t, list.Devices, counts[http.StatusOK], "only the answered boards wait")
}

// TestOTACredentialsBoundToClientID: with credentials required, they are
// bound to the Client-Id the board first registered with. A board with
// the same MAC and another Client-Id gets no credentials from OTA, cannot
// use the owner's over MQTT or WebSocket, and is shown to the operator
// and logged, until the operator resets the binding. Before the fix the
// OTA answer handed it the owner's credentials.
func TestOTACredentialsBoundToClientID(t *testing.T) {
	leakCheck(t)
	a := startOTABridge(t, func(c *Config) { c.OTA.RequireCredentials = true; c.Control.Tokens = []string{"ops"} })
	const mac, other = "02:00:09:00:00:11", "0badbadb-0000-4000-8000-000000000011"
	owner := newBoard(t, mac, "breadboard")
	res, _ := bootOTA(t, owner, simulator.OTAConfig{URL: a.OTAURL()})
	require.Equal(t, "mqtt", res.Transport)
	require.Eventually(t, func() bool { return hubReady(a.App, mac) }, mqttWait, 10*time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), mqttWait)
	defer cancel()
	impostor, err := simulator.NewBoard(simulator.Config{MAC: mac, ClientID: other, Profile: loadProfile(t, "breadboard")})
	require.NoError(t, err)
	t.Cleanup(func() { _ = impostor.Close() })
	_, err = impostor.CheckOTA(ctx, simulator.OTAConfig{URL: a.OTAURL()})
	require.ErrorIs(t, err, simulator.ErrOTAStatus, "no credentials for another Client-Id")
	assert.ErrorContains(t, err, "409")

	// Nor over the transports with the owner's credentials.
	broker := "tcp://" + a.MQTTAddr().String()
	_, err = impostor.ConnectMQTT(ctx, simulator.MQTTConfig{Endpoint: broker, ClientID: "GID_devicebridge@@@02_00_09_00_00_11@@@" + other,
		Username: res.MQTT.Username, Password: res.MQTT.Password})
	require.ErrorIs(t, err, simulator.ErrMQTTRefused)
	wsImpostor, err := simulator.NewBoard(simulator.Config{MAC: mac, ClientID: other, Profile: loadProfile(t, "breadboard"),
		Token: a.OTA().Credentials().WebSocketToken(mac)})
	require.NoError(t, err)
	err = wsImpostor.ConnectWebSocket(ctx, a.DeviceURL())
	var he *simulator.HandshakeError
	require.ErrorAs(t, err, &he)
	assert.Equal(t, http.StatusUnauthorized, he.StatusCode)
	assert.True(t, hubReady(a.App, mac), "the owner is undisturbed")

	control := "http://" + a.ControlAddr().String()
	var list struct {
		Devices []struct {
			DeviceID         string `json:"device_id"`
			ClientID         string `json:"client_id"`
			RejectedClientID string `json:"rejected_client_id"`
		}
	}
	require.Equal(t, http.StatusOK, getWithToken(t, control+"/api/ota/devices", "ops", &list))
	require.Len(t, list.Devices, 1)
	assert.Equal(t, owner.ClientID(), list.Devices[0].ClientID)
	assert.Equal(t, other, list.Devices[0].RejectedClientID, "shown to the operator")
	assert.NotZero(t, a.logs.FilterMessageSnippet("bound to another Client-Id").Len(), "and logged")

	// The operator decides the other Client-Id is the board's (its flash
	// was erased) and resets the binding to it.
	code, _ := postJSON(t, control+"/api/ota/devices/"+mac+"/reset", "", `{"client_id":"`+other+`"}`)
	assert.Equal(t, http.StatusUnauthorized, code, "behind the control API's authentication")
	code, body := postJSON(t, control+"/api/ota/devices/"+mac+"/reset", "ops", `{"client_id":"`+other+`"}`)
	require.Equal(t, http.StatusOK, code, body)
	res2, err := impostor.CheckOTA(ctx, simulator.OTAConfig{URL: a.OTAURL()})
	require.NoError(t, err)
	assert.Equal(t, res.MQTT.Password, res2.MQTT.Password, "credentials are the MAC's; the binding decides who gets them")
	_, err = owner.CheckOTA(ctx, simulator.OTAConfig{URL: a.OTAURL()})
	assert.ErrorIs(t, err, simulator.ErrOTAStatus, "now the old Client-Id is the other one")
}

// TestOTAOpenModeRefusesAnotherBoardsCredentials: with admission off (the
// default) a board without credentials is admitted as before, but a board
// presenting credentials the bridge issued to another board is refused,
// over MQTT and WebSocket. Before the fix it was admitted.
func TestOTAOpenModeRefusesAnotherBoardsCredentials(t *testing.T) {
	leakCheck(t)
	a := startOTABridge(t, nil)
	const macA, macB = "02:00:09:00:00:21", "02:00:09:00:00:22"
	res, _ := bootOTA(t, newBoard(t, macA, "breadboard"), simulator.OTAConfig{URL: a.OTAURL()})
	require.Equal(t, "mqtt", res.Transport)

	ctx, cancel := context.WithTimeout(context.Background(), mqttWait)
	defer cancel()
	broker := "tcp://" + a.MQTTAddr().String()
	b := newBoard(t, macB, "breadboard")
	t.Cleanup(func() { _ = b.Close() })
	_, err := b.ConnectMQTT(ctx, simulator.MQTTConfig{Endpoint: broker, Username: res.MQTT.Username, Password: res.MQTT.Password})
	require.ErrorIs(t, err, simulator.ErrMQTTRefused, "A's login, presented by B")

	wsB, err := simulator.NewBoard(simulator.Config{MAC: macB, Profile: loadProfile(t, "breadboard"), Token: a.OTA().Credentials().WebSocketToken(macA)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = wsB.Close() })
	err = wsB.ConnectWebSocket(ctx, a.DeviceURL())
	var he *simulator.HandshakeError
	require.ErrorAs(t, err, &he, "A's token, presented by B")
	assert.Equal(t, http.StatusUnauthorized, he.StatusCode)
	assert.NotZero(t, a.logs.FilterMessageSnippet("issued to another board").Len())

	// Without credentials, B is admitted: open mode is still open.
	connectMQTT(t, a.App, newBoard(t, macB, "breadboard"), simulator.MQTTConfig{})
	apiOf(t, a.App).waitReady(macB)
}

// TestOTABoundsConfig: the OTA bounds have their defaults spelled out in
// the shipped file, take flags, and a bad value stops the start with the
// key and what is allowed.
func TestOTABoundsConfig(t *testing.T) {
	shipped, err := ParseArgs("bridge", []string{"--config", "../configs/bridge.yaml"})
	require.NoError(t, err)
	bounds := func(c ota.Config) []any {
		return []any{c.MaxPending, c.PendingTTL, c.MaxDevices, c.RequestsPerSecond, c.RequestBurst, c.MaxAddresses,
			c.CodeDigits, c.CodeGuessesPerHour, c.CodeGuessesPerCallerPerHour}
	}
	assert.Equal(t, bounds(ota.Config{}.WithDefaults()), bounds(shipped.OTA.Config), "the shipped file spells out the defaults")
	assert.Equal(t, bounds(ota.Config{}.WithDefaults()), bounds(Default().OTA.Config))

	cfg, err := ParseArgs("bridge", []string{"--ota-max-pending", "50", "--ota-pending-ttl", "10m", "--ota-rate", "2.5", "--ota-burst", "500"})
	require.NoError(t, err)
	assert.Equal(t, 50, cfg.OTA.MaxPending)
	assert.Equal(t, 10*time.Minute, cfg.OTA.PendingTTL)
	assert.InDelta(t, 2.5, cfg.OTA.RequestsPerSecond, 0)
	assert.Equal(t, 500, cfg.OTA.RequestBurst)

	path := filepath.Join(t.TempDir(), "bridge.yaml")
	for yaml, want := range map[string]string{
		"ota:\n  max_pending: -1\n":         "ota.max_pending -1: use a whole number from 1 to 1048576; default 1000",
		"ota:\n  pending_ttl: 5s\n":         "ota.pending_ttl 5s: use a duration from 1m to 720h; default 1h",
		"ota:\n  code_digits: 12\n":         "ota.code_digits 12: use a whole number from 6 to 10; default 6",
		"ota:\n  max_pending: 100000\n":     "ota.code_digits 6 with ota.max_pending 100000",
		"ota:\n  requests_per_second: -1\n": "ota.requests_per_second -1",
	} {
		require.NoError(t, os.WriteFile(path, []byte(yaml), 0o600))
		_, err := ParseArgs("bridge", []string{"--config", path})
		assert.ErrorContains(t, err, want, yaml)
	}
}

// TestOTAVoiceUpstreamPassThrough: with voice.upstream_ota set, a board
// booting through the bridge shows the voice upstream's activation code,
// its activation polls reach the upstream (202, then 200 once bound), and
// it then connects to the bridge, never to the upstream; the calls are
// counted in /metrics.
func TestOTAVoiceUpstreamPassThrough(t *testing.T) {
	leakCheck(t)
	const mac, code = "02:00:09:00:00:21", "482913"
	var mu sync.Mutex
	var polls int
	var paths []string
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		defer mu.Unlock()
		paths = append(paths, r.URL.Path)
		assert.Equal(t, mac, r.Header.Get("Device-Id"))
		if r.URL.Path == "/xiaozhi/ota/activate" {
			if polls++; polls < 2 {
				w.WriteHeader(http.StatusAccepted)
				return
			}
			_, _ = io.WriteString(w, "success")
			return
		}
		answer := `{"server_time":{"timestamp":1754611200000,"timezone_offset":480},"firmware":{"version":"v9","url":"http://voice.example/fw.bin"},` +
			`"websocket":{"url":"ws://voice.example:8000/xiaozhi/v1/","token":"voice-token"}`
		if polls < 2 {
			answer += `,"activation":{"code":"` + code + `","message":"bind me","challenge":"ch"}`
		}
		_, _ = io.WriteString(w, answer+"}")
	}))
	t.Cleanup(upstream.Close)

	a := startOTABridge(t, func(c *Config) {
		c.MQTT.Listen = "" // WebSocket boards
		c.Voice.UpstreamOTA = upstream.URL + "/xiaozhi/ota/"
	})
	b := newBoard(t, mac, "breadboard")
	res, _ := bootOTA(t, b, simulator.OTAConfig{URL: a.OTAURL(), ActivationPending: 10 * time.Millisecond, ActivationRetry: 10 * time.Millisecond})
	assert.Equal(t, 1, res.Activations)
	assert.Equal(t, code, res.ActivationCode, "the voice upstream's code on the board's screen")
	require.Equal(t, "websocket", res.Transport)
	assert.Equal(t, a.DeviceURL(), res.WebSocketURL, "the board connects to the bridge")
	assert.NotEqual(t, "voice-token", res.WebSocketToken)
	require.Eventually(t, func() bool { return hubReady(a.App, mac) }, mqttWait, 10*time.Millisecond)

	mu.Lock()
	assert.Equal(t, []string{"/xiaozhi/ota/", "/xiaozhi/ota/activate", "/xiaozhi/ota/activate", "/xiaozhi/ota/"}, paths)
	mu.Unlock()
	metricsURL := "http://" + a.ControlAddr().String() + "/metrics"
	assert.Equal(t, 4.0, scrape(t, metricsURL, "devicebridge_voice_ota_upstream_requests_total"))
	// The upstream's "v9" would abort the board: dropped, twice.
	assert.Equal(t, 2.0, scrape(t, metricsURL, `devicebridge_voice_ota_upstream_errors_total{reason="unsafe"}`))
	assert.Zero(t, scrape(t, metricsURL, `devicebridge_voice_ota_upstream_errors_total{reason="unreachable"}`))
	a.assertNoSecrets(t, code, res.WebSocketToken)
}

// TestVoiceOTAConfig: voice.upstream_ota and voice.ota_timeout come from
// the file and the flags, and a URL the bridge cannot call, or one without
// the OTA endpoint, stops the start naming the key.
func TestVoiceOTAConfig(t *testing.T) {
	cfg, err := ParseArgs("bridge", nil)
	require.NoError(t, err)
	assert.Equal(t, VoiceConfig{Config: voice.Config{}.WithDefaults(), OTATimeout: ota.DefaultUpstreamTimeout, OTAMaxInFlight: ota.DefaultUpstreamMaxInFlight}, cfg.Voice)

	path := filepath.Join(t.TempDir(), "bridge.yaml")
	require.NoError(t, os.WriteFile(path, []byte("voice:\n  upstream_ota: http://voice:8002/xiaozhi/ota/\n  ota_timeout: 2s\n  ota_max_in_flight: 8\n"), 0o600))
	cfg, err = ParseArgs("bridge", []string{"--config", path})
	require.NoError(t, err)
	assert.Equal(t, VoiceConfig{Config: voice.Config{}.WithDefaults(), UpstreamOTA: "http://voice:8002/xiaozhi/ota/", OTATimeout: 2 * time.Second, OTAMaxInFlight: 8}, cfg.Voice)

	cfg, err = ParseArgs("bridge", []string{"--config", path, "--voice-upstream-ota", "https://voice.example/xiaozhi/ota/", "--voice-ota-timeout", "750ms"})
	require.NoError(t, err)
	assert.Equal(t, "https://voice.example/xiaozhi/ota/", cfg.Voice.UpstreamOTA)
	assert.Equal(t, 750*time.Millisecond, cfg.Voice.OTATimeout)

	_, err = ParseArgs("bridge", []string{"--voice-upstream-ota", "voice:8002/xiaozhi/ota/"})
	assert.ErrorContains(t, err, "voice.upstream_ota")
	_, err = ParseArgs("bridge", []string{"--voice-upstream-ota", "http://voice:8002/xiaozhi/ota/", "--ota=false"})
	assert.ErrorContains(t, err, "needs ota.enabled")
	_, err = ParseArgs("bridge", []string{"--voice-ota-timeout", "0s"})
	assert.ErrorContains(t, err, "voice.ota_timeout 0s: use a duration from 100ms to 1m")
}
