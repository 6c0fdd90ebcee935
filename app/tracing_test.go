package app_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
	collector "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/devicebridge/devicebridge/simulator"
)

// otlpSink is an OTLP/HTTP trace collector that keeps what it receives.
type otlpSink struct {
	mu    sync.Mutex
	spans []*tracepb.Span
}

func (s *otlpSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req collector.ExportTraceServiceRequest
	if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
		http.Error(w, "bad export", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			s.spans = append(s.spans, ss.Spans...)
		}
	}
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&collector.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

func (s *otlpSink) find(name string) *tracepb.Span {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sp := range s.spans {
		if sp.Name == name {
			return sp
		}
	}
	return nil
}

func attr(sp *tracepb.Span, key string) string {
	for _, kv := range sp.Attributes {
		if kv.Key == key {
			return kv.Value.GetStringValue()
		}
	}
	return ""
}

// TestTracesOfAToolCall: with an OTLP endpoint, a tools/call that carries
// trace context in _meta is exported as a server span of that trace, with
// the MCP attributes, and a child span for the board call.
func TestTracesOfAToolCall(t *testing.T) {
	noLeaks(t)
	sink := &otlpSink{}
	collectorSrv := httptest.NewServer(sink)
	t.Cleanup(collectorSrv.Close) // after the bridge flushed its last spans
	cfg := testConfig()
	cfg.Tracing.OTLPEndpoint = collectorSrv.URL
	cfg.Tracing.FlushInterval = 10 * time.Millisecond
	cfg.MCP.Aliases = map[string]string{kitchenMAC: "kitchen"}
	a, base := startApp(t, cfg)
	obsBoard(t, a, simulator.Config{MAC: kitchenMAC})
	require.Eventually(t, func() bool { return a.MCP().Published(kitchenMAC) }, obsWait, 5*time.Millisecond)

	cs := mcpSession(t, base, http.DefaultClient, "2025-11-25")
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "kitchen_get_device_status",
		Meta: mcp.Meta{"traceparent": "00-" + traceID + "-00f067aa0ba902b7-01"}})
	require.NoError(t, err)
	require.False(t, res.IsError)

	var server, board *tracepb.Span
	require.Eventually(t, func() bool {
		server, board = sink.find("tools/call kitchen_get_device_status"), sink.find("board self.get_device_status")
		return server != nil && board != nil
	}, obsWait, 10*time.Millisecond)
	require.Equal(t, traceID, hexID(server.TraceId), "the client's trace continues")
	require.Equal(t, "tools/call", attr(server, "mcp.method.name"))
	require.Equal(t, "kitchen_get_device_status", attr(server, "gen_ai.tool.name"))
	require.Equal(t, server.SpanId, board.ParentSpanId, "the board call is a child of the request")
	require.Equal(t, kitchenMAC, attr(board, "devicebridge.device_id"))
}

func hexID(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}
