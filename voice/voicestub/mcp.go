package voicestub

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
)

// MCP request ids, fixed as xiaozhi-esp32-server uses them: initialize is
// always 1 and every tools/list page is 2. Tool calls count up from 3 per
// connection (wrapping back to 3 past int32), so concurrent calls never
// share an id. (The real server counts its calls from 1; a relay has to
// remap ids either way.)
const (
	InitializeID = 1
	ToolsListID  = 2
	firstCallID  = 3
)

// InitializePayload is the initialize request the stub sends after its
// hello to a board whose hello said features.mcp.
const InitializePayload = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{"vision":{"url":"http://stub/vision","token":"x"}},"clientInfo":{"name":"voicestub","version":"1"}}}`

// InitializedPayload is the notification sent once initialize is answered.
const InitializedPayload = `{"jsonrpc":"2.0","method":"notifications/initialized"}`

// ToolsListPayload is the tools/list request for a page: no params for the
// first (cursor ""), {"cursor":...} for the next, as the real server does.
func ToolsListPayload(cursor string) []byte {
	if cursor == "" {
		return []byte(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	}
	c, _ := json.Marshal(cursor)
	return []byte(`{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"cursor":` + string(c) + `}}`)
}

// ToolError is an MCP error reply from the board.
type ToolError struct {
	// Message is error.message ("" if the reply could not be parsed).
	Message string
	// Raw is the reply's payload, or the whole text message when the
	// board sent invalid JSON (it does not escape error text).
	Raw json.RawMessage
}

func (e *ToolError) Error() string { return "voicestub: board answered error: " + e.Message }

type mcpReply struct {
	result json.RawMessage
	err    *ToolError
}

// rpcMsg is what the stub reads of a JSON-RPC message from the board.
type rpcMsg struct {
	ID     *json.Number    `json:"id"`
	Method *string         `json:"method"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// handleMCP records a board's mcp payload and hands a reply to the request
// waiting for its id. Replies to ids nobody waits for are only recorded.
func (c *conn) handleMCP(payload json.RawMessage) {
	c.s.update(c.rec, func(r *connRec) {
		if c.s.keep(r, len(r.MCPReplies), len(payload)) {
			r.MCPReplies = append(r.MCPReplies, payload)
		}
	})
	var m rpcMsg
	if json.Unmarshal(payload, &m) != nil || m.ID == nil || m.Method != nil {
		return
	}
	id, err := m.ID.Int64()
	if err != nil {
		return
	}
	switch {
	case m.Error != nil:
		c.deliver(id, mcpReply{err: &ToolError{Message: m.Error.Message, Raw: payload}})
	case m.Result != nil:
		c.deliver(id, mcpReply{result: m.Result})
	}
}

var brokenIDRE = regexp.MustCompile(`"payload":\{"jsonrpc":"2\.0","id":(-?[0-9]+),"error":`)

// handleBrokenMCP ends the call an unparsable error reply answers: the
// firmware pastes error text (a tool name with a quote) without escaping.
func (c *conn) handleBrokenMCP(data []byte) {
	m := brokenIDRE.FindSubmatch(data)
	if m == nil {
		return
	}
	id, err := strconv.ParseInt(string(m[1]), 10, 64)
	if err != nil {
		return
	}
	c.deliver(id, mcpReply{err: &ToolError{Raw: bytes.Clone(data)}})
}

func (c *conn) deliver(id int64, r mcpReply) {
	c.mcpMu.Lock()
	ch := c.pending[id]
	delete(c.pending, id) // the first answer counts
	c.mcpMu.Unlock()
	if ch != nil {
		ch <- r // buffered 1, one sender per registration
	}
}

// register reserves id (a fixed id) or, with id 0, the next call id.
func (c *conn) register(id int64) (int64, chan mcpReply, error) {
	c.mcpMu.Lock()
	defer c.mcpMu.Unlock()
	if id == 0 {
		if len(c.pending) >= maxPendingCalls {
			return 0, nil, ErrTooManyCalls
		}
		for {
			id = c.nextID
			c.nextID++
			if c.nextID > math.MaxInt32 {
				c.nextID = firstCallID
			}
			if c.pending[id] == nil {
				break
			}
		}
	} else if c.pending[id] != nil {
		return 0, nil, fmt.Errorf("voicestub: request id %d already pending", id)
	}
	ch := make(chan mcpReply, 1)
	c.pending[id] = ch
	return id, ch, nil
}

// unregister drops id's registration if it is still ch's.
func (c *conn) unregister(id int64, ch chan mcpReply) {
	c.mcpMu.Lock()
	if c.pending[id] == ch {
		delete(c.pending, id)
	}
	c.mcpMu.Unlock()
}

// call sends payload (a request with id, already registered as ch) and
// waits for its reply.
func (c *conn) call(ctx context.Context, id int64, ch chan mcpReply, payload []byte) (mcpReply, error) {
	defer c.unregister(id, ch)
	env := mustJSON(envelopeMsg{SessionID: c.sid, Type: "mcp", Payload: payload})
	if !c.sendText(env, nil) {
		return mcpReply{}, ErrConnectionClosed
	}
	select {
	case r := <-ch:
		return r, nil
	case <-c.done:
		return mcpReply{}, ErrConnectionClosed
	case <-ctx.Done():
		return mcpReply{}, ctx.Err()
	}
}

// request registers a fixed id and calls, bounded by MCPTimeout.
func (c *conn) request(id int64, payload []byte) (mcpReply, error) {
	_, ch, err := c.register(id)
	if err != nil {
		return mcpReply{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.s.cfg.MCPTimeout)
	defer cancel()
	return c.call(ctx, id, ch, payload)
}

// listTools runs the real server's sequence: initialize (id 1), then
// notifications/initialized, then tools/list (id 2) page by page.
func (c *conn) listTools() {
	fail := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		c.s.update(c.rec, func(r *connRec) { r.MCPError = msg })
		c.log.Info("mcp listing stopped", zap.String("reason", msg))
	}
	rep, err := c.request(InitializeID, []byte(InitializePayload))
	switch {
	case err != nil:
		fail("initialize: %v", err)
		return
	case rep.err != nil:
		fail("initialize: %s", rep.err.Message)
		return
	}
	c.s.update(c.rec, func(r *connRec) { r.InitializeResult = rep.result })
	env := mustJSON(envelopeMsg{SessionID: c.sid, Type: "mcp", Payload: json.RawMessage(InitializedPayload)})
	if !c.sendText(env, nil) {
		return
	}
	cursor := ""
	for page := 0; ; page++ {
		if page == c.s.cfg.MaxToolPages {
			fail("tools/list: more than %d pages", c.s.cfg.MaxToolPages)
			return
		}
		rep, err := c.request(ToolsListID, ToolsListPayload(cursor))
		switch {
		case err != nil:
			fail("tools/list: %v", err)
			return
		case rep.err != nil:
			fail("tools/list: %s", rep.err.Message)
			return
		}
		var res struct {
			Tools      []json.RawMessage `json:"tools"`
			NextCursor json.RawMessage   `json:"nextCursor"`
		}
		if err := json.Unmarshal(rep.result, &res); err != nil {
			fail("tools/list: result: %v", err)
			return
		}
		var next string
		_ = json.Unmarshal(res.NextCursor, &next) // absent or not a string: last page
		c.s.update(c.rec, func(r *connRec) {
			if c.s.keep(r, len(r.ToolPages), len(rep.result)) {
				r.ToolPages = append(r.ToolPages, rep.result)
			}
			for _, t := range res.Tools {
				if c.s.keep(r, len(r.Tools), 0) { // bytes charged with the page
					r.Tools = append(r.Tools, t)
				}
			}
			r.ToolsListed = next == ""
		})
		if next == "" {
			c.log.Debug("tools listed", zap.Int("pages", page+1))
			return
		}
		cursor = next
	}
}

// CallTool calls a tool on deviceID's newest live connection whose hello
// announced MCP and has been answered, and returns the result as the board
// sent it. Ids count up from 3 on each connection. An error reply is a
// *ToolError; ErrNoDevice, ErrConnectionClosed, ErrTooManyCalls and ctx's
// error are the others. args nil sends {}.
func (s *Server) CallTool(ctx context.Context, deviceID, name string, args any) (json.RawMessage, error) {
	argJSON := json.RawMessage(`{}`)
	if args != nil {
		b, err := json.Marshal(args)
		if err != nil {
			return nil, fmt.Errorf("voicestub: arguments: %w", err)
		}
		argJSON = b
	}
	params := mustJSON(struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}{name, argJSON})
	c := s.mcpConn(deviceID)
	if c == nil {
		return nil, ErrNoDevice
	}
	id, ch, err := c.register(0)
	if err != nil {
		return nil, err
	}
	payload := []byte(`{"jsonrpc":"2.0","id":` + strconv.FormatInt(id, 10) + `,"method":"tools/call","params":` + string(params) + `}`)
	start := time.Now()
	rep, err := c.call(ctx, id, ch, payload)
	c.log.Debug("tool call", zap.String("tool", name), zap.Int64("id", id),
		zap.Duration("took", time.Since(start)), zap.Error(err))
	if err != nil {
		return nil, err
	}
	if rep.err != nil {
		return nil, rep.err
	}
	return rep.result, nil
}

// mcpConn is deviceID's newest live connection able to take tool calls.
func (s *Server) mcpConn(deviceID string) *conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	var best *conn
	for c := range s.live {
		r := c.rec
		if strings.EqualFold(r.DeviceID, deviceID) && r.HelloMCP && r.HelloSent && !r.Closed &&
			(best == nil || r.ID > best.rec.ID) {
			best = c
		}
	}
	return best
}
