package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
)

// TestMixedLeases is a fleet in the middle of a deploy that changes the
// lease: one process holds a key with one lease and runs a 4s action; 300ms
// later another process with another lease calls with the same key. The
// action runs once whichever lease is the longer: the waiter gets the
// holder's result (mode wait) or ErrInProgress (mode raise), and a caller
// with another fingerprint gets ErrKeyReuse. A caller's own lease never
// decides what happens to a record another process holds.
func TestMixedLeases(t *testing.T) {
	for _, leases := range []struct{ holder, caller time.Duration }{
		{30 * time.Second, 2 * time.Second},
		{2 * time.Second, 30 * time.Second},
	} {
		for _, mode := range []coordinator.InFlightMode{coordinator.InFlightWait, coordinator.InFlightRaise} {
			t.Run(fmt.Sprintf("holder=%v/caller=%v/%s", leases.holder, leases.caller, mode), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					const runFor = 4 * time.Second
					s := memstore.New()
					holder := newFixture(t, s, coordinator.WithLease(leases.holder), coordinator.WithStorageTimeout(100*time.Millisecond))
					caller := newFixture(t, s, coordinator.WithLease(leases.caller), coordinator.WithStorageTimeout(100*time.Millisecond),
						coordinator.WithInFlight(mode), coordinator.WithWaitTimeout(10*time.Second))
					var k counter
					slow := func(ctx context.Context) (charge, error) {
						select {
						case <-time.After(runFor):
						case <-ctx.Done():
							return charge{}, context.Cause(ctx)
						}
						return k.action("holder")(ctx)
					}
					fp := call("k")
					fp.Fingerprint = "fp"
					held := make(chan error, 1)
					var first charge
					go func() {
						v, err := coordinator.Do(t.Context(), holder.c, fp, slow)
						first = v
						held <- err
					}()
					time.Sleep(300 * time.Millisecond)
					reuse := call("k")
					reuse.Fingerprint = "another"
					if _, err := coordinator.Do(t.Context(), caller.c, reuse, k.action("reuse")); !errors.Is(err, coordinator.ErrKeyReuse) {
						t.Errorf("another fingerprint over the live holder: %v, want ErrKeyReuse", err)
					}
					v, err := coordinator.Do(t.Context(), caller.c, fp, k.action("caller"))
					if mode == coordinator.InFlightRaise {
						if !errors.Is(err, coordinator.ErrInProgress) {
							t.Errorf("caller in mode raise: %+v, %v; want ErrInProgress", v, err)
						}
					}
					if err := <-held; err != nil {
						t.Fatalf("holder: %v", err)
					}
					if mode == coordinator.InFlightWait && (err != nil || v != first) {
						t.Errorf("waiter: %+v, %v; want the holder's %+v", v, err, first)
					}
					if k.n() != 1 {
						t.Fatalf("the action ran %d times, want once", k.n())
					}
					if n := holder.rec.errors(idemevent.ErrorLeaseLost); n != 0 {
						t.Errorf("the holder lost its lease %d times", n)
					}
				})
			})
		}
	}
}
