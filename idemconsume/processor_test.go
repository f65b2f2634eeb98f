package idemconsume_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemconsume"
)

// newCoordinator returns a coordinator over store (memstore when nil),
// closed when t ends.
func newCoordinator(t *testing.T, store idemstore.Store, opts ...coordinator.Option) *coordinator.Coordinator {
	t.Helper()
	if store == nil {
		store = memstore.New()
	}
	c, err := coordinator.New(store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func newProcessor(t *testing.T, c *coordinator.Coordinator, opts ...idemconsume.Option) *idemconsume.Processor {
	t.Helper()
	p, err := idemconsume.New(c, "test.consume", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// counter is a handler that counts its runs and returns err.
type counter struct {
	runs atomic.Int64
	err  error
}

func (h *counter) handle(context.Context, idemconsume.Message) error {
	h.runs.Add(1)
	return h.err
}

func msg(id string, deliveries int64) idemconsume.Message {
	return idemconsume.Message{ID: id, Fields: map[string]string{"amount": "5"}, Deliveries: deliveries}
}

func check(t *testing.T, d idemconsume.Decision, action idemconsume.Action, reason idemconsume.Reason) {
	t.Helper()
	if d.Action != action || d.Reason != reason {
		t.Fatalf("decision %v (err %v), want %v (%s)", d, d.Err, action, reason)
	}
	if (action == idemconsume.Ack) != (d.Err == nil) {
		t.Fatalf("decision %v has error %v", d, d.Err)
	}
}

func TestProcessedThenDuplicate(t *testing.T) {
	p := newProcessor(t, newCoordinator(t, nil))
	h := &counter{}
	check(t, p.Process(t.Context(), msg("1-0", 1), h.handle), idemconsume.Ack, idemconsume.ReasonProcessed)
	d := p.Process(t.Context(), msg("1-0", 2), h.handle) // redelivered: the ack was lost
	check(t, d, idemconsume.Ack, idemconsume.ReasonDuplicate)
	if d.Key != "1-0" {
		t.Errorf("key %q, want the ID", d.Key)
	}
	if n := h.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

func TestProducerCopiesShareTheKeyField(t *testing.T) {
	p := newProcessor(t, newCoordinator(t, nil))
	h := &counter{}
	a := idemconsume.Message{ID: "1-0", Fields: map[string]string{idemconsume.DefaultKeyField: "order-7"}, Deliveries: 1}
	b := idemconsume.Message{ID: "2-0", Fields: map[string]string{idemconsume.DefaultKeyField: "order-7"}, Deliveries: 1}
	check(t, p.Process(t.Context(), a, h.handle), idemconsume.Ack, idemconsume.ReasonProcessed)
	check(t, p.Process(t.Context(), b, h.handle), idemconsume.Ack, idemconsume.ReasonDuplicate)
	if n := h.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

func TestHandlerErrors(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name       string
		err        error
		deliveries int64
		action     idemconsume.Action
		reason     idemconsume.Reason
	}{
		{"transient", boom, 1, idemconsume.Retry, idemconsume.ReasonHandlerError},
		{"transient, unknown count", boom, 0, idemconsume.Retry, idemconsume.ReasonHandlerError},
		{"transient on the last delivery", boom, 3, idemconsume.DeadLetter, idemconsume.ReasonMaxDeliveries},
		{"permanent", idemconsume.Permanent(boom), 1, idemconsume.DeadLetter, idemconsume.ReasonPermanent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newProcessor(t, newCoordinator(t, nil), idemconsume.WithMaxDeliveries(3))
			h := &counter{err: tt.err}
			d := p.Process(t.Context(), msg("1-0", tt.deliveries), h.handle)
			check(t, d, tt.action, tt.reason)
			if !errors.Is(d.Err, boom) {
				t.Errorf("decision error %v, want the handler's", d.Err)
			}
			// The key was released: the next delivery runs the handler again.
			h.err = nil
			check(t, p.Process(t.Context(), msg("1-0", 2), h.handle), idemconsume.Ack, idemconsume.ReasonProcessed)
			if n := h.runs.Load(); n != 2 {
				t.Errorf("handler ran %d times, want 2", n)
			}
		})
	}
}

func TestPanicIsAHandlerError(t *testing.T) {
	p := newProcessor(t, newCoordinator(t, nil))
	d := p.Process(t.Context(), msg("1-0", 1), func(context.Context, idemconsume.Message) error { panic("oops") })
	check(t, d, idemconsume.Retry, idemconsume.ReasonHandlerError)
	var pe *idemconsume.PanicError
	if !errors.As(d.Err, &pe) || pe.Value != "oops" || len(pe.Stack) == 0 {
		t.Fatalf("error %#v, want a *PanicError with the value and a stack", d.Err)
	}
}

func TestOverMaxDeliveries(t *testing.T) {
	c := newCoordinator(t, nil)
	p := newProcessor(t, c, idemconsume.WithMaxDeliveries(3))
	h := &counter{}

	// Never completed (its handler crashed the consumer every time): dead,
	// without running the handler again.
	d := p.Process(t.Context(), msg("1-0", 4), h.handle)
	check(t, d, idemconsume.DeadLetter, idemconsume.ReasonMaxDeliveries)
	if !errors.Is(d.Err, idemconsume.ErrMaxDeliveries) || h.runs.Load() != 0 {
		t.Fatalf("error %v, runs %d; want ErrMaxDeliveries and no run", d.Err, h.runs.Load())
	}

	// Completed, then redelivered many times (the acks were lost): an ack.
	check(t, p.Process(t.Context(), msg("2-0", 1), h.handle), idemconsume.Ack, idemconsume.ReasonProcessed)
	check(t, p.Process(t.Context(), msg("2-0", 9), h.handle), idemconsume.Ack, idemconsume.ReasonDuplicate)
}

func TestInProgressElsewhere(t *testing.T) {
	c := newCoordinator(t, nil, coordinator.WithInFlight(coordinator.InFlightRaise), coordinator.WithLease(2*time.Second))
	p := newProcessor(t, c)
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan idemconsume.Decision)
	go func() {
		done <- p.Process(t.Context(), msg("1-0", 1), func(context.Context, idemconsume.Message) error {
			close(started)
			<-release
			return nil
		})
	}()
	<-started
	h := &counter{}
	d := p.Process(t.Context(), msg("1-0", 2), h.handle)
	check(t, d, idemconsume.Retry, idemconsume.ReasonInProgress)
	if !errors.Is(d.Err, coordinator.ErrInProgress) || d.RetryAfter <= 0 || d.RetryAfter > 2*time.Second {
		t.Errorf("error %v, RetryAfter %v; want ErrInProgress and at most the lease", d.Err, d.RetryAfter)
	}
	close(release)
	check(t, <-done, idemconsume.Ack, idemconsume.ReasonProcessed)
	check(t, p.Process(t.Context(), msg("1-0", 3), h.handle), idemconsume.Ack, idemconsume.ReasonDuplicate)
	if h.runs.Load() != 0 {
		t.Error("the second consumer ran the handler")
	}
}

func TestStorageErrorModes(t *testing.T) {
	for _, mode := range []coordinator.OnStorageErrorMode{coordinator.OnStorageErrorRaise, coordinator.OnStorageErrorRun} {
		t.Run(string(mode), func(t *testing.T) {
			store := faultstore.Wrap(memstore.New())
			p := newProcessor(t, newCoordinator(t, store, coordinator.WithOnStorageError(mode)))
			store.Fail(idemevent.MethodReserve, errors.New("connection refused"))
			store.Fail(idemevent.MethodGet, errors.New("connection refused"))
			h := &counter{}
			d := p.Process(t.Context(), msg("1-0", 1), h.handle)
			if mode == coordinator.OnStorageErrorRaise {
				check(t, d, idemconsume.Retry, idemconsume.ReasonStorage)
				if !errors.Is(d.Err, coordinator.ErrStorage) || h.runs.Load() != 0 {
					t.Fatalf("error %v, runs %d; want ErrStorage and no run", d.Err, h.runs.Load())
				}
				return
			}
			check(t, d, idemconsume.Ack, idemconsume.ReasonUnprotected)
			if h.runs.Load() != 1 {
				t.Fatalf("runs %d, want 1", h.runs.Load())
			}
		})
	}
}

func TestCanceled(t *testing.T) {
	p := newProcessor(t, newCoordinator(t, nil), idemconsume.WithMaxDeliveries(1))
	ctx, cancel := context.WithCancel(t.Context())
	// Cancelled while the handler runs, on what would be the last delivery:
	// a stop is not a failure.
	d := p.Process(ctx, msg("1-0", 1), func(ctx context.Context, _ idemconsume.Message) error {
		cancel()
		return ctx.Err()
	})
	check(t, d, idemconsume.Retry, idemconsume.ReasonCanceled)
	// Cancelled before.
	check(t, p.Process(ctx, msg("2-0", 1), (&counter{}).handle), idemconsume.Retry, idemconsume.ReasonCanceled)
}

func TestBadMessages(t *testing.T) {
	c := newCoordinator(t, nil)
	h := &counter{}
	p := newProcessor(t, c, idemconsume.WithKey(idemconsume.KeyFromField("order")))
	d := p.Process(t.Context(), msg("1-0", 1), h.handle)
	check(t, d, idemconsume.DeadLetter, idemconsume.ReasonBadMessage)
	if !errors.Is(d.Err, idemconsume.ErrNoKey) {
		t.Errorf("error %v, want ErrNoKey", d.Err)
	}
	bad := idemconsume.Message{ID: "2-0", Fields: map[string]string{"order": "has space"}, Deliveries: 1}
	check(t, p.Process(t.Context(), bad, h.handle), idemconsume.DeadLetter, idemconsume.ReasonBadMessage)
	if h.runs.Load() != 0 {
		t.Error("handler ran")
	}
}

func TestKeyReuse(t *testing.T) {
	fp := func(m idemconsume.Message) (string, error) { return coordinator.Fingerprint(m.Fields["amount"]) }
	p := newProcessor(t, newCoordinator(t, nil), idemconsume.WithFingerprint(fp))
	h := &counter{}
	first := idemconsume.Message{ID: "1-0", Fields: map[string]string{"idempotency-key": "k", "amount": "5"}, Deliveries: 1}
	other := idemconsume.Message{ID: "2-0", Fields: map[string]string{"idempotency-key": "k", "amount": "6"}, Deliveries: 1}
	check(t, p.Process(t.Context(), first, h.handle), idemconsume.Ack, idemconsume.ReasonProcessed)
	d := p.Process(t.Context(), other, h.handle)
	check(t, d, idemconsume.DeadLetter, idemconsume.ReasonKeyReuse)
	if !errors.Is(d.Err, coordinator.ErrKeyReuse) {
		t.Errorf("error %v, want ErrKeyReuse", d.Err)
	}
}

func TestKillSwitch(t *testing.T) {
	p := newProcessor(t, newCoordinator(t, nil, coordinator.WithEnabled(false)))
	h := &counter{}
	for range 2 {
		check(t, p.Process(t.Context(), idemconsume.Message{Deliveries: 1}, h.handle), idemconsume.Ack, idemconsume.ReasonUnprotected)
	}
	if h.runs.Load() != 2 {
		t.Errorf("runs %d, want 2: nothing is stored with the kill switch off", h.runs.Load())
	}
}

func TestNew(t *testing.T) {
	c := newCoordinator(t, nil)
	for _, tt := range []struct {
		name string
		c    *coordinator.Coordinator
		op   string
		opts []idemconsume.Option
	}{
		{"nil coordinator", nil, "op", nil},
		{"bad operation", c, "a:b", nil},
		{"max deliveries", c, "op", []idemconsume.Option{idemconsume.WithMaxDeliveries(0)}},
		{"ttl", c, "op", []idemconsume.Option{idemconsume.WithTTL(-time.Second)}},
	} {
		if _, err := idemconsume.New(tt.c, tt.op, tt.opts...); err == nil {
			t.Errorf("%s: New accepted it", tt.name)
		}
	}
}

func TestKeyFuncs(t *testing.T) {
	withField := idemconsume.Message{ID: "1-0", Fields: map[string]string{"k": "order-7"}}
	without := idemconsume.Message{ID: "1-0"}
	for _, tt := range []struct {
		name string
		f    idemconsume.KeyFunc
		m    idemconsume.Message
		want string // "" for ErrNoKey
	}{
		{"id", idemconsume.KeyFromID, withField, "1-0"},
		{"id, none", idemconsume.KeyFromID, idemconsume.Message{}, ""},
		{"field", idemconsume.KeyFromField("k"), withField, "order-7"},
		{"field, none", idemconsume.KeyFromField("k"), without, ""},
		{"field or id", idemconsume.KeyFromFieldOrID("k"), withField, "order-7"},
		{"field or id, no field", idemconsume.KeyFromFieldOrID("k"), without, "1-0"},
	} {
		got, err := tt.f(tt.m)
		if tt.want == "" && !errors.Is(err, idemconsume.ErrNoKey) || got != tt.want {
			t.Errorf("%s: got %q, %v; want %q", tt.name, got, err, tt.want)
		}
	}
}

func TestDecisionString(t *testing.T) {
	d := idemconsume.Decision{Action: idemconsume.Retry, Reason: idemconsume.ReasonInProgress}
	if got := fmt.Sprint(d); got != "retry (in_progress)" {
		t.Errorf("got %q", got)
	}
}

// A fingerprint the coordinator would refuse is the message's fault: a dead
// letter, with the coordinator's own *InvalidRequestError behind it, the
// same rule coordinator.Do applies (coordinator.ValidateFingerprint).
func TestBadFingerprint(t *testing.T) {
	for name, fp := range map[string]string{
		"space":    "has space",
		"too long": strings.Repeat("f", coordinator.MaxFingerprintLen+1),
		"control":  "a\x00b",
	} {
		t.Run(name, func(t *testing.T) {
			p := newProcessor(t, newCoordinator(t, nil), idemconsume.WithFingerprint(func(idemconsume.Message) (string, error) { return fp, nil }))
			h := &counter{}
			d := p.Process(t.Context(), msg("1-0", 1), h.handle)
			check(t, d, idemconsume.DeadLetter, idemconsume.ReasonBadMessage)
			var ir *coordinator.InvalidRequestError
			if !errors.Is(d.Err, coordinator.ErrInvalidRequest) || !errors.As(d.Err, &ir) || !strings.Contains(ir.Reason, "fingerprint") {
				t.Errorf("error %v, want a *coordinator.InvalidRequestError about the fingerprint", d.Err)
			}
			if h.runs.Load() != 0 {
				t.Error("handler ran")
			}
		})
	}
	// The longest fingerprint the coordinator takes is taken.
	p := newProcessor(t, newCoordinator(t, nil), idemconsume.WithFingerprint(func(idemconsume.Message) (string, error) {
		return strings.Repeat("f", coordinator.MaxFingerprintLen), nil
	}))
	check(t, p.Process(t.Context(), msg("1-0", 1), (&counter{}).handle), idemconsume.Ack, idemconsume.ReasonProcessed)
}

// A handler whose reservation was taken over while it ran is not trusted,
// whatever its error says: the message is retried, never dead-lettered
// while another consumer holds it (its redelivery will find that
// consumer's result, or its key in progress).
func TestLeaseLostIsRetriedEvenIfPermanent(t *testing.T) {
	for name, herr := range map[string]error{
		"permanent":      idemconsume.Permanent(errors.New("ledger says: no such account")),
		"last delivery":  errors.New("ledger unavailable"),
		"panic is alike": nil, // the handler panics
	} {
		t.Run(name, func(t *testing.T) {
			store := memstore.New()
			c := newCoordinator(t, store, coordinator.WithLease(time.Second),
				coordinator.WithRenewInterval(20*time.Millisecond), coordinator.WithStorageTimeout(100*time.Millisecond))
			p := newProcessor(t, c, idemconsume.WithMaxDeliveries(1))
			key := idemstore.Key{Operation: p.Operation(), Key: "1-0"}
			other := idemstore.Record{State: idemstore.StatePending, Token: "0123456789abcdef"}
			d := p.Process(t.Context(), msg("1-0", 1), func(ctx context.Context, _ idemconsume.Message) error {
				store.Put(key, other) // another consumer took the message over
				<-ctx.Done()
				if herr == nil {
					panic(context.Cause(ctx))
				}
				return herr
			})
			check(t, d, idemconsume.Retry, idemconsume.ReasonLeaseLost)
			if got := store.Snapshot(key); got.State != idemstore.StatePending || got.Token != other.Token {
				t.Errorf("record %+v, want the other consumer's reservation left alone", got)
			}
		})
	}
}

// A message over the delivery limit is dead-lettered only when the store
// says it is neither completed nor held by another consumer. With the store
// down (on-storage-error mode "run") nobody can say: it waits, and the
// handler does not run.
func TestOverMaxDeliveriesWithTheStoreDown(t *testing.T) {
	store := faultstore.Wrap(memstore.New())
	c := newCoordinator(t, store, coordinator.WithOnStorageError(coordinator.OnStorageErrorRun))
	p := newProcessor(t, c, idemconsume.WithMaxDeliveries(3))
	store.Fail(idemevent.MethodReserve, errors.New("connection refused"))
	store.Fail(idemevent.MethodGet, errors.New("connection refused"))
	h := &counter{}
	d := p.Process(t.Context(), msg("1-0", 4), h.handle)
	check(t, d, idemconsume.Retry, idemconsume.ReasonStorage)
	if !errors.Is(d.Err, idemconsume.ErrMaxDeliveries) || h.runs.Load() != 0 {
		t.Fatalf("error %v, runs %d; want ErrMaxDeliveries and no run", d.Err, h.runs.Load())
	}
	store.Reset()
	check(t, p.Process(t.Context(), msg("1-0", 5), h.handle), idemconsume.DeadLetter, idemconsume.ReasonMaxDeliveries)
}

// A key or fingerprint function that panics on a message dead-letters that
// message: a panic there would otherwise kill every consumer it reaches,
// before its delivery count could stop it.
func TestKeyOrFingerprintPanics(t *testing.T) {
	boom := func(m idemconsume.Message) (string, error) { return m.Fields["parts"][:8], nil } // out of range
	for name, opt := range map[string]idemconsume.Option{
		"key":         idemconsume.WithKey(boom),
		"fingerprint": idemconsume.WithFingerprint(boom),
	} {
		t.Run(name, func(t *testing.T) {
			p := newProcessor(t, newCoordinator(t, nil), opt)
			h := &counter{}
			d := p.Process(t.Context(), msg("1-0", 1), h.handle)
			check(t, d, idemconsume.DeadLetter, idemconsume.ReasonBadMessage)
			var pe *idemconsume.PanicError
			if !errors.As(d.Err, &pe) || len(pe.Stack) == 0 || h.runs.Load() != 0 {
				t.Errorf("error %v, runs %d; want a *PanicError and no run", d.Err, h.runs.Load())
			}
		})
	}
}

// TestNotReplayableKeyIsAcked: a key whose record is not replayable (here a
// result limit smaller than the empty result) is acknowledged as a
// duplicate on every redelivery, past MaxDeliveries too: the effect
// happened, and the handler does not run again.
func TestNotReplayableKeyIsAcked(t *testing.T) {
	var notReplayable atomic.Int64
	obs := idemevent.ObserverFunc(func(_ context.Context, e idemevent.Event) {
		if e.Kind == idemevent.NotReplayable {
			notReplayable.Add(1)
		}
	})
	c := newCoordinator(t, nil, coordinator.WithMaxResultBytes(1), coordinator.WithObserver(obs))
	p := newProcessor(t, c, idemconsume.WithMaxDeliveries(3))
	h := &counter{}
	check(t, p.Process(t.Context(), msg("1-0", 1), h.handle), idemconsume.Ack, idemconsume.ReasonProcessed)
	for _, deliveries := range []int64{2, 3, 4, 10} {
		d := p.Process(t.Context(), msg("1-0", deliveries), h.handle)
		check(t, d, idemconsume.Ack, idemconsume.ReasonDuplicate)
		if d.Key != "1-0" {
			t.Fatalf("key %q, want the ID", d.Key)
		}
	}
	if n := h.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	if n := notReplayable.Load(); n != 4 {
		t.Fatalf("not_replayable events = %d, want 4: the redeliveries met a not-replayable record", n)
	}
}
