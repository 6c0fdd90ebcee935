package voicestub

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/simulator"
)

// TestSimulatedBoard: a real simulated board (the catalog profile, whose
// tools need several pages) connects as a board would; the stub's MCP
// client pages its whole catalogue and calls one of its tools.
func TestSimulatedBoard(t *testing.T) {
	s := startStub(t, Config{Tokens: []string{"tok"}})
	p, err := simulator.LoadProfile("catalog")
	require.NoError(t, err)
	const mac = "02:00:00:00:00:01"
	b, err := simulator.NewBoard(simulator.Config{Profile: p, MAC: mac, Token: "tok", ProtocolVersion: 2})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(testCtx(t))
	require.NoError(t, b.ConnectWebSocket(ctx, s.URL()))
	served := make(chan error, 1)
	go func() { served <- b.Serve(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-served)
		require.NoError(t, b.Close())
	}()

	require.NoError(t, s.WaitTools(testCtx(t), mac))
	c := last(t, s, mac)
	assert.Equal(t, "static", c.AuthBy)
	assert.Equal(t, 2, c.ProtocolVersion)
	require.Empty(t, c.MCPError)
	require.True(t, c.ToolsListed)
	require.GreaterOrEqual(t, len(c.ToolPages), 2, "the catalog needs more than one page")

	// Each page's nextCursor is the first tool of the next (the board's
	// cursor is inclusive), and every tool appears once.
	seen := map[string]bool{}
	for i, raw := range c.ToolPages {
		var page struct {
			Tools []struct {
				Name string `json:"name"`
			} `json:"tools"`
			NextCursor string `json:"nextCursor"`
		}
		require.NoError(t, json.Unmarshal(raw, &page))
		require.NotEmpty(t, page.Tools)
		for _, tl := range page.Tools {
			assert.False(t, seen[tl.Name], "tool %s listed twice", tl.Name)
			seen[tl.Name] = true
		}
		if i+1 < len(c.ToolPages) {
			require.NotEmpty(t, page.NextCursor)
			assert.Contains(t, string(c.ToolPages[i+1]), `{"tools":[{"name":"`+page.NextCursor+`"`)
		} else {
			assert.Empty(t, page.NextCursor)
		}
	}
	assert.Len(t, c.Tools, len(seen))
	assert.True(t, seen["self.get_device_status"])

	res, err := s.CallTool(testCtx(t), mac, "self.audio_speaker.set_volume", map[string]int{"volume": 42})
	require.NoError(t, err)
	assert.JSONEq(t, `{"content":[{"type":"text","text":"true"}],"isError":false}`, string(res))
	assert.EqualValues(t, 42, b.State()["audio_speaker.volume"])
	_, err = s.CallTool(testCtx(t), mac, "self.nope", nil)
	var te *ToolError
	require.ErrorAs(t, err, &te)
	assert.Equal(t, "Unknown tool: self.nope", te.Message)
}
