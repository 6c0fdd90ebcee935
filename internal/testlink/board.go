package testlink

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
)

// Request is a JSON-RPC request as a scripted board sees it. ID is kept as
// a number literal so tests can check the bridge sends integers.
type Request struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.Number     `json:"id"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params"`
}

// Board is a scripted MCP board on one end of a Pair: it answers each
// request with what Reply returns (a raw JSON-RPC payload, "" for no
// reply), one request at a time, as the firmware does. It is the one fake
// board of the unit tests above the transports; integration tests use the
// simulator over real sockets.
type Board struct {
	link  *Link
	reply func(Request) string

	mu   sync.Mutex
	seen []Request
	errs []error
	wg   sync.WaitGroup
}

// NewBoard starts a board reading link. Call Close to stop it.
func NewBoard(link *Link, reply func(Request) string) *Board {
	b := &Board{link: link, reply: reply}
	b.wg.Add(1)
	go b.run()
	return b
}

func (b *Board) run() {
	defer b.wg.Done()
	for {
		msg, err := b.link.Receive(context.Background())
		if err != nil {
			return
		}
		// Decoded by hand: envelope's own tests use this package.
		var env struct {
			Type    string          `json:"type"`
			Payload json.RawMessage `json:"payload"`
		}
		if err := json.Unmarshal(msg, &env); err != nil || env.Type != "mcp" {
			b.fail(fmt.Errorf("bridge sent a message that is not an mcp envelope: %q", msg))
			continue
		}
		var r Request
		dec := json.NewDecoder(strings.NewReader(string(env.Payload)))
		dec.UseNumber()
		if err := dec.Decode(&r); err != nil {
			b.fail(fmt.Errorf("bridge sent bad JSON-RPC: %w", err))
			continue
		}
		b.mu.Lock()
		b.seen = append(b.seen, r)
		b.mu.Unlock()
		if out := b.reply(r); out != "" {
			_ = b.link.Send(context.Background(), []byte(`{"session_id":"","type":"mcp","payload":`+out+`}`))
		}
	}
}

func (b *Board) fail(err error) {
	b.mu.Lock()
	b.errs = append(b.errs, err)
	b.mu.Unlock()
}

// Requests returns every request seen so far, in order.
func (b *Board) Requests() []Request {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]Request(nil), b.seen...)
}

// Count returns how many requests of method were seen.
func (b *Board) Count(method string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, r := range b.seen {
		if r.Method == method {
			n++
		}
	}
	return n
}

// Errs returns what the bridge sent that was not valid MCP.
func (b *Board) Errs() []error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]error(nil), b.errs...)
}

// Close closes the board's link and waits for its goroutine.
func (b *Board) Close() {
	b.link.Close(nil)
	b.wg.Wait()
}

// Result is a success reply to r.
func Result(r Request, result string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":%s}`, r.ID, result)
}

// ErrorReply is an error reply to r the way boards send it: a message and
// no code.
func ErrorReply(r Request, msg string) string {
	m, _ := json.Marshal(msg)
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"error":{"message":%s}}`, r.ID, m)
}
