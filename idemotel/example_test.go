package idemotel_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemotel"
	"github.com/idemkit/idempotency/observability"
)

// printSpan prints a span's idempotency attributes and its events.
func printSpan(s sdktrace.ReadOnlySpan) {
	fmt.Println("span", s.Name())
	for _, kv := range s.Attributes() {
		fmt.Printf("  %s=%s\n", kv.Key, kv.Value.String())
	}
	for _, e := range s.Events() {
		fmt.Println("  event", e.Name)
	}
}

// A coordinator whose calls are recorded on the caller's span. In an app the
// span is the one otelhttp or otelgrpc started for the request; here a
// tracer of the SDK, recording in memory, starts it.
func Example() {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr)) // in an app: your provider
	defer tp.Shutdown(context.Background())

	obs, err := observability.New() // metrics and logs, as you have them
	if err != nil {
		fmt.Println(err)
		return
	}
	c, err := coordinator.New(memstore.New(), coordinator.WithObserver(observability.Multi(obs, idemotel.New())))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	for range 2 {
		ctx, span := tp.Tracer("shop").Start(context.Background(), "POST /charges")
		_, err := coordinator.Do(ctx, c, coordinator.Call{Operation: "payment.charge", Key: "order-42"},
			func(context.Context) (string, error) { return "ch_1", nil })
		span.End()
		if err != nil {
			fmt.Println(err)
			return
		}
	}
	for _, s := range sr.Ended() {
		printSpan(s)
	}
	// Output:
	// span POST /charges
	//   idempotency.operation=payment.charge
	//   idempotency.key_hash=3bf8b157c4238eef
	//   idempotency.outcome=miss
	//   idempotency.replayed=false
	//   event idempotency.storage_call
	//   event idempotency.miss
	//   event idempotency.storage_call
	//   event idempotency.stored
	// span POST /charges
	//   idempotency.operation=payment.charge
	//   idempotency.key_hash=3bf8b157c4238eef
	//   idempotency.outcome=hit
	//   idempotency.replayed=true
	//   event idempotency.storage_call
	//   event idempotency.hit
}

// New with its defaults: events and attributes on the caller's span, with
// the key's hash.
func ExampleNew() {
	obs := idemotel.New()
	c, err := coordinator.New(memstore.New(), coordinator.WithObserver(obs))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	// Without a span in the context, nothing is recorded, and nothing
	// fails.
	v, err := coordinator.Do(context.Background(), c, coordinator.Call{Operation: "order.create", Key: "cart-7"},
		func(context.Context) (int, error) { return 7, nil })
	fmt.Println(v, err)
	// Output:
	// 7 <nil>
}

// Observe records one event on the span of its context.
func ExampleObserver_Observe() {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	defer tp.Shutdown(context.Background())

	ctx, span := tp.Tracer("shop").Start(context.Background(), "POST /charges")
	idemotel.New().Observe(ctx, idemevent.Event{
		Kind:     idemevent.Waited,
		Key:      idemstore.Key{Operation: "payment.charge", Key: "order-42"},
		Outcome:  idemevent.WaitTimeout,
		Duration: 30 * time.Second,
	})
	span.End()
	for _, e := range sr.Ended()[0].Events() {
		fmt.Println(e.Name)
		for _, kv := range e.Attributes {
			fmt.Printf("  %s=%s\n", kv.Key, kv.Value.String())
		}
	}
	// Output:
	// idempotency.waited
	//   idempotency.operation=payment.charge
	//   idempotency.key_hash=3bf8b157c4238eef
	//   idempotency.wait.outcome=timeout
	//   idempotency.wait.duration=30
}

// Store calls as child spans, each as long as the call.
func ExampleWithStoreSpans() {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	defer tp.Shutdown(context.Background())

	ctx, span := tp.Tracer("shop").Start(context.Background(), "POST /charges")
	idemotel.New(idemotel.WithStoreSpans(true)).Observe(ctx, idemevent.Event{
		Kind:     idemevent.StorageCall,
		Key:      idemstore.Key{Operation: "payment.charge", Key: "order-42"},
		Method:   idemevent.MethodReserve,
		Duration: 300 * time.Microsecond,
	})
	span.End()
	store := sr.Ended()[0]
	fmt.Println(store.Name())
	fmt.Println("child of the request:", store.Parent().SpanID() == span.SpanContext().SpanID())
	fmt.Println("lasted:", store.EndTime().Sub(store.StartTime()))
	// Output:
	// idempotency.store reserve
	// child of the request: true
	// lasted: 300µs
}

// Without the key's hash, spans carry no trace of the key.
func ExampleWithKeyHash() {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	defer tp.Shutdown(context.Background())

	ctx, span := tp.Tracer("shop").Start(context.Background(), "POST /charges")
	k := idemstore.Key{Operation: "payment.charge", Key: "order-42"}
	idemotel.New(idemotel.WithKeyHash(false)).Observe(ctx, idemevent.Event{
		Kind:      idemevent.Error,
		Key:       k,
		ErrorType: idemevent.ErrorKeyReuse,
		Err:       &coordinator.KeyReuseError{Operation: k.Operation, Key: k.Key, Stored: "fp-a", Got: "fp-b"},
	})
	span.End()
	for _, kv := range sr.Ended()[0].Events()[0].Attributes {
		fmt.Printf("%s=%s\n", kv.Key, kv.Value.String())
	}
	// Output:
	// idempotency.operation=payment.charge
	// idempotency.error_type=key_reuse
	// exception.type=*coordinator.KeyReuseError
	// exception.message=idempotency: key "<key>" of operation "payment.charge" reused for a different request (stored fingerprint "fp-a", got "fp-b")
}

// Store spans of a provider of their own; their parent is still the
// caller's span, whatever its provider.
func ExampleWithTracerProvider() {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	defer tp.Shutdown(context.Background())

	obs := idemotel.New(idemotel.WithTracerProvider(tp), idemotel.WithStoreSpans(true))
	parent := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled,
	}))
	// A remote parent does not record, so nothing is recorded under it: the
	// Observer needs a span of this process.
	obs.Observe(parent, idemevent.Event{Kind: idemevent.StorageCall, Key: idemstore.Key{Operation: "op", Key: "k"}, Method: idemevent.MethodGet})
	fmt.Println("spans under a remote parent:", len(sr.Ended()))

	ctx, span := tp.Tracer("shop").Start(parent, "POST /charges")
	obs.Observe(ctx, idemevent.Event{Kind: idemevent.StorageCall, Key: idemstore.Key{Operation: "op", Key: "k"}, Method: idemevent.MethodGet})
	span.End()
	for _, s := range sr.Ended() {
		fmt.Println(s.Name(), "in trace", s.SpanContext().TraceID())
	}
	// Output:
	// spans under a remote parent: 0
	// idempotency.store get in trace 01000000000000000000000000000000
	// POST /charges in trace 01000000000000000000000000000000
}

// Options can be collected before New, e.g. from an app's configuration.
func ExampleOption() {
	storeSpans := true // say, from a flag
	opts := []idemotel.Option{idemotel.WithKeyHash(true)}
	if storeSpans {
		opts = append(opts, idemotel.WithStoreSpans(true))
	}
	var obs idemevent.Observer = idemotel.New(opts...)
	fmt.Printf("%T\n", obs)
	// Output:
	// *idemotel.Observer
}
