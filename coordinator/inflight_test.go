package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

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
	eventually(t, time.Second, func() bool { return f.rec.count(coordinator.EventInFlight, "") == 3 }, "three waiters")
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
	if got := f.rec.count(coordinator.EventWaited, ""); got != 3 {
		t.Fatalf("waited events = %d, want 3", got)
	}
}

func TestWaitersShareOnePollLoop(t *testing.T) {
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
	eventually(t, time.Second, func() bool { return f.rec.count(coordinator.EventInFlight, "") == 20 }, "twenty waiters")
	time.Sleep(100 * time.Millisecond)
	gets := 0
	for _, e := range f.rec.all() {
		if e.Kind == coordinator.EventStorageCall && e.Method == coordinator.MethodGet {
			gets++
		}
	}
	// One loop backing off from 5ms reads ~5 times in 100ms; twenty loops
	// would read ~100 times or more.
	if gets > 10 {
		t.Fatalf("%d reads in 100ms by 20 waiters, want one shared backing-off loop", gets)
	}
	close(release)
	wg.Wait()
	if err := <-done; err != nil || k.n() != 0 {
		t.Fatalf("holder err=%v, waiter runs=%d", err, k.n())
	}
}

func TestRaiseModeRefusesAtOnce(t *testing.T) {
	f, _ := newMem(t, coordinator.WithInFlight(coordinator.InFlightRaise))
	release := make(chan struct{})
	done := holder(t, f.c, "r", release, charge{ID: "first"}, nil)
	var k counter
	start := time.Now()
	_, err := coordinator.Do(t.Context(), f.c, call("r"), k.action("x"))
	var ip *coordinator.InProgressError
	if !errors.Is(err, coordinator.ErrInProgress) || !errors.As(err, &ip) || ip.RetryAfter <= 0 {
		t.Fatalf("err = %v, want *InProgressError with RetryAfter", err)
	}
	if time.Since(start) > 100*time.Millisecond || k.n() != 0 {
		t.Fatalf("took %v and ran %d times", time.Since(start), k.n())
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if v, err := coordinator.Do(t.Context(), f.c, call("r"), k.action("x")); err != nil || v.ID != "first" {
		t.Fatalf("after completion: %+v, %v", v, err)
	}
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
	if got := f.rec.count(coordinator.EventMiss, ""); got != 2 {
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
	key := coordinator.Key{Operation: "payment.charge", Key: "mixed"}
	s.Put(key, coordinator.Record{State: coordinator.StatePending, Token: "reserving-peer", TTL: time.Minute})
	var k counter
	v, err := coordinator.Do(t.Context(), f.c, call("mixed"), k.action("own"))
	if err != nil || v.ID != "own" || k.n() != 1 {
		t.Fatalf("Do = %+v, %v, runs %d", v, err, k.n())
	}
	if rec := s.Snapshot(key); rec.State != coordinator.StatePending || rec.Token != "reserving-peer" {
		t.Fatalf("the peer's reservation was overwritten: %+v", rec)
	}
	if f.rec.count(coordinator.EventInFlight, "") != 1 {
		t.Fatal("collision not reported")
	}
}

func TestWaiterTakesOverWhenTheHolderFails(t *testing.T) {
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
	eventually(t, time.Second, func() bool { return f.rec.count(coordinator.EventInFlight, "") == 1 }, "the waiter waits")
	close(release)
	if err := <-done; err != boom {
		t.Fatalf("holder err = %v", err)
	}
	if v := <-got; v.ID != "waiter" || k.n() != 1 {
		t.Fatalf("waiter got %+v after %d runs; want its own run", v, k.n())
	}
	outcomes := map[coordinator.WaitOutcome]int{}
	for _, e := range f.rec.all() {
		if e.Kind == coordinator.EventWaited {
			outcomes[e.Outcome]++
		}
	}
	if outcomes[coordinator.WaitTakeover] != 1 {
		t.Fatalf("wait outcomes = %v, want one takeover", outcomes)
	}
}

func TestWaiterTakesOverAnExpiredLease(t *testing.T) {
	// A holder that crashed stops renewing; its lease runs out and the
	// waiter runs.
	f, s := newMem(t, coordinator.WithLease(50*time.Millisecond), coordinator.WithPollInterval(time.Millisecond),
		coordinator.WithWaitTimeout(5*time.Second))
	key := coordinator.Key{Operation: "payment.charge", Key: "crashed"}
	s.Put(key, coordinator.Record{State: coordinator.StatePending, Token: "crashed-holder", TTL: 50 * time.Millisecond})
	var k counter
	v, err := coordinator.Do(t.Context(), f.c, call("crashed"), k.action("waiter"))
	if err != nil || v.ID != "waiter" || k.n() != 1 {
		t.Fatalf("Do = %+v, %v after %d runs", v, err, k.n())
	}
}

func TestWaiterPastItsBoundGetsInProgress(t *testing.T) {
	f, _ := newMem(t, coordinator.WithWaitTimeout(50*time.Millisecond), coordinator.WithPollInterval(time.Millisecond))
	release := make(chan struct{})
	done := holder(t, f.c, "slow", release, charge{ID: "first"}, nil)
	defer func() { close(release); <-done }()
	var k counter
	start := time.Now()
	_, err := coordinator.Do(t.Context(), f.c, call("slow"), k.action("x"))
	if !errors.Is(err, coordinator.ErrInProgress) || k.n() != 0 {
		t.Fatalf("err = %v, runs %d; want ErrInProgress", err, k.n())
	}
	if d := time.Since(start); d < 50*time.Millisecond || d > time.Second {
		t.Fatalf("waited %v, want about 50ms", d)
	}
}

func TestWaiterNeverWaitsPastItsDeadline(t *testing.T) {
	f, _ := newMem(t) // wait bound: one lease, 30s
	release := make(chan struct{})
	done := holder(t, f.c, "deadline", release, charge{ID: "first"}, nil)
	defer func() { close(release); <-done }()
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	var k counter
	_, err := coordinator.Do(ctx, f.c, call("deadline"), k.action("x"))
	if !errors.Is(err, coordinator.ErrInProgress) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("waited %v past a 50ms deadline", d)
	}
}

func TestCancelledWaiterReturnsAtOnce(t *testing.T) {
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
	eventually(t, time.Second, func() bool { return f.rec.count(coordinator.EventInFlight, "") == 1 }, "the waiter waits")
	start := time.Now()
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if d := time.Since(start); d > 50*time.Millisecond {
			t.Fatalf("returned %v after cancel", d)
		}
	case <-time.After(time.Second):
		t.Fatal("waiter did not return after cancel")
	}
}

// Many goroutines, many keys, concurrent calls per key: exactly one effect
// per key, and every caller of a key gets the same result.
func TestOneEffectPerKeyUnderConcurrency(t *testing.T) {
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
					time.Sleep(time.Millisecond)
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
}
