package mcpserver

// Board news: legacy sessions that set a log level of info or below hear,
// as notifications/message on their standalone stream, when a board they
// may see (the policy's BoardVisible) becomes ready or goes offline. The
// modern era has no session to tell: its log messages only go with the
// request they are about.
//
// News never floods a client: the Hub's events are taken in batches (Run),
// one round of news goes out at most every newsGap, a round names at most
// newsEach boards per session and sums up the rest in one message, and
// each session's rate bucket (clientlog.go) bounds the whole. One
// goroutine sends the news, so that a client slow to read never holds up
// the catalogue's sync; Run owns it and waits for it.

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/ctxtime"
	"github.com/devicebridge/devicebridge/policy"
)

const (
	// newsGap is the least time between two rounds of board news.
	newsGap = time.Second
	// newsEach is how many boards a round names one by one to a session;
	// past it, the round is one message with the counts.
	newsEach = 5
	// maxNews bounds the board events waiting for the next round; past it
	// they are only counted.
	maxNews = 256
	// newsWrite bounds one message's write to a session's stream.
	newsWrite = 5 * time.Second
)

// causeWords say why a board went offline, from the fixed set of causes
// (the full reason may quote the board, and stays in the bridge's log).
var causeWords = map[device.CloseCause]string{
	device.CauseDisconnected: "it closed the connection or the network dropped it",
	device.CauseReplaced:     "it connected again; the new connection replaces this one",
	device.CauseRefused:      "the bridge refused the connection",
	device.CauseShutdown:     "the bridge is shutting down",
	device.CauseInitFailed:   "its initialization failed",
	device.CauseUnresponsive: "it stopped answering keepalive probes",
	device.CauseProtocol:     "it broke the protocol",
	device.CauseBrokerLost:   "the MQTT broker connection carrying it was lost",
}

// boardEvent is one piece of news about a board.
type boardEvent struct {
	ready         bool // else offline
	id, alias     string
	label         string
	cause, reason string // why it went offline
	tools         int
}

// boardNews collects events for the sender.
type boardNews struct {
	mu       sync.Mutex
	pending  []boardEvent
	overflow map[bool]int // events past maxNews, by ready
	wake     chan struct{}
}

func newBoardNews() *boardNews { return &boardNews{wake: make(chan struct{}, 1)} }

// add queues the news of a batch of Hub events. before and after are the
// catalogue around the sync that took them: a board that left is named
// as it was published before.
func (b *boardNews) add(evs []device.Event, before, after *catalog) {
	var news []boardEvent
	for _, ev := range evs {
		if ev.Type != device.EventOnline && ev.Type != device.EventOffline {
			continue
		}
		v, ok := after.byDevice[ev.DeviceID]
		if !ok {
			v, ok = before.byDevice[ev.DeviceID]
		}
		alias, label := "", ev.DeviceID
		if ok {
			alias, label = v.alias, boardLabel(v)
		}
		news = append(news, boardEvent{ready: ev.Type == device.EventOnline, id: ev.DeviceID, alias: alias, label: label,
			cause: string(ev.Info.CloseCause), reason: causeWords[ev.Info.CloseCause], tools: len(ev.Info.Tools)})
	}
	if len(news) == 0 {
		return
	}
	b.mu.Lock()
	for _, n := range news {
		if len(b.pending) < maxNews {
			b.pending = append(b.pending, n)
			continue
		}
		if b.overflow == nil {
			b.overflow = map[bool]int{}
		}
		b.overflow[n.ready]++
	}
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

func (b *boardNews) take() ([]boardEvent, map[bool]int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p, o := b.pending, b.overflow
	b.pending, b.overflow = nil, nil
	return p, o
}

// runNews sends board news until ctx ends.
func (s *Server) runNews(ctx context.Context, b *boardNews) {
	for {
		select {
		case <-b.wake:
		case <-ctx.Done():
			return
		}
		evs, overflow := b.take()
		for _, l := range s.logSessions.listeners(s.mcp, "info") {
			s.tell(ctx, l, evs, overflow)
		}
		if !ctxtime.Sleep(ctx, newsGap) {
			return
		}
	}
}

// tell sends one session the news it may see.
func (s *Server) tell(ctx context.Context, l listener, evs []boardEvent, overflow map[bool]int) {
	pol := s.opts.Access.Policy
	msgs := newsFor(evs, overflow, pol.Enabled(), func(ev boardEvent) bool {
		return pol.BoardVisible(l.id, policy.Board{ID: ev.id, Alias: ev.alias})
	})
	if len(msgs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, newsWrite)
	defer cancel()
	for _, m := range msgs {
		l.log.send(ctx, s.log, "info", m)
	}
}

// newsFor is one round of news for a session: the events it may see (by
// visible), one message each, or one summary when there are more than
// newsEach. Events past maxNews were not kept, only counted: they count
// in the summary unless a policy may hide boards from the session.
func newsFor(evs []boardEvent, overflow map[bool]int, policyOn bool, visible func(boardEvent) bool) []map[string]any {
	var mine []boardEvent
	for _, ev := range evs {
		if visible(ev) {
			mine = append(mine, ev)
		}
	}
	if policyOn {
		overflow = nil
	}
	if len(mine) == 0 && len(overflow) == 0 {
		return nil
	}
	if len(mine) <= newsEach && len(overflow) == 0 {
		out := make([]map[string]any, len(mine))
		for i, ev := range mine {
			out[i] = ev.data()
		}
		return out
	}
	return []map[string]any{summary(mine, overflow)}
}

// data is the message of one board event.
func (ev boardEvent) data() map[string]any {
	d := map[string]any{"board": ev.alias, "device_id": ev.id}
	if ev.ready {
		d["event"], d["tools"] = "board_ready", ev.tools
		d["message"] = fmt.Sprintf("board %s is ready (%d %s)", ev.label, ev.tools, plural(ev.tools, "tool", "tools"))
	} else {
		d["event"], d["cause"] = "board_offline", ev.cause
		d["message"] = fmt.Sprintf("board %s went offline", ev.label)
		if ev.reason != "" {
			d["message"] = fmt.Sprintf("board %s went offline: %s", ev.label, ev.reason)
		}
	}
	return d
}

// summary sums up a round with too many boards to name one by one: the
// counts, and the first few names.
func summary(evs []boardEvent, overflow map[bool]int) map[string]any {
	ready, offline := overflow[true], overflow[false]
	var names []string
	for _, ev := range evs {
		if ev.ready {
			ready++
		} else {
			offline++
		}
		if len(names) < newsEach {
			names = append(names, ev.alias)
		}
	}
	sort.Strings(names)
	return map[string]any{"event": "boards_changed", "ready": ready, "offline": offline,
		"message": fmt.Sprintf("%d %s became ready and %d went offline (among them %s); list the tools again to see them",
			ready, plural(ready, "board", "boards"), offline, strings.Join(names, ", "))}
}
