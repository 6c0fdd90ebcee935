package ws

// This file relays a WebSocket board's conversation to its voice upstream
// (package voice): the board's conversation messages and audio go to the
// upstream, the upstream's come back on the same socket in order, and the
// upstream's MCP requests run through the board's session.

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/envelope"
	"github.com/devicebridge/devicebridge/voice"
)

// voiceLink is one board socket's side of its conversations; it
// implements voice.BoardSide. A socket holds at most one conversation at a
// time; after the upstream ends one, the board's next conversation message
// opens another (at most one attempt at a time, and not within
// voice.retry_after of a failure).
type voiceLink struct {
	relay *voice.Relay
	c     *conn
	board voice.Board
	hello atomic.Pointer[[]byte] // the board's hello, as it sent it

	session  atomic.Pointer[device.Session]
	attached chan struct{}
	conv     atomic.Pointer[voice.Conversation]
	opening  atomic.Bool
	// heldMu guards held, what the board said while a conversation opens
	// (opening set); see hold and release.
	heldMu sync.Mutex
	held   []heldMsg
	// wg counts reopen attempts; close waits for them.
	wg     sync.WaitGroup
	closed chan struct{}
	ctx    context.Context // ends when the board's socket closes
	cancel context.CancelFunc
}

var _ voice.BoardSide = (*voiceLink)(nil)

func newVoiceLink(r *voice.Relay, c *conn, b voice.Board) *voiceLink {
	ctx, cancel := context.WithCancel(context.Background())
	return &voiceLink{relay: r, c: c, board: b,
		attached: make(chan struct{}), closed: make(chan struct{}), ctx: ctx, cancel: cancel}
}

// open runs the first conversation, when the board says hello. On success
// the board's server hello is built from the upstream's.
func (v *voiceLink) open(ctx context.Context, hello []byte) (voice.ServerHello, error) {
	v.hello.Store(&hello)
	conv, sh, err := v.relay.Open(ctx, v.board, hello, v)
	if err != nil {
		return voice.ServerHello{}, err
	}
	v.conv.Store(conv)
	return sh, nil
}

// sessionID is the current conversation's, "" with none.
func (v *voiceLink) sessionID() string {
	if conv := v.conv.Load(); conv != nil {
		return conv.SessionID()
	}
	return ""
}

// current is the open conversation, nil when none is open.
func (v *voiceLink) current() *voice.Conversation {
	conv := v.conv.Load()
	if conv == nil {
		return nil
	}
	select {
	case <-conv.Done():
		return nil
	default:
		return conv
	}
}

// text relays a board's text message when it belongs to the conversation;
// false leaves it to the MCP stream (mcp, and anything undecodable, which
// the stream counts and drops).
func (v *voiceLink) text(msg []byte) bool {
	env, err := envelope.Decode(msg, int(v.c.cfg.ReadLimit))
	if err != nil || env.Type == envelope.TypeMCP || env.Type == envelope.TypeHello {
		return false
	}
	if conv := v.current(); conv != nil {
		conv.Text(msg)
		return true
	}
	if v.hold(false, msg) {
		return true
	}
	// The board started a conversation that cannot reach the upstream
	// yet (voice.retry_after): say so rather than let it talk to nobody.
	v.alert()
	return true
}

// audio relays one audio frame from the board.
func (v *voiceLink) audio(frame []byte) {
	if conv := v.current(); conv != nil {
		conv.Audio(frame)
		return
	}
	if !v.hold(true, frame) {
		v.relay.DroppedUp()
	}
}

// maxHeld bounds what a board says while its next conversation opens
// (about 4 s of audio).
const maxHeld = 64

type heldMsg struct {
	binary bool
	data   []byte
}

// hold keeps a message from the board while a conversation opens (and
// starts opening one), so its first words reach the upstream; false when
// no conversation can open now.
func (v *voiceLink) hold(binary bool, data []byte) bool {
	v.heldMu.Lock()
	defer v.heldMu.Unlock()
	if conv := v.current(); conv != nil {
		// It opened meanwhile, and everything held has been passed on.
		if binary {
			conv.Audio(data)
		} else {
			conv.Text(data)
		}
		return true
	}
	if !v.opening.Load() && !v.reopen() {
		return false
	}
	if len(v.held) < maxHeld {
		v.held = append(v.held, heldMsg{binary: binary, data: data})
	} else {
		v.relay.DroppedUp()
	}
	return true
}

// release passes what was held on to conv, then makes conv current, in
// that order, so nothing overtakes what was held.
func (v *voiceLink) release(conv *voice.Conversation) {
	for {
		v.heldMu.Lock()
		batch := v.held
		v.held = nil
		if len(batch) == 0 {
			v.conv.Store(conv)
			v.opening.Store(false)
			v.heldMu.Unlock()
			return
		}
		v.heldMu.Unlock()
		for _, m := range batch {
			if m.binary {
				conv.Audio(m.data)
			} else {
				conv.Text(m.data)
			}
		}
	}
}

// drop forgets what was held when the conversation could not open.
func (v *voiceLink) drop() {
	v.heldMu.Lock()
	v.held = nil
	v.opening.Store(false)
	v.heldMu.Unlock()
}

// reopen starts a new conversation in the background (the socket's reader
// must not wait on the upstream); what the board says meanwhile is held
// and passed on once it is open. heldMu is held by the caller.
func (v *voiceLink) reopen() bool {
	hello := v.hello.Load()
	if hello == nil || !v.relay.MayRetry(v.board.DeviceID) {
		return false
	}
	select {
	case <-v.closed:
		return false
	default:
	}
	v.opening.Store(true)
	v.wg.Add(1)
	go func() {
		defer v.wg.Done()
		conv, sh, err := v.relay.Open(v.ctx, v.board, *hello, v)
		if err != nil {
			v.drop()
			v.alert()
			return
		}
		// The board takes a hello at any time and adopts its session id
		// and audio parameters; it goes first, before anything relayed
		// from the new conversation.
		sendCtx, cancel := context.WithTimeout(v.ctx, v.c.cfg.WriteTimeout)
		err = v.c.Send(sendCtx, v.serverHello(sh))
		cancel()
		if err != nil {
			v.drop()
			conv.Close(voice.ErrBoardLeft)
			return
		}
		v.release(conv)
		select {
		case <-v.closed:
			conv.Close(voice.ErrBoardLeft)
		default:
		}
	}()
	return true
}

// serverHello is the board's hello for a relayed conversation.
func (v *voiceLink) serverHello(sh voice.ServerHello) []byte {
	audio := envelope.AudioParams{Format: "opus", SampleRate: sh.SampleRate, Channels: 1, FrameDuration: sh.FrameDuration}
	return envelope.ServerHello{Transport: TransportName, SessionID: sh.SessionID, AudioParams: &audio}.Marshal()
}

// alert tells the board's user the conversation could not start.
func (v *voiceLink) alert() {
	ctx, cancel := context.WithTimeout(context.Background(), v.c.cfg.WriteTimeout)
	defer cancel()
	_ = v.c.Send(ctx, voice.FailureAlert(v.c.SessionID()))
}

// attach hands the link the board's session, once the Hub has it.
func (v *voiceLink) attach(s *device.Session) {
	v.session.Store(s)
	s.SetPeerNotify(func(msg json.RawMessage) {
		if conv := v.current(); conv != nil {
			conv.Notify(msg)
		}
	})
	close(v.attached)
}

// close ends the conversation with the board's socket and waits for a
// reopen in progress.
func (v *voiceLink) close() {
	// Under heldMu: reopen (which runs under it) either sees closed or
	// has counted its goroutine in wg before the Wait below.
	v.heldMu.Lock()
	close(v.closed)
	v.heldMu.Unlock()
	v.cancel()
	if conv := v.conv.Load(); conv != nil {
		conv.Close(voice.ErrBoardLeft)
	}
	v.wg.Wait()
	if conv := v.conv.Load(); conv != nil {
		conv.Close(voice.ErrBoardLeft)
	}
}

// SendText implements voice.BoardSide.
func (v *voiceLink) SendText(ctx context.Context, msg []byte) error { return v.c.Send(ctx, msg) }

// SendAudio implements voice.BoardSide.
func (v *voiceLink) SendAudio(frame []byte) bool { return v.c.sendAudio(frame) }

// ServeMCP implements voice.BoardSide: the upstream's MCP goes through the
// board's session, which remaps ids and queues the call with the
// bridge's own.
func (v *voiceLink) ServeMCP(ctx context.Context, payload json.RawMessage) json.RawMessage {
	select {
	case <-v.attached:
	case <-ctx.Done():
		return nil
	}
	return v.session.Load().ServePeer(ctx, payload)
}
