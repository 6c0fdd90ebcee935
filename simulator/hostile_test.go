package simulator

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHostileExtraToolsArePaged: extra tools follow the profile's; one past
// the firmware's page budget is sent alone on its page rather than refused.
func TestHostileExtraToolsArePaged(t *testing.T) {
	deep := DeepSchemaTool("self.hostile.deep", 600)
	require.Greater(t, len(deep), toolsPageLimit, "the deep tool must not fit a firmware page")
	h := newHarness(t, Config{Hostile: &Hostile{ExtraTools: []string{deep, `{"name":"self.hostile.small","inputSchema":{"type":"object"}}`}}})
	var names []string
	cursor := ""
	for i := 0; i < 10; i++ {
		pg := h.listPage(i+1, cursor, true)
		names = append(names, pg.names...)
		if pg.next == "" {
			break
		}
		cursor = pg.next
	}
	require.GreaterOrEqual(t, len(names), 3)
	assert.Equal(t, []string{"self.hostile.deep", "self.hostile.small"}, names[len(names)-2:])

	var tool struct {
		InputSchema json.RawMessage `json:"inputSchema"`
	}
	require.NoError(t, json.Unmarshal([]byte(deep), &tool))
	assert.Equal(t, 601, strings.Count(string(tool.InputSchema), `"type"`), "600 nested objects and the leaf")
}

// TestHostileDeviceIDOnTheWire: a hostile board sends its chosen id as
// Device-Id instead of its MAC.
func TestHostileDeviceIDOnTheWire(t *testing.T) {
	ts := newTestServer(t, nil)
	b := newTestBoard(t, Config{MAC: "02:00:00:00:00:01", Hostile: &Hostile{DeviceID: "02-00-00-00-00-01"}})
	sc, _, err := connect(t, b, ts, serverHello)
	require.NoError(t, err)
	assert.Equal(t, "02-00-00-00-00-01", sc.header.Get("Device-Id"))
	assert.Equal(t, "02:00:00:00:00:01", b.MAC(), "the board's own MAC is unchanged")
}

func TestHostileValidation(t *testing.T) {
	p := mustProfile(t, "breadboard")
	_, err := NewBoard(Config{Profile: p, Hostile: &Hostile{DeviceID: "a\r\nb"}})
	assert.Error(t, err)
	_, err = NewBoard(Config{Profile: p, Hostile: &Hostile{ExtraTools: []string{"{"}}})
	assert.Error(t, err)
}

func TestWideSchemaTool(t *testing.T) {
	var tool struct {
		InputSchema struct {
			Properties map[string]json.RawMessage `json:"properties"`
		} `json:"inputSchema"`
	}
	require.NoError(t, json.Unmarshal([]byte(WideSchemaTool("w", 1000, 10)), &tool))
	assert.Len(t, tool.InputSchema.Properties, 1000)
}
