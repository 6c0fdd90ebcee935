package voice

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/require"
)

// blockingSide holds the upstream's request until its notification has
// been served.
type blockingSide struct {
	noted chan struct{}
	freed chan bool
}

func (s *blockingSide) SendText(context.Context, []byte) error { return nil }
func (s *blockingSide) SendAudio([]byte) bool                  { return true }
func (s *blockingSide) ServeMCP(ctx context.Context, p json.RawMessage) json.RawMessage {
	if strings.Contains(string(p), "notifications/cancelled") {
		close(s.noted)
		return nil
	}
	select {
	case <-s.noted:
		s.freed <- true
	case <-ctx.Done():
		s.freed <- false
	}
	return json.RawMessage(`{"jsonrpc":"2.0","id":1,"result":{}}`)
}

// A notifications/cancelled from the upstream reaches the board while the
// request it names is still running: notifications do not queue behind
// requests.
func TestNotificationsOvertakeRequests(t *testing.T) {
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		if _, _, err := c.ReadMessage(); err != nil {
			return
		}
		_ = c.WriteMessage(websocket.TextMessage, []byte(`{"type":"hello","transport":"websocket","session_id":"s1"}`))
		_ = c.WriteMessage(websocket.TextMessage, []byte(`{"session_id":"s1","type":"mcp","payload":{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow"}}}`))
		_ = c.WriteMessage(websocket.TextMessage, []byte(`{"session_id":"s1","type":"mcp","payload":{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}}`))
		for {
			if _, _, err := c.ReadMessage(); err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	r, err := NewRelay(Config{Upstream: "ws" + strings.TrimPrefix(srv.URL, "http")}, nil, nil)
	require.NoError(t, err)
	defer r.Close()
	side := &blockingSide{noted: make(chan struct{}), freed: make(chan bool, 1)}
	conv, _, err := r.Open(context.Background(), Board{DeviceID: "aa:bb:cc:dd:ee:ff", ProtocolVersion: 1}, []byte(`{"type":"hello"}`), side)
	require.NoError(t, err)
	defer conv.Close(ErrBoardLeft)
	select {
	case ok := <-side.freed:
		require.True(t, ok, "the request ended before the notification came")
	case <-time.After(10 * time.Second):
		t.Fatal("the notification waited behind the request")
	}
}
