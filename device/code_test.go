package device

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/internal/argcheck"
)

// TestLogSafe: the logged form of an invalid-arguments error keeps the
// tool, the code and the arguments at fault, and drops what the caller
// sent, which the error itself quotes back to the caller.
func TestLogSafe(t *testing.T) {
	schema, err := argcheck.Parse(json.RawMessage(`{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}`))
	require.NoError(t, err)
	_, bad := schema.Validate(json.RawMessage(`{"volume":"secret-value-1"}`))
	require.NotNil(t, bad)
	full := &ArgumentsError{Tool: "self.audio_speaker.set_volume", Invalid: bad, Schema: schema}
	require.Contains(t, full.Error(), "secret-value-1", "the caller sees what it sent")

	safe := LogSafe(full)
	assert.NotContains(t, safe.Error(), "secret-value-1")
	assert.Contains(t, safe.Error(), "self.audio_speaker.set_volume")
	assert.Contains(t, safe.Error(), "volume")
	assert.Equal(t, CodeInvalidArguments, CodeOf(safe))

	other := errors.New("device offline")
	assert.Same(t, other, LogSafe(other))
	assert.Nil(t, LogSafe(nil))
}
