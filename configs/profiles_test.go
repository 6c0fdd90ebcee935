package configs

import (
	"io/fs"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProfileNames(t *testing.T) {
	assert.Equal(t, []string{"breadboard", "catalog", "conformance", "conformance-tasks", "robot"}, ProfileNames())
}

func TestProfile(t *testing.T) {
	for _, name := range ProfileNames() {
		data, err := Profile(name)
		require.NoError(t, err, name)
		assert.True(t, strings.HasPrefix(string(data), "# "), "%s should start with a comment describing it", name)
	}
	for _, name := range []string{"", "nope", "../profiles/breadboard", "breadboard.yaml", `a\b`} {
		_, err := Profile(name)
		assert.ErrorIs(t, err, fs.ErrNotExist, "%q", name)
	}
}
