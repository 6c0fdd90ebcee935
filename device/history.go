package device

import "github.com/devicebridge/devicebridge/internal/randid"

// This file keeps the Hub's recent events so that a subscriber that went
// away (an /api/events client that reconnects) can resume where it left
// off: SubscribeAfter replays what it missed, or says it cannot.

// History is where a subscription from SubscribeAfter starts.
type History struct {
	// Replay holds the events published after the requested Seq that the
	// subscription would have received, oldest first. The subscription
	// itself delivers only later ones.
	Replay []Event
	// Complete is false when the Hub does not hold every event after the
	// requested Seq (too old, a Seq it never published, or no history
	// kept: HubConfig.EventHistory 0): Replay is
	// empty and the subscriber must re-read Devices instead.
	Complete bool
	// Seq is the last event published before the subscription began.
	Seq uint64
}

// Epoch names this Hub's event numbering: a Seq means something only
// together with the Epoch of the Hub that published it (another process,
// or another node of the fleet, has its own).
func (h *Hub) Epoch() string { return h.epoch }

// SubscribeAfter is SubscribeWith for a subscriber that has seen the events
// up to after: the History holds those published since, and the
// subscription every later one, with no gap and no overlap (both are taken
// under the Hub lock).
func (h *Hub) SubscribeAfter(opts SubscribeOptions, after uint64) (*Subscription, History) {
	h.mu.Lock()
	defer h.mu.Unlock()
	sub := h.subscribeLocked(opts)
	hist := History{Seq: h.seq}
	if h.cfg.EventHistory <= 0 || after > h.seq || h.seq-after > uint64(h.history.len()) {
		return sub, hist
	}
	hist.Complete = true
	h.history.each(func(ev Event) {
		if ev.Seq > after && (opts.Calls || !ev.activity()) {
			hist.Replay = append(hist.Replay, ev)
		}
	})
	return sub, hist
}

// SubscribeRecent is SubscribeWith with the newest n events the Hub still
// holds (fewer when it holds fewer; those a subscription with opts would
// not receive are skipped) as History.Replay, oldest first: a new
// subscriber sees the recent past, then every later event, with no gap and
// no overlap. Complete is true; with no history kept, Replay is empty.
func (h *Hub) SubscribeRecent(opts SubscribeOptions, n int) (*Subscription, History) {
	h.mu.Lock()
	defer h.mu.Unlock()
	sub := h.subscribeLocked(opts)
	hist := History{Seq: h.seq, Complete: true}
	if n <= 0 {
		return sub, hist
	}
	h.history.each(func(ev Event) {
		if opts.Calls || !ev.activity() {
			hist.Replay = append(hist.Replay, ev)
		}
	})
	if len(hist.Replay) > n {
		hist.Replay = hist.Replay[len(hist.Replay)-n:]
	}
	return sub, hist
}

// eventRing holds the last cap(buf) events; a zero capacity holds none.
type eventRing struct {
	buf  []Event
	head int // the oldest event once buf is full
}

func (r *eventRing) len() int { return len(r.buf) }

func (r *eventRing) add(ev Event) {
	switch {
	case cap(r.buf) == 0:
	case len(r.buf) < cap(r.buf):
		r.buf = append(r.buf, ev)
	default:
		r.buf[r.head] = ev
		r.head = (r.head + 1) % len(r.buf)
	}
}

// each calls f on every event held, oldest first.
func (r *eventRing) each(f func(Event)) {
	for i := range r.buf {
		f(r.buf[(r.head+i)%len(r.buf)])
	}
}

// newEpoch returns a random name for a Hub's event numbering.
func newEpoch() string {
	return randid.Hex(4)
}
