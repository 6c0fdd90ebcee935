package app_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/internal/bridgetest"
	"github.com/devicebridge/devicebridge/simulator"
)

// keepAlive opens a connection, completes one request on it and leaves it
// open, idle, as a keep-alive client does. It returns nil when the
// listener refused the connection (a 503 that closes it, or a close before
// any answer), and an error when the server neither answered nor closed.
func keepAlive(addr net.Addr, path string) (net.Conn, error) {
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(obsWait))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, addr); err != nil {
		_ = c.Close()
		return nil, nil
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		_ = c.Close()
		return nil, errors.New("the server neither answered nor closed the connection")
	}
	if err != nil {
		_ = c.Close()
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

// served reports whether the listener serves a new connection now.
func served(addr net.Addr, path string) bool {
	c, err := keepAlive(addr, path)
	if c != nil {
		_ = c.Close()
	}
	return c != nil && err == nil
}

// closedByServer waits until the server closes c (EOF or reset), reading
// and dropping whatever it answers first. It fails if the server still
// holds the connection after obsWait.
func closedByServer(t *testing.T, c net.Conn) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(obsWait)))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the server still holds the connection")
}

// TestListenerConnectionCaps: each listener holds at most its cap of
// connections (idle keep-alives included); past it a connection is
// refused at once, counted and logged; a freed slot serves again. Before
// the caps, 19,800 idle keep-alive connections were all held.
func TestListenerConnectionCaps(t *testing.T) {
	noLeaks(t)
	cfg := testConfig()
	cfg.HTTP.ControlMaxConnections = 4
	cfg.HTTP.DeviceMaxConnections = 4
	cfg.WebSocket.MaxConnections = 2
	a, base := startApp(t, cfg)

	for _, l := range []struct {
		name string
		addr net.Addr
		path string
	}{{"control", a.ControlAddr(), "/readyz"}, {"device", a.DeviceAddr(), "/xiaozhi/ota/"}} {
		var held []net.Conn
		refused := 0
		for range 200 {
			c, err := keepAlive(l.addr, l.path)
			require.NoError(t, err, l.name)
			if c == nil {
				refused++
				continue
			}
			held = append(held, c)
		}
		assert.Equal(t, 4, len(held), "%s: the cap's worth of idle connections is held", l.name)
		assert.Equal(t, 196, refused, l.name)
		require.False(t, served(l.addr, l.path), "%s: full", l.name)
		for _, c := range held {
			require.NoError(t, c.Close())
		}
		require.Eventually(t, func() bool { return served(l.addr, l.path) }, obsWait, 5*time.Millisecond,
			"%s: freed slots serve again", l.name)
	}
	scrape := scrapeMetrics(t, &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}, base)
	for _, name := range []string{"control", "device"} {
		assert.Equal(t, 4.0, scrape[metricSeries("devicebridge_http_connections_max", "listener", name)])
		assert.GreaterOrEqual(t, scrape[metricSeries("devicebridge_http_connections_refused_total", "listener", name)], 197.0)
	}
	for _, limit := range []string{"max_sessions", "max_sessions_per_client"} {
		assert.Contains(t, scrape, metricSeries("devicebridge_mcp_sessions_refused_total", "limit", limit))
	}
	assert.Contains(t, scrape, "devicebridge_mcp_sessions_idle_closed_total")
}

// TestIdleConnectionsClosed: a keep-alive connection idle for
// http.idle_timeout is closed, on both listeners. Before, it was held for
// ever.
func TestIdleConnectionsClosed(t *testing.T) {
	noLeaks(t)
	cfg := testConfig()
	cfg.HTTP.IdleTimeout = 100 * time.Millisecond
	a, _ := startApp(t, cfg)
	for _, addr := range []net.Addr{a.ControlAddr(), a.DeviceAddr()} {
		c, err := keepAlive(addr, "/readyz")
		require.NoError(t, err)
		require.NotNil(t, c)
		closedByServer(t, c)
		_ = c.Close()
	}
}

// slowPOST starts a POST whose body arrives a byte at a time, for as long
// as the server takes it, and returns the connection. The dribble stops
// when a write fails or the test ends.
func slowPOST(t *testing.T, addr net.Addr, path string) net.Conn {
	t.Helper()
	return bridgetest.Dribble(t, addr, fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"+
		"Device-Id: 02:00:00:00:00:09\r\nClient-Id: 5b1c2a3e-0000-4000-8000-000000000009\r\nContent-Length: 100000\r\n\r\n{", path, addr), ' ')
}

// TestSlowBodiesCutOff: a request whose body dribbles in is dropped once
// http.read_timeout has passed since it started, on the device listener
// (OTA) and on the control listener (/api, /mcp). Before, 300 OTA POSTs
// sending a byte every 5 s were all held.
func TestSlowBodiesCutOff(t *testing.T) {
	noLeaks(t)
	cfg := testConfig()
	cfg.HTTP.ReadTimeout = 300 * time.Millisecond
	a, _ := startApp(t, cfg)
	for _, target := range []struct {
		addr net.Addr
		path string
	}{
		{a.DeviceAddr(), "/xiaozhi/ota/"},
		{a.ControlAddr(), "/mcp"},
		{a.ControlAddr(), "/api/devices/02:00:00:00:00:09/call"},
	} {
		closedByServer(t, slowPOST(t, target.addr, target.path))
	}
}

// TestStreamsOutliveTimeouts: with read, write and idle timeouts far
// shorter than the test, what is in use keeps working past them: an
// /api/events stream and an MCP host's GET stream that stay silent longer
// than the write timeout and then deliver, a board's WebSocket, and an /api
// call that waits for its board longer than the read and write timeouts.
// (A naive fix, net/http's ReadTimeout and WriteTimeout alone, cancels the
// streams and the waiting call.)
func TestStreamsOutliveTimeouts(t *testing.T) {
	noLeaks(t)
	const short = 200 * time.Millisecond
	cfg := testConfig()
	cfg.HTTP.ReadHeaderTimeout, cfg.HTTP.ReadTimeout, cfg.HTTP.WriteTimeout, cfg.HTTP.IdleTimeout = short, short, short, short
	release := make(chan struct{})
	a, base := startApp(t, cfg)
	obsBoard(t, a, simulator.Config{MAC: "02:00:00:00:00:01", Hold: map[string]<-chan struct{}{"self.lamp.turn_on": release}})
	waitReady(t, base, 1)

	events := openSSE(t, http.DefaultClient, base+"/api/events", "")
	var mu sync.Mutex
	changed := 0
	client := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "1"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { mu.Lock(); changed++; mu.Unlock() },
	})
	ctx, cancel := context.WithTimeout(context.Background(), obsWait)
	defer cancel()
	// No keep-alive: an idle connection the server closes (idle timeout)
	// must not fail a request that picks it up.
	noReuse := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: noReuse, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	require.NoError(t, err)
	defer cs.Close()

	// A call its board holds until told.
	type answer struct {
		status int
		body   string
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := noReuse.Post(base+"/api/devices/02:00:00:00:00:01/call", "application/json",
			strings.NewReader(`{"name":"self.lamp.turn_on","arguments":{}}`))
		if err != nil {
			answered <- answer{body: err.Error()}
			return
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		answered <- answer{resp.StatusCode, string(data)}
	}()

	// A clock: the server drops this slow request only once the timeouts
	// have passed since it began, which is after everything above.
	closedByServer(t, slowPOST(t, a.ControlAddr(), "/api/devices/02:00:00:00:00:09/call"))

	// The held call is still waiting; the board's socket still works.
	close(release)
	got := <-answered
	require.Equal(t, http.StatusOK, got.status, got.body)

	// The silent streams deliver the next board.
	obsBoard(t, a, simulator.Config{MAC: "02:00:00:00:00:02"})
	for {
		ev := nextSSE(t, events)
		if ev.Event == "online" && ev.Data["device_id"] == "02:00:00:00:00:02" {
			break
		}
	}
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return changed > 0 }, obsWait, 5*time.Millisecond,
		"the MCP host's GET stream delivered list_changed")
	res, err := cs.ListTools(ctx, nil)
	require.NoError(t, err)
	assert.NotEmpty(t, res.Tools)
}
