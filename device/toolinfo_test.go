package device

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestToolInfosNameProseDefaults: a tool whose schema declares prose as a
// default (the firmware's self.upgrade_firmware) names that argument, so
// that clients neither show nor prefill it; the schema itself is the
// board's.
func TestToolInfosNameProseDefaults(t *testing.T) {
	upgrade := `{"type":"object","properties":{"url":{"type":"string","default":"The URL of the firmware binary file to download and install"}}}`
	snapshot := `{"type":"object","properties":{"url":{"type":"string"},"quality":{"type":"integer","default":80}},"required":["url"]}`
	info := Info{Tools: []Tool{
		{Name: "self.upgrade_firmware", InputSchema: json.RawMessage(upgrade)},
		{Name: "self.screen.snapshot", InputSchema: json.RawMessage(snapshot)},
		{Name: "self.reboot"},
	}}
	tools := info.ToolInfos()
	assert.Equal(t, []string{"url"}, tools[0].ProseDefaults)
	assert.JSONEq(t, upgrade, string(tools[0].InputSchema))
	assert.Empty(t, tools[1].ProseDefaults)
	assert.Empty(t, tools[2].ProseDefaults)
	b, err := json.Marshal(tools[1])
	assert.NoError(t, err)
	assert.NotContains(t, string(b), "prose_defaults", "absent when none")
}
