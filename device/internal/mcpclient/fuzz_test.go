package mcpclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/devicebridge/devicebridge/envelope"
	"github.com/devicebridge/devicebridge/internal/testlink"
)

// FuzzBoardReply feeds arbitrary bytes to the client as a board's reply to
// initialize, tools/list or tools/call, through the envelope stream over
// an in-memory link. "$ID" in the input becomes the id of the request
// being answered, so the fuzzer can reach the decoding of matched replies.
// The board answers up to three requests, then drops the link (at once
// when no next request comes). Whatever
// the bytes, the client must not panic or hang, and must end with a result
// or one of its documented errors.
func FuzzBoardReply(f *testing.F) {
	for _, seed := range []struct {
		op    byte
		reply string
	}{
		{0, `{"jsonrpc":"2.0","id":$ID,"result":{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"b","version":"2.4.2"}}}`},
		{0, `{"jsonrpc":"2.0","id":$ID,"error":{"message":"no "quotes" here"}}`},
		{0, `{"jsonrpc":"2.0","id":"$ID","result":{}}`},
		{1, `{"jsonrpc":"2.0","id":$ID,"result":{"tools":[{"name":"self.a","inputSchema":{"type":"object","properties":{}}}],"nextCursor":"self.a"}}`},
		{1, `{"jsonrpc":"2.0","id":$ID,"result":{"tools":[{"name":""}]}}`},
		{1, `{"jsonrpc":"2.0","id":$ID,"result":{"tools":{},"nextCursor":5}}`},
		{2, `{"jsonrpc":"2.0","id":$ID,"result":{"content":[{"type":"text","text":"true"}],"isError":false}}`},
		{2, `{"jsonrpc":"2.0","id":$ID,"result":{"content":"x","isError":"yes"}}`},
		{2, `[{"jsonrpc":"2.0","id":$ID,"result":null}]`},
		{2, "\x00\xff{"},
	} {
		f.Add(seed.op, []byte(seed.reply))
	}
	f.Fuzz(func(t *testing.T, op byte, reply []byte) {
		client, board := testlink.Pair(8)
		c := New(envelope.NewStream(client, envelope.StreamOptions{}), Options{
			RequestTimeout: 2 * time.Second, CallTimeout: 2 * time.Second, MaxPages: 4, MaxTools: 16,
		})
		defer c.Close()
		boardDone := make(chan struct{})
		go func() {
			defer close(boardDone)
			for i := range 3 {
				// A request the client does not send soon (it is done, or
				// waits for a reply it will never get) ends the board.
				within := 20 * time.Millisecond
				if i == 0 {
					within = 2 * time.Second
				}
				ctx, cancel := context.WithTimeout(context.Background(), within)
				msg, err := board.Receive(ctx)
				cancel()
				if err != nil {
					break
				}
				var env struct {
					Payload struct {
						ID json.RawMessage `json:"id"`
					} `json:"payload"`
				}
				_ = json.Unmarshal(msg, &env)
				p := bytes.ReplaceAll(reply, []byte("$ID"), env.Payload.ID)
				// Both as the payload of an mcp envelope and as a message
				// of its own, as a confused board might send it.
				framed := append(append([]byte(`{"session_id":"","type":"mcp","payload":`), p...), '}')
				_ = board.Send(context.Background(), framed)
				_ = board.Send(context.Background(), p)
			}
			board.Close(errors.New("board gone"))
		}()

		done := make(chan error, 1)
		go func() {
			ctx := context.Background()
			var err error
			switch op % 3 {
			case 0:
				_, err = c.Initialize(ctx)
			case 1:
				_, err = c.ListTools(ctx)
			default:
				_, err = c.CallTool(ctx, "self.a", json.RawMessage(`{"x":1}`))
			}
			done <- err
		}()
		var err error
		select {
		case err = <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("op %d hangs on reply %q", op%3, reply)
		}
		board.Close(errors.New("test over"))
		<-boardDone
		if err == nil {
			return
		}
		var de *DeviceError
		for _, known := range []error{ErrDisconnected, ErrBadReply, ErrCursorLoop, ErrTooManyPages, ErrTooManyTools, ErrListTooLarge, ErrTimeout} {
			if errors.Is(err, known) {
				return
			}
		}
		if errors.As(err, &de) {
			return
		}
		t.Fatalf("op %d: reply %q: undocumented error %T: %v", op%3, reply, err, err)
	})
}
