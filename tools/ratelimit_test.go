package tools

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRateLimiterPerKey(t *testing.T) {
	l := newRateLimiter(2, 3)
	now := time.Unix(1000, 0)
	for i := range 3 {
		ok, _ := l.allow("a", now)
		require.True(t, ok, "burst call %d", i)
	}
	ok, wait := l.allow("a", now)
	require.False(t, ok, "the burst is spent")
	assert.InDelta(t, 500*time.Millisecond, wait, float64(time.Millisecond), "one token every 500ms")
	ok, _ = l.allow("b", now)
	assert.True(t, ok, "keys are independent")
	ok, _ = l.allow("a", now.Add(500*time.Millisecond))
	assert.True(t, ok, "a refused call does not use up the next token")

	l.forget("a")
	ok, _ = l.allow("a", now.Add(500*time.Millisecond))
	assert.True(t, ok, "a forgotten key starts with a full burst")
}

func TestRateLimiterSweepsIdleKeys(t *testing.T) {
	l := newRateLimiter(10, 1)
	now := time.Unix(1000, 0)
	for i := range minSweepSize {
		l.allow(fmt.Sprint(i), now)
	}
	l.allow("late", now.Add(time.Second)) // every earlier bucket has refilled
	l.mu.Lock()
	defer l.mu.Unlock()
	assert.Len(t, l.limiters, 1)
}
