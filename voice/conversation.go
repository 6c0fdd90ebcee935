package voice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/envelope"
)

// maxEarly bounds the upstream messages that arrive before its hello and
// are delivered after it.
const maxEarly = 16

// Errors that end a conversation.
var (
	ErrBoardLeft      = errors.New("voice: the board ended the conversation")
	ErrUpstreamClosed = errors.New("voice: the upstream closed the conversation")
	ErrUpstreamSlow   = errors.New("voice: the upstream did not take a message in time (voice.write_timeout)")
	ErrBoardSlow      = errors.New("voice: the board did not take a message in time")
)

type frame struct {
	binary bool
	data   []byte
}

// Conversation is one board's open conversation with its upstream.
type Conversation struct {
	r     *Relay
	board Board
	up    string
	side  BoardSide
	log   *zap.Logger
	ws    *websocket.Conn

	sessionID string

	out chan frame           // board → upstream
	mcp chan json.RawMessage // upstream MCP requests → board
	// notes admits the upstream's notifications being written to the
	// board (notifyBoard).
	notes chan struct{}
	done  chan struct{}
	ctx   context.Context // ends with the conversation: bounds MCP waits
	stop  context.CancelFunc

	mu     sync.Mutex
	reason error
	once   sync.Once
	wg     sync.WaitGroup
}

func newConversation(r *Relay, b Board, up string, side BoardSide) *Conversation {
	ctx, stop := context.WithCancel(context.Background())
	return &Conversation{
		r: r, board: b, up: up, side: side,
		log:   r.log.With(zap.String("device_id", b.DeviceID), zap.String("transport", b.Transport)),
		out:   make(chan frame, r.cfg.QueueFrames),
		mcp:   make(chan json.RawMessage, r.cfg.MCPQueue),
		notes: make(chan struct{}, r.cfg.MCPQueue),
		done:  make(chan struct{}),
		ctx:   ctx, stop: stop,
	}
}

// SessionID is the id the board was given for this conversation.
func (c *Conversation) SessionID() string { return c.sessionID }

// Done is closed once the conversation has ended.
func (c *Conversation) Done() <-chan struct{} { return c.done }

// Err is why the conversation ended, once Done is closed.
func (c *Conversation) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reason
}

// start dials, exchanges hellos and starts the goroutines.
func (c *Conversation) start(ctx context.Context, hello []byte) (ServerHello, error) {
	ctx, cancel := context.WithTimeout(ctx, c.r.cfg.HelloTimeout)
	defer cancel()
	// Closing the conversation (the relay shutting down) ends the dial.
	stopLink := context.AfterFunc(c.ctx, cancel)
	defer stopLink()
	ws, err := c.r.dial(ctx, c.up, c.board)
	if err != nil {
		return ServerHello{}, err
	}
	c.mu.Lock()
	select {
	case <-c.done:
		c.mu.Unlock()
		_ = ws.Close()
		return ServerHello{}, ErrClosed
	default:
	}
	c.ws = ws
	c.mu.Unlock()
	deadline, _ := ctx.Deadline()
	_ = ws.SetWriteDeadline(deadline)
	if err := ws.WriteMessage(websocket.TextMessage, hello); err != nil {
		return ServerHello{}, fmt.Errorf("voice: sending hello upstream: %w", err)
	}
	// The read deadline also ends the wait when ctx ends first.
	stopWatch := context.AfterFunc(ctx, func() { _ = ws.SetReadDeadline(time.Now()) })
	defer stopWatch()
	_ = ws.SetReadDeadline(deadline)
	var early []frame
	for {
		kind, data, err := ws.ReadMessage()
		if err != nil {
			if ctx.Err() != nil {
				return ServerHello{}, fmt.Errorf("%w (%v)", ErrNoHello, c.r.cfg.HelloTimeout)
			}
			return ServerHello{}, fmt.Errorf("voice: upstream closed before its hello: %w", err)
		}
		if kind == websocket.TextMessage {
			if env, err := envelope.Decode(data, int(c.r.cfg.MaxMessage)); err == nil && env.Type == envelope.TypeHello {
				sh, err := parseServerHello(env.Raw)
				if err != nil {
					return ServerHello{}, err
				}
				c.sessionID = sh.SessionID
				_ = ws.SetReadDeadline(time.Time{})
				c.wg.Add(3)
				go c.read(early)
				go c.write()
				go c.serveMCP()
				return sh, nil
			}
		}
		if len(early) < maxEarly {
			early = append(early, frame{binary: kind == websocket.BinaryMessage, data: data})
		}
	}
}

// abandon releases a conversation whose start failed.
func (c *Conversation) abandon() {
	c.finish(nil)
	c.r.forget(c)
}

// Text queues a board's conversation message (listen, abort, ...) for the
// upstream.
func (c *Conversation) Text(msg []byte) { c.queue(frame{data: msg}) }

// queue waits at most WriteTimeout for room for a message that must not be
// dropped; past that the upstream is too slow and the conversation ends.
func (c *Conversation) queue(f frame) {
	select {
	case c.out <- f:
		return
	case <-c.done:
		return
	default:
	}
	t := time.NewTimer(c.r.cfg.WriteTimeout)
	defer t.Stop()
	select {
	case c.out <- f:
	case <-c.done:
	case <-t.C:
		c.finish(ErrUpstreamSlow)
	}
}

// Audio queues one audio frame from the board; a full queue drops it, as
// a board drops audio it cannot play in time.
func (c *Conversation) Audio(data []byte) {
	select {
	case <-c.done:
		return
	default:
	}
	select {
	case c.out <- frame{binary: true, data: data}:
	default:
		c.r.stats.droppedUp.Add(1)
	}
}

// Notify passes a board's MCP notification to the upstream.
func (c *Conversation) Notify(payload json.RawMessage) {
	msg, err := envelope.Encode(c.sessionID, envelope.TypeMCP, payload)
	if err != nil {
		return
	}
	select {
	case c.out <- frame{data: msg}:
	case <-c.done:
	default:
		c.r.stats.droppedUp.Add(1)
	}
}

// Close ends the conversation with reason; its goroutines end soon after
// (Relay.Close waits for them). The upstream socket closes with it; the
// board is the transport's. It may be called from a BoardSide callback.
func (c *Conversation) Close(reason error) { c.finish(reason) }

// finish records the reason and tears the socket down once.
func (c *Conversation) finish(reason error) {
	c.once.Do(func() {
		c.mu.Lock()
		c.reason = reason
		ws := c.ws
		close(c.done)
		c.mu.Unlock()
		c.stop()
		if ws != nil {
			// A close frame first when the board left, so the upstream
			// ends its session at once; the socket goes either way.
			_ = ws.WriteControl(websocket.CloseMessage,
				websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
			_ = ws.Close()
		}
	})
}

// read is the upstream socket's only reader: text and audio go to the
// board in the order they came, MCP to the worker.
func (c *Conversation) read(early []frame) {
	defer c.wg.Done()
	defer c.ended()
	for _, f := range early {
		if !c.toBoard(f.binary, f.data) {
			return
		}
	}
	for {
		kind, data, err := c.ws.ReadMessage()
		if err != nil {
			select {
			case <-c.done:
			default:
				c.finish(fmt.Errorf("%w: %v", ErrUpstreamClosed, err))
			}
			return
		}
		if !c.toBoard(kind == websocket.BinaryMessage, data) {
			return
		}
	}
}

// toBoard hands one upstream message on; false ends the reader.
func (c *Conversation) toBoard(binary bool, data []byte) bool {
	if binary {
		c.r.stats.framesDown.Add(1)
		c.r.stats.bytesDown.Add(int64(len(data)))
		if !c.side.SendAudio(data) {
			c.r.stats.droppedDown.Add(1)
		}
		return true
	}
	env, err := envelope.Decode(data, int(c.r.cfg.MaxMessage))
	if err != nil {
		c.r.stats.malformed.Add(1)
		return true
	}
	switch env.Type {
	case envelope.TypeMCP:
		if env.Payload == nil {
			c.r.stats.malformed.Add(1)
			return true
		}
		if isNotification(env.Payload) {
			c.notifyBoard(env.Payload)
			return true
		}
		select {
		case c.mcp <- env.Payload:
		default:
			c.r.stats.mcpRefused.Add(1)
			c.reply(busyReply(env.Payload, c.r.cfg.MCPQueue))
		}
		return true
	case envelope.TypeHello:
		// A second hello would change the board's session under the
		// relay; the conversation keeps the first.
		c.r.stats.malformed.Add(1)
		return true
	}
	c.r.stats.textDown.Add(1)
	ctx, cancel := context.WithTimeout(c.ctx, c.r.cfg.WriteTimeout)
	err = c.side.SendText(ctx, env.Raw)
	cancel()
	if err != nil {
		c.finish(fmt.Errorf("%w: %v", ErrBoardSlow, err))
		return false
	}
	return true
}

// write is the upstream socket's only writer.
func (c *Conversation) write() {
	defer c.wg.Done()
	for {
		select {
		case f := <-c.out:
			kind := websocket.TextMessage
			if f.binary {
				kind = websocket.BinaryMessage
			}
			_ = c.ws.SetWriteDeadline(time.Now().Add(c.r.cfg.WriteTimeout))
			if err := c.ws.WriteMessage(kind, f.data); err != nil {
				c.finish(fmt.Errorf("%w: %v", ErrUpstreamClosed, err))
				return
			}
			if f.binary {
				c.r.stats.framesUp.Add(1)
				c.r.stats.bytesUp.Add(int64(len(f.data)))
			} else {
				c.r.stats.textUp.Add(1)
			}
		case <-c.done:
			return
		}
	}
}

// serveMCP runs the upstream's MCP messages against the board one at a
// time, as the board itself would.
func (c *Conversation) serveMCP() {
	defer c.wg.Done()
	for {
		select {
		case p := <-c.mcp:
			c.r.stats.mcpIn.Add(1)
			if reply := c.side.ServeMCP(c.ctx, p); reply != nil {
				c.reply(reply)
			}
		case <-c.done:
			return
		}
	}
}

// notifyBoard serves one of the upstream's notifications beside its
// requests, not behind them: a notifications/cancelled must reach the
// request it names while that request runs. Each has a goroutine (in wg)
// while it is written to the board; past MCPQueue of them at once it is
// dropped, as notifications may be.
func (c *Conversation) notifyBoard(p json.RawMessage) {
	select {
	case c.notes <- struct{}{}:
	default:
		c.r.stats.mcpRefused.Add(1)
		return
	}
	// Added by the reader only, before it ends: ended waits for wg after.
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer func() { <-c.notes }()
		c.r.stats.mcpIn.Add(1)
		_ = c.side.ServeMCP(c.ctx, p) // a notification has no reply
	}()
}

// isNotification: a JSON-RPC message with a method and no id.
func isNotification(p json.RawMessage) bool {
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method *string         `json:"method"`
	}
	return json.Unmarshal(p, &m) == nil && m.Method != nil && m.ID == nil
}

// reply queues an MCP reply for the upstream.
func (c *Conversation) reply(payload json.RawMessage) {
	if payload == nil {
		return
	}
	msg, err := envelope.Encode(c.sessionID, envelope.TypeMCP, payload)
	if err != nil {
		return
	}
	c.queue(frame{data: msg})
}

// ended runs when the reader stops: the conversation is over for both.
func (c *Conversation) ended() {
	c.finish(ErrUpstreamClosed)
	go func() {
		// The writer and worker end on done; forget once all have.
		c.wg.Wait()
		reason := c.Err()
		c.r.stats.closed.Add(1)
		c.r.onEvent(Event{Kind: "closed", DeviceID: c.board.DeviceID, Transport: c.board.Transport,
			SessionID: c.sessionID, Upstream: Redact(c.up), Reason: errString(reason)})
		c.log.Debug("voice conversation ended", zap.String("session_id", c.sessionID), zap.Error(reason))
		if e, ok := c.side.(Ender); ok {
			e.ConversationEnded(c)
		}
		c.r.forget(c)
	}()
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// Ender is a BoardSide that wants to know when a conversation has ended
// (for example to tell an MQTT board with a goodbye). It is called once,
// after the conversation's goroutines are done.
type Ender interface {
	ConversationEnded(c *Conversation)
}

// busyReply answers an MCP request the worker had no room for.
func busyReply(payload json.RawMessage, queue int) json.RawMessage {
	var req struct {
		ID     json.RawMessage `json:"id"`
		Method *string         `json:"method"`
	}
	if json.Unmarshal(payload, &req) != nil || req.Method == nil || len(req.ID) == 0 || string(req.ID) == "null" {
		return nil
	}
	b, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0", "id": req.ID,
		"error": map[string]any{"code": -32000, "message": fmt.Sprintf("busy: %d requests already wait for this board (voice.mcp_queue)", queue)},
	})
	return b
}
