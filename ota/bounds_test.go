package ota

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeClock is the server's clock in these tests: rate limits and expiry
// are checked against it, so no test waits or depends on how fast it runs.
type fakeClock struct{ ns atomic.Int64 }

func newClock(f *fixture) *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	f.srv.now = c.Now
	return c
}

func (c *fakeClock) Now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Add(d time.Duration) { c.ns.Add(int64(d)) }

// from is an HTTP client whose connections come from another loopback
// address, so that tests can be several callers at once.
func from(t *testing.T, ip string) *http.Client {
	t.Helper()
	tr := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}).DialContext, DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// send POSTs body with headers h through c and returns the status and the
// answer.
func send(t *testing.T, c *http.Client, url string, h http.Header, body string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	if h != nil {
		req.Header = h.Clone()
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// board returns boardHeaders for the i-th board of a flood.
func board(i int) http.Header {
	h := boardHeaders()
	h.Set("Device-Id", fmt.Sprintf("02:00:00:00:%02x:%02x", i>>8, i&0xff))
	h.Set("Client-Id", fmt.Sprintf("1f0a0b0c-0000-4000-8000-%012d", i))
	return h
}

type listing struct {
	Pending    int          `json:"pending"`
	MaxPending int          `json:"max_pending"`
	Devices    []DeviceView `json:"devices"`
}

func (f *fixture) list(t *testing.T) listing {
	t.Helper()
	resp, err := http.Get(f.control + "/api/ota/devices")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var l listing
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&l))
	return l
}

func (l listing) ids() []string {
	var out []string
	for _, d := range l.Devices {
		out = append(out, d.DeviceID)
	}
	return out
}

// TestOTAFloodIsBounded: unauthenticated OTA POSTs from one address, each
// claiming a new MAC, are rate-limited (429), and the boards that get
// through never make more than ota.max_pending wait for approval (503
// past it, which the firmware retries); another address is not limited
// by the first one's flood. Before the fix every POST added a pending
// board.
func TestOTAFloodIsBounded(t *testing.T) {
	dir := t.TempDir()
	f := newFixture(t, Config{DataDir: dir, Approval: true, MaxPending: 5, RequestsPerSecond: 1, RequestBurst: 20}, embedded())
	newClock(f)
	counts := map[int]int{}
	for i := range 40 {
		code, _, h := send(t, http.DefaultClient, f.url, board(i), systemInfoBody)
		counts[code]++
		if code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable {
			assert.NotEmpty(t, h.Get("Retry-After"))
		}
	}
	assert.Equal(t, map[int]int{http.StatusOK: 5, http.StatusServiceUnavailable: 15, http.StatusTooManyRequests: 20}, counts)
	l := f.list(t)
	assert.Len(t, l.Devices, 5)
	assert.Equal(t, 5, l.Pending)

	// Another address has its own allowance: refused for the full list,
	// not for the rate.
	code, body, _ := send(t, from(t, "127.0.0.2"), f.url, board(100), systemInfoBody)
	assert.Equal(t, http.StatusServiceUnavailable, code, body)
	assert.Contains(t, body, "waiting for approval")

	// The flooder's activation polls are limited too.
	code, _, _ = send(t, http.DefaultClient, f.url+"activate", board(0), "{}")
	assert.Equal(t, http.StatusTooManyRequests, code)

	// A restart over the same state holds the same bound (the bridge
	// writes its state as it stops).
	require.NoError(t, f.srv.Close())
	s, dropped, err := OpenStore(dir, Limits{MaxPending: 5}, f.srv.now())
	require.NoError(t, err)
	assert.Zero(t, dropped)
	assert.Equal(t, 5, s.Counts(f.srv.now()).Pending)
}

// TestPendingExpires: a pending board that stopped asking is forgotten
// after ota.pending_ttl, making room for others; one that keeps booting
// stays, with the same code.
func TestPendingExpires(t *testing.T) {
	f := newFixture(t, Config{Secret: "0123456789abcdef0123", Approval: true, MaxPending: 2, PendingTTL: time.Hour}, embedded())
	clock := newClock(f)
	boot := func(i int) (int, string) {
		code, body, _ := send(t, http.DefaultClient, f.url, board(i), systemInfoBody)
		return code, body
	}
	_, first := boot(1)
	boot(2)
	code, _ := boot(3)
	require.Equal(t, http.StatusServiceUnavailable, code, "the list is full")

	clock.Add(50 * time.Minute)
	_, again := boot(1) // board 1 keeps asking
	var a, b Answer
	require.NoError(t, json.Unmarshal([]byte(first), &a))
	require.NoError(t, json.Unmarshal([]byte(again), &b))
	assert.Equal(t, a.Activation.Code, b.Activation.Code, "the same code while it waits")

	clock.Add(20 * time.Minute) // board 2 was last seen 70 minutes ago
	code, _ = boot(3)
	require.Equal(t, http.StatusOK, code, "board 2 expired and made room")
	assert.Equal(t, []string{"02:00:00:00:00:01", "02:00:00:00:00:03"}, f.list(t).ids())

	clock.Add(2 * time.Hour)
	assert.Empty(t, f.list(t).Devices, "nobody asked for two hours")
}

// TestStoredStateLoadsWithinBounds: a state file written with more
// pending boards than the limits allow (an older bridge, a lowered
// ota.max_pending) loads within them: expired ones and the least recently
// seen are left out, approved boards never.
func TestStoredStateLoadsWithinBounds(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	f := storeFile{Version: storeVersion}
	for i := range 10 {
		f.Devices = append(f.Devices, Record{DeviceID: fmt.Sprintf("02:00:00:00:00:%02x", i), Code: fmt.Sprintf("%06d", i), Challenge: "c",
			FirstSeen: now.Add(-3 * time.Hour), LastSeen: now.Add(-time.Duration(i) * time.Minute)})
	}
	f.Devices = append(f.Devices,
		Record{DeviceID: "02:00:00:00:01:00", Code: "999999", LastSeen: now.Add(-2 * time.Hour)},                    // expired
		Record{DeviceID: "02:00:00:00:02:00", Approved: true, LastSeen: now.Add(-400 * 24 * time.Hour)},             // approved long ago
		Record{DeviceID: "02:00:00:00:03:00", Code: "000001", Challenge: "c", LastSeen: now.Add(-30 * time.Second)}, // a code taken twice
	)
	data, err := json.Marshal(f)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, DevicesFile), data, 0o600))

	s, dropped, err := OpenStore(dir, Limits{MaxPending: 3, PendingTTL: time.Hour, MaxDevices: 4}, now)
	require.NoError(t, err)
	assert.Equal(t, 9, dropped)
	var ids []string
	codes := map[string]bool{}
	for _, r := range s.List(now) {
		ids = append(ids, r.DeviceID)
		if r.Pending() {
			assert.False(t, codes[r.Code], "codes stay unique")
			codes[r.Code] = true
		}
	}
	assert.Equal(t, []string{"02:00:00:00:00:00", "02:00:00:00:00:01", "02:00:00:00:02:00", "02:00:00:00:03:00"}, ids)
}

// TestCodeGuessesThrottled: wrong activation codes on the approve route
// are limited per caller and in all, so the code space cannot be walked;
// a right code does not count, and approval by MAC stays open. Before the
// fix any number of guesses was answered at once.
func TestCodeGuessesThrottled(t *testing.T) {
	// Bursts: 6 per caller, 10 in all (a sixth of the hourly allowance).
	f := newFixture(t, Config{Secret: "0123456789abcdef0123", Approval: true, CodeDigits: 8,
		CodeGuessesPerCallerPerHour: 36, CodeGuessesPerHour: 60}, embedded())
	clock := newClock(f)
	var codes []string
	for i := range 2 {
		_, body, _ := send(t, http.DefaultClient, f.url, board(i), systemInfoBody)
		var a Answer
		require.NoError(t, json.Unmarshal([]byte(body), &a))
		require.Regexp(t, `^\d{8}$`, a.Activation.Code)
		codes = append(codes, a.Activation.Code)
	}
	wrong := func(i int) string { return fmt.Sprintf("%08d", (i*7919+1)%100_000_000) }
	approve := func(c *http.Client, idOrCode string) int {
		code, _, _ := send(t, c, f.control+"/api/ota/devices/"+idOrCode+"/approve", nil, "")
		return code
	}
	me, other := http.DefaultClient, from(t, "127.0.0.2")
	require.Equal(t, http.StatusOK, approve(me, codes[0]), "a right code is no guess")
	for i := range 6 {
		require.Equal(t, http.StatusNotFound, approve(me, wrong(i)))
	}
	code, body, h := send(t, me, f.control+"/api/ota/devices/"+codes[1]+"/approve", nil, "")
	assert.Equal(t, http.StatusTooManyRequests, code, "this caller's allowance is spent, even for a right code")
	assert.Contains(t, body, "too_many_guesses")
	assert.NotEmpty(t, h.Get("Retry-After"))

	// Another caller still has its own, until all callers together have
	// used the global one.
	for i := range 4 {
		require.Equal(t, http.StatusNotFound, approve(other, wrong(10+i)), "guess %d", i)
	}
	assert.Equal(t, http.StatusTooManyRequests, approve(other, wrong(20)))
	assert.Equal(t, http.StatusTooManyRequests, approve(from(t, "127.0.0.3"), wrong(21)), "the global allowance is spent")

	// By MAC needs no guess.
	assert.Equal(t, http.StatusOK, approve(me, "02:00:00:00:00:01"))

	clock.Add(time.Hour)
	assert.Equal(t, http.StatusNotFound, approve(me, wrong(30)), "the allowance refills")
}

// TestClientIDBoundOnFirstUse: where credentials are required, they are
// bound to the Client-Id a board first registers with. Another Client-Id
// for the same MAC gets no credentials (409), is shown to the operator
// and logged, and the transports refuse the credentials with it too, until
// the binding is reset. Before the fix anyone who knew the MAC got them.
func TestClientIDBoundOnFirstUse(t *testing.T) {
	n := embedded()
	n.MQTT, n.MQTTEmbedded = false, false
	f := newFixture(t, Config{Secret: "0123456789abcdef0123", Allow: []string{"aa:bb:cc:dd:ee:ff"}}, n)
	code, m, _ := f.boot(t, boardHeaders())
	require.Equal(t, http.StatusOK, code)
	var ws WebSocket
	require.NoError(t, json.Unmarshal(m["websocket"], &ws))

	impostor := boardHeaders()
	impostor.Set("Client-Id", "0badbadb-0000-4000-8000-000000000009")
	code, _, body := f.boot(t, impostor)
	assert.Equal(t, http.StatusConflict, code)
	assert.NotContains(t, body, ws.Token)
	ok, _ := f.srv.CheckWebSocketToken("aa:bb:cc:dd:ee:ff", "0badbadb-0000-4000-8000-000000000009", ws.Token)
	assert.False(t, ok, "the transports hold the binding too")
	assert.True(t, f.wsOK("aa:bb:cc:dd:ee:ff", ws.Token))

	row := f.list(t).Devices[0]
	assert.True(t, row.Bound)
	assert.Equal(t, clientID, row.ClientID)
	assert.Equal(t, "0badbadb-0000-4000-8000-000000000009", row.RejectedClientID)
	assert.Equal(t, 2, row.Rejections, "the OTA call and the transport's")
	assert.NotZero(t, f.logs.FilterMessageSnippet("bound to another Client-Id").Len())

	noID := boardHeaders()
	noID.Del("Client-Id")
	code, body = f.post(t, f.url, noID, strings.Replace(systemInfoBody, `"uuid":"`+clientID+`",`, "", 1))
	assert.Equal(t, http.StatusBadRequest, code, "no Client-Id, nothing to bind to")
	assert.Contains(t, body, "Client-Id")

	// The operator resets the binding to the new Client-Id (the board's
	// flash was erased): the new one is served, the old one refused.
	code, body, _ = send(t, http.DefaultClient, f.control+"/api/ota/devices/AA-BB-CC-DD-EE-FF/reset", nil, `{"client_id":"0badbadb-0000-4000-8000-000000000009"}`)
	require.Equal(t, http.StatusOK, code, body)
	code, _, _ = f.boot(t, impostor)
	assert.Equal(t, http.StatusOK, code)
	assert.False(t, f.wsOK("aa:bb:cc:dd:ee:ff", ws.Token), "the old Client-Id no longer")
	code, _, _ = f.boot(t, boardHeaders())
	assert.Equal(t, http.StatusConflict, code)

	// Reset without a body: the next OTA call binds.
	code, _, _ = send(t, http.DefaultClient, f.control+"/api/ota/devices/aa:bb:cc:dd:ee:ff/reset", nil, "")
	require.Equal(t, http.StatusOK, code)
	code, _, _ = f.boot(t, boardHeaders())
	assert.Equal(t, http.StatusOK, code)
	assert.True(t, f.wsOK("aa:bb:cc:dd:ee:ff", ws.Token))

	for _, bad := range []struct{ path, body string }{
		{"482913/reset", ""}, {"aa:bb:cc:dd:ee:ff/reset", `{"client_id":"no spaces allowed"}`}, {"aa:bb:cc:dd:ee:ff/reset", `{"other":1}`},
	} {
		code, body, _ := send(t, http.DefaultClient, f.control+"/api/ota/devices/"+bad.path, nil, bad.body)
		assert.Equal(t, http.StatusBadRequest, code, bad)
		assert.NotContains(t, body, `\u003c`, "a JSON API does not HTML-escape its messages")
	}
	code, _, _ = send(t, http.DefaultClient, f.control+"/api/ota/devices/aa:bb:cc:dd:ee:01/reset", nil, "")
	assert.Equal(t, http.StatusNotFound, code)
}

// TestOpenModeRefusesAnotherBoardsCredentials: with admission off, a
// board presenting no credentials is admitted as before, but one
// presenting credentials the bridge issued to another board is refused
// (foreign). Tokens of the form issued before tokens named their board
// still work for their own board.
func TestOpenModeRefusesAnotherBoardsCredentials(t *testing.T) {
	f := newFixture(t, Config{Secret: "0123456789abcdef0123"}, embedded())
	creds := f.srv.Credentials()
	tok := creds.WebSocketToken("aa:bb:cc:dd:ee:ff")
	assert.True(t, strings.HasPrefix(tok, "dbw1.aabbccddeeff."), tok)
	issued, foreign := f.srv.CheckWebSocketToken("aa:bb:cc:dd:ee:01", "x", tok)
	assert.False(t, issued)
	assert.True(t, foreign)
	issued, foreign = f.srv.CheckWebSocketToken("AA-BB-CC-DD-EE-FF", "x", tok)
	assert.True(t, issued, "its own board, in any MAC spelling")
	assert.False(t, foreign)
	_, foreign = f.srv.CheckWebSocketToken("aa:bb:cc:dd:ee:01", "x", "dbw1.aabbccddeeff.forged")
	assert.False(t, foreign, "a token the bridge did not issue names nobody")
	issued, _ = f.srv.CheckWebSocketToken("aa:bb:cc:dd:ee:ff", "x", creds.legacyWebSocketToken("aa:bb:cc:dd:ee:ff"))
	assert.True(t, issued, "a token issued before the upgrade")

	login := creds.MQTT("aa:bb:cc:dd:ee:ff", clientID)
	issued, foreign = f.srv.CheckMQTT("aa:bb:cc:dd:ee:01", "x", login.Username, login.Password)
	assert.False(t, issued)
	assert.True(t, foreign)
	_, foreign = f.srv.CheckMQTT("aa:bb:cc:dd:ee:01", "x", login.Username, "wrong")
	assert.False(t, foreign)
	assert.NotZero(t, f.logs.FilterMessageSnippet("issued to another board").Len())
}

// TestBoundsValidated: the bounds must fit together (each number's own
// range is the bridge configuration's; out of range values from code are
// made safe by WithDefaults).
func TestBoundsValidated(t *testing.T) {
	for cfg, want := range map[*Config]string{
		{MaxPending: 5000}: "ota.code_digits 6 with ota.max_pending 5000",
		{MaxPending: 20_000, MaxDevices: 10_000, CodeDigits: 8}: "ota.max_devices 10000 is less than ota.max_pending 20000",
	} {
		assert.ErrorContains(t, cfg.Validate(), want)
	}
	assert.NoError(t, Config{MaxPending: 10_000, CodeDigits: 7}.Validate())
	assert.NoError(t, Config{}.Validate())
	d := Config{MaxPending: -1, RequestsPerSecond: -2, PendingTTL: time.Second, CodeDigits: 40}.WithDefaults()
	assert.Equal(t, DefaultMaxPending, d.MaxPending)
	assert.InDelta(t, DefaultRequestsPerSecond, d.RequestsPerSecond, 0)
	assert.Equal(t, minPendingTTL, d.PendingTTL)
	assert.Equal(t, maxCodeDigits, d.CodeDigits)
}

// TestBootStormWritesOnce: a fleet's first boot (or an outsider inventing
// MACs) no longer rewrites the whole store for every new board: with the
// interval stretched to an hour, a hundred boards booting write nothing,
// and the bridge's Close writes them all at once. Before, each new board
// rewrote and synced the file under the store's lock: O(n²) bytes for a
// fleet, and one full write per request for anyone.
func TestBootStormWritesOnce(t *testing.T) {
	dir := t.TempDir()
	f := newFixture(t, Config{DataDir: dir, RequestBurst: 1000}, embedded())
	setInterval(f.srv.Store(), time.Hour)
	const boards = 100
	for i := range boards {
		code, _, _ := send(t, http.DefaultClient, f.url, board(i), systemInfoBody)
		require.Equal(t, http.StatusOK, code)
	}
	assert.Zero(t, writesOf(f.srv.Store()), "no write per board")
	require.NoError(t, f.srv.Close())
	assert.Equal(t, 1, writesOf(f.srv.Store()))
	disk := onDisk(t, dir)
	assert.Len(t, disk, boards)
	assert.Equal(t, TransportMQTT, disk[mac(7)].Transport)
}

// TestApprovalOnDiskWhenAnswered: the approve route answers only once the
// approval is on disk, and a board that gets credentials where they are
// required has its Client-Id binding on disk before the answer, while
// everything else still waits for its write.
func TestApprovalOnDiskWhenAnswered(t *testing.T) {
	dir := t.TempDir()
	f := newFixture(t, Config{DataDir: dir, Approval: true, Allow: []string{mac(2)}, RequestBurst: 1000}, embedded())
	setInterval(f.srv.Store(), time.Hour)
	code, _, _ := send(t, http.DefaultClient, f.url, board(1), systemInfoBody)
	require.Equal(t, http.StatusOK, code)
	assert.Empty(t, onDisk(t, dir), "a pending board waits for the next write")
	code, body := f.post(t, f.control+"/api/ota/devices/"+mac(1)+"/approve", nil, "")
	require.Equal(t, http.StatusOK, code, body)
	assert.True(t, onDisk(t, dir)[mac(1)].Approved)

	// An allowlisted board gets credentials at once, bound to its
	// Client-Id: the binding is on disk when the answer arrives.
	code, answer, _ := send(t, http.DefaultClient, f.url, board(2), systemInfoBody)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, answer, `"password"`)
	assert.Equal(t, board(2).Get("Client-Id"), onDisk(t, dir)[mac(2)].ClientID)
	assert.Equal(t, 2, writesOf(f.srv.Store()))
}
