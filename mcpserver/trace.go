package mcpserver

// OpenTelemetry spans of upstream requests, with the MCP semantic
// conventions: a server span per request named "{mcp.method.name}
// {target}", continuing the trace context a client put in params._meta
// (traceparent, tracestate), and a child span per board call. Off (no
// cost) unless Access.Tracer is set.

import (
	"context"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

var propagator = propagation.TraceContext{}

// metaCarrier reads trace context from a request's _meta.
type metaCarrier map[string]any

func (m metaCarrier) Get(key string) string { s, _ := m[key].(string); return s }
func (m metaCarrier) Set(key, value string) { m[key] = value }
func (m metaCarrier) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

func (s *Server) startSpan(ctx context.Context, method string, req mcp.Request) (context.Context, trace.Span) {
	tr := s.opts.Access.Tracer
	if tr == nil {
		return ctx, nil
	}
	attrs := []attribute.KeyValue{attribute.String("mcp.method.name", method)}
	name := method
	if p := req.GetParams(); p != nil {
		if meta := p.GetMeta(); len(meta) > 0 {
			ctx = propagator.Extract(ctx, metaCarrier(meta))
		}
		if call, ok := p.(*mcp.CallToolParamsRaw); ok && call != nil {
			attrs = append(attrs, attribute.String("gen_ai.tool.name", call.Name), attribute.String("gen_ai.operation.name", "execute_tool"))
			name += " " + call.Name
		}
	}
	if ss, ok := req.GetSession().(*mcp.ServerSession); ok && ss != nil && ss.ID() != "" {
		attrs = append(attrs, attribute.String("mcp.session.id", ss.ID()))
	}
	return tr.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
}

func endSpan(span trace.Span, res mcp.Result, err error) {
	if span == nil {
		return
	}
	switch {
	case err != nil:
		span.SetAttributes(attribute.String("error.type", fmt.Sprintf("%T", err)))
		span.SetStatus(codes.Error, err.Error())
	default:
		if r, ok := res.(*mcp.CallToolResult); ok && r != nil && r.IsError {
			span.SetAttributes(attribute.String("error.type", "tool_error"))
			span.SetStatus(codes.Error, "tool error")
		}
	}
	span.End()
}

// boardSpan records a finished board call as a child of the request's
// span.
func (s *Server) boardSpan(ctx context.Context, e *entry, outcome string, took time.Duration) {
	tr := s.opts.Access.Tracer
	if tr == nil {
		return
	}
	end := time.Now()
	_, span := tr.Start(ctx, "board "+e.tool.Name, trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(end.Add(-took)),
		trace.WithAttributes(attribute.String("devicebridge.device_id", e.deviceID), attribute.String("devicebridge.board_tool", e.tool.Name),
			attribute.String("gen_ai.tool.name", e.name), attribute.String("devicebridge.outcome", outcome)))
	if outcome != outcomeOK {
		span.SetStatus(codes.Error, outcome)
	}
	span.End(trace.WithTimestamp(end))
}
