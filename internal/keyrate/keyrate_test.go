package keyrate

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBurstThenRefusedWithWait(t *testing.T) {
	s := New(1, 3, 10)
	t0 := time.Unix(1000, 0)
	for range 3 {
		ok, _ := s.Allow("a", t0)
		require.True(t, ok)
	}
	ok, wait := s.Allow("a", t0)
	assert.False(t, ok)
	assert.Equal(t, time.Second, wait)
	ok, _ = s.Allow("b", t0)
	assert.True(t, ok, "another key has its own bucket")
	ok, _ = s.Allow("a", t0.Add(time.Second))
	assert.True(t, ok, "one token a second")
}

func TestCancelGivesTheTokenBack(t *testing.T) {
	s := New(1, 1, 10)
	t0 := time.Unix(1000, 0)
	r, ok, _ := s.Reserve("a", t0)
	require.True(t, ok)
	r.CancelAt(t0)
	ok, _ = s.Allow("a", t0)
	assert.True(t, ok)
}

func TestForget(t *testing.T) {
	s := New(1, 1, 1)
	t0 := time.Unix(1000, 0)
	ok, _ := s.Allow("a", t0)
	require.True(t, ok)
	s.Forget("a")
	assert.Zero(t, s.Len())
	ok, _ = s.Allow("b", t0)
	assert.True(t, ok, "the room a forgotten key held is free for a newcomer")
	assert.Equal(t, 1, s.Len(), "b has its own bucket, not the overflow")
	s.Forget("b")
	ok, _ = s.Allow("a", t0)
	assert.True(t, ok, "a forgotten key starts with a full bucket")
}

// TestBoundedKeys: a flood of distinct keys never makes the set hold more
// than its size; past it newcomers share one bucket, and idle buckets are
// reclaimed so that later newcomers get their own again.
func TestBoundedKeys(t *testing.T) {
	s := New(1, 2, 4)
	t0 := time.Unix(1000, 0)
	for i := range 4 {
		ok, _ := s.Allow(fmt.Sprint(i), t0)
		require.True(t, ok)
	}
	shared := 0
	for i := 4; i < 1000; i++ {
		if ok, _ := s.Allow(fmt.Sprint(i), t0); ok {
			shared++
		}
	}
	assert.Equal(t, 4, s.Len())
	assert.Equal(t, 2, shared, "keys past the bound share one bucket of the same burst")
	// Once the buckets have refilled they are reclaimed.
	ok, _ := s.Allow("new", t0.Add(2*time.Second))
	assert.True(t, ok)
	assert.Equal(t, 1, s.Len())
}

func TestAddrKey(t *testing.T) {
	assert.Equal(t, "192.0.2.1", AddrKey("192.0.2.1:5000"))
	assert.Equal(t, "192.0.2.1", AddrKey("[::ffff:192.0.2.1]:5000"))
	assert.Equal(t, "2001:db8:1:2::/64", AddrKey("[2001:db8:1:2:aaaa::1]:80"))
	assert.Equal(t, AddrKey("[2001:db8:1:2::1]:80"), AddrKey("[2001:db8:1:2:ffff::9]:81"), "one /64, one bucket")
	assert.Equal(t, "pipe", AddrKey("pipe"))
}
