package idempotency_test

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"
	"go.uber.org/zap"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/fxtest"
	"github.com/idemkit/idempotency/observability"
)

// Module records calls on their spans, with the app's trace.TracerProvider
// from the graph, as here, or else the global one (otel.SetTracerProvider).
// fx matches types exactly: the SDK's provider is provided as the interface
// too.
func ExampleModule_tracing() {
	sr := tracetest.NewSpanRecorder() // in an app: an exporter, e.g. OTLP, in a batch processor
	newTracerProvider := func(lc fx.Lifecycle) *sdktrace.TracerProvider {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
		lc.Append(fx.StopHook(tp.Shutdown))
		return tp
	}
	var c *coordinator.Coordinator
	var tp trace.TracerProvider
	app := fx.New(
		fx.NopLogger,
		fx.Provide(fx.Annotate(newTracerProvider, fx.As(fx.Self()), fx.As(new(trace.TracerProvider)))),
		idempotency.Module,
		fxtest.IgnoreEnvironment(), // an app reads the environment instead
		fxtest.MemoryStore(),       // and uses Redis
		fx.Supply(zap.NewNop(), fx.Annotate(prometheus.NewRegistry(), fx.As(new(prometheus.Registerer)))),
		fx.Populate(&c, &tp),
	)
	ctx := context.Background()
	if err := app.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer app.Stop(ctx)

	// In an app, otelhttp or otelgrpc starts the request's span.
	ctx, span := tp.Tracer("shop").Start(ctx, "POST /charges")
	_, err := coordinator.Do(ctx, c, coordinator.Call{Operation: "payment.charge", Key: "order-42"},
		func(context.Context) (string, error) { return "ch_1", nil })
	span.End()
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, kv := range sr.Ended()[0].Attributes() {
		fmt.Printf("%s=%s\n", kv.Key, kv.Value.String())
	}
	// Output:
	// idempotency.operation=payment.charge
	// idempotency.key_hash=3bf8b157c4238eef
	// idempotency.outcome=miss
	// idempotency.replayed=false
}

// Without fx: the tracing observer beside the metrics and logs.
func ExampleNewTracingObserver() {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	defer tp.Shutdown(context.Background())

	s := idempotency.DefaultSettings()       // or idempotency.LoadSettings()
	s.LogKeys = observability.LogKeysOmitted // no key hash in logs, nor on spans
	obs, err := idempotency.NewObserver(s, zap.NewNop(), prometheus.NewRegistry())
	if err != nil {
		fmt.Println(err)
		return
	}
	c, err := idempotency.NewCoordinator(s, memstore.New(), observability.Multi(obs, idempotency.NewTracingObserver(s, tp)))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	ctx, span := tp.Tracer("shop").Start(context.Background(), "POST /charges")
	_, err = coordinator.Do(ctx, c, coordinator.Call{Operation: "payment.charge", Key: "order-42"},
		func(context.Context) (string, error) { return "ch_1", nil })
	span.End()
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, e := range sr.Ended()[0].Events() {
		fmt.Println(e.Name)
	}
	// Output:
	// idempotency.storage_call
	// idempotency.miss
	// idempotency.storage_call
	// idempotency.stored
}
