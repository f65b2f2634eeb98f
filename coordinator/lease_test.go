package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/coordinator/memstore"
)

// The renewal tests run in a synctest bubble (testing/synctest): the
// renewer's ticker, the waiters' poll timers, the actions' timers and
// memstore's clock all read the bubble's fake clock, which moves only when
// every goroutine of the test is blocked. A renewal happens at each exact
// multiple of the renew interval, so the tests count them exactly; the
// actions last a time that is not a multiple of the interval, so that no
// renewal is due at the instant the action returns.

const testLease = 60 * time.Millisecond

// testStorageTimeout fits the lease rule: a renewal that takes its whole
// timeout still ends before the watchdog's deadline.
const testStorageTimeout = 20 * time.Millisecond

func TestRenewalKeepsALongActionExclusive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			renew = testLease / 4 // 15ms
			// Three leases, and 10ms past the renewal at 180ms.
			runFor = 3*testLease + 10*time.Millisecond
		)
		s := memstore.New()
		opts := []coordinator.Option{coordinator.WithLease(testLease), coordinator.WithRenewInterval(renew), coordinator.WithStorageTimeout(testStorageTimeout),
			coordinator.WithWaitTimeout(5 * time.Second), coordinator.WithPollInterval(time.Millisecond)}
		// Two coordinators over one store: two processes.
		a := newFixture(t, s, opts...)
		b := newFixture(t, s, opts...)
		var k counter
		long := func(ctx context.Context) (charge, error) {
			<-time.After(runFor)
			if ctx.Err() != nil {
				return charge{}, context.Cause(ctx)
			}
			return k.action("long")(ctx)
		}
		done := make(chan charge, 1)
		go func() {
			v, err := coordinator.Do(t.Context(), a.c, call("long"), long)
			if err != nil {
				t.Error(err)
			}
			done <- v
		}()
		synctest.Wait() // a holds the key and runs its action
		if got := a.rec.count(idemevent.Miss, ""); got != 1 {
			t.Fatalf("a's misses = %d, want 1: a runs", got)
		}
		start := time.Now()
		v, err := coordinator.Do(t.Context(), b.c, call("long"), long)
		if err != nil {
			t.Fatal(err)
		}
		if first := <-done; v != first || k.n() != 1 {
			t.Fatalf("b got %+v, a got %+v, runs %d: want one run and one result", v, first, k.n())
		}
		// a renews at 15ms, 30ms, ..., 180ms: without the renewals its
		// lease would run out at 60ms, and b's read at 63ms would take over.
		for m, want := range map[idemevent.Method]int{idemevent.MethodReserve: 1, idemevent.MethodRenew: 12, idemevent.MethodComplete: 1} {
			if got := a.rec.calls(m); got != want {
				t.Errorf("a made %d %s calls, want %d", got, m, want)
			}
		}
		if got := a.rec.count(idemevent.StorageCall, ""); got != 14 {
			t.Errorf("a made %d store calls, want 14", got)
		}
		// b polls at 1, 3, 7, 15, 31, 63, 127 and 255ms (another process:
		// nobody kicks it), and finds a's result at 255ms.
		if got := b.rec.calls(idemevent.MethodGet); got != 8 {
			t.Errorf("b read %d times, want 8", got)
		}
		if d := time.Since(start); d != 255*time.Millisecond {
			t.Errorf("b's Do took %v, want 255ms", d)
		}
		wantWaits(t, b.rec, 1, idemevent.WaitHit, 255*time.Millisecond)
		if a.rec.errors("") != 0 || b.rec.errors("") != 0 {
			t.Fatalf("errors: a %+v, b %+v", a.rec.all(), b.rec.all())
		}
	})
}

func TestLostLeaseCancelsTheActionAndKeepsTheNewOwner(t *testing.T) {
	for _, name := range []string{"action honours cancellation", "action ignores cancellation"} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const renew = testLease / 6 // 10ms
				s := memstore.New()
				f := newFixture(t, s, coordinator.WithLease(testLease), coordinator.WithRenewInterval(renew), coordinator.WithStorageTimeout(testStorageTimeout))
				key := idemstore.Key{Operation: "payment.charge", Key: "stolen"}
				var cause error
				var cancelledAfter time.Duration
				v, err := coordinator.Do(t.Context(), f.c, call("stolen"), func(ctx context.Context) (charge, error) {
					// Another caller takes the key over (as after a store
					// failover or a long pause past the lease).
					s.Put(key, idemstore.Record{State: idemstore.StatePending, Token: "new-owner", TTL: time.Minute})
					start := time.Now()
					select {
					case <-ctx.Done():
						cause = context.Cause(ctx)
						cancelledAfter = time.Since(start)
					case <-time.After(time.Second):
						t.Error("the action's context was not cancelled")
					}
					if name == "action honours cancellation" {
						return charge{}, cause
					}
					return charge{ID: "late"}, nil
				})
				if !errors.Is(cause, coordinator.ErrLeaseLost) {
					t.Fatalf("cause = %v, want ErrLeaseLost", cause)
				}
				// The first renewal, one interval into the action, finds
				// the lease lost.
				if cancelledAfter != renew || f.rec.calls(idemevent.MethodRenew) != 1 {
					t.Fatalf("cancelled after %v and %d renewals, want %v and 1", cancelledAfter, f.rec.calls(idemevent.MethodRenew), renew)
				}
				if name == "action honours cancellation" {
					if !errors.Is(err, coordinator.ErrLeaseLost) {
						t.Fatalf("err = %v", err)
					}
				} else if err != nil || v.ID != "late" {
					t.Fatalf("Do = %+v, %v; want the action's result", v, err)
				}
				if rec := s.Snapshot(key); rec.State != idemstore.StatePending || rec.Token != "new-owner" {
					t.Fatalf("the new owner's record was touched: %+v", rec)
				}
				if got := f.rec.errors(idemevent.ErrorLeaseLost); got != 1 {
					t.Fatalf("lease_lost = %d, want 1", got)
				}
			})
		})
	}
}

func TestCompletionAfterATakeoverDoesNotOverwrite(t *testing.T) {
	// The lease is lost between the last renewal and completion: completion
	// is refused by the owner check.
	s := memstore.New()
	f := newFixture(t, s) // renewals every 10s: none during this action
	key := idemstore.Key{Operation: "payment.charge", Key: "late"}
	v, err := coordinator.Do(t.Context(), f.c, call("late"), func(context.Context) (charge, error) {
		s.Put(key, idemstore.Record{State: idemstore.StateCompleted, Token: "winner", Result: []byte(`{"id":"winner"}`), TTL: time.Hour})
		return charge{ID: "loser"}, nil
	})
	if err != nil || v.ID != "loser" {
		t.Fatalf("Do = %+v, %v", v, err)
	}
	if rec := s.Snapshot(key); string(rec.Result) != `{"id":"winner"}` {
		t.Fatalf("winner's record overwritten: %+v", rec)
	}
	if f.rec.errors(idemevent.ErrorLeaseLost) != 1 {
		t.Fatal("lease_lost not reported")
	}
}

func TestRenewerStopsBeforeCompletion(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			renew  = 5 * time.Millisecond
			runFor = 32 * time.Millisecond // renewals at 5, 10, ..., 30ms
			after  = 30 * time.Millisecond // six more intervals
		)
		s := memstore.New()
		f := newFixture(t, s, coordinator.WithLease(testLease), coordinator.WithRenewInterval(renew), coordinator.WithStorageTimeout(testStorageTimeout))
		if _, err := coordinator.Do(t.Context(), f.c, call("stop"), func(context.Context) (int, error) {
			<-time.After(runFor)
			return 1, nil
		}); err != nil {
			t.Fatal(err)
		}
		if got := f.rec.calls(idemevent.MethodRenew); got != 6 {
			t.Fatalf("%d renewals during a 32ms action renewed every 5ms, want 6", got)
		}
		n := f.rec.count(idemevent.StorageCall, "")
		if n != 8 { // reserve, six renewals, complete
			t.Fatalf("%d store calls, want 8", n)
		}
		<-time.After(after)
		if got := f.rec.count(idemevent.StorageCall, ""); got != n {
			t.Fatalf("%d store calls %v after Do returned: the renewer outlived the call", got-n, after)
		}
		rec := s.Snapshot(idemstore.Key{Operation: "payment.charge", Key: "stop"})
		if rec.State != idemstore.StateCompleted || rec.TTL != coordinator.DefaultTTL-after {
			t.Fatalf("record = %v with TTL %v, want completed with %v; a late renewal shortened it?", rec.State, rec.TTL, coordinator.DefaultTTL-after)
		}
	})
}

// The watchdog: a holder cut off from the store (every renewal fails, or
// hangs) has its action's context cancelled with ErrLeaseLost when no
// renewal has been confirmed for the lease less its margin — while its
// reservation is still in the store, so before another caller could take
// the key over.
func TestWatchdogCancelsAHolderCutOffFromTheStore(t *testing.T) {
	const renew = testLease / 6 // 10ms
	margin := testLease / 10    // 6ms
	for _, fault := range []string{"renewals fail", "renewals hang"} {
		t.Run(fault, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := memstore.New()
				fs := faultstore.Wrap(mem)
				f := newFixture(t, fs, coordinator.WithLease(testLease), coordinator.WithRenewInterval(renew),
					coordinator.WithStorageTimeout(testStorageTimeout))
				// One renewal goes through, at 10ms; after that the holder is
				// cut off.
				var renewals int
				fs.Before(idemevent.MethodRenew, func(ctx context.Context, _ idemstore.Key) error {
					renewals++
					switch {
					case renewals == 1:
						return nil
					case fault == "renewals fail":
						return errConnRefused
					}
					<-ctx.Done() // hangs until the call's deadline
					return ctx.Err()
				})
				key := idemstore.Key{Operation: "payment.charge", Key: "cut-off"}
				start := time.Now()
				var cancelledAt time.Duration
				var left idemstore.Record
				_, err := coordinator.Do(t.Context(), f.c, call("cut-off"), func(ctx context.Context) (charge, error) {
					<-ctx.Done()
					cancelledAt = time.Since(start)
					left = mem.Snapshot(key)
					return charge{}, context.Cause(ctx)
				})
				if !errors.Is(err, coordinator.ErrLeaseLost) {
					t.Fatalf("Do err = %v, want the action's ErrLeaseLost", err)
				}
				// The last confirmed renewal was sent at 10ms: the watchdog
				// fires at 10ms + lease - margin.
				if want := renew + testLease - margin; cancelledAt != want {
					t.Fatalf("cancelled after %v, want %v", cancelledAt, want)
				}
				if left.State != idemstore.StatePending || left.TTL != margin {
					t.Fatalf("when cancelled the record was %v with %v left; want still pending, %v left", left.State, left.TTL, margin)
				}
				if f.rec.errors(idemevent.ErrorLeaseLost) != 1 {
					t.Fatalf("lease_lost = %d, want 1", f.rec.errors(idemevent.ErrorLeaseLost))
				}
			})
		})
	}
}

// The watchdog stays quiet while renewals are confirmed, however long the
// action runs, and while a renewal is slow but within its timeout.
func TestWatchdogQuietWhileRenewalsAreConfirmed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := faultstore.Wrap(memstore.New())
		f := newFixture(t, fs, coordinator.WithLease(testLease), coordinator.WithRenewInterval(testLease/6),
			coordinator.WithStorageTimeout(testStorageTimeout))
		fs.Before(idemevent.MethodRenew, func(ctx context.Context, _ idemstore.Key) error {
			<-time.After(testStorageTimeout - time.Millisecond) // slow, within the timeout
			return nil
		})
		v, err := coordinator.Do(t.Context(), f.c, call("slow"), func(ctx context.Context) (charge, error) {
			<-time.After(10 * testLease)
			return charge{ID: "done"}, context.Cause(ctx)
		})
		if err != nil || v.ID != "done" || f.rec.errors(idemevent.ErrorLeaseLost) != 0 {
			t.Fatalf("Do = %+v, %v, lease_lost %d; want done and no loss", v, err, f.rec.errors(idemevent.ErrorLeaseLost))
		}
	})
}

// A completion the store refuses is checked with a read before it is called
// a lost lease; when that read fails, the store cannot say, and a lost lease
// is not reported: a storage_get_error is. When the read shows another
// caller's record, it is a lost lease.
func TestRefusedCompletionWhoseCheckFailsIsNoLostLease(t *testing.T) {
	for _, readFails := range []bool{true, false} {
		t.Run(fmt.Sprint("read fails=", readFails), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := memstore.New()
				fs := faultstore.Wrap(mem)
				f := newFixture(t, fs, coordinator.WithLease(testLease), coordinator.WithStorageTimeout(testStorageTimeout))
				v, err := coordinator.Do(t.Context(), f.c, call("taken"), func(context.Context) (charge, error) {
					// Another caller takes the key over as the action ends.
					mem.Put(idemstore.Key{Operation: "payment.charge", Key: "taken"},
						idemstore.Record{State: idemstore.StatePending, Token: "other", TTL: testLease})
					if readFails {
						fs.Fail(idemevent.MethodGet, errors.New("connection reset by peer"))
					}
					return charge{ID: "done"}, nil
				})
				if err != nil || v.ID != "done" {
					t.Fatalf("Do = %+v, %v; want done", v, err)
				}
				lost, get := f.rec.errors(idemevent.ErrorLeaseLost), f.rec.errors(idemevent.ErrorStorageGet)
				if readFails && (lost != 0 || get != 1) {
					t.Errorf("lease_lost %d, storage_get_error %d; want 0 and 1: the read that would tell failed", lost, get)
				}
				if !readFails && (lost != 1 || get != 0) {
					t.Errorf("lease_lost %d, storage_get_error %d; want 1 and 0: the record is another caller's", lost, get)
				}
			})
		})
	}
}
