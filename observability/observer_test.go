package observability_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/observability"
)

func TestZeroAndNilObserverDiscard(t *testing.T) {
	var zero observability.Observer
	var nilObs *observability.Observer
	for _, o := range []idemevent.Observer{&zero, nilObs} {
		feed(t, o, idemevent.Event{Kind: idemevent.Hit, Key: key("op")})
	}
}

// counting is an Observer that counts its events.
type counting struct{ n atomic.Int64 }

func (c *counting) Observe(context.Context, idemevent.Event) { c.n.Add(1) }

func TestMulti(t *testing.T) {
	a, b := &counting{}, &counting{}
	var nilObs *observability.Observer
	m := observability.Multi(a, nil, idemevent.NopObserver{}, observability.Multi(b, a), nilObs)
	feed(t, m, idemevent.Event{Kind: idemevent.Hit}, idemevent.Event{Kind: idemevent.Miss})
	if a.n.Load() != 4 || b.n.Load() != 2 {
		t.Fatalf("a saw %d events, b %d; want 4 and 2", a.n.Load(), b.n.Load())
	}
	if got := observability.Multi(nil, idemevent.NopObserver{}); got != (idemevent.NopObserver{}) {
		t.Errorf("Multi of nothing = %#v, want NopObserver", got)
	}
	if got := observability.Multi(a); got != idemevent.Observer(a) {
		t.Errorf("Multi(a) = %#v, want a itself", got)
	}
}

// flakyStore is a memstore whose Reserve fails while down is set.
type flakyStore struct {
	*memstore.Store
	down atomic.Bool
}

func (s *flakyStore) Reserve(ctx context.Context, k idemstore.Key, w idemstore.Write) (idemstore.Record, bool, error) {
	if s.down.Load() {
		return idemstore.Record{}, false, errors.New("connection refused")
	}
	return s.Store.Reserve(ctx, k, w)
}

// TestWithCoordinator runs real calls through a coordinator and checks what
// the Observer makes of the events it reports.
func TestWithCoordinator(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	o, reg := newObserver(t, observability.WithOperations("payment.charge"), observability.WithLogger(zap.New(core)))
	store := &flakyStore{Store: memstore.New()}
	c, err := coordinator.New(store, coordinator.WithObserver(o), coordinator.WithLease(time.Second), coordinator.WithStorageTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	call := coordinator.Call{Operation: "payment.charge", Key: "order-42"}
	runs := 0
	action := func(context.Context) (int, error) { runs++; return 42, nil }
	for range 3 {
		if _, err := coordinator.Do(t.Context(), c, call, action); err != nil {
			t.Fatal(err)
		}
	}
	store.down.Store(true)
	if _, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: "payment.charge", Key: "order-43"}, action); err != nil {
		t.Fatal(err)
	}
	if runs != 2 {
		t.Fatalf("action ran %d times, want 2", runs)
	}

	for _, tt := range []struct {
		metric string
		labels []string
		want   float64
	}{
		{"idempotency_requests_total", []string{"operation", "payment.charge", "outcome", "miss"}, 1},
		{"idempotency_requests_total", []string{"operation", "payment.charge", "outcome", "hit"}, 2},
		{"idempotency_stored_total", []string{"operation", "payment.charge"}, 1},
		{"idempotency_errors_total", []string{"operation", "payment.charge", "error_type", "storage_reserve_error"}, 1},
		{"idempotency_unprotected_total", []string{"operation", "payment.charge", "method", "reserve"}, 1},
	} {
		if got := counter(t, reg, tt.metric, tt.labels...); got != tt.want {
			t.Errorf("%s%v = %v, want %v", tt.metric, tt.labels, got, tt.want)
		}
	}
	if n, _ := histogram(t, reg, "idempotency_storage_duration_seconds", "method", "reserve", "result", "ok"); n < 3 {
		t.Errorf("successful reserve calls = %d, want at least 3", n)
	}
	if n, _ := histogram(t, reg, "idempotency_storage_duration_seconds", "method", "reserve", "result", "error"); n < 1 {
		t.Errorf("failed reserve calls = %d, want at least 1", n)
	}
	if got := logs.FilterMessage("storage call failed").FilterField(zap.String("error_type", "storage_reserve_error")).Len(); got != 1 {
		t.Errorf("%d storage_reserve_error lines, want 1: %v", got, logs.All())
	}
	if got := logs.FilterMessage("running action unprotected: store failed").Len(); got != 1 {
		t.Errorf("%d unprotected lines, want 1: %v", got, logs.All())
	}
}
