package mcphttp

import (
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// evictions records what sessionLimits closes, and reports each back as
// closed, as the go-sdk does.
type evictions struct {
	mu  sync.Mutex
	ids []string
	l   *sessionLimits
}

func (e *evictions) evict(sid string) {
	e.mu.Lock()
	e.ids = append(e.ids, sid)
	e.mu.Unlock()
	e.l.closed(sid)
}

func (e *evictions) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.ids)
}

func open(t *testing.T, l *sessionLimits, client, sid string) {
	t.Helper()
	res, full, _ := l.reserve(client)
	require.NotNil(t, res, "refused: %s", full)
	res.admit(sid)
	l.end(sid) // the initialize request ends
}

// TestSessionIdleClock: the idle clock runs only while a session has no
// request in flight and no stream open. A host that uses its session more
// often than the timeout, or keeps a stream open, is never cut off.
func TestSessionIdleClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ev := &evictions{}
		l := newSessionLimits(10, 10, time.Minute, ev.evict)
		ev.l = l
		defer l.stop()
		open(t, l, "addr:a", "now-and-then")
		open(t, l, "addr:a", "listening")
		open(t, l, "addr:a", "forgotten")
		require.True(t, l.begin("listening")) // a GET stream opens and stays

		for range 5 {
			time.Sleep(50 * time.Second)
			require.True(t, l.begin("now-and-then"))
			l.end("now-and-then")
		}
		synctest.Wait()
		assert.Equal(t, []string{"forgotten"}, ev.list(), "only the session nobody used closed")
		assert.Equal(t, 2, l.stats().Live)

		// Ten minutes later the stream is still open; the other session,
		// left alone, closed a minute after its last request.
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		assert.Equal(t, []string{"forgotten", "now-and-then"}, ev.list())
		assert.False(t, l.begin("now-and-then"), "a closed session is not live")

		// Once its stream ends, the listening host's session idles out too.
		l.end("listening")
		time.Sleep(59 * time.Second)
		synctest.Wait()
		assert.Len(t, ev.list(), 2)
		time.Sleep(time.Second)
		synctest.Wait()
		assert.Equal(t, []string{"forgotten", "now-and-then", "listening"}, ev.list())
		st := l.stats()
		assert.Zero(t, st.Live)
		assert.EqualValues(t, 3, st.IdleClosed)
	})
}

// TestSessionReservations: initializations in flight count against the
// caps; one that issues no session gives its slot back; Retry-After is
// when the longest-idle session of the client (or of anyone, for the
// global cap) times out.
func TestSessionReservations(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ev := &evictions{}
		l := newSessionLimits(3, 2, time.Minute, ev.evict)
		ev.l = l
		defer l.stop()

		r1, _, _ := l.reserve("addr:a")
		r2, _, _ := l.reserve("addr:a")
		require.NotNil(t, r1)
		require.NotNil(t, r2)
		r, full, wait := l.reserve("addr:a")
		require.Nil(t, r)
		assert.Equal(t, refusedClient, full)
		assert.Equal(t, time.Minute, wait, "nobody idle: the whole timeout")

		r2.release()
		r2.release() // idempotent
		r3, _, _ := l.reserve("addr:a")
		require.NotNil(t, r3, "a released slot is free again")
		r1.admit("s1")
		r3.admit("s3")
		r1.release() // after admit: no effect
		l.end("s1")
		l.end("s3")

		time.Sleep(20 * time.Second)
		_, full, wait = l.reserve("addr:a")
		assert.Equal(t, refusedClient, full)
		assert.Equal(t, 40*time.Second, wait)

		rb, _, _ := l.reserve("addr:b")
		require.NotNil(t, rb)
		_, full, wait = l.reserve("addr:c")
		assert.Equal(t, refusedTotal, full)
		assert.Equal(t, 40*time.Second, wait)
		st := l.stats()
		assert.Equal(t, 3, st.Live)
		assert.EqualValues(t, 2, st.RefusedClient)
		assert.EqualValues(t, 1, st.RefusedTotal)

		l.closed("s1")
		l.closed("s1") // idempotent
		rc, _, _ := l.reserve("addr:c")
		require.NotNil(t, rc)
		rb.release()
		rc.release()
	})
}
