package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/coordinator/memstore"
)

// The tests in this file are the rows of the storage-failure table
// (docs/architecture.md, "When the store fails"), each in both on-storage-error modes, on the in-memory store
// behind a wrapper that fails on demand.

var storageModes = []coordinator.OnStorageErrorMode{coordinator.OnStorageErrorRun, coordinator.OnStorageErrorRaise}

func newFaulty(t *testing.T, opts ...coordinator.Option) (fixture, *faultstore.Store, *memstore.Store) {
	t.Helper()
	mem := memstore.New()
	fs := faultstore.Wrap(mem)
	return newFixture(t, fs, opts...), fs, mem
}

// errConnRefused stands for a raw driver error from a custom store.
var errConnRefused = &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}

func wantStorageError(t *testing.T, err error, method idemevent.Method) {
	t.Helper()
	var se *coordinator.StorageError
	if !errors.Is(err, coordinator.ErrStorage) || !errors.As(err, &se) {
		t.Fatalf("err = %v, want a *StorageError", err)
	}
	if se.Method != method {
		t.Fatalf("StorageError.Method = %q, want %q", se.Method, method)
	}
}

// The scenario of the original pull request: the store is unreachable and
// one key is used twice.
func TestStorageDown_SameKeyTwice(t *testing.T) {
	for _, mode := range storageModes {
		t.Run(string(mode), func(t *testing.T) {
			f, fs, _ := newFaulty(t, coordinator.WithOnStorageError(mode))
			for _, m := range idemevent.Methods() {
				fs.Fail(m, errConnRefused)
			}
			var k counter
			for range 2 {
				_, err := coordinator.Do(t.Context(), f.c, call("twice"), k.action("x"))
				switch mode {
				case coordinator.OnStorageErrorRun:
					if err != nil {
						t.Fatalf("run mode: %v", err)
					}
				case coordinator.OnStorageErrorRaise:
					wantStorageError(t, err, idemevent.MethodReserve)
				}
			}
			want := map[coordinator.OnStorageErrorMode]int{coordinator.OnStorageErrorRun: 2, coordinator.OnStorageErrorRaise: 0}[mode]
			if k.n() != want {
				t.Fatalf("action ran %d times, want %d", k.n(), want)
			}
			// The metric is reported in both modes.
			if got := f.rec.errors(idemevent.ErrorStorageReserve); got != 2 {
				t.Fatalf("storage_reserve_error = %d, want 2", got)
			}
		})
	}
}

func TestStorageError_Reserve(t *testing.T) {
	for _, mode := range storageModes {
		t.Run(string(mode), func(t *testing.T) {
			f, fs, mem := newFaulty(t, coordinator.WithOnStorageError(mode))
			fs.FailOnce(idemevent.MethodReserve, errConnRefused)
			var k counter
			v, err := coordinator.Do(t.Context(), f.c, call("reserve"), k.action("x"))
			if mode == coordinator.OnStorageErrorRaise {
				wantStorageError(t, err, idemevent.MethodReserve)
				if k.n() != 0 || mem.Len() != 0 {
					t.Fatalf("raise: runs=%d stored=%d", k.n(), mem.Len())
				}
			} else {
				if err != nil || v.ID != "x" || k.n() != 1 {
					t.Fatalf("run: %+v, %v, runs %d", v, err, k.n())
				}
				if f.rec.count(idemevent.Unprotected, "") != 1 {
					t.Fatal("unprotected run not reported")
				}
				// The result is written best effort once the store is back,
				// in the background.
				f.c.Close()
				if rec := mem.Snapshot(idemstore.Key{Operation: "payment.charge", Key: "reserve"}); rec.State != idemstore.StateCompleted {
					t.Fatalf("record after an unprotected run = %v", rec.State)
				}
			}
			if f.rec.errors(idemevent.ErrorStorageReserve) != 1 {
				t.Fatal("storage_reserve_error not reported")
			}
		})
	}
}

func TestStorageError_RunModeFirstRead(t *testing.T) {
	for _, mode := range storageModes {
		t.Run(string(mode), func(t *testing.T) {
			f, fs, _ := newFaulty(t, coordinator.WithOnStorageError(mode), coordinator.WithInFlight(coordinator.InFlightRun))
			fs.FailOnce(idemevent.MethodGet, errConnRefused)
			var k counter
			_, err := coordinator.Do(t.Context(), f.c, call("first-read"), k.action("x"))
			if mode == coordinator.OnStorageErrorRaise {
				wantStorageError(t, err, idemevent.MethodGet)
				if k.n() != 0 {
					t.Fatal("the action ran")
				}
			} else if err != nil || k.n() != 1 {
				t.Fatalf("run: %v, runs %d", err, k.n())
			}
			if f.rec.errors(idemevent.ErrorStorageGet) != 1 {
				t.Fatal("storage_get_error not reported")
			}
		})
	}
}

// A second caller finds the key reserved and waits; its read fails.
func TestStorageError_ReadAfterContestedReservation(t *testing.T) {
	for _, mode := range storageModes {
		t.Run(string(mode), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f, fs, _ := newFaulty(t, coordinator.WithOnStorageError(mode), coordinator.WithPollInterval(time.Millisecond))
				release := make(chan struct{})
				done := holder(t, f.c, "contested", release, charge{ID: "holder"}, nil)
				fs.Fail(idemevent.MethodGet, errConnRefused)
				var k counter
				v, err := coordinator.Do(t.Context(), f.c, call("contested"), k.action("waiter"))
				if mode == coordinator.OnStorageErrorRaise {
					wantStorageError(t, err, idemevent.MethodGet)
					if k.n() != 0 {
						t.Fatal("the waiter ran the action")
					}
				} else if err != nil || v.ID != "waiter" || k.n() != 1 {
					t.Fatalf("run: %+v, %v, runs %d; want an unprotected run", v, err, k.n())
				}
				// The first poll, at 1ms, fails and ends the wait.
				if got := f.rec.errors(idemevent.ErrorStorageGet); got != 1 || fs.Calls(idemevent.MethodGet) != 1 {
					t.Fatalf("storage_get_error = %d after %d reads, want 1 after 1", got, fs.Calls(idemevent.MethodGet))
				}
				wantWaits(t, f.rec, 1, idemevent.WaitError, time.Millisecond)
				close(release)
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// In-flight mode "raise" refuses a contested key from the reserve reply
// alone: no read that could fail.
func TestStorageError_RaiseModeNeedsNoRead(t *testing.T) {
	f, fs, _ := newFaulty(t, coordinator.WithInFlight(coordinator.InFlightRaise), coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise))
	release := make(chan struct{})
	done := holder(t, f.c, "refused", release, charge{ID: "holder"}, nil)
	fs.Fail(idemevent.MethodGet, errConnRefused)
	var k counter
	if _, err := coordinator.Do(t.Context(), f.c, call("refused"), k.action("x")); !errors.Is(err, coordinator.ErrInProgress) {
		t.Fatalf("err = %v, want ErrInProgress", err)
	}
	if fs.Calls(idemevent.MethodGet) != 0 {
		t.Fatal("read the store")
	}
	close(release)
	<-done
}

// A completion that fails is retried in the background, never followed by
// a release: the result exists and is stored as soon as the store lets it,
// and a retry of the client replays it.
func TestStorageError_Save(t *testing.T) {
	for _, mode := range storageModes {
		t.Run(string(mode), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f, fs, mem := newFaulty(t, coordinator.WithOnStorageError(mode))
				fs.FailOnce(idemevent.MethodComplete, errConnRefused)
				var k counter
				start := time.Now()
				v, err := coordinator.Do(t.Context(), f.c, call("save"), k.action("x"))
				if err != nil || v.ID != "x" || time.Since(start) != 0 {
					t.Fatalf("Do = %+v, %v after %v; want the result at once: the effect has happened", v, err, time.Since(start))
				}
				f.c.Close() // the save is retried in the background
				if got := time.Since(start); got != coordinator.DefaultPollInterval {
					t.Fatalf("the retried save ended after %v, want one poll interval (%v)", got, coordinator.DefaultPollInterval)
				}
				if f.rec.errors(idemevent.ErrorStorageSave) != 1 || f.rec.count(idemevent.Stored, "") != 1 {
					t.Fatalf("storage_save_error %d, stored %d; want 1, 1", f.rec.errors(idemevent.ErrorStorageSave), f.rec.count(idemevent.Stored, ""))
				}
				wantCalls(t, fs, 1, 2, 0)
				wantRecord(t, mem, "save", idemstore.StateCompleted)
				wantReplayed(t, f.c, &k, "save")
			})
		})
	}
}

// A completion that the store applied although its reply was lost (a
// timeout): the background retry finds it applied and reports it stored.
// It sends the completion again although Renew found the record completed:
// a store that acknowledges completions (redisrepo.WithReplicaAcks) has one
// that it applied but did not acknowledge acknowledged only when it is sent
// again, and a read of the record would have seen the master's copy alone.
func TestStorageError_LateSave(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, fs, mem := newFaulty(t, coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise))
		fs.LoseReplies(idemevent.MethodComplete, 1, context.DeadlineExceeded)
		var k counter
		if _, err := coordinator.Do(t.Context(), f.c, call("late"), k.action("x")); err != nil {
			t.Fatal(err)
		}
		f.c.Close()
		if f.rec.count(idemevent.Stored, "") != 1 || f.rec.errors(idemevent.ErrorLeaseLost) != 0 || fs.Calls(idemevent.MethodRelease) != 0 {
			t.Fatalf("stored %d, lease_lost %d, releases %d; want 1, 0, 0",
				f.rec.count(idemevent.Stored, ""), f.rec.errors(idemevent.ErrorLeaseLost), fs.Calls(idemevent.MethodRelease))
		}
		if fs.Calls(idemevent.MethodRenew) != 1 || fs.Calls(idemevent.MethodComplete) != 2 {
			t.Fatalf("renew %d, complete %d; want 1, 2: the completion sent again after Renew found it applied",
				fs.Calls(idemevent.MethodRenew), fs.Calls(idemevent.MethodComplete))
		}
		if rec := mem.Snapshot(idemstore.Key{Operation: "payment.charge", Key: "late"}); rec.State != idemstore.StateCompleted {
			t.Fatalf("record %v, want completed", rec.State)
		}
	})
}

// A completion applied although its reply was lost, whose resends then all
// fail (a starved store): the background retry keeps sending it until the
// reservation could have expired, and then, since Renew found the record no
// longer its pending one, settles on what the record holds (stored), rather
// than reporting the result lost.
func TestStorageError_LateSaveWhoseResendsFail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, fs, mem := newFaulty(t, coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise),
			coordinator.WithLease(testLease), coordinator.WithStorageTimeout(testStorageTimeout))
		fs.LoseReplies(idemevent.MethodComplete, 1, context.DeadlineExceeded)
		var k counter
		if _, err := coordinator.Do(t.Context(), f.c, call("starved"), k.action("x")); err != nil {
			t.Fatal(err)
		}
		fs.Fail(idemevent.MethodComplete, context.DeadlineExceeded) // every resend
		f.c.Close()
		if f.rec.count(idemevent.Stored, "") != 1 || f.rec.errors(idemevent.ErrorLeaseLost) != 0 {
			t.Fatalf("stored %d, lease_lost %d; want 1, 0", f.rec.count(idemevent.Stored, ""), f.rec.errors(idemevent.ErrorLeaseLost))
		}
		if fs.Calls(idemevent.MethodComplete) < 3 {
			t.Fatalf("complete %d; want the first and resends until the lease ran out", fs.Calls(idemevent.MethodComplete))
		}
		for _, e := range f.rec.all() {
			if e.Kind == idemevent.Error && e.ErrorType == idemevent.ErrorStorageSave && strings.Contains(e.Err.Error(), "is not stored") {
				t.Fatalf("the save was given up: %v", e.Err)
			}
		}
		if rec := mem.Snapshot(idemstore.Key{Operation: "payment.charge", Key: "starved"}); rec.State != idemstore.StateCompleted {
			t.Fatalf("record %v, want completed", rec.State)
		}
	})
}

// A store that stays down after the action: the save is retried until the
// reservation could have expired, then given up, reported once; the key is
// never released.
func TestStorageError_SaveGivesUpAfterTheLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, fs, _ := newFaulty(t, coordinator.WithLease(testLease), coordinator.WithStorageTimeout(testStorageTimeout))
		fs.Fail(idemevent.MethodComplete, errConnRefused)
		fs.Fail(idemevent.MethodRenew, errConnRefused)
		var k counter
		start := time.Now()
		if _, err := coordinator.Do(t.Context(), f.c, call("down"), k.action("x")); err != nil {
			t.Fatal(err)
		}
		f.c.Close()
		// The reservation was sent at start: it may be ours until the lease
		// has passed. The attempts come closer together as it runs out (each
		// waits at most half the time left, at least 1ms), so the last one
		// goes out less than 1ms before the end, and the save gives up at the
		// first round due at or after it.
		if got := time.Since(start); got < testLease || got >= testLease+time.Millisecond {
			t.Fatalf("gave up after %v, want within 1ms after the lease (%v)", got, testLease)
		}
		if fs.Calls(idemevent.MethodRelease) != 0 || f.rec.count(idemevent.Stored, "") != 0 {
			t.Fatalf("releases %d, stored %d; want 0, 0", fs.Calls(idemevent.MethodRelease), f.rec.count(idemevent.Stored, ""))
		}
		var gaveUp int
		for _, e := range f.rec.all() {
			if e.Kind == idemevent.Error && e.ErrorType == idemevent.ErrorStorageSave && strings.Contains(e.Err.Error(), "is not stored") {
				gaveUp++
			}
		}
		if gaveUp != 1 {
			t.Fatalf("%d give-up events, want 1", gaveUp)
		}
	})
}

// wantCalls fails t unless fs saw exactly these calls of Renew, Complete
// and Release.
func wantCalls(t *testing.T, fs *faultstore.Store, renew, complete, release int) {
	t.Helper()
	if fs.Calls(idemevent.MethodRenew) != renew || fs.Calls(idemevent.MethodComplete) != complete || fs.Calls(idemevent.MethodRelease) != release {
		t.Fatalf("renew %d, complete %d, release %d; want %d, %d, %d",
			fs.Calls(idemevent.MethodRenew), fs.Calls(idemevent.MethodComplete), fs.Calls(idemevent.MethodRelease), renew, complete, release)
	}
}

// wantRecord fails t unless mem holds key's record in state.
func wantRecord(t *testing.T, mem *memstore.Store, key string, state idemstore.State) {
	t.Helper()
	if rec := mem.Snapshot(idemstore.Key{Operation: "payment.charge", Key: key}); rec.State != state {
		t.Fatalf("record %v, want %v", rec.State, state)
	}
}

// wantReplayed fails t unless a retry of key replays the stored "x" of the
// one run that k counted.
func wantReplayed(t *testing.T, c *coordinator.Coordinator, k *counter, key string) {
	t.Helper()
	again, err := coordinator.Do(t.Context(), c, call(key), k.action("retry"))
	if err != nil || again.ID != "x" || k.n() != 1 {
		t.Fatalf("retry = %+v, %v after %d runs; want the stored x after 1", again, err, k.n())
	}
}

// gaveUp counts the events that report a save given up.
func gaveUp(r *recorder) int {
	n := 0
	for _, e := range r.all() {
		if e.Kind == idemevent.Error && e.ErrorType == idemevent.ErrorStorageSave && strings.Contains(e.Err.Error(), "is not stored") {
			n++
		}
	}
	return n
}

// A first completion that fails only after the reservation could have
// expired by this process's clock (a starved process): the background save
// does not give up on the process's own reckoning, but sends one round, and
// the store's answer decides. The reservation is applied 10ms after it was
// sent, so the store holds the record until 70ms while this process reckons
// its reservation until 60ms (the 60ms lease from when it was sent).
func TestStorageError_SaveAfterTheExpiry(t *testing.T) {
	for _, tc := range []struct {
		name string
		// failAt is when the first completion fails; renewHangs makes
		// the store answer no renewal.
		failAt     time.Duration
		renewHangs bool
		// What the store and the observer see, and when the save ends.
		stored, givenUp, leaseLost int
		renews, completes          int
		record                     idemstore.State
		end                        time.Duration
	}{
		// The record is still ours: stored, and a retry replays it.
		{name: "the store holds the record", failAt: 65 * time.Millisecond,
			stored: 1, renews: 1, completes: 2, record: idemstore.StateCompleted, end: 66 * time.Millisecond},
		// The store's lease has run out too: the lease lost, on the
		// store's word, not a give-up.
		{name: "the store's lease ran out", failAt: 75 * time.Millisecond,
			leaseLost: 1, renews: 1, completes: 2, record: idemstore.StateAbsent, end: 76 * time.Millisecond},
		// The store answers that round neither: given up then, one
		// storage timeout later; the key is not released, and has
		// expired by then.
		{name: "the store does not answer", failAt: 65 * time.Millisecond, renewHangs: true,
			givenUp: 1, renews: 1, completes: 1, record: idemstore.StateAbsent, end: 66*time.Millisecond + testStorageTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f, fs, mem := newFaulty(t, coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise),
					coordinator.WithLease(testLease), coordinator.WithStorageTimeout(testStorageTimeout))
				start := time.Now()
				fs.Before(idemevent.MethodReserve, func(context.Context, idemstore.Key) error {
					time.Sleep(10 * time.Millisecond)
					return nil
				})
				first := true
				fs.Before(idemevent.MethodComplete, func(context.Context, idemstore.Key) error {
					if !first {
						return nil
					}
					first = false
					time.Sleep(time.Until(start.Add(tc.failAt)))
					return context.DeadlineExceeded
				})
				if tc.renewHangs {
					fs.Before(idemevent.MethodRenew, func(ctx context.Context, _ idemstore.Key) error {
						<-ctx.Done()
						return ctx.Err()
					})
				}
				var k counter
				if v, err := coordinator.Do(t.Context(), f.c, call("late"), k.action("x")); err != nil || v.ID != "x" {
					t.Fatalf("Do = %+v, %v", v, err)
				}
				f.c.Close()
				if got := time.Since(start); got != tc.end {
					t.Fatalf("the save ended after %v, want %v", got, tc.end)
				}
				if s, g, l := f.rec.count(idemevent.Stored, ""), gaveUp(f.rec), f.rec.errors(idemevent.ErrorLeaseLost); s != tc.stored || g != tc.givenUp || l != tc.leaseLost {
					t.Fatalf("stored %d, given up %d, lease_lost %d; want %d, %d, %d", s, g, l, tc.stored, tc.givenUp, tc.leaseLost)
				}
				wantCalls(t, fs, tc.renews, tc.completes, 0)
				wantRecord(t, mem, "late", tc.record)
				if tc.stored == 1 {
					wantReplayed(t, f.c, &k, "late")
				}
			})
		})
	}
}

func TestStorageError_Release(t *testing.T) {
	for _, mode := range storageModes {
		t.Run(string(mode), func(t *testing.T) {
			f, fs, _ := newFaulty(t, coordinator.WithOnStorageError(mode))
			fs.FailOnce(idemevent.MethodRelease, errConnRefused)
			boom := errors.New("declined")
			_, err := coordinator.Do(t.Context(), f.c, call("release"), func(context.Context) (int, error) { return 0, boom })
			if err != boom {
				t.Fatalf("err = %v, want the action's own error", err)
			}
			if f.rec.errors(idemevent.ErrorStorageRelease) != 1 {
				t.Fatal("storage_release_error not reported")
			}
		})
	}
}

func TestStorageError_Renew(t *testing.T) {
	for _, mode := range storageModes {
		t.Run(string(mode), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const (
					renew = testLease / 6 // 10ms
					// Past the first lease, and 5ms past the renewal at 60ms.
					runFor = testLease + 5*time.Millisecond
				)
				f, fs, mem := newFaulty(t, coordinator.WithOnStorageError(mode),
					coordinator.WithLease(testLease), coordinator.WithRenewInterval(renew), coordinator.WithStorageTimeout(testStorageTimeout))
				fs.FailTimes(idemevent.MethodRenew, 2, errConnRefused)
				var k counter
				v, err := coordinator.Do(t.Context(), f.c, call("renew"), func(ctx context.Context) (charge, error) {
					<-time.After(runFor)
					if ctx.Err() != nil {
						t.Error("the action was cancelled by a failed renewal")
					}
					return k.action("x")(ctx)
				})
				if err != nil || v.ID != "x" {
					t.Fatalf("Do = %+v, %v", v, err)
				}
				// The renewals at 10 and 20ms fail; the one at 30ms is
				// retried on time and keeps the lease, which would have
				// run out at 60ms; three more follow.
				if got := f.rec.errors(idemevent.ErrorStorageRenew); got != 2 {
					t.Fatalf("storage_renew_error = %d, want 2", got)
				}
				if got := fs.Calls(idemevent.MethodRenew); got != 6 {
					t.Fatalf("%d renewals, want 6", got)
				}
				if rec := mem.Snapshot(idemstore.Key{Operation: "payment.charge", Key: "renew"}); rec.State != idemstore.StateCompleted {
					t.Fatalf("record = %v, want completed", rec.State)
				}
			})
		})
	}
}

func TestStorageError_RawErrorIsWrapped(t *testing.T) {
	f, fs, _ := newFaulty(t, coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise))
	fs.FailOnce(idemevent.MethodReserve, errConnRefused)
	_, err := coordinator.Do(t.Context(), f.c, call("raw"), (&counter{}).action("x"))
	var se *coordinator.StorageError
	if !errors.As(err, &se) || se.Method != idemevent.MethodReserve || !errors.Is(err, errConnRefused) ||
		se.Operation != "payment.charge" || se.Key != "raw" {
		t.Fatalf("err = %#v", err)
	}
	var op *net.OpError
	if !errors.As(err, &op) {
		t.Fatal("the driver error is not reachable with errors.As")
	}
	// A *StorageError from the store keeps its error, with the call's
	// operation and key filled in.
	own := &coordinator.StorageError{Method: idemevent.MethodReserve, Err: errors.New("cluster down")}
	fs.FailOnce(idemevent.MethodReserve, own)
	_, err = coordinator.Do(t.Context(), f.c, call("own"), (&counter{}).action("x"))
	if !errors.As(err, &se) || se.Err != own.Err || se.Method != own.Method || se.Operation != "payment.charge" || se.Key != "own" {
		t.Fatalf("err = %v, want the store's own *StorageError with the call's key", err)
	}
	if want := "idempotency: storage reserve of payment.charge:own: cluster down"; err.Error() != want {
		t.Fatalf("err = %q, want %q", err, want)
	}
}

func TestStorageError_HungStoreTimesOut(t *testing.T) {
	for _, mode := range storageModes {
		t.Run(string(mode), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const timeout = 20 * time.Millisecond
				f, fs, _ := newFaulty(t, coordinator.WithOnStorageError(mode), coordinator.WithStorageTimeout(timeout))
				fs.Before(idemevent.MethodReserve, func(ctx context.Context, _ idemstore.Key) error {
					<-ctx.Done()
					return ctx.Err()
				})
				var k counter
				start := time.Now()
				_, err := coordinator.Do(t.Context(), f.c, call("hung"), k.action("x"))
				// The call lasts one storage timeout in both modes: the hung
				// Reserve. Then, in the background, run mode saves the
				// unprotected result best effort (another hung Reserve, one
				// more timeout), and raise mode releases the key in case the
				// Reserve was applied (Release does not hang here).
				if d := time.Since(start); d != timeout {
					t.Fatalf("the call took %v with a %v storage timeout, want one timeout", d, timeout)
				}
				f.c.Close()
				background := map[coordinator.OnStorageErrorMode]time.Duration{coordinator.OnStorageErrorRun: 2 * timeout, coordinator.OnStorageErrorRaise: timeout}[mode]
				if d := time.Since(start); d != background {
					t.Fatalf("the background work ended after %v, want %v", d, background)
				}
				if mode == coordinator.OnStorageErrorRaise {
					wantStorageError(t, err, idemevent.MethodReserve)
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Fatalf("err = %v, want it to wrap context.DeadlineExceeded", err)
					}
				} else if err != nil || k.n() != 1 {
					t.Fatalf("run: %v, runs %d", err, k.n())
				}
			})
		})
	}
}

// A caller whose own context ends while reserving gets its context's error,
// not a storage error, and the action does not run.
func TestCallerCancelledWhileReserving(t *testing.T) {
	f, fs, _ := newFaulty(t)
	ctx, cancel := context.WithCancel(t.Context())
	fs.Before(idemevent.MethodReserve, func(ctx context.Context, _ idemstore.Key) error {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	})
	var k counter
	_, err := coordinator.Do(ctx, f.c, call("cancelled"), k.action("x"))
	if !errors.Is(err, context.Canceled) || errors.Is(err, coordinator.ErrStorage) || k.n() != 0 {
		t.Fatalf("err = %v, runs %d", err, k.n())
	}
	if f.rec.errors("") != 0 {
		t.Fatal("a cancelled caller was counted as a storage error")
	}
}

func TestStorageHealthy_ReplaysAsUsual(t *testing.T) {
	for _, mode := range storageModes {
		t.Run(string(mode), func(t *testing.T) {
			f, fs, _ := newFaulty(t, coordinator.WithOnStorageError(mode))
			var k counter
			a, err1 := coordinator.Do(t.Context(), f.c, call("healthy"), k.action("x"))
			b, err2 := coordinator.Do(t.Context(), f.c, call("healthy"), k.action("y"))
			if err1 != nil || err2 != nil || a != b || k.n() != 1 {
				t.Fatalf("a=%+v b=%+v errs=%v,%v runs=%d", a, b, err1, err2, k.n())
			}
			// Round trips: a first execution is reserve + complete; a replay
			// is one reserve.
			if r, c := fs.Calls(idemevent.MethodReserve), fs.Calls(idemevent.MethodComplete); r != 2 || c != 1 {
				t.Fatalf("reserve calls=%d complete calls=%d, want 2 and 1", r, c)
			}
			if f.rec.errors("") != 0 {
				t.Fatalf("errors reported: %+v", f.rec.all())
			}
		})
	}
}

func TestStorageError_UnreadableRecordIsNotAnOutage(t *testing.T) {
	for _, mode := range storageModes {
		t.Run(string(mode), func(t *testing.T) {
			f, _, mem := newFaulty(t, coordinator.WithOnStorageError(mode))
			key := idemstore.Key{Operation: "payment.charge", Key: "corrupt"}
			mem.Put(key, idemstore.Record{State: idemstore.StateUnreadable, TTL: time.Hour})
			var k counter
			v, err := coordinator.Do(t.Context(), f.c, call("corrupt"), k.action("fresh"))
			if err != nil || v.ID != "fresh" || k.n() != 1 {
				t.Fatalf("Do = %+v, %v, runs %d", v, err, k.n())
			}
			if rec := mem.Snapshot(key); rec.State != idemstore.StateCompleted {
				t.Fatalf("record not replaced: %v", rec.State)
			}
			if f.rec.errors(idemevent.ErrorStorageGet)+f.rec.errors(idemevent.ErrorStorageReserve) != 0 {
				t.Fatal("counted as a storage error")
			}
		})
	}
}

// A store that answers with a conflict or a refusal is not down: in every
// in-flight mode and both on-storage-error modes, the call returns a
// *StorageError that matches the sentinel, and the action does not run.
func TestStorageAnswered_NeverRunsUnprotected(t *testing.T) {
	answers := map[string]error{
		"conflict":      fmt.Errorf("%w: ERROR: could not serialize access due to concurrent update (SQLSTATE 40001)", coordinator.ErrConflict),
		"misconfigured": fmt.Errorf("%w: ERROR: prepared statement \"stmtcache_1\" already exists (SQLSTATE 42P05)", coordinator.ErrMisconfigured),
	}
	sentinels := map[string]error{"conflict": coordinator.ErrConflict, "misconfigured": coordinator.ErrMisconfigured}
	for name, answer := range answers {
		for _, inFlight := range []coordinator.InFlightMode{coordinator.InFlightWait, coordinator.InFlightRaise, coordinator.InFlightRun} {
			for _, mode := range storageModes {
				t.Run(name+"/"+string(inFlight)+"/"+string(mode), func(t *testing.T) {
					f, fs, mem := newFaulty(t, coordinator.WithOnStorageError(mode), coordinator.WithInFlight(inFlight))
					fs.Fail(idemevent.MethodReserve, answer)
					fs.Fail(idemevent.MethodGet, answer)
					var k counter
					_, err := coordinator.Do(t.Context(), f.c, call("answered"), k.action("x"))
					method := idemevent.MethodReserve
					if inFlight == coordinator.InFlightRun {
						method = idemevent.MethodGet
					}
					wantStorageError(t, err, method)
					if !errors.Is(err, sentinels[name]) {
						t.Fatalf("err = %v, want it to match %v", err, sentinels[name])
					}
					if k.n() != 0 {
						t.Fatalf("action ran %d times, want 0", k.n())
					}
					if f.rec.count(idemevent.Unprotected, "") != 0 {
						t.Fatalf("an unprotected run was reported")
					}
					if rec, _ := mem.Get(t.Context(), idemstore.Key{Operation: "op", Key: "answered"}); rec.State != idemstore.StateAbsent {
						t.Fatalf("record = %v, want absent", rec.State)
					}
				})
			}
		}
	}
}
