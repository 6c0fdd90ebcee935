package mqtt

import (
	"sync/atomic"

	"github.com/devicebridge/devicebridge/device"
)

// Stats are the gateway's counters since it started.
type Stats struct {
	Connected bool
	// Connects counts successful broker connections (1 + reconnects).
	Connects int64
	Links    int
	// MessagesIn counts uplink messages accepted; MessagesOut downlink
	// publishes completed.
	MessagesIn, MessagesOut int64
	// Dropped uplink messages, by reason.
	Oversized, Malformed, InboxFull, UnknownTopic, Unattributed int64
	// Other counts valid non-MCP messages (listen, abort, ...).
	Other                             int64
	Hellos, BadHellos                 int64
	GoodbyesIn, GoodbyesOut           int64
	Probes, ProbeMisses, Unresponsive int64
	Discovered, Recovered, Reconciled int64
	// NotOwned counts uplink messages and claims dropped because another
	// bridge on a shared broker holds the board; Adopted counts boards
	// handed to this gateway by its Owner (Adopt).
	NotOwned, Adopted int64
	// RateLimited counts uplink messages dropped for going over the
	// board's rate, CutOff boards whose session was closed for flooding
	// past the grace, and Muted messages ignored from boards cut off.
	// Behind the embedded broker these stay zero: the broker limits boards
	// itself (broker.Stats).
	RateLimited, CutOff, Muted int64
	UDP                        UDPStats
}

type counters struct {
	connects, in, out                                        atomic.Int64
	oversized, malformed, inboxFull, unknownTopic, unattrib  atomic.Int64
	other, hellos, badHellos, goodbyesIn, goodbyesOut        atomic.Int64
	probes, probeMisses, unresponsive, discovered, recovered atomic.Int64
	reconciled, notOwned, adopted                            atomic.Int64
	rateLimited, cutOff, muted                               atomic.Int64
}

// Stats returns the gateway's counters.
func (g *Gateway) Stats() Stats {
	g.mu.Lock()
	n := len(g.links)
	g.mu.Unlock()
	s := &g.stats
	st := Stats{
		Connected: g.Connected(), Connects: s.connects.Load(), Links: n,
		MessagesIn: s.in.Load(), MessagesOut: s.out.Load(),
		Oversized: s.oversized.Load(), Malformed: s.malformed.Load(), InboxFull: s.inboxFull.Load(),
		UnknownTopic: s.unknownTopic.Load(), Unattributed: s.unattrib.Load(), Other: s.other.Load(),
		Hellos: s.hellos.Load(), BadHellos: s.badHellos.Load(),
		GoodbyesIn: s.goodbyesIn.Load(), GoodbyesOut: s.goodbyesOut.Load(),
		Probes: s.probes.Load(), ProbeMisses: s.probeMisses.Load(), Unresponsive: s.unresponsive.Load(),
		Discovered: s.discovered.Load(), Recovered: s.recovered.Load(), Reconciled: s.reconciled.Load(),
		NotOwned: s.notOwned.Load(), Adopted: s.adopted.Load(),
		RateLimited: s.rateLimited.Load(), CutOff: s.cutOff.Load(), Muted: s.muted.Load(),
	}
	if g.udp != nil {
		st.UDP = g.udp.stats()
	}
	return st
}

// countProbe keeps the gateway's liveness counters.
func (g *Gateway) countProbe(o device.ProbeOutcome) {
	g.stats.probes.Add(1)
	switch o {
	case device.ProbeMissed:
		g.stats.probeMisses.Add(1)
	case device.ProbeUnresponsive:
		g.stats.probeMisses.Add(1)
		g.stats.unresponsive.Add(1)
	}
}
