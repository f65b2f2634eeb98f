package idemotel

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idempotency/internal/telemetry"
)

// scopeName is the instrumentation scope of the store spans: the name of
// the tracer that starts them.
const scopeName = "github.com/idemkit/idempotency/idemotel"

// Observer records the coordinator's events on the span of each call's
// context. Build one with New; it is safe for concurrent use, and holds no
// state between events.
type Observer struct {
	tracer     trace.Tracer // of WithTracerProvider; nil: the caller's span's provider
	storeSpans bool
	keyHash    bool
}

var _ idemevent.Observer = (*Observer)(nil)

// New returns an Observer configured by opts: the key's hash on spans, no
// store spans, and the caller's span's provider for store spans, unless an
// option says otherwise.
func New(opts ...Option) *Observer {
	c := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	o := &Observer{storeSpans: c.storeSpans, keyHash: c.keyHash}
	if c.provider != nil {
		o.tracer = c.provider.Tracer(scopeName)
	}
	return o
}

// Observe records e on the span of ctx (trace.SpanFromContext): as a span
// event named after its kind (idempotency.hit, ...), and, for the events that
// decide a call's outcome, as attributes of the span. A store call is an
// event, or with WithStoreSpans a child span. Observe never sets the status
// of the caller's span: the call's error, if any, reaches the caller, whose
// instrumentation sets it (see the package doc).
//
// When the span does not record — there is none in ctx, it was not sampled,
// or it has ended — Observe returns at once and records nothing, not even a
// store span. A nil Observer records nothing.
func (o *Observer) Observe(ctx context.Context, e idemevent.Event) {
	if o == nil {
		return
	}
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	var buf [6]attribute.KeyValue
	attrs := append(buf[:0], keyOperation.String(e.Key.Operation))
	if o.keyHash && e.Key.Key != "" {
		attrs = append(attrs, keyKeyHash.String(telemetry.KeyHash(e.Key.Key)))
	}
	switch e.Kind {
	case idemevent.Hit:
		setOutcome(span, attrs, "hit", true)
		span.AddEvent(eventHit, trace.WithAttributes(attrs...))
	case idemevent.Miss:
		setOutcome(span, attrs, "miss", false)
		span.AddEvent(eventMiss, trace.WithAttributes(attrs...))
	case idemevent.InFlight:
		setOutcome(span, attrs, "in_flight", false)
		attrs = append(attrs, keyInFlightMode.String(e.Mode))
		span.AddEvent(eventInFlight, trace.WithAttributes(attrs...))
	case idemevent.Unprotected:
		setOutcome(span, attrs, "unprotected", false)
		attrs = append(attrs, keyMethod.String(string(e.Method)))
		span.AddEvent(eventUnprotected, trace.WithAttributes(attrs...))
	case idemevent.NotReplayable:
		setOutcome(span, attrs, "not_replayable", false)
		if e.Err != nil {
			attrs = append(attrs, keyExcType.String(fmt.Sprintf("%T", e.Err)), keyExcMessage.String(o.message(e)))
		}
		span.AddEvent(eventNotReplay, trace.WithAttributes(attrs...))
	case idemevent.Waited:
		wait := []attribute.KeyValue{keyWaitOutcome.String(string(e.Outcome)), keyWaitDuration.Float64(seconds(e.Duration))}
		span.SetAttributes(wait...)
		span.AddEvent(eventWaited, trace.WithAttributes(append(attrs, wait...)...))
	case idemevent.Stored:
		span.AddEvent(eventStored, trace.WithAttributes(attrs...))
	case idemevent.Error:
		attrs = append(attrs, keyErrorType.String(string(e.ErrorType)))
		if e.Method != "" {
			attrs = append(attrs, keyMethod.String(string(e.Method)))
		}
		if e.Err != nil {
			attrs = append(attrs, keyExcType.String(fmt.Sprintf("%T", e.Err)), keyExcMessage.String(o.message(e)))
		}
		span.AddEvent(eventError, trace.WithAttributes(attrs...))
	case idemevent.StorageCall:
		result := telemetry.StorageResult(e.Err).String()
		if o.storeSpans {
			o.storeSpan(ctx, span, e, append(attrs, keyMethod.String(string(e.Method)), keyResult.String(result)))
			return
		}
		attrs = append(attrs, keyMethod.String(string(e.Method)), keyStorageTime.Float64(seconds(e.Duration)), keyResult.String(result))
		span.AddEvent(eventStorageCall, trace.WithAttributes(attrs...))
	default:
		span.AddEvent("idempotency."+e.Kind.String(), trace.WithAttributes(attrs...))
	}
}

// setOutcome sets the attributes of the event that decides, for now, how the
// call ends: a later one replaces them (a waiter's in_flight by hit or miss).
func setOutcome(span trace.Span, attrs []attribute.KeyValue, outcome string, replayed bool) {
	var buf [4]attribute.KeyValue
	span.SetAttributes(append(append(buf[:0], attrs...), keyOutcome.String(outcome), keyReplayed.Bool(replayed))...)
}

// storeSpan records the store call of e as a child of parent that began
// e.Duration ago and ends now: the Observer only learns of a call once it
// has ended. A failed call's span has status Error: the span is the store
// call's own.
func (o *Observer) storeSpan(ctx context.Context, parent trace.Span, e idemevent.Event, attrs []attribute.KeyValue) {
	tracer := o.tracer
	if tracer == nil {
		tracer = parent.TracerProvider().Tracer(scopeName)
	}
	end := time.Now()
	start := end.Add(-max(e.Duration, 0))
	_, span := tracer.Start(ctx, storeSpanName(e.Method),
		trace.WithTimestamp(start),
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attrs...))
	if e.Err != nil {
		span.SetStatus(codes.Error, o.message(e))
	}
	span.End(trace.WithTimestamp(end))
}

// storeSpanName returns the name of a store span of method m, without
// building a string for the known methods.
func storeSpanName(m idemevent.Method) string {
	switch m {
	case idemevent.MethodReserve:
		return storeSpanPrefix + "reserve"
	case idemevent.MethodGet:
		return storeSpanPrefix + "get"
	case idemevent.MethodComplete:
		return storeSpanPrefix + "complete"
	case idemevent.MethodRelease:
		return storeSpanPrefix + "release"
	case idemevent.MethodRenew:
		return storeSpanPrefix + "renew"
	}
	return storeSpanPrefix + string(m)
}

// message returns e's error message with the key hidden, as the log lines
// hide it: by its hash, or, without WithKeyHash, by "<key>".
func (o *Observer) message(e idemevent.Event) string {
	if e.Err == nil {
		return ""
	}
	hidden := telemetry.OmittedKey
	if o.keyHash {
		hidden = telemetry.HashedKey(e.Key)
	}
	return telemetry.Redact(e.Err.Error(), e.Key, hidden)
}

// seconds returns d in seconds, and 0 for a negative d.
func seconds(d time.Duration) float64 { return max(d, 0).Seconds() }
