package idemotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idempotency/idemotel"
)

// discard is a SpanProcessor that drops ended spans: the cost measured is
// the Observer's and the span's, not an exporter's.
type discard struct{}

func (discard) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (discard) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (discard) Shutdown(context.Context) error                  { return nil }
func (discard) ForceFlush(context.Context) error                { return nil }

// BenchmarkObserve is the cost of one event: a miss (span event and
// attributes) or a store call (span event, or a child span), on a span that
// records, one that does not (not sampled), and none.
func BenchmarkObserve(b *testing.B) {
	miss := idemevent.Event{Kind: idemevent.Miss, Key: idemstore.Key{Operation: "payment.charge", Key: "9b2f6f5e-6c1a-4a43-b7a9-0b3f1f6f6d2e"}}
	storage := idemevent.Event{Kind: idemevent.StorageCall, Key: miss.Key, Method: idemevent.MethodReserve, Duration: 200 * time.Microsecond}
	recording := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(discard{}))
	unsampled := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	b.Cleanup(func() {
		_ = recording.Shutdown(context.Background())
		_ = unsampled.Shutdown(context.Background())
	})
	for _, bb := range []struct {
		name  string
		tp    trace.TracerProvider // nil: no span
		obs   *idemotel.Observer
		event idemevent.Event
	}{
		{"recording/miss", recording, idemotel.New(), miss},
		{"recording/miss/no_key_hash", recording, idemotel.New(idemotel.WithKeyHash(false)), miss},
		{"recording/storage_call", recording, idemotel.New(), storage},
		{"recording/storage_call/store_span", recording, idemotel.New(idemotel.WithStoreSpans(true)), storage},
		{"not_sampled/miss", unsampled, idemotel.New(), miss},
		{"not_sampled/storage_call/store_span", unsampled, idemotel.New(idemotel.WithStoreSpans(true)), storage},
		{"no_span/miss", nil, idemotel.New(), miss},
	} {
		b.Run(bb.name, func(b *testing.B) {
			ctx := context.Background()
			var span trace.Span
			if bb.tp != nil {
				ctx, span = bb.tp.Tracer("bench").Start(ctx, "request")
			}
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				bb.obs.Observe(ctx, bb.event)
				if n++; n == 100 && span != nil {
					// A span keeps 128 events: start a new one now and
					// then, as requests do.
					span.End()
					ctx, span = bb.tp.Tracer("bench").Start(context.Background(), "request")
					n = 0
				}
			}
			if span != nil {
				span.End()
			}
		})
	}
}
