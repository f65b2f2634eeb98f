package coordinator_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is an Observer that keeps every event.
type recorder struct {
	mu     sync.Mutex
	events []idemevent.Event
}

func (r *recorder) Observe(_ context.Context, e idemevent.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// count returns how many events of kind were seen (and, for EventError, of
// error type t when t is not "").
func (r *recorder) count(kind idemevent.Kind, t idemevent.ErrorType) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e.Kind == kind && (t == "" || e.ErrorType == t) {
			n++
		}
	}
	return n
}

func (r *recorder) errors(t idemevent.ErrorType) int { return r.count(idemevent.Error, t) }

// calls returns how many store calls of method m were made.
func (r *recorder) calls(m idemevent.Method) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e.Kind == idemevent.StorageCall && e.Method == m {
			n++
		}
	}
	return n
}

// waits returns the EventWaited events, in order.
func (r *recorder) waits() []idemevent.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var w []idemevent.Event
	for _, e := range r.events {
		if e.Kind == idemevent.Waited {
			w = append(w, e)
		}
	}
	return w
}

func (r *recorder) all() []idemevent.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]idemevent.Event(nil), r.events...)
}

// fixture is a coordinator over a store with a recorder.
type fixture struct {
	c   *coordinator.Coordinator
	rec *recorder
}

func newFixture(t *testing.T, store idemstore.Store, opts ...coordinator.Option) fixture {
	t.Helper()
	rec := &recorder{}
	opts = append([]coordinator.Option{coordinator.WithObserver(rec)}, opts...)
	c, err := coordinator.New(store, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	// The poll loops exit before the test ends: goleak, and a synctest
	// bubble, which fails when goroutines outlive its test function.
	t.Cleanup(func() { _ = c.Close() })
	return fixture{c: c, rec: rec}
}

func newMem(t *testing.T, opts ...coordinator.Option) (fixture, *memstore.Store) {
	t.Helper()
	s := memstore.New()
	return newFixture(t, s, opts...), s
}

// counter is an action that counts its runs and returns a result.
type counter struct {
	runs atomic.Int64
}

type charge struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

func (k *counter) action(id string) func(context.Context) (charge, error) {
	return func(context.Context) (charge, error) {
		n := k.runs.Add(1)
		return charge{ID: id, Amount: int(n)}, nil
	}
}

func (k *counter) n() int { return int(k.runs.Load()) }

func call(key string) coordinator.Call {
	return coordinator.Call{Operation: "payment.charge", Key: key}
}

// wantWaits fails the test unless rec saw n waits, each ending with outcome
// after exactly d: the tests that wait run in a synctest bubble, where
// durations on the fake clock are exact.
func wantWaits(t *testing.T, rec *recorder, n int, outcome idemevent.WaitOutcome, d time.Duration) {
	t.Helper()
	waits := rec.waits()
	if len(waits) != n {
		t.Fatalf("%d waits, want %d: %+v", len(waits), n, waits)
	}
	for _, e := range waits {
		if e.Outcome != outcome || e.Duration != d {
			t.Fatalf("wait ended %s after %v, want %s after %v", e.Outcome, e.Duration, outcome, d)
		}
	}
}
