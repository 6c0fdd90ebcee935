//lint:file-ignore SA1019 logging is deprecated in 2026-07-28 (SEP-2577) but still defined there, per request, and served in both eras

package mcpserver

// What a caller hears about its own tools/call while it runs: progress
// notifications, when the request carried a progressToken, and log
// messages at the caller's level (clientlog.go). Both say the same steps:
//
//	received      debug    the call was taken (board and tool named)
//	waiting       info     the board is connecting or reconnecting
//	forwarded     debug    another bridge of the fleet holds the board
//	queued        debug    behind N calls to the same board
//	sent          debug    written to the board
//	(heartbeat)   debug    still waiting, every mcp.progress_interval
//	answered      debug    the board answered in D (info if the result is an error)
//	refused/failed info or warning: policy, confirmation, busy, timeout,
//	              the board left during the call, ...
//
// so that even a fast call gives three progress notifications with
// increasing values (received, sent, answered). The board path never
// waits for a client: steps are queued (a call has at most maxNotes of
// them) and one goroutine per call sends them, in order, until the call's
// handler returns; notesMiddleware waits for it, so that every
// notification precedes the response on the request's stream.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device"
)

// maxNotes bounds the steps queued for one call; heartbeats are not
// queued (one is due at most every progress interval).
const maxNotes = 16

// note is one step of a call.
type note struct {
	level mcp.LoggingLevel
	data  map[string]any // "message" and structured fields; never payloads
}

// callNotes reports the steps of one tools/call to its caller.
type callNotes struct {
	s     *Server
	ctx   context.Context // the request's: its stream, and (modern) its log level
	ss    *mcp.ServerSession
	token any        // progress token; nil for none
	log   *clientLog // nil: no log messages

	mu       sync.Mutex
	queue    []note
	dropped  int
	finished bool
	// The call waits for its board from waitFrom until the answer
	// (heartbeats while it does); waitBoard and waitTool name them.
	waitFrom            time.Time
	waitBoard, waitTool string
	sentAt              time.Time

	wake     chan struct{} // cap 1
	done     chan struct{}
	progress float64 // the sender's; every notification increases it
}

type notesKey struct{}

// notesOf is the callNotes of the call in ctx, or nil.
func notesOf(ctx context.Context) *callNotes {
	n, _ := ctx.Value(notesKey{}).(*callNotes)
	return n
}

// notesMiddleware gives each tools/call whose caller asked for progress
// or log messages its callNotes, and waits for them to be sent before the
// result goes out.
func (s *Server) notesMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method != "tools/call" {
			return next(ctx, method, req)
		}
		p, ok := req.GetParams().(*mcp.CallToolParamsRaw)
		ss, _ := req.GetSession().(*mcp.ServerSession)
		if !ok || p == nil || ss == nil {
			return next(ctx, method, req)
		}
		token := p.GetProgressToken()
		log := s.callerLog(ss, p.Meta)
		if token == nil && log == nil {
			return next(ctx, method, req)
		}
		n := &callNotes{s: s, ctx: ctx, ss: ss, token: token, log: log,
			wake: make(chan struct{}, 1), done: make(chan struct{})}
		go n.run()
		defer n.finish()
		return next(context.WithValue(ctx, notesKey{}, n), method, req)
	}
}

// post queues a step for the sender. It never blocks.
func (n *callNotes) post(level mcp.LoggingLevel, data map[string]any) {
	if n == nil {
		return
	}
	if n.token == nil && !n.log.wants(level) {
		return
	}
	n.mu.Lock()
	if n.finished || len(n.queue) >= maxNotes {
		n.dropped++
		n.mu.Unlock()
		return
	}
	n.queue = append(n.queue, note{level: level, data: data})
	n.mu.Unlock()
	n.signal()
}

func (n *callNotes) signal() {
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

// finish lets the sender send what is queued and waits for it.
func (n *callNotes) finish() {
	n.mu.Lock()
	n.finished = true
	n.mu.Unlock()
	n.signal()
	<-n.done
}

// run is the sender: it sends queued steps in order and heartbeats while
// the call waits for its board, until finish (or the request's end).
func (n *callNotes) run() {
	defer close(n.done)
	interval := n.s.opts.ProgressInterval
	if n.token == nil && !n.log.wants("debug") {
		interval = 0 // nobody to hear the heartbeats
	}
	var beat *time.Timer
	var beatC <-chan time.Time
	defer func() {
		if beat != nil {
			beat.Stop()
		}
	}()
	for {
		n.mu.Lock()
		queue, finished, waiting, dropped := n.queue, n.finished, !n.waitFrom.IsZero(), n.dropped
		n.queue = nil
		n.mu.Unlock()
		for _, nt := range queue {
			n.send(nt)
		}
		if finished {
			if dropped > 0 {
				n.s.log.Debug("call steps not reported: too many", zap.Int("dropped", dropped))
			}
			return
		}
		switch {
		case waiting && beat == nil && interval > 0:
			beat = time.NewTimer(interval)
			beatC = beat.C
		case !waiting && beat != nil:
			beat.Stop()
			beat, beatC = nil, nil
		}
		select {
		case <-n.wake:
		case <-beatC:
			n.heartbeat()
			beat.Reset(interval)
		case <-n.ctx.Done():
			return
		}
	}
}

// send delivers one step: a progress notification if the caller gave a
// token, a log message if it wants the level.
func (n *callNotes) send(nt note) {
	msg, _ := nt.data["message"].(string)
	if n.token != nil {
		n.progress++
		err := n.ss.NotifyProgress(n.ctx, &mcp.ProgressNotificationParams{ProgressToken: n.token, Progress: n.progress, Message: msg})
		if err != nil {
			n.s.log.Debug("progress notification not delivered", zap.Error(err))
		}
	}
	n.log.send(n.ctx, n.s.log, nt.level, nt.data)
}

// heartbeat says the call still waits for its board.
func (n *callNotes) heartbeat() {
	n.mu.Lock()
	from, board, tool := n.waitFrom, n.waitBoard, n.waitTool
	n.mu.Unlock()
	if from.IsZero() {
		return
	}
	secs := int(time.Since(from).Seconds())
	n.send(note{level: "debug", data: map[string]any{"event": "waiting", "board": board, "tool": tool, "seconds": secs,
		"message": fmt.Sprintf("still waiting for board %q to finish %s (%ds)", board, tool, secs)}})
}

// The steps, posted by the call path. Each is a no-op on nil notes.

// received: the call was taken for board tool e.
func (n *callNotes) received(e *entry) {
	if n == nil {
		return
	}
	n.post("debug", n.fields(e, "received", fmt.Sprintf("received call of %s for board %s", e.tool.Name, e.label())))
}

// fields are a step's data: what names the call, and the message.
func (n *callNotes) fields(e *entry, event, msg string) map[string]any {
	return map[string]any{"event": event, "board": e.alias, "tool": e.tool.Name, "message": msg}
}

// refused: the call was answered without reaching the board, for why
// (policy, confirmation, ...).
func (n *callNotes) refused(e *entry, why string) {
	if n == nil {
		return
	}
	n.post("info", n.fields(e, "refused", fmt.Sprintf("%s for board %s was not sent to the board: %s", e.tool.Name, e.label(), why)))
}

// asking: the bridge asks the user for arguments or confirmation.
func (n *callNotes) asking(e *entry, round int) {
	if n == nil {
		return
	}
	d := n.fields(e, "asking", fmt.Sprintf("asking the user about %s for board %s (question %d)", e.tool.Name, e.label(), round))
	d["round"] = round
	n.post("debug", d)
}

// waiting starts the wait for board tool e: heartbeats run from now, and
// the hub's steps come through stage.
func (n *callNotes) waiting(e *entry) {
	if n == nil {
		return
	}
	n.mu.Lock()
	n.waitFrom, n.waitBoard, n.waitTool = time.Now(), e.alias, e.tool.Name
	n.mu.Unlock()
	n.signal() // arm the heartbeat
}

// stage reports a step of the board call (device.WithCallStages): it runs
// on the call's goroutine, sometimes holding the board's turn, and only
// queues.
func (n *callNotes) stage(e *entry) func(device.CallStage) {
	return func(st device.CallStage) {
		switch st.Kind {
		case device.StageWaitReady:
			n.post("info", n.fields(e, "waiting_ready", fmt.Sprintf("board %s is connecting or reconnecting; the call waits for it", e.label())))
		case device.StageForwarded:
			n.post("debug", n.fields(e, "forwarded", fmt.Sprintf("board %s is connected to another bridge of the fleet; the call was forwarded to it", e.label())))
		case device.StageQueued:
			d := n.fields(e, "queued", fmt.Sprintf("call queued behind %d %s for board %s", st.Ahead, plural(st.Ahead, "call", "calls"), e.label()))
			d["ahead"] = st.Ahead
			n.post("debug", d)
		case device.StageSent:
			n.mu.Lock()
			n.sentAt = st.At
			n.mu.Unlock()
			n.post("debug", n.fields(e, "sent", fmt.Sprintf("sent %s to board %s", e.tool.Name, e.label())))
		}
	}
}

// answered ends the wait: the outcome of the board call, in words that
// carry no payload (no result, no board error text).
func (n *callNotes) answered(e *entry, outcome string, took time.Duration) {
	if n == nil {
		return
	}
	n.mu.Lock()
	n.waitFrom = time.Time{}
	sent := n.sentAt
	n.mu.Unlock()
	label := e.label()
	level := mcp.LoggingLevel("warning")
	var msg string
	switch device.Code(outcome) {
	case outcomeOK:
		level, msg = "debug", fmt.Sprintf("board %s answered %s in %s", label, e.tool.Name, stepDuration(boardTime(sent, took)))
	case outcomeToolError:
		level, msg = "info", fmt.Sprintf("board %s answered %s in %s with an error result", label, e.tool.Name, stepDuration(boardTime(sent, took)))
	case device.CodeDeviceError:
		level, msg = "info", fmt.Sprintf("board %s refused %s (it returned an error)", label, e.tool.Name)
	case device.CodeInvalidArguments, device.CodeUnknownTool:
		level, msg = "info", fmt.Sprintf("%s for board %s was refused before the board: %s", e.tool.Name, label, outcome)
	case device.CodeCanceled:
		level, msg = "debug", fmt.Sprintf("the call of %s for board %s was cancelled", e.tool.Name, label)
	case device.CodeTimeout:
		msg = fmt.Sprintf("board %s did not answer %s within %s; the outcome is unknown (the board may still carry it out)",
			label, e.tool.Name, roundDuration(took))
	case device.CodeOffline, device.CodeUnknownDevice:
		if !sent.IsZero() {
			msg = fmt.Sprintf("board %s disconnected during %s, before it answered; the outcome is unknown", label, e.tool.Name)
		} else {
			msg = fmt.Sprintf("board %s is offline; %s was not sent", label, e.tool.Name)
		}
	case device.CodeBusy:
		msg = fmt.Sprintf("board %s is busy (too many calls waiting); %s was not sent", label, e.tool.Name)
	case device.CodeQueueTimeout:
		msg = fmt.Sprintf("the time for %s ran out while it waited behind other calls for board %s; it was not sent", e.tool.Name, label)
	case device.CodeNotReady:
		msg = fmt.Sprintf("board %s did not become ready in time; %s was not sent", label, e.tool.Name)
	case device.CodeShuttingDown:
		msg = fmt.Sprintf("the bridge is shutting down; the call of %s for board %s was abandoned", e.tool.Name, label)
	default:
		msg = fmt.Sprintf("the call of %s for board %s failed (%s)", e.tool.Name, label, outcome)
	}
	d := n.fields(e, "answered", msg)
	d["outcome"], d["ms"] = outcome, took.Milliseconds()
	n.post(level, d)
}

// boardTime is how long the board took: from sending to the answer when
// the call was sent (took covers the queue too).
func boardTime(sent time.Time, took time.Duration) time.Duration {
	if sent.IsZero() {
		return took
	}
	return time.Since(sent)
}

// stepDuration shows how long a step took: to the tenth of a millisecond
// for the fastest, like roundDuration beyond.
func stepDuration(d time.Duration) time.Duration {
	if d < 10*time.Millisecond {
		return d.Round(100 * time.Microsecond)
	}
	return roundDuration(d)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
