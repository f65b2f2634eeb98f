package coordinator_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
)

// retrying applies every write twice and returns the second reply, as a
// client does that retries a command whose first reply was lost.
type retrying struct{ idemstore.Store }

func (r retrying) Reserve(ctx context.Context, key idemstore.Key, w idemstore.Write) (idemstore.Record, bool, error) {
	_, _, _ = r.Store.Reserve(ctx, key, w)
	return r.Store.Reserve(ctx, key, w)
}

func (r retrying) Complete(ctx context.Context, key idemstore.Key, token string, c idemstore.Completion) (bool, error) {
	_, _ = r.Store.Complete(ctx, key, token, c)
	return r.Store.Complete(ctx, key, token, c)
}

func TestRetriedStoreCallsAreRecognised(t *testing.T) {
	for _, mode := range []coordinator.InFlightMode{coordinator.InFlightWait, coordinator.InFlightRaise, coordinator.InFlightRun} {
		t.Run(string(mode), func(t *testing.T) {
			mem := memstore.New()
			f := newFixture(t, retrying{mem}, coordinator.WithInFlight(mode), coordinator.WithWaitTimeout(50*time.Millisecond))
			var k counter
			v, err := coordinator.Do(t.Context(), f.c, call("retried"), k.action("x"))
			if err != nil || v.ID != "x" || k.n() != 1 {
				t.Fatalf("Do = %+v, %v, runs %d; a retried reserve must not look like another holder", v, err, k.n())
			}
			if f.rec.errors("") != 0 || f.rec.count(idemevent.Stored, "") != 1 {
				t.Fatalf("events: %+v", f.rec.all())
			}
			if rec := mem.Snapshot(idemstore.Key{Operation: "payment.charge", Key: "retried"}); rec.State != idemstore.StateCompleted {
				t.Fatalf("record %v", rec.State)
			}
		})
	}
}
