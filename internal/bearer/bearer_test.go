package bearer

import (
	"strings"
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

func TestNamedTokens(t *testing.T) {
	for _, c := range []struct{ in, name, secret string }{
		{"kitchen=s3cret", "kitchen", "s3cret"},
		{"plain", "", "plain"},
		{"dGVzdA==", "", "dGVzdA=="},
		{"abc=", "", "abc="},
		{"a b=c", "", "a b=c"},
		{"x=y=z", "x", "y=z"},
	} {
		n, s := Split(c.in)
		if n != c.name || s != c.secret {
			t.Errorf("Split(%q) = %q, %q; want %q, %q", c.in, n, s, c.name, c.secret)
		}
	}
	set := NewNamed([]string{"kitchen=k1", "o2"})
	if id, ok := set.Lookup("k1"); !ok || id != "kitchen" {
		t.Fatalf("k1: %q %v", id, ok)
	}
	if id, ok := set.Lookup("kitchen=k1"); !ok || id != "kitchen" {
		t.Fatalf("a token configured as abc=def before names existed must keep working: %q %v", id, ok)
	}
	if _, ok := set.Lookup("kitchen"); ok {
		t.Fatal("the name alone is not a credential")
	}
	if id, ok := set.Lookup("o2"); !ok || id != UnnamedIdentity("o2") || strings.Contains(id, "o2") {
		t.Fatalf("o2: %q %v", id, ok)
	}
}
