package coordinator_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
)

// plainStore is a Store that is no Fencer.
type plainStore struct{ idemstore.Store }

func TestFencedOperationsNeedAFencer(t *testing.T) {
	_, err := coordinator.New(plainStore{memstore.New()}, coordinator.WithFencedOperations("payment.charge"))
	var oe *coordinator.OptionError
	if !errors.As(err, &oe) || oe.Option != "WithFencedOperations" || !strings.Contains(err.Error(), "hands out no fences") {
		t.Fatalf("New over a store without fences = %v, want an *OptionError for WithFencedOperations", err)
	}
	if _, err := coordinator.New(plainStore{memstore.New()}, coordinator.WithFencedOperations()); err != nil {
		t.Errorf("New with no fenced operation over a store without fences = %v, want nil", err)
	}
}

// fenceOf runs call and returns the fence its action saw, and whether it ran
// under a reservation.
func fenceOf(t *testing.T, c *coordinator.Coordinator, call coordinator.Call) (uint64, bool) {
	t.Helper()
	var fence uint64
	var reserved bool
	_, err := coordinator.Do(t.Context(), c, call, func(ctx context.Context) (string, error) {
		r, ok := coordinator.ReservationFromContext(ctx)
		fence, reserved = r.Fence, ok
		return "done", nil
	})
	if err != nil {
		t.Fatalf("Do(%s): %v", call.Key, err)
	}
	return fence, reserved
}

func TestReservationCarriesItsFence(t *testing.T) {
	store := memstore.New()
	c, err := coordinator.New(store, coordinator.WithFencedOperations("payment.charge"))
	if err != nil {
		t.Fatal(err)
	}
	if f, ok := fenceOf(t, c, coordinator.Call{Operation: "payment.charge", Key: "order-1"}); !ok || f == 0 {
		t.Errorf("fenced operation: fence %d (reserved %t), want a fence above 0", f, ok)
	}
	if f, ok := fenceOf(t, c, coordinator.Call{Operation: "order.create", Key: "order-1"}); !ok || f != 0 {
		t.Errorf("unfenced operation: fence %d (reserved %t), want 0 under a reservation", f, ok)
	}
}

// A holder whose lease ran out, and the caller that took the key over: the
// second fence is the greater one, so a downstream write of the first is
// refused. On the fake clock: the first holder stalls past its lease.
func TestTakeoverGetsAGreaterFence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		c, err := coordinator.New(store,
			coordinator.WithFencedOperations("payment.charge"),
			coordinator.WithLease(300*time.Millisecond),
			coordinator.WithStorageTimeout(50*time.Millisecond),
			coordinator.WithRenewInterval(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		// The downstream store refuses a write whose fence is not above the
		// last one it accepted.
		var last uint64
		write := func(fence uint64) bool {
			if fence <= last {
				return false
			}
			last = fence
			return true
		}
		call := coordinator.Call{Operation: "payment.charge", Key: "order-1"}

		firstIn, release := make(chan uint64), make(chan struct{})
		firstWrote := make(chan bool)
		go func() {
			_, _ = coordinator.Do(context.Background(), c, call, func(ctx context.Context) (string, error) {
				r, _ := coordinator.ReservationFromContext(ctx)
				firstIn <- r.Fence
				<-release // stalls; the watchdog gives its key up meanwhile
				firstWrote <- write(r.Fence)
				return "first", ctx.Err()
			})
		}()
		first := <-firstIn
		// Make the holder lose its lease: the key is taken from it, as a
		// partition would.
		if ok, err := store.Release(t.Context(), idemstore.Key{Operation: call.Operation, Key: call.Key}, tokenOf(t, store, call)); err != nil || !ok {
			t.Fatalf("releasing the first holder's key: %t, %v", ok, err)
		}
		time.Sleep(time.Second) // the renewer finds the lease lost
		synctest.Wait()

		var second uint64
		_, err = coordinator.Do(t.Context(), c, call, func(ctx context.Context) (string, error) {
			r, _ := coordinator.ReservationFromContext(ctx)
			second = r.Fence
			if !write(r.Fence) {
				t.Errorf("the new holder's write (fence %d) was refused", r.Fence)
			}
			return "second", nil
		})
		if err != nil {
			t.Fatalf("second Do: %v", err)
		}
		close(release)
		if <-firstWrote {
			t.Errorf("the stale holder's late write (fence %d) was accepted after the new holder's (fence %d)", first, second)
		}
		if second <= first {
			t.Errorf("fences %d then %d: want the takeover's greater", first, second)
		}
		synctest.Wait()
	})
}

// tokenOf returns the token of the pending record of call.
func tokenOf(t *testing.T, store *memstore.Store, call coordinator.Call) string {
	t.Helper()
	rec := store.Snapshot(idemstore.Key{Operation: call.Operation, Key: call.Key})
	if rec.State != idemstore.StatePending {
		t.Fatalf("%s:%s is %s, want pending", call.Operation, call.Key, rec.State)
	}
	return rec.Token
}
