package idemotel_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemotel"
	"github.com/idemkit/idempotency/internal/telemetry"
	"github.com/idemkit/idempotency/observability"
)

// newCoordinator returns a coordinator over store that reports to obs and
// the returned counter, and is closed (its background work waited for) on
// cleanup.
func newCoordinator(t *testing.T, store idemstore.Store, obs idemevent.Observer, opts ...coordinator.Option) (*coordinator.Coordinator, *counter) {
	t.Helper()
	cnt := newCounter()
	c, err := coordinator.New(store, append(opts, coordinator.WithObserver(observability.Multi(obs, cnt)))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, cnt
}

// call runs one call of key under a new span named name, and ends the span.
func call(t *testing.T, tp trace.TracerProvider, c *coordinator.Coordinator, name, key string, action func(context.Context) (string, error)) (string, error) {
	t.Helper()
	ctx, span := tp.Tracer("test").Start(t.Context(), name)
	defer span.End()
	return coordinator.Do(ctx, c, coordinator.Call{Operation: "payment.charge", Key: key}, action)
}

func charge(context.Context) (string, error) { return "ch_1", nil }

func TestMissThenHit(t *testing.T) {
	tp, sr := newProvider(t)
	c, _ := newCoordinator(t, memstore.New(), idemotel.New())
	for _, name := range []string{"first", "second"} {
		if _, err := call(t, tp, c, name, "order-42", charge); err != nil {
			t.Fatal(err)
		}
	}
	first, second := ended(t, sr, "first"), ended(t, sr, "second")
	for _, tt := range []struct {
		s        sdktrace.ReadOnlySpan
		outcome  string
		replayed string
		events   []string
	}{
		{first, "miss", "false", []string{"idempotency.miss", "idempotency.stored"}},
		{second, "hit", "true", []string{"idempotency.hit"}},
	} {
		a := attrs(tt.s.Attributes())
		if a["idempotency.outcome"] != tt.outcome || a["idempotency.replayed"] != tt.replayed ||
			a["idempotency.operation"] != "payment.charge" || a["idempotency.key_hash"] != hash {
			t.Errorf("%s: attributes %v, want outcome %s, replayed %s", tt.s.Name(), a, tt.outcome, tt.replayed)
		}
		got := slices.DeleteFunc(eventNames(tt.s), func(n string) bool { return n == "idempotency.storage_call" })
		if !slices.Equal(got, tt.events) {
			t.Errorf("%s: events %v (without storage calls), want %v", tt.s.Name(), got, tt.events)
		}
		if slices.Index(eventNames(tt.s), "idempotency.storage_call") < 0 {
			t.Errorf("%s: no storage_call event: %v", tt.s.Name(), eventNames(tt.s))
		}
	}
}

// The store spans of a real call: children of the caller's span, within it,
// lasting what the coordinator measured.
func TestStoreSpansOfACall(t *testing.T) {
	tp, sr := newProvider(t)
	var mu sync.Mutex
	durations := map[idemevent.Method]time.Duration{}
	measured := idemevent.ObserverFunc(func(_ context.Context, e idemevent.Event) {
		if e.Kind == idemevent.StorageCall {
			mu.Lock()
			durations[e.Method] = e.Duration
			mu.Unlock()
		}
	})
	c, _ := newCoordinator(t, memstore.New(), observability.Multi(idemotel.New(idemotel.WithStoreSpans(true)), measured))
	if _, err := call(t, tp, c, "request", "order-42", charge); err != nil {
		t.Fatal(err)
	}
	parent := ended(t, sr, "request")
	for _, m := range []idemevent.Method{idemevent.MethodReserve, idemevent.MethodComplete} {
		s := ended(t, sr, "idempotency.store "+string(m))
		if s.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("%s: parent %v, want the caller's span %v", s.Name(), s.Parent().SpanID(), parent.SpanContext().SpanID())
		}
		if s.StartTime().Before(parent.StartTime()) || s.EndTime().After(parent.EndTime()) {
			t.Errorf("%s: %v to %v, outside the caller's span %v to %v", s.Name(), s.StartTime(), s.EndTime(), parent.StartTime(), parent.EndTime())
		}
		mu.Lock()
		want := durations[m]
		mu.Unlock()
		if got := s.EndTime().Sub(s.StartTime()); got != want || want == 0 {
			t.Errorf("%s: lasted %v, the coordinator measured %v", s.Name(), got, want)
		}
	}
	if n := len(sr.Ended()); n != 3 {
		t.Errorf("spans %v, want the caller's and two store spans", names(sr.Ended()))
	}
}

// A second caller waits for the first one's result: in_flight, waited, hit.
func TestWaiter(t *testing.T) {
	tp, sr := newProvider(t)
	c, _ := newCoordinator(t, memstore.New(), idemotel.New(), coordinator.WithPollInterval(time.Millisecond))
	started, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		_, err := call(t, tp, c, "holder", "order-42", func(context.Context) (string, error) {
			close(started)
			<-release
			return "ch_1", nil
		})
		if err != nil {
			t.Error(err)
		}
	})
	<-started
	wg.Go(func() {
		if v, err := call(t, tp, c, "waiter", "order-42", charge); err != nil || v != "ch_1" {
			t.Errorf("waiter got %q, %v", v, err)
		}
	})
	time.Sleep(20 * time.Millisecond) // let the waiter find the key held
	close(release)
	wg.Wait()

	s := ended(t, sr, "waiter")
	got := slices.DeleteFunc(eventNames(s), func(n string) bool { return n == "idempotency.storage_call" })
	if want := []string{"idempotency.in_flight", "idempotency.waited", "idempotency.hit"}; !slices.Equal(got, want) {
		t.Fatalf("waiter's events %v, want %v", got, want)
	}
	a := attrs(s.Attributes())
	if a["idempotency.outcome"] != "hit" || a["idempotency.replayed"] != "true" || a["idempotency.wait.outcome"] != "hit" {
		t.Errorf("waiter's attributes %v", a)
	}
	if d := attrs(event(t, s, "idempotency.waited").Attributes)["idempotency.wait.duration"]; d == "" || d == "0" {
		t.Errorf("wait duration %q", d)
	}
	if m := attrs(event(t, s, "idempotency.in_flight").Attributes)["idempotency.in_flight.mode"]; m != "wait" {
		t.Errorf("in-flight mode %q, want wait", m)
	}
}

// A store that is down, in on-storage-error mode run: the error and the
// unprotected run are events, and the caller's span status is left alone,
// since the call succeeds.
func TestUnprotectedRun(t *testing.T) {
	tp, sr := newProvider(t)
	fs := faultstore.Wrap(memstore.New())
	fs.Fail(idemevent.MethodReserve, nil)
	// After the unprotected run the coordinator saves the result in the
	// background, with a Reserve that fails too; its events go to the
	// caller's context. Held until the caller's span has ended, they are
	// dropped, as in production, where the caller does not wait for them;
	// unheld, they could land on the span before it ends.
	spanEnded := make(chan struct{})
	var reserves atomic.Int64
	fs.Before(idemevent.MethodReserve, func(ctx context.Context, _ idemstore.Key) error {
		if reserves.Add(1) == 1 {
			return nil // the caller's
		}
		select {
		case <-spanEnded:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	c, _ := newCoordinator(t, fs, idemotel.New())
	v, err := call(t, tp, c, "request", "order-42", charge)
	close(spanEnded) // call has ended the span
	if err != nil || v != "ch_1" {
		t.Fatalf("call = %q, %v; mode run runs the action", v, err)
	}
	c.Close()
	if n := reserves.Load(); n != 2 {
		t.Fatalf("%d reserves, want the caller's and the background save's", n)
	}
	s := ended(t, sr, "request")
	e := attrs(event(t, s, "idempotency.error").Attributes)
	if e["idempotency.error_type"] != "storage_reserve_error" || e["idempotency.storage.method"] != "reserve" ||
		e["exception.type"] != "*coordinator.StorageError" || e["exception.message"] == "" {
		t.Errorf("error event %v", e)
	}
	if m := attrs(event(t, s, "idempotency.unprotected").Attributes)["idempotency.storage.method"]; m != "reserve" {
		t.Errorf("unprotected method %q, want reserve", m)
	}
	if a := attrs(s.Attributes()); a["idempotency.outcome"] != "unprotected" {
		t.Errorf("outcome %q, want unprotected", a["idempotency.outcome"])
	}
	if s.Status().Code != codes.Unset {
		t.Errorf("status %v %q: a handled storage error is not the caller's failure", s.Status().Code, s.Status().Description)
	}
}

// A renewal's events come from the renewer's goroutine, with the call's
// context, and land on the caller's span.
func TestRenewalsOnTheCallersSpan(t *testing.T) {
	tp, sr := newProvider(t)
	c, _ := newCoordinator(t, memstore.New(), idemotel.New(idemotel.WithStoreSpans(true)),
		coordinator.WithLease(300*time.Millisecond), coordinator.WithRenewInterval(40*time.Millisecond),
		coordinator.WithStorageTimeout(100*time.Millisecond))
	_, err := call(t, tp, c, "request", "order-42", func(context.Context) (string, error) {
		time.Sleep(150 * time.Millisecond)
		return "ch_1", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	parent := ended(t, sr, "request")
	renewals := 0
	for _, s := range sr.Ended() {
		if s.Name() == "idempotency.store renew" {
			renewals++
			if s.Parent().SpanID() != parent.SpanContext().SpanID() {
				t.Errorf("renewal's parent %v, want the caller's span", s.Parent().SpanID())
			}
		}
	}
	if renewals < 2 {
		t.Errorf("%d renewal spans in a 150ms action renewed every 40ms, want at least 2 (spans %v)", renewals, names(sr.Ended()))
	}
}

// A save that the coordinator retries in the background after the call has
// returned reports its events on the call's context; the caller's span has
// ended by then, and they are dropped.
func TestBackgroundSaveAfterTheSpanEnded(t *testing.T) {
	tp, sr := newProvider(t)
	fs := faultstore.Wrap(memstore.New())
	fs.FailOnce(idemevent.MethodComplete, nil)
	c, cnt := newCoordinator(t, fs, idemotel.New(idemotel.WithStoreSpans(true)))
	if _, err := call(t, tp, c, "request", "order-42", charge); err != nil {
		t.Fatal(err)
	}
	calls := len(sr.Ended())
	_ = c.Close() // waits for the background save
	if n := count(cnt.kinds(), idemevent.Stored); n != 1 {
		t.Fatalf("%d stored events, want 1 from the background save", n)
	}
	if fs.Calls(idemevent.MethodComplete) != 2 {
		t.Fatalf("%d completions, want the failed one and the background one", fs.Calls(idemevent.MethodComplete))
	}
	if got := len(sr.Ended()); got != calls {
		t.Errorf("%d spans after the background save, %d before: %v", got, calls, names(sr.Ended()))
	}
	s := ended(t, sr, "request")
	if slices.Contains(eventNames(s), "idempotency.stored") {
		t.Errorf("stored event recorded after the span ended: %v", eventNames(s))
	}
	if e := attrs(event(t, s, "idempotency.error").Attributes); e["idempotency.error_type"] != "storage_save_error" {
		t.Errorf("error event %v, want the failed save", e)
	}
}

// Concurrent calls, each under its own span, on one Observer: each span has
// its own call's outcome and store spans.
func TestConcurrentCalls(t *testing.T) {
	tp, sr := newProvider(t)
	c, _ := newCoordinator(t, memstore.New(), idemotel.New(idemotel.WithStoreSpans(true)), coordinator.WithPollInterval(time.Millisecond))
	const calls = 40
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			key := []string{"order-1", "order-2", "order-3", "order-4"}[i%4]
			if _, err := call(t, tp, c, "request "+key, key, func(context.Context) (string, error) {
				time.Sleep(time.Millisecond)
				return key, nil
			}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range sr.Ended() {
		byID[s.SpanContext().SpanID()] = s
	}
	outcomes := map[string]int{}
	for _, s := range sr.Ended() {
		if s.Parent().IsValid() {
			p, ok := byID[s.Parent().SpanID()]
			if !ok {
				t.Fatalf("%s: parent not among the ended spans", s.Name())
			}
			if want := telemetry.KeyHash(p.Name()[len("request "):]); attrs(s.Attributes())["idempotency.key_hash"] != want {
				t.Errorf("%s under %s: key hash %s, want %s", s.Name(), p.Name(), attrs(s.Attributes())["idempotency.key_hash"], want)
			}
			continue
		}
		a := attrs(s.Attributes())
		if want := telemetry.KeyHash(s.Name()[len("request "):]); a["idempotency.key_hash"] != want {
			t.Errorf("%s: key hash %s, want %s", s.Name(), a["idempotency.key_hash"], want)
		}
		outcomes[a["idempotency.outcome"]]++
	}
	if outcomes["miss"] != 4 || outcomes["hit"] != calls-4 {
		t.Errorf("outcomes %v, want 4 misses (one per key) and %d hits", outcomes, calls-4)
	}
}

// A call whose key's result was not kept gets ErrNotReplayable, and its span
// says so: outcome not_replayable, an idempotency.not_replayable event with
// the reason, and no status (the error reaches the caller).
func TestNotReplayableOnTheCallersSpan(t *testing.T) {
	tp, sr := newProvider(t)
	c, _ := newCoordinator(t, memstore.New(), idemotel.New(), coordinator.WithMaxResultBytes(4))
	if _, err := call(t, tp, c, "first", "order-42", charge); err != nil {
		t.Fatal(err)
	}
	if _, err := call(t, tp, c, "retry", "order-42", charge); !errors.Is(err, coordinator.ErrNotReplayable) {
		t.Fatalf("retry = %v, want ErrNotReplayable", err)
	}
	s := ended(t, sr, "retry")
	e := attrs(event(t, s, "idempotency.not_replayable").Attributes)
	if e["exception.type"] != "*coordinator.NotReplayableError" || !strings.Contains(e["exception.message"], "more than the limit of 4") ||
		strings.Contains(e["exception.message"], "order-42") {
		t.Errorf("not_replayable event %v, want the reason with the key hidden", e)
	}
	if a := attrs(s.Attributes()); a["idempotency.outcome"] != "not_replayable" || a["idempotency.replayed"] != "false" {
		t.Errorf("span attributes %v, want outcome not_replayable, not replayed", a)
	}
	if s.Status().Code != codes.Unset {
		t.Errorf("status %v: the caller's instrumentation sets it", s.Status().Code)
	}
}
