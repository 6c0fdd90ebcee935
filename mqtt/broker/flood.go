package broker

// This file keeps a flooding board from costing the others, at the place
// where its flood would start costing anything: before mochi routes the
// board's publish to the bridge's gateway.
//
// Every board's uplink reaches the gateway through one queue, the
// gateway's outbound queue in mochi (client_writes_pending long). If
// boards could fill it, mochi would drop whatever came next, a healthy
// board's reply as likely as a flooder's message. So each publish is
// admitted only if the board is within its rate (mqtt.BoardLimits) and
// within its share of that queue: at most mqtt.inbox_size messages of one
// board waiting, and, once the queue is half full, only boards with next
// to nothing waiting get in. A board over its rate for longer than the
// flood grace is disconnected and refused for the same time.

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/internal/logthrottle"
	"github.com/devicebridge/devicebridge/mqtt"
)

// lightShare: a board with fewer messages than this waiting for the
// gateway is admitted even when the gateway's queue is half full, so the
// reply a healthy board sends to a request gets through a flood.
const lightShare = 2

// maxCutOffs bounds the boards remembered as cut off. Each entry takes a
// board connection that flooded for the whole grace; past the bound a
// further board is still disconnected, only not refused afterwards.
const maxCutOffs = 4096

// gatewayQueue counts, for one connection of the bridge's gateway, the
// messages waiting in mochi's queue towards it, in all and per board.
// Every such message carries its board's uplink topic (OnPublish moved it
// there), which keys the per-board counts. A message is counted when
// mochi is about to queue it (the gateway's read ACL check) and uncounted
// when it is written (OnPacketSent) or dropped (OnPublishDropped), so the
// counts are exact while the connection lives; a new connection starts a
// new gatewayQueue.
type gatewayQueue struct {
	cl       *mochi.Client
	capacity int64 // mochi's queue length (client_writes_pending)
	perBoard int64 // mqtt.inbox_size

	total  atomic.Int64
	shares sync.Map // uplink topic → *atomic.Int64; entries live while the board is connected
}

// room reports whether one more message of the board with this uplink
// topic may join the queue.
func (q *gatewayQueue) room(topic string) bool {
	var n int64
	if v, ok := q.shares.Load(topic); ok {
		n = v.(*atomic.Int64).Load()
	}
	if n >= q.perBoard {
		return false
	}
	return n < lightShare || 2*q.total.Load() < q.capacity
}

func (q *gatewayQueue) queued(topic string) {
	if strings.ContainsAny(topic, "+#") {
		return // the gateway's own subscription being checked, not a message
	}
	v, ok := q.shares.Load(topic)
	if !ok {
		v, _ = q.shares.LoadOrStore(topic, new(atomic.Int64))
	}
	v.(*atomic.Int64).Add(1)
	q.total.Add(1)
}

func (q *gatewayQueue) left(topic string) {
	if v, ok := q.shares.Load(topic); ok {
		v.(*atomic.Int64).Add(-1)
	}
	q.total.Add(-1)
}

// forget drops a board's count when it disconnects. Its messages still
// queued then uncount nothing but the total.
func (q *gatewayQueue) forget(topic string) { q.shares.Delete(topic) }

// gatewayConnected starts counting for a new gateway connection.
func (h *policy) gatewayConnected(cl *mochi.Client) {
	h.gwq.Store(&gatewayQueue{
		cl:       cl,
		capacity: int64(h.b.cfg.ClientWritesPending),
		perBoard: int64(h.b.cfg.BoardQueue),
	})
}

// gatewayDisconnected stops counting, unless a newer connection already
// took over.
func (h *policy) gatewayDisconnected(cl *mochi.Client) {
	if q := h.gwq.Load(); q != nil && q.cl == cl {
		h.gwq.CompareAndSwap(q, nil)
	}
}

// toGateway is the queue accounting of cl if cl is the gateway's current
// connection.
func (h *policy) toGateway(cl *mochi.Client) *gatewayQueue {
	if q := h.gwq.Load(); q != nil && q.cl == cl {
		return q
	}
	return nil
}

// OnPacketSent uncounts a message written to the gateway, and lets a board
// that was sent one (a request from the bridge, mostly) answer it beyond
// its rate.
func (h *policy) OnPacketSent(cl *mochi.Client, pk packets.Packet, _ []byte) {
	if pk.FixedHeader.Type != packets.Publish {
		return
	}
	if q := h.toGateway(cl); q != nil {
		q.left(pk.TopicName)
		return
	}
	if st := h.state(cl); st != nil && st.role == roleBoard {
		st.guard.Credit()
	}
}

// admit decides whether a board's publish is routed at all: within its
// rate and within its share of the gateway's queue. It runs on the
// board's own reader goroutine, before the message costs anyone else.
func (h *policy) admit(cl *mochi.Client, st *clientState) bool {
	switch st.guard.Check(time.Now()) {
	case mqtt.Drop:
		h.b.rateLimited.Add(1)
		h.b.warns.rateLimited.Warn(h.b.log, "board is publishing over its rate; dropping its excess",
			h.boardFields(cl, st, zap.Stringer("limit", h.b.cfg.BoardLimits))...)
		return false
	case mqtt.CutOff:
		h.b.rateLimited.Add(1)
		h.cutOff(cl, st)
		return false
	}
	if q := h.gwq.Load(); q != nil && !q.room(st.uplink) {
		h.b.queueFull.Add(1)
		h.b.warns.queueShare.Warn(h.b.log, "board has its share of the queue to the gateway waiting; dropping its excess",
			h.boardFields(cl, st, zap.Int64("share", q.perBoard))...)
		return false
	}
	return true
}

// deniedOverRate counts a denied publish against the board's rate too, so
// a board flooding topics it may not use is cut off like any other; the
// message itself is dropped either way.
func (h *policy) deniedOverRate(cl *mochi.Client, st *clientState) {
	if st.guard.Check(time.Now()) == mqtt.CutOff {
		h.cutOff(cl, st)
	}
}

func (h *policy) boardFields(cl *mochi.Client, st *clientState, more ...zap.Field) []zap.Field {
	return append([]zap.Field{zap.String("device_id", st.ident.DeviceID), zap.String("transport", mqtt.TransportName),
		clip.Field("client_id", cl.ID), zap.String("remote", cl.Net.Remote)}, more...)
}

// cutOff disconnects a board that stayed over its rate for the whole
// grace, and remembers it so that it is refused reconnecting for as long
// and the gateway can tell why it left.
func (h *policy) cutOff(cl *mochi.Client, st *clientState) {
	if !st.cut.CompareAndSwap(false, true) {
		return // already on its way out
	}
	lim := h.b.cfg.BoardLimits
	reason := fmt.Errorf("%w (%s); disconnected and refused for %v", mqtt.ErrPublishFlood, lim, lim.FloodGrace)
	h.b.recordCutOff(cl, st.ident.DeviceID, reason, time.Now().Add(lim.FloodGrace))
	h.b.cutOffs.Add(1)
	h.b.warns.cutOff.Warn(h.b.log, "disconnected a board that kept publishing over its rate",
		h.boardFields(cl, st, zap.Stringer("limit", lim))...)
	// Stop only closes the socket; the board's reader, which runs this,
	// then ends and the disconnect is reported as usual.
	cl.Stop(reason)
}

// cutOffEntry is a board disconnected for flooding.
type cutOffEntry struct {
	gen    uint64 // the connection that was cut off
	until  time.Time
	reason error
}

// recordCutOff remembers a cut-off board (bounded by maxCutOffs).
func (b *Broker) recordCutOff(cl *mochi.Client, deviceID string, reason error, until time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var gen uint64
	if e := b.boards[deviceID]; e != nil && e.cl == cl {
		gen = e.board.Gen
	}
	if len(b.cut) >= maxCutOffs {
		now := time.Now()
		for id, c := range b.cut {
			if now.After(c.until) {
				delete(b.cut, id)
			}
		}
		if len(b.cut) >= maxCutOffs {
			return
		}
	}
	b.cut[deviceID] = cutOffEntry{gen: gen, until: until, reason: reason}
}

// cutOffUntil reports until when a board is refused, if it is.
func (b *Broker) cutOffUntil(deviceID string, now time.Time) (time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c, ok := b.cut[deviceID]
	if !ok {
		return time.Time{}, false
	}
	if !now.Before(c.until) {
		delete(b.cut, deviceID)
		return time.Time{}, false
	}
	return c.until, true
}

// Departure tells the gateway why the broker ended a board's connection
// gen, when it ended it for flooding (nil otherwise). It implements
// mqtt.Departures.
func (b *Broker) Departure(deviceID string, gen uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c, ok := b.cut[deviceID]; ok && c.gen == gen && gen != 0 {
		return c.reason
	}
	return nil
}

var _ mqtt.Departures = (*Broker)(nil)

// refuseCutOff turns away a board reconnecting while it is cut off, with
// CONNACK "server unavailable".
func (h *policy) refuseCutOff(cl *mochi.Client, st *clientState) error {
	if st.role != roleBoard {
		return nil
	}
	until, ok := h.b.cutOffUntil(st.ident.DeviceID, time.Now())
	if !ok {
		return nil
	}
	h.b.refusedCutOff.Add(1)
	h.b.warns.refusedCutOff.Warn(h.b.log, "refused a board reconnecting while cut off for flooding",
		h.boardFields(cl, st, zap.Time("until", until))...)
	_ = h.b.srv.SendConnack(cl, packets.ErrServerUnavailable, false, nil)
	return packets.ErrServerUnavailable
}

// warnings are the broker's log lines an outsider can repeat at will: each
// is written at most once per interval, with a count of those left out.
type warnings struct {
	refusedID, refusedAuth, refusedCutOff logthrottle.Throttle
	deniedPub, deniedRead, notReading     logthrottle.Throttle
	gatewayBehind, rateLimited            logthrottle.Throttle
	queueShare, cutOff, refusedSocket     logthrottle.Throttle
}
