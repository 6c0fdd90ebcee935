//go:build faults

package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// deviceHello is what current firmware sends first (firmware-protocol.md
// §3.4).
const deviceHello = `{"type":"hello","version":1,"features":{"mcp":true},"transport":"websocket","audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`

// dialDevice opens a raw device WebSocket with the headers a board sends.
func dialDevice(url, mac, token string, extra http.Header) (*websocket.Conn, *http.Response, error) {
	h := http.Header{"Protocol-Version": {"1"}, "Client-Id": {"0b9c3d5e-0000-4000-8000-000000000000"}}
	if mac != "" {
		h.Set("Device-Id", mac)
	}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	for k, v := range extra {
		h[k] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
	return d.DialContext(ctx, url, h)
}

// rpcRequest is a request the bridge sent to a fake board.
type rpcRequest struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
}

// handler answers one request with raw frames (sent first, as they are:
// binary when they start with a byte past ASCII) and raw JSON-RPC payloads
// (each sent as the payload of an mcp envelope); nil sends nothing.
type handler func(req rpcRequest) (payloads []string, frames []string)

// fakeBoard is a scripted board over a real WebSocket: it does the hello
// exchange like firmware, then answers each MCP request as its handler
// says.
type fakeBoard struct {
	conn *websocket.Conn
	sid  string
	mu   sync.Mutex // serialises writes
	wg   sync.WaitGroup
	done chan struct{} // closed when the socket ends
	err  error         // why it ended, set before done closes
}

// startFake connects, exchanges hellos and serves h until the socket
// closes. The test's cleanup closes it and waits for its goroutine.
func startFake(t *testing.T, url, mac, token string, h handler) (*fakeBoard, error) {
	conn, _, err := dialDevice(url, mac, token, nil)
	if err != nil {
		return nil, err
	}
	f := &fakeBoard{conn: conn, done: make(chan struct{})}
	t.Cleanup(f.close)
	if err := conn.WriteMessage(websocket.TextMessage, []byte(deviceHello)); err != nil {
		return nil, err
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, msg, err := conn.ReadMessage()
	if err != nil {
		return nil, fmt.Errorf("no server hello: %w", err)
	}
	_ = conn.SetReadDeadline(time.Time{})
	var hello struct {
		SessionID string `json:"session_id"`
	}
	if err := json.Unmarshal(msg, &hello); err != nil {
		return nil, err
	}
	f.sid = hello.SessionID
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		f.serve(h)
	}()
	return f, nil
}

func (f *fakeBoard) serve(h handler) {
	for {
		kind, msg, err := f.conn.ReadMessage()
		if err != nil {
			f.err = err
			close(f.done)
			return
		}
		if kind != websocket.TextMessage {
			continue
		}
		var env struct {
			Type    string     `json:"type"`
			Payload rpcRequest `json:"payload"`
		}
		if json.Unmarshal(msg, &env) != nil || env.Type != "mcp" || env.Payload.Method == "" {
			continue
		}
		payloads, frames := h(env.Payload)
		for _, fr := range frames {
			_ = f.send(fr)
		}
		for _, p := range payloads {
			_ = f.sendPayload(p)
		}
	}
}

func (f *fakeBoard) sendPayload(p string) error {
	return f.send(`{"session_id":"` + f.sid + `","type":"mcp","payload":` + p + `}`)
}

func (f *fakeBoard) send(frame string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	typ := websocket.TextMessage
	if len(frame) > 0 && frame[0] > 0x7f {
		typ = websocket.BinaryMessage
	}
	_ = f.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	return f.conn.WriteMessage(typ, []byte(frame))
}

func (f *fakeBoard) close() {
	_ = f.conn.Close()
	f.wg.Wait()
}

// closeText is the server's close reason once the socket has ended ("" if
// it has not, or ended without a close frame). A close frame without text
// gives its code: 1009 is gorilla's own answer to a frame past the read
// limit.
func (f *fakeBoard) closeText() string {
	select {
	case <-f.done:
	default:
		return ""
	}
	return closeReason(f.err)
}

func closeReason(err error) string {
	var ce *websocket.CloseError
	if !errors.As(err, &ce) {
		return ""
	}
	if ce.Text == "" {
		return fmt.Sprintf("close %d", ce.Code)
	}
	return ce.Text
}

// Replies of a well-behaved board.
const (
	initResult  = `{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"fake-board","version":"2.4.2"}}`
	toolsResult = `{"tools":[{"name":"self.ping","description":"answers pong","inputSchema":{"type":"object","properties":{}}}]}`
	callResult  = `{"content":[{"type":"text","text":"pong"}],"isError":false}`
)

func result(id json.RawMessage, res string) string {
	return `{"jsonrpc":"2.0","id":` + string(id) + `,"result":` + res + `}`
}

// wellBehaved answers initialize, one page of tools/list and tools/call.
func wellBehaved(req rpcRequest) ([]string, []string) {
	switch req.Method {
	case "initialize":
		return []string{result(req.ID, initResult)}, nil
	case "tools/list":
		return []string{result(req.ID, toolsResult)}, nil
	case "tools/call":
		return []string{result(req.ID, callResult)}, nil
	}
	return nil, nil
}
