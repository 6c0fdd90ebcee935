package app

// This file is the upstream MCP server's hook into the app; it is replaced by
// the upstream server's wiring.

import (
	"context"
	"flag"
	"net/http"
)

// MCPConfig configures the upstream MCP server on /mcp.
type MCPConfig struct{}

func defaultMCPConfig() MCPConfig                     { return MCPConfig{} }
func (c MCPConfig) validate() error                   { return nil }
func registerMCPFlags(fs *flag.FlagSet, c *MCPConfig) {}

// startMCP mounts /mcp on the control mux and starts whatever it needs; it
// registers its own shutdown with a.onShutdown.
func (a *App) startMCP(ctx context.Context, mux *http.ServeMux) error { return nil }
