// Package tracing exports OpenTelemetry traces of the bridge's upstream
// calls over OTLP/HTTP. It is off unless an endpoint is configured; the
// spans themselves are made where the calls are handled (tools).
package tracing

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// DefaultFlushInterval is Config.FlushInterval's default.
const DefaultFlushInterval = 5 * time.Second

// Config is the tracing: section.
type Config struct {
	// OTLPEndpoint is the collector's OTLP/HTTP URL, e.g.
	// http://localhost:4318 (the path defaults to /v1/traces); "" is off.
	OTLPEndpoint string `yaml:"otlp_endpoint"`
	// SampleRatio is the share of root traces kept (0 < r ≤ 1); a trace
	// whose caller sampled it is always kept. Default 1.
	SampleRatio float64 `yaml:"sample_ratio"`
	// FlushInterval bounds how long a finished span waits before export.
	// Default 5s.
	FlushInterval time.Duration `yaml:"flush_interval"`
}

// Validate reports configuration mistakes (numbers are checked by the
// bridge's configuration against its table of ranges).
func (c Config) Validate() error {
	if c.OTLPEndpoint != "" {
		u, err := url.Parse(c.OTLPEndpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("tracing.otlp_endpoint %q: use http(s)://host:4318", c.OTLPEndpoint)
		}
	}
	return nil
}

// Provider is a running trace pipeline.
type Provider struct {
	tp *sdktrace.TracerProvider
}

// Start builds the pipeline; nil, nil when tracing is off.
func Start(ctx context.Context, c Config, version string) (*Provider, error) {
	if c.OTLPEndpoint == "" {
		return nil, nil
	}
	endpoint := strings.TrimSuffix(c.OTLPEndpoint, "/")
	if u, _ := url.Parse(endpoint); u.Path == "" {
		endpoint += "/v1/traces"
	}
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(endpoint))
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	ratio := cmp.Or(c.SampleRatio, 1)
	flush := cmp.Or(max(c.FlushInterval, 0), DefaultFlushInterval)
	res := resource.NewSchemaless(attribute.String("service.name", "devicebridge"), attribute.String("service.version", version))
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(flush)),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
	)
	return &Provider{tp: tp}, nil
}

// Tracer is the bridge's tracer; nil for a nil provider (tracing off).
func (p *Provider) Tracer() trace.Tracer {
	if p == nil {
		return nil
	}
	return p.tp.Tracer("github.com/devicebridge/devicebridge")
}

// Shutdown exports what is pending and stops.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil {
		return nil
	}
	return p.tp.Shutdown(ctx)
}
