package clip

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestShortStringsPassWhole(t *testing.T) {
	for _, s := range []string{"", "02:00:00:00:00:01", strings.Repeat("x", Max)} {
		assert.Equal(t, s, String(s))
	}
}

func TestLongStringsAreCutAndMarked(t *testing.T) {
	s := strings.Repeat("a", 1<<20)
	got := String(s)
	assert.True(t, strings.HasPrefix(got, strings.Repeat("a", Max)+"…"), got)
	assert.Contains(t, got, "cut from 1048576 bytes")
	assert.Less(t, len(got), Max+40)
}

func TestCutsAtARuneBoundary(t *testing.T) {
	// "é" is two bytes: with one byte of padding, byte Max falls inside a
	// rune, so the cut must step back to its start.
	s := "x" + strings.Repeat("é", Max)
	got := String(s)
	assert.True(t, utf8.ValidString(got), "a cut never splits a rune")
	prefix, _, ok := strings.Cut(got, "…")
	assert.True(t, ok)
	assert.Equal(t, Max-1, len(prefix))
	// Four-byte runes: the step back is at most three bytes.
	got = String(strings.Repeat("😀", Max))
	assert.True(t, utf8.ValidString(got))
}

func TestNotUTF8IsStillBounded(t *testing.T) {
	got := String(strings.Repeat("\x80", 10*Max))
	assert.Less(t, len(got), Max+40)
}

func TestFieldsCutTheirValues(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	log := zap.New(core)
	long := strings.Repeat("z", 5000)
	log.Info("line", Field("tool", long), Error(errors.New(long)), Error(nil), NamedError("why", errors.New("short")))
	m := logs.All()[0].ContextMap()
	assert.Equal(t, String(long), m["tool"])
	assert.Equal(t, String(long), m["error"])
	assert.Equal(t, "short", m["why"])
	assert.Len(t, m, 3, "a nil error adds no field")
}
