package device

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
)

// KeepaliveLink is a Link whose transport cannot tell by itself that a
// board went away (MQTT through an external broker: the broker knows, the
// bridge is not told). The Session then probes the board while it is idle
// and closes the link with ErrUnresponsive after too many unanswered
// probes. Transports with their own liveness signal (WebSocket ping/pong)
// do not implement it.
type KeepaliveLink interface {
	Link
	// Keepalive is the probing policy. It is read once, when the session
	// becomes ready; an Interval <= 0 means no probing.
	Keepalive() KeepalivePolicy
	// LastHeard is when the board last sent anything over the link, MCP or
	// not (a hello, a listen): silence is what keepalive measures, and a
	// board that is talking needs no probe.
	LastHeard() time.Time
}

// KeepalivePolicy says when and how a session probes an idle board.
type KeepalivePolicy struct {
	// Interval is the silence after which the board is probed.
	Interval time.Duration
	// Timeout bounds the board's answer to one probe.
	Timeout time.Duration
	// Misses is how many probes in a row may go unanswered before the link
	// is closed with ErrUnresponsive.
	Misses int
	// OnProbe, when set, is told the outcome of every probe (for the
	// transport's counters). It runs on the session's keepalive goroutine
	// and must be quick.
	OnProbe func(ProbeOutcome)
}

// ProbeOutcome is what one keepalive probe found out.
type ProbeOutcome int

// Probe outcomes.
const (
	// ProbeAnswered: the board replied (an error reply counts: it proves
	// the board alive as well as a result would).
	ProbeAnswered ProbeOutcome = iota
	// ProbeMissed: the board left the probe unanswered.
	ProbeMissed
	// ProbeUnresponsive: the miss that used up the allowance; the link is
	// being closed with ErrUnresponsive.
	ProbeUnresponsive
	// ProbeInconclusive: no verdict, for example because the probe waited
	// its turn behind a long tool call; it neither proves nor disproves
	// life.
	ProbeInconclusive
)

// probeMethod is what keepalive probes send. Boards implement no ping and
// answer any unknown method with an error reply, which proves them alive
// as well as a result would, and costs the board nothing.
const probeMethod = "ping"

// DefaultMaxProbes bounds keepalive probes in flight across the Hub, so a
// fleet falling silent at once (a network blip) does not turn into a burst
// of thousands of requests.
const DefaultMaxProbes = 16

// startKeepalive starts probing the board if its link asks for it, and
// returns a function that stops the probing and waits for it. The
// goroutine is counted in the Hub's WaitGroup, like the session itself.
func (s *Session) startKeepalive() (stop func()) {
	kl, ok := s.link.(KeepaliveLink)
	if !ok {
		return func() {}
	}
	p := kl.Keepalive()
	if p.Interval <= 0 {
		return func() {}
	}
	p.Misses = max(p.Misses, 1)
	p.Timeout = cmp.Or(max(p.Timeout, 0), p.Interval)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	s.hub.wg.Add(1)
	go func() {
		defer s.hub.wg.Done()
		defer close(done)
		s.keepalive(ctx, kl, p)
	}()
	return func() { cancel(); <-done }
}

// keepalive probes the board whenever it has been silent for p.Interval,
// until ctx ends. Only a request the board never answered is a miss, and
// a board heard from between misses starts the count afresh.
func (s *Session) keepalive(ctx context.Context, kl KeepaliveLink, p KeepalivePolicy) {
	// Retry pacing for probes that could not run or found nothing out: a
	// fraction of the interval, as often as idleness is worth checking.
	retry := max(p.Interval/4, 10*time.Millisecond)
	timer := time.NewTimer(p.Interval)
	defer timer.Stop()
	misses := 0
	var lastMiss time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		heard := kl.LastHeard()
		if idle := time.Since(heard); idle < p.Interval {
			timer.Reset(p.Interval - idle)
			continue
		}
		if misses > 0 && heard.After(lastMiss) {
			misses = 0 // it spoke since the last miss: the streak is over
		}
		if !s.hub.acquireProbe() {
			timer.Reset(retry) // enough probes in flight; try again shortly
			continue
		}
		start := time.Now()
		outcome := s.probe(ctx, p)
		if ctx.Err() != nil {
			s.hub.releaseProbe()
			return
		}
		if outcome == ProbeMissed && kl.LastHeard().After(start) {
			outcome = ProbeAnswered // something else arrived meanwhile: it is alive
		}
		switch outcome {
		case ProbeAnswered:
			misses = 0
		case ProbeMissed:
			misses++
			lastMiss = time.Now()
			s.log.Info("board missed a liveness probe", zap.Int("misses", misses), zap.Int("limit", p.Misses))
			if misses >= p.Misses {
				outcome = ProbeUnresponsive
			}
		}
		if p.OnProbe != nil {
			p.OnProbe(outcome)
		}
		// The slot is held until the outcome is reported, so a probe counts
		// as in flight until its verdict is known everywhere.
		s.hub.releaseProbe()
		if outcome == ProbeUnresponsive {
			s.log.Warn("board stopped answering liveness probes; closing its session",
				zap.Int("misses", misses), zap.Duration("silent_for", time.Since(kl.LastHeard())))
			kl.Close(Closing(CauseUnresponsive,
				fmt.Errorf("%w (%d in a row unanswered)", ErrUnresponsive, misses)))
			return
		}
		if outcome == ProbeAnswered {
			timer.Reset(p.Interval)
		} else {
			timer.Reset(retry)
		}
	}
}

// probe sends one cheap request. Any reply, error replies included, proves
// the board alive; only a request the board never answered counts as a
// miss. Waiting for a turn behind a long tool call is not a miss: the
// client's timeout starts only once the request is sent.
func (s *Session) probe(ctx context.Context, p KeepalivePolicy) ProbeOutcome {
	ctx, cancel := context.WithTimeout(ctx, max(p.Interval, 2*p.Timeout))
	defer cancel()
	_, err := s.Call(ctx, probeMethod, nil, p.Timeout)
	var de *DeviceError
	switch {
	case err == nil || errors.As(err, &de):
		return ProbeAnswered
	case errors.Is(err, ErrTimeout):
		return ProbeMissed
	}
	s.log.Debug("liveness probe without verdict", zap.Error(err))
	return ProbeInconclusive
}

// acquireProbe takes one of the Hub's probe slots without waiting.
func (h *Hub) acquireProbe() bool {
	select {
	case h.probes <- struct{}{}:
		return true
	default:
		return false
	}
}

func (h *Hub) releaseProbe() { <-h.probes }
