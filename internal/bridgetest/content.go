package bridgetest

import (
	_ "embed"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/simulator"
)

//go:embed testdata/content.yaml
var contentProfile []byte

// ContentProfile writes the content profile (a board answering every kind
// of content a tool result may carry: text, image, audio, resource_link,
// embedded text and blob resources, annotations, _meta,
// structuredContent, isError) into a temporary file and returns its path,
// for Bridge.Board.
func ContentProfile(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "content.yaml")
	require.NoError(t, os.WriteFile(path, contentProfile, 0o600))
	return path
}

// BoardResult is what a content tool answers, decoded.
type BoardResult struct {
	Content           []json.RawMessage `json:"content"`
	IsError           bool              `json:"isError"`
	StructuredContent json.RawMessage   `json:"structuredContent"`
}

// ContentResults are the content profile's tools and what each answers.
func ContentResults(t testing.TB) map[string]BoardResult {
	t.Helper()
	p, err := simulator.ParseProfile(contentProfile, "content")
	require.NoError(t, err)
	out := map[string]BoardResult{}
	for _, tool := range p.Tools {
		var r BoardResult
		require.NoError(t, json.Unmarshal(tool.Result, &r), tool.Name)
		out[tool.Name] = r
	}
	return out
}

// AssertSameContent compares what a host received with what the board
// sent, item by item, as JSON: every field of every item must arrive.
func AssertSameContent(t testing.TB, want BoardResult, res *mcp.CallToolResult) {
	t.Helper()
	require.Len(t, res.Content, len(want.Content))
	for i, c := range res.Content {
		got, err := json.Marshal(c)
		require.NoError(t, err)
		assert.JSONEq(t, string(want.Content[i]), string(got), "content[%d]", i)
	}
	assert.Equal(t, want.IsError, res.IsError)
	if want.StructuredContent != nil {
		got, err := json.Marshal(res.StructuredContent)
		require.NoError(t, err)
		assert.JSONEq(t, string(want.StructuredContent), string(got))
	}
}
