package ota

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// standIn is a voice upstream's OTA endpoint (xiaozhi-esp32-server's
// manager-api answers as answer does), recording what it is sent.
type standIn struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []seenRequest
	// ota and activate answer the two paths; either may be replaced
	// before the first request.
	ota, activate http.HandlerFunc
}

type seenRequest struct {
	method, path, query string
	header              http.Header
	body                string
}

// upstreamAnswer is what manager-api sends a board it has not bound yet:
// its own websocket (which the bridge must never pass on) and members the
// firmware does not know.
const upstreamAnswer = `{"server_time":{"timestamp":1754611200000,"timeZone":"Asia/Shanghai","timezone_offset":480},` +
	`"firmware":{"version":"2.4.2","url":"http://upstream.example:8002/xiaozhi/otaMag/download/x"},` +
	`"activation":{"code":"482913","message":"bind this board\n482913","challenge":"aa:bb:cc:dd:ee:ff","timeout_ms":30000},` +
	`"websocket":{"url":"ws://upstream.example:8000/xiaozhi/v1/","token":"upstream-token"},` +
	`"mqtt":{"endpoint":"upstream.example:1883","client_id":"GID_test@@@aa_bb_cc_dd_ee_ff","publish_topic":"device-server"},` +
	`"an_unknown_member_far_longer_than_fifteen":{"x":1}}`

func newStandIn(t *testing.T) *standIn {
	t.Helper()
	s := &standIn{
		ota: func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, upstreamAnswer)
		},
		activate: func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusAccepted) },
	}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.got = append(s.got, seenRequest{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Clone(), string(b)})
		otaH, actH := s.ota, s.activate
		s.mu.Unlock()
		if strings.HasSuffix(r.URL.Path, "/activate") {
			actH(w, r)
			return
		}
		otaH(w, r)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *standIn) url() string { return s.srv.URL + "/xiaozhi/ota/" }

func (s *standIn) seen() []seenRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seenRequest(nil), s.got...)
}

func (s *standIn) set(ota, activate http.HandlerFunc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ota != nil {
		s.ota = ota
	}
	if activate != nil {
		s.activate = activate
	}
}

// webSocketOnly is a bridge without a broker: it answers websocket.
func webSocketOnly() Network {
	n := embedded()
	n.MQTT, n.MQTTEmbedded = false, false
	return n
}

func upstreamFixture(t *testing.T, up Upstream, n Network) *fixture {
	t.Helper()
	return newFixture(t, Config{Secret: "0123456789abcdef0123", RequestsPerSecond: 1e6, RequestBurst: 1e6, Upstream: up}, n)
}

func (f *fixture) upstreamStats(t *testing.T) UpstreamStats {
	t.Helper()
	st, ok := f.srv.UpstreamStats()
	require.True(t, ok)
	return st
}

// TestUpstreamMerge: the board shows the upstream's activation code, takes
// its firmware and server_time, and connects to the bridge with the
// bridge's credentials: the upstream's websocket, mqtt and unknown members
// never reach it.
func TestUpstreamMerge(t *testing.T) {
	for _, tc := range []struct {
		name      string
		n         Network
		transport string
	}{{"websocket", webSocketOnly(), "websocket"}, {"mqtt", embedded(), "mqtt"}} {
		t.Run(tc.name, func(t *testing.T) {
			up := newStandIn(t)
			f := upstreamFixture(t, Upstream{URL: up.url()}, tc.n)
			code, m, body := f.boot(t, boardHeaders())
			require.Equal(t, http.StatusOK, code, body)

			keys := make([]string, 0, len(m))
			for k := range m {
				keys = append(keys, k)
			}
			assert.ElementsMatch(t, []string{"server_time", "firmware", "activation", tc.transport}, keys,
				"only the bridge's transport and the three pieces taken from the upstream")
			assert.JSONEq(t, `{"code":"482913","message":"bind this board\n482913","challenge":"aa:bb:cc:dd:ee:ff"}`,
				string(m["activation"]), "the upstream's binding code, without timeout_ms")
			assert.JSONEq(t, `{"version":"2.4.2","url":"http://upstream.example:8002/xiaozhi/otaMag/download/x"}`, string(m["firmware"]))
			assert.JSONEq(t, `{"timestamp":1754611200000,"timezone_offset":480}`, string(m["server_time"]))
			switch tc.transport {
			case "websocket":
				var ws WebSocket
				require.NoError(t, json.Unmarshal(m["websocket"], &ws))
				assert.Equal(t, "ws://127.0.0.1:8000/xiaozhi/v1/", ws.URL, "the bridge's listener, never the upstream's")
				assert.True(t, f.wsOK("aa:bb:cc:dd:ee:ff", ws.Token), "the bridge's token")
			case "mqtt":
				var mq MQTT
				require.NoError(t, json.Unmarshal(m["mqtt"], &mq))
				assert.Equal(t, "127.0.0.1:18830", mq.Endpoint)
				assert.True(t, f.mqttOK("aa:bb:cc:dd:ee:ff", mq.Username, mq.Password))
			}
			assert.NotContains(t, body, "upstream-token")
			assert.NotContains(t, body, "upstream.example:8000")

			st := f.upstreamStats(t)
			assert.EqualValues(t, 1, st.Requests)
			for reason, n := range st.Errors {
				assert.Zero(t, n, reason)
			}
		})
	}
}

// TestUpstreamRequestForwarded: the upstream gets the board's method, body
// and firmware headers, and the board's address in X-Forwarded-For, not
// one the caller wrote; nothing else the caller sent.
func TestUpstreamRequestForwarded(t *testing.T) {
	up := newStandIn(t)
	f := upstreamFixture(t, Upstream{URL: up.url()}, webSocketOnly())
	h := boardHeaders()
	h.Set("Serial-Number", "SN0123456789abcdef0123456789abcd")
	h.Set("X-Forwarded-For", "203.0.113.9")
	h.Set("Authorization", "Bearer not-for-the-upstream")
	h.Set("Cookie", "session=not-for-the-upstream")
	code, _, body := f.boot(t, h)
	require.Equal(t, http.StatusOK, code, body)
	code, _ = f.post(t, f.url+"activate", h, `{"algorithm":"hmac-sha256"}`)
	assert.Equal(t, http.StatusAccepted, code)

	seen := up.seen()
	require.Len(t, seen, 2)
	for i, want := range []struct{ path, body string }{{"/xiaozhi/ota/", systemInfoBody}, {"/xiaozhi/ota/activate", `{"algorithm":"hmac-sha256"}`}} {
		got := seen[i]
		assert.Equal(t, http.MethodPost, got.method)
		assert.Equal(t, want.path, got.path)
		assert.Equal(t, want.body, got.body, "the body as the board sent it")
		for _, name := range forwardedHeaders {
			assert.Equal(t, h.Get(name), got.header.Get(name), name)
		}
		assert.Equal(t, "127.0.0.1", got.header.Get("X-Forwarded-For"))
		assert.Empty(t, got.header.Get("Authorization"))
		assert.Empty(t, got.header.Get("Cookie"))
	}
}

// TestUpstreamPiecesOnlyWhenSafe: a piece of the upstream's answer that
// would crash or flash the board is dropped, counted and logged; the rest
// is passed on, and the bridge's own piece stays in its place.
func TestUpstreamPiecesOnlyWhenSafe(t *testing.T) {
	const echo = `{"version":"2.4.2","url":""}`
	for _, tc := range []struct {
		name, answer string
		// want is the member as the board gets it ("" for absent).
		member, want string
		unsafe       int64
	}{
		{"older firmware", `{"firmware":{"version":"2.4.1","url":"http://u/fw.bin"}}`, "firmware", `{"version":"2.4.1","url":"http://u/fw.bin"}`, 0},
		{"force is dropped", `{"firmware":{"version":"2.4.2","url":"http://u/fw.bin","force":1}}`, "firmware", `{"version":"2.4.2","url":"http://u/fw.bin"}`, 0},
		{"v-prefixed version", `{"firmware":{"version":"v2.4","url":"http://u/fw.bin"}}`, "firmware", echo, 1},
		{"newer firmware", `{"firmware":{"version":"2.5.0","url":"http://u/fw.bin"}}`, "firmware", echo, 1},
		{"numeric version", `{"firmware":{"version":3,"url":"http://u/fw.bin"}}`, "firmware", echo, 1},
		{"firmware not an object", `{"firmware":"2.4.2"}`, "firmware", echo, 1},
		{"activation with a numeric code", `{"activation":{"code":482913,"challenge":"c"}}`, "activation", "", 1},
		{"activation with an object message", `{"activation":{"code":"482913","message":{"a":1},"challenge":"c"}}`, "activation", "", 1},
		{"activation too long", `{"activation":{"code":"482913","message":"` + strings.Repeat("x", MaxValueLen+1) + `"}}`, "activation", "", 1},
		{"empty activation", `{"activation":{}}`, "activation", "", 0},
		{"activation without challenge", `{"activation":{"code":"482913"}}`, "activation", `{"code":"482913"}`, 0},
		{"server_time as a string", `{"server_time":{"timestamp":"1754611200000"}}`, "server_time", "bridge", 1},
		{"server_time fractional", `{"server_time":{"timestamp":1754611200000.5}}`, "server_time", "bridge", 1},
		{"server_time offset out of range", `{"server_time":{"timestamp":1754611200000,"timezone_offset":100000}}`, "server_time", "bridge", 1},
		{"server_time without offset", `{"server_time":{"timestamp":1754611200000}}`, "server_time", `{"timestamp":1754611200000}`, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newStandIn(t)
			up.set(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, tc.answer) }, nil)
			f := upstreamFixture(t, Upstream{URL: up.url()}, webSocketOnly())
			code, m, body := f.boot(t, boardHeaders())
			require.Equal(t, http.StatusOK, code, body)
			require.Contains(t, m, "websocket", "the board boots whatever the upstream sent")
			switch tc.want {
			case "":
				assert.NotContains(t, m, tc.member)
			case "bridge":
				var st ServerTime
				require.NoError(t, json.Unmarshal(m["server_time"], &st))
				assert.NotEqual(t, int64(1754611200000), st.Timestamp, "the bridge's own clock")
			default:
				assert.JSONEq(t, tc.want, string(m[tc.member]))
			}
			assert.Equal(t, tc.unsafe, f.upstreamStats(t).Errors[UpstreamUnsafe])
			lines := f.logs.FilterMessageSnippet("pieces that would break or flash the board were dropped").Len()
			assert.Equal(t, int(tc.unsafe), lines)
		})
	}
}

// TestUpstreamActivationForwarded: an admitted board's activation polls
// reach <upstream>/activate ("/" added only where missing, the query
// kept), and the upstream's 202 then 200 reach the board.
func TestUpstreamActivationForwarded(t *testing.T) {
	for _, tc := range []struct{ path, want string }{
		{"/xiaozhi/ota/", "/xiaozhi/ota/activate"},
		{"/xiaozhi/ota", "/xiaozhi/ota/activate"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			up := newStandIn(t)
			var mu sync.Mutex
			polls := 0
			up.set(nil, func(w http.ResponseWriter, _ *http.Request) {
				mu.Lock()
				polls++
				n := polls
				mu.Unlock()
				if n < 2 {
					w.WriteHeader(http.StatusAccepted)
					return
				}
				_, _ = io.WriteString(w, "success")
			})
			f := upstreamFixture(t, Upstream{URL: up.srv.URL + tc.path + "?key=k1"}, webSocketOnly())
			code, m, _ := f.boot(t, boardHeaders())
			require.Equal(t, http.StatusOK, code)
			require.Contains(t, m, "activation")
			activate := f.url + "activate"
			code, _ = f.post(t, activate, boardHeaders(), `{}`)
			assert.Equal(t, http.StatusAccepted, code, "pending at the upstream")
			code, _ = f.post(t, activate, boardHeaders(), `{}`)
			assert.Equal(t, http.StatusOK, code, "bound at the upstream")
			seen := up.seen()
			require.Len(t, seen, 3)
			assert.Equal(t, tc.path, seen[0].path)
			for _, s := range seen[1:] {
				assert.Equal(t, tc.want, s.path)
				assert.Equal(t, "key=k1", s.query)
			}
		})
	}
}

// TestUpstreamNotAskedBeforeAdmission: a board waiting for the bridge's
// own approval shows the bridge's code and polls the bridge; it reaches
// the upstream only once admitted. A board the bridge never saw is not
// passed on either.
func TestUpstreamNotAskedBeforeAdmission(t *testing.T) {
	up := newStandIn(t)
	f := newFixture(t, Config{Secret: "0123456789abcdef0123", Approval: true, Upstream: Upstream{URL: up.url()}}, webSocketOnly())
	h := boardHeaders()
	h.Set("Device-Id", "aa:bb:cc:dd:ee:01")
	code, _ := f.post(t, f.url+"activate", h, `{}`)
	assert.Equal(t, http.StatusNotFound, code, "unknown board")

	code, m, _ := f.boot(t, boardHeaders())
	require.Equal(t, http.StatusOK, code)
	var act Activation
	require.NoError(t, json.Unmarshal(m["activation"], &act))
	assert.NotEqual(t, "482913", act.Code, "the bridge's own code")
	assert.NotContains(t, m, "websocket")
	code, _ = f.post(t, f.url+"activate", boardHeaders(), `{}`)
	assert.Equal(t, http.StatusAccepted, code)
	assert.Empty(t, up.seen(), "nothing reaches the upstream before admission")

	code, body := f.post(t, f.control+"/api/ota/devices/"+act.Code+"/approve", nil, "")
	require.Equal(t, http.StatusOK, code, body)
	code, m, _ = f.boot(t, boardHeaders())
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, m, "websocket")
	assert.JSONEq(t, `{"code":"482913","message":"bind this board\n482913","challenge":"aa:bb:cc:dd:ee:ff"}`, string(m["activation"]))
	code, _ = f.post(t, f.url+"activate", boardHeaders(), `{}`)
	assert.Equal(t, http.StatusAccepted, code)
	assert.Len(t, up.seen(), 2)
}

// TestUpstreamFailuresFallBack: an upstream that is down, slow, failing,
// babbling, oversized or redirecting leaves the board with the bridge's
// own answer, on which it boots; each is counted and logged with its
// reason, and an activation poll gets a status the board retries on.
func TestUpstreamFailuresFallBack(t *testing.T) {
	down := httptest.NewServer(http.NotFoundHandler())
	downURL := down.URL + "/xiaozhi/ota/"
	down.Close()
	for _, tc := range []struct {
		name, reason string
		handler      http.HandlerFunc // nil: the upstream is down
		activate     int              // what a poll gets
	}{
		{"down", UpstreamUnreachable, nil, http.StatusBadGateway},
		{"slow", UpstreamTimeout, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }, http.StatusGatewayTimeout},
		{"500", UpstreamStatus, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", http.StatusInternalServerError) },
			http.StatusInternalServerError},
		{"garbage", UpstreamInvalid, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "<html>not json</html>") },
			http.StatusOK},
		{"not an object", UpstreamInvalid, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, `["activation"]`) },
			http.StatusOK},
		{"huge", UpstreamOversized, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, `{"activation":{"code":"1","challenge":"c","message":"`+strings.Repeat("x", MaxUpstreamAnswerBytes)+`"}}`)
		}, http.StatusBadGateway},
		{"redirect", UpstreamStatus, func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "http://upstream.example/elsewhere", http.StatusFound)
		}, http.StatusBadGateway},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := downURL
			if tc.handler != nil {
				up := newStandIn(t)
				up.set(tc.handler, tc.handler)
				url = up.url()
			}
			timeout := time.Minute
			if tc.reason == UpstreamTimeout {
				timeout = 50 * time.Millisecond
			}
			f := upstreamFixture(t, Upstream{URL: url, Timeout: timeout}, webSocketOnly())
			code, m, body := f.boot(t, boardHeaders())
			require.Equal(t, http.StatusOK, code, body)
			assert.Contains(t, m, "websocket")
			assert.NotContains(t, m, "activation")
			assert.JSONEq(t, `{"version":"2.4.2","url":""}`, string(m["firmware"]), "the bridge's echo")
			assert.EqualValues(t, 1, f.upstreamStats(t).Errors[tc.reason])
			lines := f.logs.FilterMessage("voice upstream OTA failed; the board gets the bridge's own answer").All()
			require.Len(t, lines, 1)
			assert.Equal(t, tc.reason, lines[0].ContextMap()["reason"])

			code, _ = f.post(t, f.url+"activate", boardHeaders(), `{}`)
			assert.Equal(t, tc.activate, code)
			assert.NotEqual(t, http.StatusAccepted, code)
		})
	}
}

// TestUpstreamConcurrencyBound: past MaxInFlight calls in flight, a board
// is answered at once with the bridge's own answer, and counted as busy.
func TestUpstreamConcurrencyBound(t *testing.T) {
	const limit = 2
	up := newStandIn(t)
	arrived, release := make(chan struct{}, limit+1), make(chan struct{})
	up.set(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		_, _ = io.WriteString(w, upstreamAnswer)
	}, nil)
	f := upstreamFixture(t, Upstream{URL: up.url(), MaxInFlight: limit, Timeout: time.Minute}, webSocketOnly())

	type result struct {
		code int
		body string
	}
	results := make(chan result, limit)
	var wg sync.WaitGroup
	for range limit {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, f.url, strings.NewReader(systemInfoBody))
			req.Header = boardHeaders()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				results <- result{body: err.Error()}
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			results <- result{resp.StatusCode, string(b)}
		})
	}
	t.Cleanup(wg.Wait)
	for range limit {
		select {
		case <-arrived:
		case <-time.After(time.Minute):
			close(release)
			t.Fatal("the first boards' calls did not reach the upstream")
		}
	}

	code, m, body := f.boot(t, boardHeaders())
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, m, "websocket")
	assert.NotContains(t, m, "activation", "the bridge's own answer")
	st := f.upstreamStats(t)
	assert.EqualValues(t, 1, st.Errors[UpstreamBusy])
	assert.EqualValues(t, limit, st.Requests, "the third board's call was not sent")
	assert.Equal(t, 1, f.logs.FilterMessageSnippet("calls are in flight already").Len())

	close(release)
	for range limit {
		r := <-results
		require.Equal(t, http.StatusOK, r.code, r.body)
		assert.Contains(t, r.body, "482913", "the boards in flight get the merged answer")
	}
	assert.Len(t, up.seen(), limit)
}

// TestUpstreamCredentialsNeverLogged: the upstream URL's password and
// query (a token, say) appear in no log line and no configuration error.
func TestUpstreamCredentialsNeverLogged(t *testing.T) {
	down := httptest.NewServer(http.NotFoundHandler())
	addr := strings.TrimPrefix(down.URL, "http://")
	down.Close()
	f := upstreamFixture(t, Upstream{URL: "http://voice:hunter2-pass@" + addr + "/xiaozhi/ota/?token=sekrit-token"}, webSocketOnly())
	code, _, _ := f.boot(t, boardHeaders())
	require.Equal(t, http.StatusOK, code)
	code, _ = f.post(t, f.url+"activate", boardHeaders(), `{}`)
	require.Equal(t, http.StatusBadGateway, code)
	require.NotZero(t, f.logs.FilterMessageSnippet("voice upstream OTA failed").Len())
	for _, e := range f.logs.All() {
		line, _ := json.Marshal(e.ContextMap())
		assert.NotContains(t, e.Message+string(line), "hunter2-pass")
		assert.NotContains(t, e.Message+string(line), "sekrit-token")
	}

	err := Upstream{URL: "ftp://voice:hunter2-pass@" + addr + "/?token=sekrit-token"}.Validate()
	require.ErrorContains(t, err, "voice.upstream_ota")
	assert.NotContains(t, err.Error(), "hunter2-pass")
	assert.NotContains(t, err.Error(), "sekrit-token")
}

func TestUpstreamValidate(t *testing.T) {
	for _, ok := range []string{"", "http://host:8002/xiaozhi/ota/", "https://voice.example/xiaozhi/ota"} {
		assert.NoError(t, Upstream{URL: ok}.Validate(), ok)
	}
	for _, bad := range []string{"host:8002/xiaozhi/ota/", "ws://host/ota/", "http:///ota/", "file:///etc/passwd", "http://host/" + strings.Repeat("a", 3000)} {
		assert.ErrorContains(t, Upstream{URL: bad}.Validate(), "voice.upstream_ota", bad)
	}
	_, err := New(Config{Upstream: Upstream{URL: "ftp://host/"}}, embedded, nil)
	assert.ErrorContains(t, err, "voice.upstream_ota")
}
