package bearer

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestTokens(t *testing.T) {
	ts := New([]string{"a", "Basic xyz"})
	assert.False(t, ts.Empty())
	assert.True(t, New(nil).Empty())
	assert.Equal(t, 0, ts.Index("a"))
	assert.Equal(t, 1, ts.Index("Basic xyz"))
	assert.Equal(t, -1, ts.Index("b"))
	assert.Equal(t, -1, ts.Index(""))
}

func TestFromHeader(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want string
		ok   bool
	}{
		{"Bearer abc", "abc", true},
		{"bearer  abc ", "abc", true},
		{"Basic abc", "", false},
		{"abc", "", false},
		{"", "", false},
	} {
		got, ok := FromHeader(tt.in)
		assert.Equal(t, tt.want, got, tt.in)
		assert.Equal(t, tt.ok, ok, tt.in)
	}
}
