package mcpserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/mcpserver/mcphttp"
	"github.com/devicebridge/devicebridge/simulator"
)

// openRaw sends an initialize with the given headers and returns the
// status, the session id issued (if any), the Retry-After header and the
// body.
func openRaw(b *bridge, headers map[string]string) (status int, sid, retryAfter, body string) {
	status, hdr, body := rawStatus(b, "POST", initBody, headers)
	return status, hdr.Get("Mcp-Session-Id"), hdr.Get("Retry-After"), body
}

// refusal checks a refused initialize: the JSON-RPC error for id 1 that
// names the setting, and a Retry-After of at least a second.
func refusal(t *testing.T, retryAfter, body, key string) {
	t.Helper()
	secs, err := strconv.Atoi(retryAfter)
	require.NoError(t, err, "Retry-After %q", retryAfter)
	assert.Positive(t, secs)
	var msg struct {
		ID    int `json:"id"`
		Error struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Data    struct {
				Setting    string `json:"setting"`
				RetryAfter int    `json:"retryAfter"`
			} `json:"data"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &msg), body)
	assert.Equal(t, 1, msg.ID)
	assert.Equal(t, -32000, msg.Error.Code)
	assert.Contains(t, msg.Error.Message, key)
	assert.Equal(t, key, msg.Error.Data.Setting)
	assert.Equal(t, secs, msg.Error.Data.RetryAfter)
}

// TestSessionCaps: legacy sessions are capped per client (the verified
// identity) and in all; an initialize past a cap gets 429 or 503 with
// Retry-After and a JSON-RPC error naming the setting, and a slot freed by
// DELETE is taken again. Before the caps, every initialize opened a
// session that stayed for the whole session timeout.
func TestSessionCaps(t *testing.T) {
	b := startBridge(t, func(c *app.Config) {
		c.MCP.Tokens = []string{"alice=alice-secret", "bob=bob-secret"}
		c.MCP.MaxSessions = 3
		c.MCP.MaxSessionsPerClient = 2
	})
	alice := map[string]string{"Authorization": "Bearer alice-secret"}
	bob := map[string]string{"Authorization": "Bearer bob-secret"}

	var aliceSIDs []string
	for range 2 {
		status, sid, _, body := openRaw(b, alice)
		require.Equal(t, http.StatusOK, status, body)
		aliceSIDs = append(aliceSIDs, sid)
	}
	status, sid, retry, body := openRaw(b, alice)
	require.Equal(t, http.StatusTooManyRequests, status, body)
	assert.Empty(t, sid)
	refusal(t, retry, body, "mcp.max_sessions_per_client")

	status, _, _, body = openRaw(b, bob)
	require.Equal(t, http.StatusOK, status, "another identity has its own budget: %s", body)
	status, _, retry, body = openRaw(b, bob)
	require.Equal(t, http.StatusServiceUnavailable, status, body)
	refusal(t, retry, body, "mcp.max_sessions")
	assert.NotContains(t, body, "per_client")

	// Ending a session frees its slot.
	hdr := map[string]string{"Mcp-Session-Id": aliceSIDs[0], "MCP-Protocol-Version": legacy}
	for k, v := range alice {
		hdr[k] = v
	}
	status, _, _ = rawStatus(b, "DELETE", "", hdr)
	require.Equal(t, http.StatusNoContent, status)
	require.Eventually(t, func() bool { return b.App.MCP().SessionStats().Live == 2 }, 10*time.Second, 5*time.Millisecond)

	// A go-sdk client takes the free slot; the next one is refused and
	// says why.
	hc := &http.Client{Transport: bearer{"alice-secret", b.HTTP.Transport}}
	cs := b.ClientWith(legacy, nil, hc)
	c := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: b.URL, HTTPClient: hc, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: legacy})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Service Unavailable", "the bridge is full (3 sessions)")
	require.NoError(t, cs.Close())
	require.Eventually(t, func() bool { return b.App.MCP().SessionStats().Live == 2 }, 10*time.Second, 5*time.Millisecond)
	b.ClientWith(legacy, nil, hc)

	st := b.App.MCP().SessionStats()
	assert.EqualValues(t, 1, st.RefusedClient)
	assert.EqualValues(t, 2, st.RefusedTotal)
	assert.Equal(t, 3, st.Live)
	// Without credentials, the client is its address.
	b2 := startBridge(t, func(c *app.Config) { c.MCP.MaxSessionsPerClient = 2 })
	for range 2 {
		status, _, _, body := openRaw(b2, nil)
		require.Equal(t, http.StatusOK, status, body)
	}
	status, _, retry, body = openRaw(b2, nil)
	require.Equal(t, http.StatusTooManyRequests, status, body)
	refusal(t, retry, body, "mcp.max_sessions_per_client")
	// The stateless era opens no session: the caps do not apply to it.
	listTools(t, b2.Client(modern, nil))
	refused := b2.Logs.FilterMessage("mcp session refused: max_sessions_per_client")
	require.Equal(t, 1, refused.Len())
	assert.Equal(t, int64(2), refused.All()[0].ContextMap()["max_sessions_per_client"])
}

// TestIdleSessionsClosed: a session with no request in flight and no
// stream open closes after mcp.session_timeout; a host listening on its GET
// stream, and one waiting for a long call, keep theirs. (The go-sdk's own
// timeout counts POSTs only: it would close the listening host's session.)
func TestIdleSessionsClosed(t *testing.T) {
	release := make(chan struct{})
	b := startBridge(t, func(c *app.Config) { c.MCP.SessionTimeout = time.Second })
	b.Board(macA, "breadboard", simulator.Config{Hold: map[string]<-chan struct{}{slowTool: release}})

	// A go-sdk host: it opens the standalone GET stream after initialize.
	var changed signals
	listening := b.Client(legacy, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed.Add() },
	})
	n := changed.Count()
	b.Board(macB, "breadboard", simulator.Config{})
	require.Eventually(t, func() bool { return changed.Count() > n }, 10*time.Second, 5*time.Millisecond,
		"the listening host's stream is open")

	// A host waiting for a call its board takes long to answer. Its
	// response stream opens with a priming event, so Do returns while the
	// call waits.
	waiting := rawSession(b, legacy)
	resp := do(b, rawRequest(b, "POST", `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"`+
		upstreamName(macA, slowTool)+`","arguments":{}}}`, map[string]string{"Mcp-Session-Id": waiting, "MCP-Protocol-Version": legacy}))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	events := make(chan sseEvent, 16)
	go readSSE(resp.Body, events)
	defer resp.Body.Close()

	// A session nobody uses.
	idle := rawSession(b, legacy)
	open := b.App.MCP().SessionCount()
	require.Eventually(t, func() bool { return b.App.MCP().SessionCount() < open }, 10*time.Second, 5*time.Millisecond,
		"no session idled out")
	status, _, _ := rawStatus(b, "POST", `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`,
		map[string]string{"Mcp-Session-Id": idle, "MCP-Protocol-Version": legacy})
	assert.Equal(t, http.StatusNotFound, status, "the idle session is gone")

	// The listening host was idle for longer than the idle one (no POST
	// since its initialize) and still hears list_changed and calls tools.
	n = changed.Count()
	b.Board(macC, "breadboard", simulator.Config{})
	require.Eventually(t, func() bool { return changed.Count() > n }, 10*time.Second, 5*time.Millisecond,
		"the listening host's stream survived")
	require.False(t, callTool(t, listening, upstreamName(macC, "self.audio_speaker.set_volume"), map[string]any{"volume": 3}).IsError)

	// The waiting host's call ends normally.
	close(release)
	for {
		ev, ok := nextEvent(t, events, 10*time.Second)
		require.True(t, ok, "the call's stream ended without its result")
		if isResponseTo(ev, 5) {
			assert.Contains(t, ev.Data, `"result"`)
			break
		}
	}
	assert.EqualValues(t, 1, b.App.MCP().SessionStats().IdleClosed, "only the idle session was closed")
}

// TestIPv6NetworkIsOneClient: outside a verified identity a client is its
// address, and for IPv6 its /64, which one host usually holds whole.
// Addresses in one /64 share one per-client session budget and one rate
// budget; another /64 has its own. Before, each address was a client of
// its own, and a host rotating addresses inside its /64 got around
// mcp.max_sessions_per_client and mcp.rate_limit.
func TestIPv6NetworkIsOneClient(t *testing.T) {
	b := startBridge(t, func(c *app.Config) {
		c.MCP.MaxSessionsPerClient = 2
		c.MCP.RateLimit = 0.5 // one token every two seconds: nothing refills during the test
		c.MCP.RateBurst = 4
	})
	// Loopback has one IPv6 address, so a real listener in front of /mcp
	// hands each request the remote address the test names, as the
	// socket would.
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.RemoteAddr = r.Header.Get("X-Test-Remote")
		b.App.MCP().Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	v6 := *b
	v6.URL = front.URL + "/mcp"
	from := func(addr string) map[string]string { return map[string]string{"X-Test-Remote": addr} }

	// Two sessions from two addresses of 2001:db8:1:2::/64 fill its
	// session budget; a third address there is refused.
	for _, addr := range []string{"[2001:db8:1:2::1]:50000", "[2001:db8:1:2:ffff:ffff:ffff:fffe]:50001"} {
		status, sid, _, body := openRaw(&v6, from(addr))
		require.Equal(t, http.StatusOK, status, "%s: %s", addr, body)
		require.NotEmpty(t, sid)
	}
	status, _, retry, body := openRaw(&v6, from("[2001:db8:1:2:abcd::3]:50002"))
	require.Equal(t, http.StatusTooManyRequests, status, body)
	refusal(t, retry, body, "mcp.max_sessions_per_client")

	// Its fourth request outside a session spends the last token of the
	// /64's rate budget; the fifth, from yet another address, is over it.
	status, _, _, body = openRaw(&v6, from("[2001:db8:1:2:abcd::4]:50003"))
	require.Equal(t, http.StatusTooManyRequests, status, body)
	assert.Contains(t, body, "mcp.max_sessions_per_client")
	status, _, retry, body = openRaw(&v6, from("[2001:db8:1:2:abcd::5]:50004"))
	require.Equal(t, http.StatusTooManyRequests, status, body)
	assert.Contains(t, body, "mcp.rate_limit", "the /64 spent its rate budget")
	assert.NotEmpty(t, retry)

	// Another /64 is another client.
	status, sid, _, body := openRaw(&v6, from("[2001:db8:1:3::1]:50000"))
	require.Equal(t, http.StatusOK, status, body)
	assert.NotEmpty(t, sid)
	assert.Equal(t, 3, b.App.MCP().SessionStats().Live)
}

// TestSSERetry: from 2025-11-25 (SEP-1699: priming events, streams the
// server may close) every legacy SSE stream announces a reconnection
// delay in its first event: a POST's response stream, the GET stream and a
// resumed one. Older sessions and the stateless era, which have no
// resumable streams to come back to, get none.
func TestSSERetry(t *testing.T) {
	b := startBridge(t, nil)
	want := strconv.FormatInt(mcphttp.SSERetry.Milliseconds(), 10)
	// firstEvent reads a stream's first event; to its end when whole
	// (a stream that ends), else closing it after that event (the GET
	// stream, which would not end by itself).
	firstEvent := func(resp *http.Response, whole bool) sseEvent {
		t.Helper()
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.True(t, strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"))
		events := make(chan sseEvent, 16)
		go readSSE(resp.Body, events)
		ev, ok := <-events
		require.True(t, ok, "an event")
		if !whole {
			resp.Body.Close()
		}
		for range events {
		}
		return ev
	}

	sid := rawSession(b, "2025-11-25")
	hdr := map[string]string{"Mcp-Session-Id": sid, "MCP-Protocol-Version": "2025-11-25"}
	// The POST stream is read to its end: resuming it while it is still
	// being written would be a conflict (409).
	prime := firstEvent(do(b, rawRequest(b, "POST", `{"jsonrpc":"2.0","id":2,"method":"ping"}`, hdr)), true)
	assert.Equal(t, want, prime.Retry, "the POST stream's priming event")
	assert.Equal(t, "prime", prime.Name)
	require.NotEmpty(t, prime.ID)

	get := rawRequest(b, "GET", "", hdr)
	get.Header.Set("Accept", "text/event-stream")
	ctx, cancel := withTimeout(10 * time.Second)
	defer cancel()
	assert.Equal(t, want, firstEvent(do(b, get.WithContext(ctx)), false).Retry, "the GET stream")

	resume := rawRequest(b, "GET", "", hdr)
	resume.Header.Set("Accept", "text/event-stream")
	resume.Header.Set("Last-Event-ID", prime.ID)
	ev := firstEvent(do(b, resume.WithContext(ctx)), true)
	assert.Equal(t, want, ev.Retry, "a resumed stream")
	assert.Contains(t, ev.Data, `"id":2`, "replays what followed the priming event")

	old := rawSession(b, "2025-06-18")
	ev = firstEvent(do(b, rawRequest(b, "POST", `{"jsonrpc":"2.0","id":2,"method":"ping"}`,
		map[string]string{"Mcp-Session-Id": old, "MCP-Protocol-Version": "2025-06-18"})), true)
	assert.Empty(t, ev.Retry, "2025-06-18: no priming, no retry")

	ev = firstEvent(do(b, rawRequest(b, "POST", modernList, map[string]string{"MCP-Protocol-Version": modern, "Mcp-Method": "tools/list"})), true)
	assert.Empty(t, ev.Retry, "the stateless era resumes nothing")
}

// TestClosedServerRefusesInitialize: once the MCP server has closed (the
// bridge shutting down), /mcp refuses an initialize with 503. Handed to
// the go-sdk, it got a session of the closed server whose stream ended at
// once, before or after the result by chance: a 2025-11-25 client then
// failed to reconnect (the session was gone) or, just as often, connected.
func TestClosedServerRefusesInitialize(t *testing.T) {
	b := startBridge(t, nil)
	b.App.MCP().Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 50 {
		c := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "1"}, nil)
		cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: b.URL, HTTPClient: b.HTTP, MaxRetries: -1},
			&mcp.ClientSessionOptions{ProtocolVersion: legacy})
		if cs != nil {
			_ = cs.Close()
		}
		require.Error(t, err, "connect %d", i)
		require.Contains(t, err.Error(), "Service Unavailable", "connect %d", i)
	}
	status, _, body := rawStatus(b, "POST", initBody, nil)
	assert.Equal(t, http.StatusServiceUnavailable, status)
	assert.Contains(t, body, `"id":1`, "a JSON-RPC error for the initialize")
	assert.Contains(t, body, "closed")
}
