package mcpserver

import (
	"context"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/devicebridge/devicebridge/mcpserver/mcphttp"
)

// Observer is told about every request and notification the upstream MCP
// server receives (for metrics). Calls happen on request paths, so it must
// be quick.
type Observer interface {
	// MCPRequestDone: a request ended. outcome is "ok", "error" (a
	// JSON-RPC error), or "tool_error" (a tools/call result with isError).
	MCPRequestDone(method, outcome string, took time.Duration)
}

// Request outcomes reported to the Observer.
const (
	RequestOK        = outcomeOK
	RequestError     = "error"
	RequestToolError = outcomeToolError
)

// observeMiddleware reports each received method to opts.Observer. It is
// added last, so it is the outermost middleware and sees what the client
// sees (the withdrawn-tool answers included).
func (s *Server) observeMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		start := time.Now()
		res, err := next(ctx, method, req)
		outcome := RequestOK
		if err != nil {
			outcome = RequestError
		} else if r, ok := res.(*mcp.CallToolResult); ok && r != nil && r.IsError {
			outcome = RequestToolError
		}
		s.opts.Observer.MCPRequestDone(method, outcome, time.Since(start))
		return res, err
	}
}

// SessionCount is the number of upstream MCP sessions open now (the
// session-based protocol eras; stateless requests open none).
func (s *Server) SessionCount() int {
	n := 0
	for range s.mcp.Sessions() {
		n++
	}
	return n
}

// SessionStats reports the legacy sessions' bounds at work: live sessions,
// refused initializations, sessions closed for idling.
func (s *Server) SessionStats() SessionStats { return s.http.Stats() }

// SessionStats describes the legacy MCP sessions (for metrics); package
// mcphttp, which admits them, counts.
type SessionStats = mcphttp.SessionStats
