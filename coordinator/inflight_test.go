package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
)

// holder starts a call whose action blocks until release is closed, and
// returns once the action is running.
func holder(t *testing.T, c *coordinator.Coordinator, key string, release <-chan struct{}, result charge, actionErr error) <-chan error {
	t.Helper()
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := coordinator.Do(context.WithoutCancel(t.Context()), c, call(key), func(context.Context) (charge, error) {
			close(started)
			<-release
			return result, actionErr
		})
		done <- err
	}()
	<-started
	return done
}

func TestWaitModeReturnsTheHoldersResult(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, _ := newMem(t, coordinator.WithPollInterval(time.Millisecond))
		release := make(chan struct{})
		done := holder(t, f.c, "w", release, charge{ID: "first"}, nil)
		var k counter
		got := make(chan charge, 3)
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() {
				v, err := coordinator.Do(t.Context(), f.c, call("w"), k.action("second"))
				if err != nil {
					t.Error(err)
				}
				got <- v
			})
		}
		synctest.Wait()
		if n := f.rec.count(idemevent.InFlight, ""); n != 3 {
			t.Fatalf("in-flight events = %d, want 3 waiters", n)
		}
		// The default mode is named, not left empty, in the events.
		f.rec.mu.Lock()
		for _, e := range f.rec.events {
			if e.Kind == idemevent.InFlight && e.Mode != "wait" {
				t.Errorf("in-flight event's Mode = %q, want \"wait\"", e.Mode)
			}
		}
		f.rec.mu.Unlock()
		close(release)
		wg.Wait()
		close(got)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		for v := range got {
			if v.ID != "first" {
				t.Fatalf("waiter got %+v, want the holder's result", v)
			}
		}
		if k.n() != 0 {
			t.Fatalf("waiters ran the action %d times", k.n())
		}
		// The holder, in this process, wakes the waiters' loop when it
		// completes: one read, at once, and no poll interval waited.
		wantWaits(t, f.rec, 3, idemevent.WaitHit, 0)
		if gets := f.rec.calls(idemevent.MethodGet); gets != 1 {
			t.Fatalf("%d reads, want the one the holder's completion kicked", gets)
		}
	})
}

func TestWaitersShareOnePollLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, _ := newMem(t, coordinator.WithPollInterval(5*time.Millisecond))
		release := make(chan struct{})
		done := holder(t, f.c, "shared", release, charge{ID: "first"}, nil)
		var k counter
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() {
				if _, err := coordinator.Do(t.Context(), f.c, call("shared"), k.action("x")); err != nil {
					t.Error(err)
				}
			})
		}
		synctest.Wait()
		if n := f.rec.count(idemevent.InFlight, ""); n != 20 {
			t.Fatalf("in-flight events = %d, want 20 waiters", n)
		}
		<-time.After(100 * time.Millisecond)
		// One loop backing off from 5ms reads at 5, 15, 35 and 75ms; twenty
		// loops would read 80 times.
		if gets := f.rec.calls(idemevent.MethodGet); gets != 4 {
			t.Fatalf("%d reads in 100ms by 20 waiters, want 4: one shared backing-off loop", gets)
		}
		close(release)
		wg.Wait()
		if err := <-done; err != nil || k.n() != 0 {
			t.Fatalf("holder err=%v, waiter runs=%d", err, k.n())
		}
		wantWaits(t, f.rec, 20, idemevent.WaitHit, 100*time.Millisecond)
	})
}

func TestRaiseModeRefusesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, _ := newMem(t, coordinator.WithInFlight(coordinator.InFlightRaise))
		release := make(chan struct{})
		done := holder(t, f.c, "r", release, charge{ID: "first"}, nil)
		var k counter
		start := time.Now()
		_, err := coordinator.Do(t.Context(), f.c, call("r"), k.action("x"))
		var ip *coordinator.InProgressError
		if !errors.Is(err, coordinator.ErrInProgress) || !errors.As(err, &ip) {
			t.Fatalf("err = %v, want *InProgressError", err)
		}
		// The holder reserved at this instant: a whole lease is left.
		if ip.RetryAfter != coordinator.DefaultLease {
			t.Fatalf("RetryAfter = %v, want the holder's remaining lease, %v", ip.RetryAfter, coordinator.DefaultLease)
		}
		if d := time.Since(start); d != 0 || k.n() != 0 {
			t.Fatalf("took %v and ran %d times, want at once and never", d, k.n())
		}
		if gets := f.rec.calls(idemevent.MethodGet); gets != 0 {
			t.Fatalf("%d reads, want none: raise mode does not wait", gets)
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if v, err := coordinator.Do(t.Context(), f.c, call("r"), k.action("x")); err != nil || v.ID != "first" {
			t.Fatalf("after completion: %+v, %v", v, err)
		}
	})
}

func TestRunModeRunsAndAdoptsTheWinner(t *testing.T) {
	f, _ := newMem(t, coordinator.WithInFlight(coordinator.InFlightRun))
	// Two callers both read "absent", both run; the first write wins and the
	// second adopts it.
	inside := make(chan struct{}, 2)
	proceed := make(chan struct{})
	action := func(id string) func(context.Context) (charge, error) {
		return func(context.Context) (charge, error) {
			inside <- struct{}{}
			<-proceed
			return charge{ID: id}, nil
		}
	}
	var a, b charge
	var wg sync.WaitGroup
	wg.Go(func() { a, _ = coordinator.Do(t.Context(), f.c, call("run"), action("a")) })
	<-inside
	wg.Go(func() { b, _ = coordinator.Do(t.Context(), f.c, call("run"), action("b")) })
	<-inside
	close(proceed)
	wg.Wait()
	if a != b {
		t.Fatalf("a=%+v b=%+v: the loser should adopt the winner's result", a, b)
	}
	if got := f.rec.count(idemevent.Miss, ""); got != 2 {
		t.Fatalf("misses = %d, want 2 (both ran)", got)
	}
	// Later calls replay.
	var k counter
	if v, err := coordinator.Do(t.Context(), f.c, call("run"), k.action("c")); err != nil || v != a || k.n() != 0 {
		t.Fatalf("replay = %+v, %v, runs %d", v, err, k.n())
	}
}

func TestRunModeKeepsOwnResultOverAPendingRecord(t *testing.T) {
	f, s := newMem(t, coordinator.WithInFlight(coordinator.InFlightRun))
	key := idemstore.Key{Operation: "payment.charge", Key: "mixed"}
	s.Put(key, idemstore.Record{State: idemstore.StatePending, Token: "reserving-peer", TTL: time.Minute})
	var k counter
	v, err := coordinator.Do(t.Context(), f.c, call("mixed"), k.action("own"))
	if err != nil || v.ID != "own" || k.n() != 1 {
		t.Fatalf("Do = %+v, %v, runs %d", v, err, k.n())
	}
	if rec := s.Snapshot(key); rec.State != idemstore.StatePending || rec.Token != "reserving-peer" {
		t.Fatalf("the peer's reservation was overwritten: %+v", rec)
	}
	if f.rec.count(idemevent.InFlight, "") != 1 {
		t.Fatal("collision not reported")
	}
}

func TestWaiterTakesOverWhenTheHolderFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, _ := newMem(t, coordinator.WithPollInterval(time.Millisecond))
		release := make(chan struct{})
		boom := errors.New("holder failed")
		done := holder(t, f.c, "takeover", release, charge{}, boom)
		var k counter
		got := make(chan charge, 1)
		go func() {
			v, err := coordinator.Do(t.Context(), f.c, call("takeover"), k.action("waiter"))
			if err != nil {
				t.Error(err)
			}
			got <- v
		}()
		synctest.Wait()
		if n := f.rec.count(idemevent.InFlight, ""); n != 1 {
			t.Fatalf("in-flight events = %d, want 1: the waiter waits", n)
		}
		close(release)
		if err := <-done; err != boom {
			t.Fatalf("holder err = %v", err)
		}
		if v := <-got; v.ID != "waiter" || k.n() != 1 {
			t.Fatalf("waiter got %+v after %d runs; want its own run", v, k.n())
		}
		// The failed holder releases and kicks the loop: the waiter takes
		// over at once.
		wantWaits(t, f.rec, 1, idemevent.WaitTakeover, 0)
	})
}

func TestWaiterTakesOverAnExpiredLease(t *testing.T) {
	// A holder that crashed stops renewing; its lease runs out and the
	// waiter runs.
	synctest.Test(t, func(t *testing.T) {
		f, s := newMem(t, coordinator.WithLease(50*time.Millisecond), coordinator.WithStorageTimeout(testStorageTimeout), coordinator.WithPollInterval(time.Millisecond),
			coordinator.WithWaitTimeout(5*time.Second))
		key := idemstore.Key{Operation: "payment.charge", Key: "crashed"}
		s.Put(key, idemstore.Record{State: idemstore.StatePending, Token: "crashed-holder", TTL: 50 * time.Millisecond})
		var k counter
		v, err := coordinator.Do(t.Context(), f.c, call("crashed"), k.action("waiter"))
		if err != nil || v.ID != "waiter" || k.n() != 1 {
			t.Fatalf("Do = %+v, %v after %d runs", v, err, k.n())
		}
		// Reads at 1, 3, 7, 15 and 31ms find the lease; the read at 63ms,
		// the first after it ran out at 50ms, finds the key free.
		if gets := f.rec.calls(idemevent.MethodGet); gets != 6 {
			t.Fatalf("%d reads, want 6", gets)
		}
		wantWaits(t, f.rec, 1, idemevent.WaitTakeover, 63*time.Millisecond)
	})
}

func TestWaiterPastItsBoundGetsInProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const bound = 50 * time.Millisecond
		f, _ := newMem(t, coordinator.WithWaitTimeout(bound), coordinator.WithPollInterval(time.Millisecond))
		release := make(chan struct{})
		done := holder(t, f.c, "slow", release, charge{ID: "first"}, nil)
		defer func() { close(release); <-done }()
		var k counter
		start := time.Now()
		_, err := coordinator.Do(t.Context(), f.c, call("slow"), k.action("x"))
		var ip *coordinator.InProgressError
		if !errors.As(err, &ip) || k.n() != 0 {
			t.Fatalf("err = %v, runs %d; want ErrInProgress", err, k.n())
		}
		if d := time.Since(start); d != bound {
			t.Fatalf("waited %v, want %v", d, bound)
		}
		// The last read, at 31ms, saw the holder's lease with 31ms gone.
		if want := coordinator.DefaultLease - 31*time.Millisecond; ip.RetryAfter != want {
			t.Fatalf("RetryAfter = %v, want %v", ip.RetryAfter, want)
		}
		wantWaits(t, f.rec, 1, idemevent.WaitTimeout, bound)
	})
}

func TestWaiterNeverWaitsPastItsDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 50 * time.Millisecond
		f, _ := newMem(t) // wait bound: one lease, 30s
		release := make(chan struct{})
		done := holder(t, f.c, "deadline", release, charge{ID: "first"}, nil)
		defer func() { close(release); <-done }()
		ctx, cancel := context.WithTimeout(t.Context(), timeout)
		defer cancel()
		start := time.Now()
		var k counter
		_, err := coordinator.Do(ctx, f.c, call("deadline"), k.action("x"))
		// The caller's deadline is the wait bound: the key is still in
		// progress, which is what the caller needs to hear.
		if !errors.Is(err, coordinator.ErrInProgress) || k.n() != 0 {
			t.Fatalf("err = %v, runs %d; want ErrInProgress", err, k.n())
		}
		if d := time.Since(start); d != timeout {
			t.Fatalf("waited %v, want the %v deadline", d, timeout)
		}
		wantWaits(t, f.rec, 1, idemevent.WaitTimeout, timeout)
	})
}

func TestCancelledWaiterReturnsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, _ := newMem(t)
		release := make(chan struct{})
		done := holder(t, f.c, "cancel", release, charge{ID: "first"}, nil)
		defer func() { close(release); <-done }()
		ctx, cancel := context.WithCancel(t.Context())
		errc := make(chan error, 1)
		var k counter
		go func() {
			_, err := coordinator.Do(ctx, f.c, call("cancel"), k.action("x"))
			errc <- err
		}()
		synctest.Wait()
		if n := f.rec.count(idemevent.InFlight, ""); n != 1 {
			t.Fatalf("in-flight events = %d, want 1: the waiter waits", n)
		}
		start := time.Now()
		cancel()
		select {
		case err := <-errc:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("err = %v, want context.Canceled", err)
			}
			if d := time.Since(start); d != 0 {
				t.Fatalf("returned %v after cancel, want at once", d)
			}
		case <-time.After(time.Second):
			t.Fatal("waiter did not return after cancel")
		}
		wantWaits(t, f.rec, 1, idemevent.WaitCanceled, 0)
	})
}

// Many goroutines, many keys, concurrent calls per key: exactly one effect
// per key, and every caller of a key gets the same result.
func TestOneEffectPerKeyUnderConcurrency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, _ := newMem(t, coordinator.WithPollInterval(time.Millisecond))
		const keys, perKey, workers = 100, 4, 64
		var mu sync.Mutex
		effects := map[string]int{}
		results := map[string][]charge{}
		jobs := make(chan string)
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for key := range jobs {
					v, err := coordinator.Do(t.Context(), f.c, call(key), func(context.Context) (charge, error) {
						mu.Lock()
						effects[key]++
						n := effects[key]
						mu.Unlock()
						<-time.After(time.Millisecond) // on the fake clock: the key's other calls overlap
						return charge{ID: key, Amount: n}, nil
					})
					if err != nil {
						t.Error(err)
					}
					mu.Lock()
					results[key] = append(results[key], v)
					mu.Unlock()
				}
			})
		}
		for i := range perKey * keys {
			jobs <- fmt.Sprintf("key-%d", i/perKey) // a key's calls are adjacent, so they overlap
		}
		close(jobs)
		wg.Wait()
		for i := range keys {
			key := fmt.Sprintf("key-%d", i)
			if effects[key] != 1 {
				t.Errorf("%s: %d effects, want 1", key, effects[key])
			}
			if len(results[key]) != perKey {
				t.Errorf("%s: %d results, want %d", key, len(results[key]), perKey)
			}
			for _, r := range results[key] {
				if r != results[key][0] {
					t.Errorf("%s: results differ: %+v vs %+v", key, r, results[key][0])
				}
			}
		}
	})
}
