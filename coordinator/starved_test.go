package coordinator_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
)

// slow is a Hook that answers after d, as a starved store does: later than
// the storage timeout, well within the lease.
func slow(d time.Duration) func(context.Context, idemstore.Key) error {
	return func(ctx context.Context, _ idemstore.Key) error {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// A store that answers slower than the storage timeout (a starved Redis)
// still gets the result: the first completion times out, and the background
// rounds, off the request path, may wait for what is left of the
// reservation instead of one storage timeout.
func TestStarvedSaveStoresTheResult(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, fs, mem := newFaulty(t, coordinator.WithLease(time.Second), coordinator.WithStorageTimeout(20*time.Millisecond))
		fs.Before(idemevent.MethodComplete, slow(50*time.Millisecond))
		fs.Before(idemevent.MethodRenew, slow(50*time.Millisecond))
		var k counter
		if _, err := coordinator.Do(t.Context(), f.c, call("starved"), k.action("x")); err != nil {
			t.Fatal(err)
		}
		f.c.Close() // waits for the background save
		if rec := mem.Snapshot(idemstore.Key{Operation: "payment.charge", Key: "starved"}); rec.State != idemstore.StateCompleted {
			t.Fatalf("record is %s, want completed", rec.State)
		}
		if n := f.rec.count(idemevent.Stored, ""); n != 1 {
			t.Fatalf("stored events = %d, want 1", n)
		}
		// One timed-out synchronous completion; the background round's
		// renewal and completion both went through.
		if n := f.rec.errors(idemevent.ErrorStorageSave); n != 1 {
			t.Fatalf("storage_save_error = %d, want 1 (the synchronous attempt)", n)
		}
		if n := f.rec.errors(idemevent.ErrorStorageRenew); n != 0 {
			t.Fatalf("storage_renew_error = %d, want 0", n)
		}
	})
}

// A background round whose renewal goes through gives its completion the
// renewed lease: a completion slower than what was left of the old one is
// still stored (it was cut at the old expiry, and every round after it at
// the expiry before its renewal, so the result was never stored).
func TestStarvedSaveCompletesWithinTheRenewedLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, fs, mem := newFaulty(t, coordinator.WithLease(time.Second), coordinator.WithStorageTimeout(20*time.Millisecond),
			coordinator.WithRenewInterval(800*time.Millisecond))
		var completes atomic.Int64
		fs.Before(idemevent.MethodComplete, func(ctx context.Context, k idemstore.Key) error {
			if completes.Add(1) == 1 { // the synchronous attempt: a hung store
				<-ctx.Done()
				return ctx.Err()
			}
			return slow(600*time.Millisecond)(ctx, k)
		})
		fs.Before(idemevent.MethodRenew, slow(300*time.Millisecond))
		_, err := coordinator.Do(t.Context(), f.c, call("renewed"), func(context.Context) (int, error) {
			time.Sleep(400 * time.Millisecond) // the lease has 600ms left when it returns
			return 1, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		f.c.Close()
		if rec := mem.Snapshot(idemstore.Key{Operation: "payment.charge", Key: "renewed"}); rec.State != idemstore.StateCompleted {
			t.Fatalf("record is %s, want completed", rec.State)
		}
		if n := completes.Load(); n != 2 {
			t.Fatalf("completions sent = %d, want 2 (the synchronous one, and one background round)", n)
		}
		if n := f.rec.count(idemevent.Stored, ""); n != 1 {
			t.Fatalf("stored events = %d, want 1", n)
		}
	})
}

// Renewals of a long action on a starved store go through: a renewal may
// take until the watchdog's deadline, not one storage timeout, so the
// watchdog does not cancel an action whose lease is being kept.
func TestStarvedRenewalsKeepTheLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, fs, _ := newFaulty(t, coordinator.WithLease(time.Second), coordinator.WithStorageTimeout(20*time.Millisecond))
		fs.Before(idemevent.MethodRenew, slow(50*time.Millisecond))
		_, err := coordinator.Do(t.Context(), f.c, call("long"), func(ctx context.Context) (int, error) {
			select {
			case <-time.After(3 * time.Second):
				return 1, nil
			case <-ctx.Done():
				return 0, context.Cause(ctx)
			}
		})
		if err != nil {
			t.Fatalf("Do = %v, want the action to finish", err)
		}
		if n := f.rec.errors(idemevent.ErrorLeaseLost) + f.rec.errors(idemevent.ErrorStorageRenew); n != 0 {
			t.Fatalf("lease_lost + storage_renew_error = %d, want 0", n)
		}
		if n := fs.Calls(idemevent.MethodRenew); n < 8 {
			t.Fatalf("renewals = %d, want one every renew interval", n)
		}
	})
}

// In mode "raise", every Reserve that times out on a struggling store would
// add a background release that times out on the same store; at most eight
// run at once, and the rest are dropped and reported.
func TestCleanupAfterRefusedReservesIsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 20 * time.Millisecond
		f, fs, _ := newFaulty(t, coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise), coordinator.WithStorageTimeout(timeout))
		hang := func(ctx context.Context, _ idemstore.Key) error { <-ctx.Done(); return ctx.Err() }
		fs.Before(idemevent.MethodReserve, hang)
		fs.Before(idemevent.MethodRelease, hang)
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Go(func() {
				_, err := coordinator.Do(t.Context(), f.c, call(string(rune('a'+i%26))+"-"+string(rune('a'+i/26))), func(context.Context) (int, error) { return 1, nil })
				if !errors.Is(err, coordinator.ErrStorage) {
					t.Errorf("Do = %v, want a storage error", err)
				}
			})
		}
		wg.Wait()
		f.c.Close()
		if n := fs.Calls(idemevent.MethodRelease); n != 8 {
			t.Fatalf("releases sent = %d, want 8", n)
		}
		if n := f.rec.errors(idemevent.ErrorStorageRelease); n != 50 {
			t.Fatalf("storage_release_error = %d, want 50 (8 timed out, 42 dropped)", n)
		}
	})
}

// The calls no caller waits for are marked (OffRequestPath): the renewals of
// a running action and the completions retried in the background; the
// reserve and the first, synchronous completion are not.
func TestOffRequestPath(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, fs, _ := newFaulty(t, coordinator.WithLease(time.Second), coordinator.WithStorageTimeout(20*time.Millisecond))
		var mu sync.Mutex
		marked := map[string][]bool{}
		mark := func(m idemevent.Method) func(context.Context, idemstore.Key) error {
			return func(ctx context.Context, _ idemstore.Key) error {
				mu.Lock()
				defer mu.Unlock()
				marked[string(m)] = append(marked[string(m)], coordinator.OffRequestPath(ctx))
				if m == idemevent.MethodComplete && len(marked[string(m)]) == 1 {
					return errors.New("the first completion fails")
				}
				return nil
			}
		}
		for _, m := range []idemevent.Method{idemevent.MethodReserve, idemevent.MethodRenew, idemevent.MethodComplete} {
			fs.Before(m, mark(m))
		}
		_, err := coordinator.Do(t.Context(), f.c, call("marked"), func(context.Context) (int, error) {
			time.Sleep(500 * time.Millisecond) // one renewal
			return 1, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		f.c.Close()
		want := map[string][]bool{
			string(idemevent.MethodReserve):  {false},
			string(idemevent.MethodRenew):    {true, true}, // the renewer's, the save round's
			string(idemevent.MethodComplete): {false, true},
		}
		for m, w := range want {
			if !slices.Equal(marked[m], w) {
				t.Errorf("%s: OffRequestPath = %v, want %v", m, marked[m], w)
			}
		}
		if coordinator.OffRequestPath(t.Context()) {
			t.Error("OffRequestPath of a plain context = true")
		}
	})
}
