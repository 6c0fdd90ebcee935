package mcphttp

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestRoute: the protocol era picks the handler. The modern era is a
// version header from 2026-07-28 on, the same version in the body's _meta
// when no header says otherwise, or server/discover in any form.
func TestRoute(t *testing.T) {
	meta := `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`
	for _, tt := range []struct {
		name, method, version, body string
		modern                      bool
	}{
		{"initialize", http.MethodPost, "", `{"jsonrpc":"2.0","id":1,"method":"initialize"}`, false},
		{"legacy session request", http.MethodPost, "2025-11-25", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, false},
		{"GET stream", http.MethodGet, "2025-11-25", "", false},
		{"DELETE", http.MethodDelete, "", "", false},
		{"modern header", http.MethodPost, "2026-07-28", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, true},
		{"later header", http.MethodPost, "2027-01-01", "", true},
		{"modern _meta", http.MethodPost, "", meta, true},
		{"_meta against an older header", http.MethodPost, "2025-11-25", meta, false},
		{"discover", http.MethodPost, "2025-11-25", `{"jsonrpc":"2.0","id":1,"method":"server/discover"}`, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			modern, legacy := &reached{}, &reached{}
			r := request(tt.method, tt.body)
			if tt.version != "" {
				r.Header.Set(headerProtocolVersion, tt.version)
			}
			serve(route(modern, legacy), classified(r))
			assert.Len(t, modern.reqs, map[bool]int{true: 1}[tt.modern], "modern")
			assert.Len(t, legacy.reqs, map[bool]int{false: 1}[tt.modern], "legacy")
		})
	}
}
