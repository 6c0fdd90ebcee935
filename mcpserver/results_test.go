package mcpserver

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/argcheck"
)

// TestInvalidArgsResultText pins the wording a model reads when its
// arguments are refused: what is wrong, what the tool takes, a call that
// would pass.
func TestInvalidArgsResultText(t *testing.T) {
	schema, err := argcheck.Parse(json.RawMessage(`{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}`))
	require.NoError(t, err)
	e := &entry{name: "dev_ddeeff_audio_speaker_set_volume", schema: schema}
	e.tool.Name = "self.audio_speaker.set_volume"
	_, v := schema.Validate(json.RawMessage(`{"volume":"max"}`))
	require.NotNil(t, v)
	res, code := callFailure(e, "x", &device.ArgumentsError{Tool: e.tool.Name, Invalid: v, Schema: schema}, 0)
	assert.Equal(t, device.CodeInvalidArguments, code)
	require.True(t, res.IsError)
	data, _ := json.Marshal(res.Content[0])
	var c struct{ Text string }
	require.NoError(t, json.Unmarshal(data, &c))
	assert.Equal(t, "Invalid arguments for self.audio_speaker.set_volume; nothing was sent to the board.\n"+
		"- argument \"volume\" must be an integer from 0 to 100, but got the string \"max\".\n"+
		"This tool takes \"volume\" (an integer from 0 to 100, required).\n"+
		"Call it again with arguments like {\"volume\": 50}.", c.Text)
}
