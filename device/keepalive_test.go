package device

// Every keepalive test runs in a synctest bubble: the probes' timers run
// on the bubble's clock, so the short intervals and the Never checks take
// no real time, and a loaded machine cannot make a board look idle or a
// probe look late. The links are in-memory (testlink), which the bubble
// can see blocked.

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/internal/testlink"
)

// aliveLink is the bridge end of a testlink that opts in to keepalive, as
// MQTT links do. Muting it drops everything the bridge sends, which is what
// a board that vanished behind a broker looks like: requests go out,
// nothing comes back, and nobody says the connection ended.
type aliveLink struct {
	*testlink.Link
	policy KeepalivePolicy
	heard  atomic.Int64
	muted  atomic.Bool
	pings  atomic.Int64
	probes *gauge

	mu       sync.Mutex
	outcomes []ProbeOutcome
}

var _ KeepaliveLink = (*aliveLink)(nil)

func newAliveLink(l *testlink.Link, p KeepalivePolicy) *aliveLink {
	a := &aliveLink{Link: l, policy: p, probes: &gauge{}}
	a.touch()
	return a
}

func (l *aliveLink) touch() { l.heard.Store(time.Now().UnixNano()) }

func (l *aliveLink) Send(ctx context.Context, msg []byte) error {
	if bytes.Contains(msg, []byte(`"method":"ping"`)) {
		l.pings.Add(1)
		l.probes.up()
	}
	if l.muted.Load() {
		return nil
	}
	return l.Link.Send(ctx, msg)
}

func (l *aliveLink) Receive(ctx context.Context) ([]byte, error) {
	m, err := l.Link.Receive(ctx)
	if err == nil {
		l.touch()
	}
	return m, err
}

func (l *aliveLink) LastHeard() time.Time { return time.Unix(0, l.heard.Load()) }

func (l *aliveLink) Keepalive() KeepalivePolicy {
	p := l.policy
	p.OnProbe = func(o ProbeOutcome) {
		l.probes.down()
		l.mu.Lock()
		l.outcomes = append(l.outcomes, o)
		l.mu.Unlock()
	}
	return p
}

func (l *aliveLink) count(o ProbeOutcome) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, x := range l.outcomes {
		if x == o {
			n++
		}
	}
	return n
}

// gauge tracks probes in flight (sent, verdict not yet reported) and the
// most ever seen at once.
type gauge struct {
	mu        sync.Mutex
	now, most int
}

func (g *gauge) up() {
	g.mu.Lock()
	g.now++
	g.most = max(g.most, g.now)
	g.mu.Unlock()
}

func (g *gauge) down() {
	g.mu.Lock()
	g.now--
	g.mu.Unlock()
}

var fastKeepalive = KeepalivePolicy{Interval: 40 * time.Millisecond, Timeout: 60 * time.Millisecond, Misses: 2}

func attachAlive(t *testing.T, h *Hub, mac string, p KeepalivePolicy) (*board, *aliveLink, *Session) {
	t.Helper()
	return attachAliveCounting(t, h, mac, p, &gauge{})
}

// attachAliveCounting is attachAlive with the gauge that counts the link's
// probes in flight (set before the session's keepalive can read it).
func attachAliveCounting(t *testing.T, h *Hub, mac string, p KeepalivePolicy, probes *gauge) (*board, *aliveLink, *Session) {
	t.Helper()
	b, end := startBoard(t, twoTools)
	l := newAliveLink(end, p)
	l.probes = probes
	s, err := h.Attach(l, Identity{DeviceID: mac, Transport: "test", HasMCP: true})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, s.WaitReady(ctx))
	return b, l, s
}

// TestKeepaliveProbesIdleBoard: an idle board is probed; its error reply
// to the unknown method proves it alive, so it stays.
func TestKeepaliveProbesIdleBoard(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHub(t)
		_, l, s := attachAlive(t, h, "aa:bb:cc:dd:ee:a1", fastKeepalive)
		require.Eventually(t, func() bool { return l.count(ProbeAnswered) >= 3 }, 5*time.Second, 5*time.Millisecond)
		assert.Zero(t, l.count(ProbeMissed))
		assert.Equal(t, StateReady, s.Info().State)
	})
}

// TestKeepaliveClosesUnresponsiveBoard: a board that stops answering is
// closed with ErrUnresponsive after Misses unanswered probes, and the
// close carries CauseUnresponsive.
func TestKeepaliveClosesUnresponsiveBoard(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHub(t)
		sub := h.Subscribe()
		defer sub.Close()
		_, l, s := attachAlive(t, h, "aa:bb:cc:dd:ee:a2", fastKeepalive)
		waitEvents(t, sub, 1) // online
		l.muted.Store(true)

		ev := waitEvents(t, sub, 1)
		require.Equal(t, EventOffline, ev[0].Type)
		assert.Equal(t, CauseUnresponsive, ev[0].Info.CloseCause)
		assert.ErrorIs(t, l.Err(), ErrUnresponsive)
		assert.Equal(t, 1, l.count(ProbeMissed), "the first miss is tolerated")
		assert.Equal(t, 1, l.count(ProbeUnresponsive), "the second closes")
		<-s.Done()
	})
}

// TestKeepaliveTrafficIsLife: a board heard from on the link (a hello, a
// listen: anything) is not probed, even though it would not answer.
func TestKeepaliveTrafficIsLife(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHub(t)
		// The toucher touches ten times per interval; the bubble's clock
		// keeps that exact, whatever the machine's load.
		p := KeepalivePolicy{Interval: 200 * time.Millisecond, Timeout: 50 * time.Millisecond, Misses: 1}
		_, l, _ := attachAlive(t, h, "aa:bb:cc:dd:ee:a3", p)
		l.muted.Store(true)
		pings := l.pings.Load()
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			tick := time.NewTicker(p.Interval / 10)
			defer tick.Stop()
			for {
				l.touch()
				select {
				case <-stop:
					return
				case <-tick.C:
				}
			}
		}()
		assert.Never(t, func() bool { return l.pings.Load() > pings }, 5*p.Interval, 5*time.Millisecond)
		close(stop)
		<-done
		select {
		case <-l.Done():
			t.Fatal("a talking board was closed")
		default:
		}
	})
}

// TestKeepaliveWaitingBehindLongCallIsNoMiss: a probe that waits its turn
// behind a tool call longer than several probe timeouts is not a miss; the
// board stays, and the call completes.
func TestKeepaliveWaitingBehindLongCallIsNoMiss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHub(t)
		b, end := startBoard(t, twoTools)
		b.hold = make(chan struct{})
		l := newAliveLink(end, fastKeepalive)
		s, err := h.Attach(l, Identity{DeviceID: "aa:bb:cc:dd:ee:a4", Transport: "test", HasMCP: true})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, s.WaitReady(ctx))

		res := make(chan error, 1)
		go func() {
			_, err := s.CallTool(ctx, "self.get_device_status", nil)
			res <- err
		}()
		// Several probe timeouts pass while the call holds the board.
		require.Eventually(t, func() bool { return l.count(ProbeInconclusive) >= 2 }, 5*time.Second, 5*time.Millisecond)
		close(b.hold)
		require.NoError(t, <-res)
		assert.Zero(t, l.count(ProbeMissed))
		assert.Zero(t, l.count(ProbeUnresponsive))
		assert.Equal(t, StateReady, s.Info().State)
	})
}

// TestKeepaliveProbesAreBounded: however many boards fall silent at once,
// no more than MaxProbes probes are in flight across the Hub, and every
// silent board is still found out.
func TestKeepaliveProbesAreBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := NewHub(HubConfig{MaxProbes: 1}, nil)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			require.NoError(t, h.Close(ctx))
		})
		shared := &gauge{}
		var links []*aliveLink
		for _, mac := range []string{"aa:bb:cc:dd:ee:b1", "aa:bb:cc:dd:ee:b2", "aa:bb:cc:dd:ee:b3"} {
			_, l, _ := attachAliveCounting(t, h, mac, fastKeepalive, shared)
			links = append(links, l)
		}
		for _, l := range links {
			l.muted.Store(true)
		}
		for _, l := range links {
			select {
			case <-l.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("a silent board was never closed")
			}
			assert.ErrorIs(t, l.Err(), ErrUnresponsive)
		}
		shared.mu.Lock()
		defer shared.mu.Unlock()
		assert.Equal(t, 1, shared.most, "probes in flight at once across the Hub")
	})
}

// TestNoKeepaliveWithoutOptIn: links that do not ask for keepalive (or ask
// with no interval) are never probed.
func TestNoKeepaliveWithoutOptIn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHub(t)
		_, l, _ := attachAlive(t, h, "aa:bb:cc:dd:ee:a5", KeepalivePolicy{Interval: -1, Timeout: time.Millisecond})
		l.heard.Store(0) // silent since 1970
		assert.Never(t, func() bool { return l.pings.Load() > 0 }, 200*time.Millisecond, 5*time.Millisecond)
	})
}
