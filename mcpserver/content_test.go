package mcpserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/internal/bridgetest"
	"github.com/devicebridge/devicebridge/simulator"
)

// TestContentPassThrough: whatever content a board answers (text, image,
// audio, resource_link, embedded text and blob resources, with their
// annotations and _meta; structuredContent; isError) reaches an MCP host
// as the board sent it, in both eras, and /api returns it as well.
func TestContentPassThrough(t *testing.T) {
	want := bridgetest.ContentResults(t)
	b := startBridge(t, nil)
	b.Board(macA, bridgetest.ContentProfile(t), simulator.Config{})
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			cs := b.Client(era, nil)
			for name, w := range want {
				t.Run(name, func(t *testing.T) {
					bridgetest.AssertSameContent(t, w, callTool(t, cs, upstreamName(macA, name), nil))
				})
			}
		})
	}

	t.Run("api", func(t *testing.T) {
		for name, w := range want {
			t.Run(name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.Base+"/api/devices/"+macA+"/call",
					strings.NewReader(`{"name":"`+name+`"}`))
				require.NoError(t, err)
				req.Header.Set("Content-Type", "application/json")
				resp, err := b.HTTP.Do(req)
				require.NoError(t, err)
				defer resp.Body.Close()
				require.Equal(t, http.StatusOK, resp.StatusCode)
				var got bridgetest.BoardResult
				require.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
				require.Len(t, got.Content, len(w.Content))
				for i := range got.Content {
					assert.JSONEq(t, string(w.Content[i]), string(got.Content[i]), "content[%d]", i)
				}
				assert.Equal(t, w.IsError, got.IsError)
				if w.StructuredContent != nil {
					assert.JSONEq(t, string(w.StructuredContent), string(got.StructuredContent))
				}
			})
		}
	})
}
