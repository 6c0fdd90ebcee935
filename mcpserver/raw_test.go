package mcpserver_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Raw HTTP, for what a go-sdk client hides: status codes, headers and the
// exact events on a stream.

type sseEvent struct {
	ID, Name, Data, Retry string
}

// readSSE sends the events of an SSE body to the channel, closing it at the
// end of the body.
func readSSE(body io.Reader, out chan<- sseEvent) {
	defer close(out)
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var ev sseEvent
	seen := false
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			if seen {
				out <- ev
			}
			ev, seen = sseEvent{}, false
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "id":
			ev.ID, seen = value, true
		case "event":
			ev.Name, seen = value, true
		case "data":
			ev.Data, seen = value, true
		case "retry":
			ev.Retry, seen = value, true
		}
	}
}

// rawRequest builds a request to /mcp with the headers a client sends.
func rawRequest(b *bridge, method, body string, headers map[string]string) *http.Request {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, b.URL, r)
	require.NoError(b.T, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	return req
}

func do(b *bridge, req *http.Request) *http.Response {
	resp, err := b.HTTP.Do(req)
	require.NoError(b.T, err)
	return resp
}

// rawStatus sends a request and returns the status, closing the body.
func rawStatus(b *bridge, method, body string, headers map[string]string) (int, http.Header, string) {
	resp := do(b, rawRequest(b, method, body, headers))
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(data)
}

// rawMessage reads the single JSON-RPC message of a response (SSE or JSON).
func rawMessage(t testing.TB, resp *http.Response) map[string]any {
	t.Helper()
	defer resp.Body.Close()
	var data string
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		events := make(chan sseEvent, 16)
		go readSSE(resp.Body, events)
		for ev := range events {
			if ev.Data != "" {
				data = ev.Data
			}
		}
	} else {
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		data = string(raw)
	}
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(data), &m), "body %q", data)
	return m
}

// rawSession opens a legacy session by hand and returns its id.
func rawSession(b *bridge, version string) string {
	t := b.T
	t.Helper()
	resp := do(b, rawRequest(b, "POST", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"`+version+
		`","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`, nil))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	sid := resp.Header.Get("Mcp-Session-Id")
	msg := rawMessage(t, resp)
	require.Contains(t, msg, "result")
	require.NotEmpty(t, sid)
	status, _, _ := rawStatus(b, "POST", `{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		map[string]string{"Mcp-Session-Id": sid, "MCP-Protocol-Version": version})
	require.Equal(t, http.StatusAccepted, status)
	return sid
}

// nextEvent waits for the next event on a stream.
func nextEvent(t testing.TB, events <-chan sseEvent, within time.Duration) (sseEvent, bool) {
	t.Helper()
	select {
	case ev, ok := <-events:
		return ev, ok
	case <-time.After(within):
		t.Fatalf("no event within %v", within)
		return sseEvent{}, false
	}
}

// isResponseTo reports whether an event carries the JSON-RPC response to id.
func isResponseTo(ev sseEvent, id float64) bool {
	var m struct {
		ID     any     `json:"id"`
		Method *string `json:"method"`
	}
	if json.Unmarshal([]byte(ev.Data), &m) != nil || m.Method != nil {
		return false
	}
	f, ok := m.ID.(float64)
	return ok && f == id
}

func withTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}
