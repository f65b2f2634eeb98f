package idemotel_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemotel"
	"github.com/idemkit/idempotency/internal/telemetry"
)

var (
	k    = idemstore.Key{Operation: "payment.charge", Key: "order-42"}
	hash = telemetry.KeyHash("order-42") // 3bf8b157c4238eef
)

// Every event kind: its span event, its attributes, and the attributes it
// sets on the span.
func TestEveryEventKind(t *testing.T) {
	down := &coordinator.StorageError{Method: idemevent.MethodReserve, Err: errors.New("dial tcp: connection refused")}
	reuse := &coordinator.KeyReuseError{Operation: k.Operation, Key: k.Key, Stored: "fp-a", Got: "fp-b"}
	common := map[string]string{"idempotency.operation": "payment.charge", "idempotency.key_hash": hash}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range common {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	tests := []struct {
		name  string
		event idemevent.Event
		span  string            // the span event's name
		attrs map[string]string // of the span event
		set   map[string]string // on the span
	}{
		{"hit", idemevent.Event{Kind: idemevent.Hit, Key: k},
			"idempotency.hit", common,
			with("idempotency.outcome", "hit", "idempotency.replayed", "true")},
		{"miss", idemevent.Event{Kind: idemevent.Miss, Key: k},
			"idempotency.miss", common,
			with("idempotency.outcome", "miss", "idempotency.replayed", "false")},
		{"in_flight", idemevent.Event{Kind: idemevent.InFlight, Key: k, Mode: string(coordinator.InFlightRaise)},
			"idempotency.in_flight", with("idempotency.in_flight.mode", "raise"),
			with("idempotency.outcome", "in_flight", "idempotency.replayed", "false")},
		{"unprotected", idemevent.Event{Kind: idemevent.Unprotected, Key: k, Method: idemevent.MethodReserve, Err: down},
			"idempotency.unprotected", with("idempotency.storage.method", "reserve"),
			with("idempotency.outcome", "unprotected", "idempotency.replayed", "false")},
		{"unprotected, no key", idemevent.Event{Kind: idemevent.Unprotected, Key: idemstore.Key{Operation: "payment.charge"}, Method: idemevent.MethodNone},
			"idempotency.unprotected", map[string]string{"idempotency.operation": "payment.charge", "idempotency.storage.method": "none"},
			map[string]string{"idempotency.operation": "payment.charge", "idempotency.outcome": "unprotected", "idempotency.replayed": "false"}},
		{"waited", idemevent.Event{Kind: idemevent.Waited, Key: k, Outcome: idemevent.WaitTimeout, Duration: 1500 * time.Millisecond},
			"idempotency.waited", with("idempotency.wait.outcome", "timeout", "idempotency.wait.duration", "1.5"),
			map[string]string{"idempotency.wait.outcome": "timeout", "idempotency.wait.duration": "1.5"}},
		{"stored", idemevent.Event{Kind: idemevent.Stored, Key: k},
			"idempotency.stored", common, nil},
		{"storage error", idemevent.Event{Kind: idemevent.Error, Key: k, ErrorType: idemevent.ErrorStorageReserve, Method: idemevent.MethodReserve, Err: down},
			"idempotency.error", with("idempotency.error_type", "storage_reserve_error", "idempotency.storage.method", "reserve",
				"exception.type", "*coordinator.StorageError", "exception.message", "idempotency: storage reserve: dial tcp: connection refused"),
			nil},
		{"key reuse, the key hidden", idemevent.Event{Kind: idemevent.Error, Key: k, ErrorType: idemevent.ErrorKeyReuse, Err: reuse},
			"idempotency.error", with("idempotency.error_type", "key_reuse", "exception.type", "*coordinator.KeyReuseError",
				"exception.message", `idempotency: key "<key `+hash+`>" of operation "payment.charge" reused for a different request (stored fingerprint "fp-a", got "fp-b")`),
			nil},
		{"error without an error", idemevent.Event{Kind: idemevent.Error, Key: k, ErrorType: idemevent.ErrorLeaseLost},
			"idempotency.error", with("idempotency.error_type", "lease_lost"), nil},
		{"storage call", idemevent.Event{Kind: idemevent.StorageCall, Key: k, Method: idemevent.MethodGet, Duration: 250 * time.Microsecond},
			"idempotency.storage_call", with("idempotency.storage.method", "get", "idempotency.storage.duration", "0.00025", "idempotency.storage.result", "ok"),
			nil},
		{"failed storage call", idemevent.Event{Kind: idemevent.StorageCall, Key: k, Method: idemevent.MethodComplete, Duration: time.Second,
			Err: fmt.Errorf("complete: %w", context.DeadlineExceeded)},
			"idempotency.storage_call", with("idempotency.storage.method", "complete", "idempotency.storage.duration", "1", "idempotency.storage.result", "timeout"),
			nil},
		{"not replayable, the key hidden", idemevent.Event{Kind: idemevent.NotReplayable, Key: k,
			Err: &coordinator.NotReplayableError{Operation: k.Operation, Key: k.Key, Reason: "the result is 2097152 bytes, more than the limit of 1048576"}},
			"idempotency.not_replayable", with("exception.type", "*coordinator.NotReplayableError",
				"exception.message", `idempotency: key "<key `+hash+`>" of operation "payment.charge" completed, but its result cannot be returned: the result is 2097152 bytes, more than the limit of 1048576`),
			map[string]string{"idempotency.operation": "payment.charge", "idempotency.key_hash": hash, "idempotency.outcome": "not_replayable", "idempotency.replayed": "false"}},
		{"an unknown kind", idemevent.Event{Kind: 200, Key: k}, "idempotency.unknown", common, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tp, sr := newProvider(t)
			ctx, span := startSpan(t, tp)
			idemotel.New().Observe(ctx, tt.event)
			span.End()
			s := ended(t, sr, "request")
			if got := eventNames(s); len(got) != 1 || got[0] != tt.span {
				t.Fatalf("events %v, want [%s]", got, tt.span)
			}
			wantAttrs(t, "event", s.Events()[0].Attributes, tt.attrs)
			wantAttrs(t, "span", s.Attributes(), tt.set)
			if s.Status().Code != codes.Unset {
				t.Errorf("span status %v %q; the caller's span status is the caller's", s.Status().Code, s.Status().Description)
			}
			if len(sr.Ended()) != 1 {
				t.Errorf("spans %v, want the caller's only", names(sr.Ended()))
			}
		})
	}
}

// The last outcome wins: a waiter that got the result is a hit; the
// collision stays an event.
func TestLaterOutcomeReplacesEarlier(t *testing.T) {
	tp, sr := newProvider(t)
	ctx, span := startSpan(t, tp)
	o := idemotel.New()
	o.Observe(ctx, idemevent.Event{Kind: idemevent.InFlight, Key: k, Mode: string(coordinator.InFlightWait)})
	o.Observe(ctx, idemevent.Event{Kind: idemevent.Waited, Key: k, Outcome: idemevent.WaitHit, Duration: 20 * time.Millisecond})
	o.Observe(ctx, idemevent.Event{Kind: idemevent.Hit, Key: k})
	span.End()
	s := ended(t, sr, "request")
	wantAttrs(t, "span", s.Attributes(), map[string]string{
		"idempotency.operation": "payment.charge", "idempotency.key_hash": hash,
		"idempotency.outcome": "hit", "idempotency.replayed": "true",
		"idempotency.wait.outcome": "hit", "idempotency.wait.duration": "0.02",
	})
	if got, want := fmt.Sprint(eventNames(s)), "[idempotency.in_flight idempotency.waited idempotency.hit]"; got != want {
		t.Errorf("events %s, want %s", got, want)
	}
}

// With WithKeyHash(false) no span carries the key in any form; by default
// they carry its hash, and never the key.
func TestKeyHashOrNothing(t *testing.T) {
	reuse := &coordinator.KeyReuseError{Operation: k.Operation, Key: k.Key, Stored: "fp-a", Got: "fp-b"}
	wrongType := &coordinator.StorageError{Method: idemevent.MethodGet, Err: errors.New("WRONGTYPE idempotency:payment.charge:order-42")}
	events := []idemevent.Event{
		{Kind: idemevent.Miss, Key: k},
		{Kind: idemevent.Error, Key: k, ErrorType: idemevent.ErrorKeyReuse, Err: reuse},
		{Kind: idemevent.Error, Key: k, ErrorType: idemevent.ErrorStorageGet, Method: idemevent.MethodGet, Err: wrongType},
		{Kind: idemevent.StorageCall, Key: k, Method: idemevent.MethodGet, Err: wrongType},
	}
	for _, hashed := range []bool{true, false} {
		t.Run(fmt.Sprint("hashed=", hashed), func(t *testing.T) {
			tp, sr := newProvider(t)
			ctx, span := startSpan(t, tp)
			o := idemotel.New(idemotel.WithKeyHash(hashed), idemotel.WithStoreSpans(true))
			for _, e := range events {
				o.Observe(ctx, e)
			}
			span.End()
			spans := sr.Ended()
			noKey(t, spans, "order-42")
			if len(spans) != 2 {
				t.Fatalf("spans %v, want a store span and the caller's", names(spans))
			}
			hidden := "<key>"
			if hashed {
				hidden = "<key " + hash + ">"
			}
			for _, s := range spans {
				h, ok := attrs(s.Attributes())["idempotency.key_hash"]
				if hashed && h != hash || !hashed && ok {
					t.Errorf("%s: idempotency.key_hash = %q (set: %v), hashed %v", s.Name(), h, ok, hashed)
				}
				for _, e := range s.Events() {
					h, ok := attrs(e.Attributes)["idempotency.key_hash"]
					if hashed && h != hash || !hashed && ok {
						t.Errorf("%s: idempotency.key_hash = %q (set: %v), hashed %v", e.Name, h, ok, hashed)
					}
				}
			}
			store := ended(t, sr, "idempotency.store get")
			if want := "idempotency: storage get: WRONGTYPE idempotency:payment.charge:" + hidden; store.Status().Description != want {
				t.Errorf("store span status %q, want %q", store.Status().Description, want)
			}
			s := ended(t, sr, "request")
			var msgs []string
			for _, e := range s.Events() {
				if m, ok := attrs(e.Attributes)["exception.message"]; ok {
					msgs = append(msgs, m)
				}
			}
			want := fmt.Sprint([]string{
				`idempotency: key "` + hidden + `" of operation "payment.charge" reused for a different request (stored fingerprint "fp-a", got "fp-b")`,
				"idempotency: storage get: WRONGTYPE idempotency:payment.charge:" + hidden,
			})
			if fmt.Sprint(msgs) != want {
				t.Errorf("messages\n%v\nwant\n%v", msgs, want)
			}
		})
	}
}

// A store span is a child of the caller's span, made after the call with its
// start and end: its duration is the event's.
func TestStoreSpans(t *testing.T) {
	tp, sr := newProvider(t)
	ctx, span := startSpan(t, tp)
	o := idemotel.New(idemotel.WithStoreSpans(true))
	before := time.Now()
	o.Observe(ctx, idemevent.Event{Kind: idemevent.StorageCall, Key: k, Method: idemevent.MethodReserve, Duration: 3 * time.Millisecond})
	o.Observe(ctx, idemevent.Event{Kind: idemevent.StorageCall, Key: k, Method: idemevent.MethodComplete, Duration: 1234567 * time.Nanosecond,
		Err: &coordinator.StorageError{Method: idemevent.MethodComplete, Err: errors.New("READONLY")}})
	after := time.Now()
	span.End()

	parent := ended(t, sr, "request")
	if ev := eventNames(parent); len(ev) != 0 {
		t.Errorf("caller's span has events %v; with store spans a store call is a span", ev)
	}
	for _, tt := range []struct {
		name     string
		duration time.Duration
		result   string
		status   codes.Code
		desc     string
	}{
		{"idempotency.store reserve", 3 * time.Millisecond, "ok", codes.Unset, ""},
		{"idempotency.store complete", 1234567 * time.Nanosecond, "error", codes.Error, "idempotency: storage complete: READONLY"},
	} {
		s := ended(t, sr, tt.name)
		if s.Parent().SpanID() != parent.SpanContext().SpanID() || s.SpanContext().TraceID() != parent.SpanContext().TraceID() {
			t.Errorf("%s: parent %v in trace %v, want the caller's span %v in trace %v", tt.name,
				s.Parent().SpanID(), s.SpanContext().TraceID(), parent.SpanContext().SpanID(), parent.SpanContext().TraceID())
		}
		if got := s.EndTime().Sub(s.StartTime()); got != tt.duration {
			t.Errorf("%s: lasted %v, want the event's %v", tt.name, got, tt.duration)
		}
		if s.EndTime().Before(before) || s.EndTime().After(after) {
			t.Errorf("%s: ended at %v, not when observed (%v to %v)", tt.name, s.EndTime(), before, after)
		}
		if s.SpanKind() != trace.SpanKindInternal {
			t.Errorf("%s: kind %v, want internal", tt.name, s.SpanKind())
		}
		if s.Status().Code != tt.status || s.Status().Description != tt.desc {
			t.Errorf("%s: status %v %q, want %v %q", tt.name, s.Status().Code, s.Status().Description, tt.status, tt.desc)
		}
		if s.InstrumentationScope().Name != "github.com/idemkit/idempotency/idemotel" {
			t.Errorf("%s: scope %q", tt.name, s.InstrumentationScope().Name)
		}
		method := tt.name[len("idempotency.store "):]
		wantAttrs(t, tt.name, s.Attributes(), map[string]string{
			"idempotency.operation": "payment.charge", "idempotency.key_hash": hash,
			"idempotency.storage.method": method, "idempotency.storage.result": tt.result,
		})
	}
}

// WithTracerProvider makes the store spans with another provider; their
// parent is still the caller's span.
func TestStoreSpansOfAnotherProvider(t *testing.T) {
	tp, sr := newProvider(t)
	own, ownSR := newProvider(t)
	ctx, span := startSpan(t, tp)
	idemotel.New(idemotel.WithStoreSpans(true), idemotel.WithTracerProvider(own)).
		Observe(ctx, idemevent.Event{Kind: idemevent.StorageCall, Key: k, Method: idemevent.MethodGet, Duration: time.Millisecond})
	span.End()
	if n := len(sr.Ended()); n != 1 {
		t.Errorf("caller's provider has %d spans, want its own only: %v", n, names(sr.Ended()))
	}
	s := ended(t, ownSR, "idempotency.store get")
	if s.Parent().SpanID() != span.SpanContext().SpanID() {
		t.Errorf("parent %v, want %v", s.Parent().SpanID(), span.SpanContext().SpanID())
	}
}

// Nothing is recorded without a recording span: no span in the context, one
// not sampled, or one that has ended; not even a store span.
func TestNothingWithoutARecordingSpan(t *testing.T) {
	all := []idemevent.Event{
		{Kind: idemevent.Miss, Key: k},
		{Kind: idemevent.StorageCall, Key: k, Method: idemevent.MethodRenew, Duration: time.Millisecond},
		{Kind: idemevent.Error, Key: k, ErrorType: idemevent.ErrorStorageRenew, Method: idemevent.MethodRenew, Err: errors.New("down")},
		{Kind: idemevent.Stored, Key: k},
	}
	o := idemotel.New(idemotel.WithStoreSpans(true))

	t.Run("no span", func(t *testing.T) {
		tp, sr := newProvider(t)
		o := idemotel.New(idemotel.WithStoreSpans(true), idemotel.WithTracerProvider(tp))
		for _, e := range all {
			o.Observe(context.Background(), e)
		}
		if n := len(sr.Ended()); n != 0 {
			t.Errorf("%d spans without a span in the context: %v", n, names(sr.Ended()))
		}
	})
	t.Run("not sampled", func(t *testing.T) {
		tp, sr := newProvider(t, sdktrace.WithSampler(sdktrace.NeverSample()))
		ctx, span := startSpan(t, tp)
		for _, e := range all {
			o.Observe(ctx, e)
		}
		span.End()
		if n := len(sr.Ended()); n != 0 {
			t.Errorf("%d spans recorded under a span not sampled: %v", n, names(sr.Ended()))
		}
	})
	t.Run("ended", func(t *testing.T) {
		tp, sr := newProvider(t)
		ctx, span := startSpan(t, tp)
		o.Observe(ctx, all[0])
		span.End()
		for _, e := range all[1:] {
			o.Observe(ctx, e)
		}
		if got := names(sr.Ended()); len(got) != 1 {
			t.Errorf("spans %v, want the caller's only", got)
		}
		if got := eventNames(ended(t, sr, "request")); fmt.Sprint(got) != "[idempotency.miss]" {
			t.Errorf("events %v, want those before the end only: [idempotency.miss]", got)
		}
	})
	t.Run("nil Observer", func(t *testing.T) {
		tp, sr := newProvider(t)
		ctx, span := startSpan(t, tp)
		var nilObs *idemotel.Observer
		nilObs.Observe(ctx, all[0])
		span.End()
		if got := eventNames(ended(t, sr, "request")); len(got) != 0 {
			t.Errorf("events %v from a nil Observer", got)
		}
	})
}

// Events of many goroutines on one span, some after it ends, as a renewal's
// may come: all those before the end are there, none after, and -race sees
// no race.
func TestConcurrentEventsOnOneSpan(t *testing.T) {
	limits := sdktrace.NewSpanLimits()
	limits.EventCountLimit = -1 // unlimited
	tp, sr := newProvider(t, sdktrace.WithRawSpanLimits(limits))
	ctx, span := startSpan(t, tp)
	o := idemotel.New(idemotel.WithStoreSpans(true))
	const goroutines, each = 8, 50
	var before sync.WaitGroup
	var after sync.WaitGroup
	ended := make(chan struct{})
	for g := range goroutines {
		before.Add(1)
		after.Add(1)
		go func() {
			defer after.Done()
			for range each {
				o.Observe(ctx, idemevent.Event{Kind: idemevent.Stored, Key: k})
				o.Observe(ctx, idemevent.Event{Kind: idemevent.StorageCall, Key: k, Method: idemevent.MethodRenew, Duration: time.Microsecond})
			}
			before.Done()
			<-ended
			for range each {
				o.Observe(ctx, idemevent.Event{Kind: idemevent.Error, Key: k, ErrorType: idemevent.ErrorStorageRenew, Method: idemevent.MethodRenew})
				o.Observe(ctx, idemevent.Event{Kind: idemevent.StorageCall, Key: k, Method: idemevent.MethodRenew, Duration: time.Microsecond})
				if g%2 == 0 {
					o.Observe(ctx, idemevent.Event{Kind: idemevent.Hit, Key: k})
				}
			}
		}()
	}
	before.Wait()
	span.End()
	close(ended)
	after.Wait()

	s := sr.Ended()
	var caller, stores int
	for _, sp := range s {
		switch sp.Name() {
		case "request":
			caller++
			if n, want := len(sp.Events()), goroutines*each; n != want {
				t.Errorf("caller's span has %d events, want the %d before its end", n, want)
			}
			for _, e := range sp.Events() {
				if e.Name != "idempotency.stored" {
					t.Errorf("event %s recorded after the span ended", e.Name)
				}
			}
			if _, ok := attrs(sp.Attributes())["idempotency.outcome"]; ok {
				t.Errorf("outcome set after the span ended: %v", sp.Attributes())
			}
		case "idempotency.store renew":
			stores++
		}
	}
	if caller != 1 || stores != goroutines*each {
		t.Errorf("%d caller's spans and %d store spans, want 1 and %d (those before the end)", caller, stores, goroutines*each)
	}
}
