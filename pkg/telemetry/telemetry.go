// Package telemetry sets up OpenTelemetry for a gauntlet process: a meter provider whose
// instruments are served in Prometheus text format on /metrics, and a tracer provider that
// records spans into a JSON-lines file when one is configured (a no-op otherwise).
//
// One Telemetry per process; its providers are safe for concurrent use. Instruments on hot
// paths are counters and histograms created once at construction, never per call.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/exemplar"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// Telemetry holds the process's meter and tracer providers.
type Telemetry struct {
	Meters *sdkmetric.MeterProvider
	// Tracers records spans into the trace file; without one it is OpenTelemetry's no-op
	// provider.
	Tracers trace.TracerProvider
	// sdkTracers is Tracers when it records, for Shutdown to flush.
	sdkTracers *sdktrace.TracerProvider
	handler    http.Handler
	traceF     *os.File
}

// New builds the providers. traceFile, when set, receives every finished span as JSON.
func New(service, traceFile string) (*Telemetry, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	res := resource.NewSchemaless(semconv.ServiceName(service))
	t := &Telemetry{
		// No exemplars: /metrics is Prometheus text, which carries none, and offering
		// every measurement made under a sampled span to a reservoir cost a worker CPU
		// (docs/benchmarks.md, Costs the code cites, Telemetry and the worker).
		Meters: sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(res),
			sdkmetric.WithExemplarFilter(exemplar.AlwaysOffFilter)),
		handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
	}
	// Spans are recorded only when they go somewhere. Without a trace file the tracers are
	// no-ops: an SDK span that samples nothing still drew ids and ran the sampler, CPU
	// spent on spans nobody read (docs/benchmarks.md, Costs the code cites, Telemetry and
	// the worker). Nothing reads trace context but the spans.
	t.Tracers = tracenoop.NewTracerProvider()
	if traceFile != "" {
		f, err := os.Create(traceFile)
		if err != nil {
			return nil, fmt.Errorf("open trace file: %w", err)
		}
		te, err := stdouttrace.New(stdouttrace.WithWriter(f))
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("trace exporter: %w", err)
		}
		t.traceF = f
		t.sdkTracers = sdktrace.NewTracerProvider(sdktrace.WithResource(res),
			sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())), sdktrace.WithBatcher(te))
		t.Tracers = t.sdkTracers
	}
	otel.SetTracerProvider(t.Tracers)
	otel.SetMeterProvider(t.Meters)
	return t, nil
}

// Meter returns a named meter.
func (t *Telemetry) Meter(name string) metric.Meter { return t.Meters.Meter(name) }

// Tracer returns a named tracer.
func (t *Telemetry) Tracer(name string) trace.Tracer { return t.Tracers.Tracer(name) }

// Handler serves /metrics.
func (t *Telemetry) Handler() http.Handler { return t.handler }

// Shutdown flushes and stops both providers.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	err := t.Meters.Shutdown(ctx)
	if t.sdkTracers != nil {
		err = errors.Join(t.sdkTracers.Shutdown(ctx), err)
	}
	if t.traceF != nil {
		err = errors.Join(err, t.traceF.Close())
	}
	return err
}

// Must panics on an instrument construction error. Instrument creation fails only on an
// invalid name, a programming error that tests catch.
func Must[T any](v T, err error) T {
	if err != nil {
		panic(fmt.Sprintf("telemetry: %v", err))
	}
	return v
}

// Label hands out the measurement option of one attribute key per value, built once per
// value: a hot path counting per value (a worker counts every fault fired by its kind)
// would otherwise build and sort a new attribute set per call (its cost is in
// docs/benchmarks.md, Costs the code cites, Telemetry and the worker). Use it only for keys with a small, bounded set of values. The zero
// value is not usable; make one with NewLabel. It is safe for concurrent use.
type Label struct {
	key  attribute.Key
	opts sync.Map // value → metric.MeasurementOption
}

// NewLabel returns the options of key.
func NewLabel(key string) *Label { return &Label{key: attribute.Key(key)} }

// Option returns the measurement option setting the key to value.
func (l *Label) Option(value string) metric.MeasurementOption {
	if o, ok := l.opts.Load(value); ok {
		return o.(metric.MeasurementOption)
	}
	o, _ := l.opts.LoadOrStore(value, metric.WithAttributeSet(attribute.NewSet(l.key.String(value))))
	return o.(metric.MeasurementOption)
}
