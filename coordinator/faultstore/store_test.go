package faultstore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/coordinator/storetest"
)

var key = idemstore.Key{Operation: "op", Key: "k"}

// call makes one call of method on s, on key with token "tok", and returns
// its error.
func call(ctx context.Context, s idemstore.Store, method idemevent.Method) error {
	var err error
	switch method {
	case idemevent.MethodReserve:
		_, _, err = s.Reserve(ctx, key, idemstore.Write{State: idemstore.StatePending, Token: "tok", TTL: time.Minute})
	case idemevent.MethodGet:
		_, err = s.Get(ctx, key)
	case idemevent.MethodComplete:
		_, err = s.Complete(ctx, key, "tok", idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("result"), TTL: time.Hour})
	case idemevent.MethodRelease:
		_, err = s.Release(ctx, key, "tok")
	case idemevent.MethodRenew:
		_, err = s.Renew(ctx, key, "tok", 2*time.Minute)
	case idemevent.MethodReserveMany, idemevent.MethodCompleteMany:
		fs, ok := s.(*faultstore.Store)
		if !ok {
			panic("a bulk method needs a *faultstore.Store")
		}
		return bulkCall(ctx, fs, method)
	default:
		panic("unknown method " + method)
	}
	return err
}

// newStore returns a faultstore over a memstore whose key holds a pending
// record owned by "tok", so that every method would succeed.
func newStore(t *testing.T) (*faultstore.Store, *memstore.Store) {
	t.Helper()
	inner := memstore.New(memstore.WithClock(memstore.NewFakeClock(time.Unix(0, 0)).Now))
	inner.Put(key, idemstore.Record{State: idemstore.StatePending, Token: "tok", TTL: time.Minute})
	return faultstore.Wrap(inner), inner
}

// untouched fails the test unless the inner store still holds the record
// newStore planted.
func untouched(t *testing.T, inner *memstore.Store) {
	t.Helper()
	got := inner.Snapshot(key)
	if got.State != idemstore.StatePending || got.Token != "tok" || got.TTL != time.Minute {
		t.Fatalf("inner record = %+v, want the planted pending record: a failed call reached the inner store", got)
	}
}

func TestConformance(t *testing.T) {
	// With nothing armed, a faultstore is its inner store.
	storetest.TestStore(t, func(t *testing.T) storetest.Harness {
		clock := memstore.NewFakeClock(time.Unix(0, 0))
		inner := memstore.New(memstore.WithClock(clock.Now))
		return storetest.Harness{
			Store:   faultstore.Wrap(inner),
			Advance: clock.Advance,
			Corrupt: func(t *testing.T, key idemstore.Key) {
				inner.Put(key, idemstore.Record{State: idemstore.StateUnreadable})
			},
		}
	})
}

func TestFailAlways(t *testing.T) {
	for _, m := range idemevent.Methods() {
		t.Run(string(m), func(t *testing.T) {
			s, inner := newStore(t)
			s.Fail(m, nil)
			for i := range 3 {
				if err := call(t.Context(), s, m); !errors.Is(err, faultstore.ErrInjected) {
					t.Fatalf("call %d: error %v, want %v", i+1, err, faultstore.ErrInjected)
				}
			}
			untouched(t, inner)
			other := idemevent.MethodGet
			if m == other {
				other = idemevent.MethodRenew
			}
			if err := call(t.Context(), s, other); err != nil {
				t.Fatalf("%s with only %s failing: %v", other, m, err)
			}
			if got := s.Calls(m); got != 3 {
				t.Fatalf("Calls(%s) = %d, want 3", m, got)
			}
		})
	}
}

func TestFailOnce(t *testing.T) {
	for _, m := range idemevent.Methods() {
		t.Run(string(m), func(t *testing.T) {
			s, inner := newStore(t)
			s.FailOnce(m, nil)
			if err := call(t.Context(), s, m); !errors.Is(err, faultstore.ErrInjected) {
				t.Fatalf("first call: error %v, want %v", err, faultstore.ErrInjected)
			}
			untouched(t, inner)
			if err := call(t.Context(), s, m); err != nil {
				t.Fatalf("second call: error %v, want nil", err)
			}
		})
	}
}

func TestFailTimes(t *testing.T) {
	s, inner := newStore(t)
	s.FailTimes(idemevent.MethodRenew, 3, nil)
	for i := range 3 {
		if err := call(t.Context(), s, idemevent.MethodRenew); !errors.Is(err, faultstore.ErrInjected) {
			t.Fatalf("call %d: error %v, want %v", i+1, err, faultstore.ErrInjected)
		}
	}
	untouched(t, inner)
	if err := call(t.Context(), s, idemevent.MethodRenew); err != nil {
		t.Fatalf("call 4: error %v, want nil", err)
	}
	if got := inner.Snapshot(key).TTL; got != 2*time.Minute {
		t.Fatalf("TTL after the passing Renew = %v, want 2m", got)
	}
	if got := s.Calls(idemevent.MethodRenew); got != 4 {
		t.Fatalf("Calls(renew) = %d, want 4", got)
	}
}

func TestFailTimesZeroDisarms(t *testing.T) {
	for _, n := range []int{0, -1} {
		s, _ := newStore(t)
		s.Fail(idemevent.MethodGet, nil)
		s.FailTimes(idemevent.MethodGet, n, nil)
		if err := call(t.Context(), s, idemevent.MethodGet); err != nil {
			t.Fatalf("Get after FailTimes(get, %d): error %v, want nil", n, err)
		}
	}
}

func TestLastArmingWins(t *testing.T) {
	s, _ := newStore(t)
	s.Fail(idemevent.MethodGet, nil)
	s.FailOnce(idemevent.MethodGet, nil)
	if err := call(t.Context(), s, idemevent.MethodGet); err == nil {
		t.Fatal("first Get: error nil, want the FailOnce error")
	}
	if err := call(t.Context(), s, idemevent.MethodGet); err != nil {
		t.Fatalf("second Get: error %v, want nil (FailOnce replaced Fail)", err)
	}
}

func TestChosenError(t *testing.T) {
	s, _ := newStore(t)
	timeout := context.DeadlineExceeded
	s.Fail(idemevent.MethodReserve, timeout)
	err := call(t.Context(), s, idemevent.MethodReserve)
	if err != timeout {
		t.Fatalf("error %v, want exactly %v", err, timeout)
	}
}

func TestBeforeHook(t *testing.T) {
	s, inner := newStore(t)
	var gotKey idemstore.Key
	var gotCtx context.Context
	s.Before(idemevent.MethodComplete, func(ctx context.Context, k idemstore.Key) error {
		gotCtx, gotKey = ctx, k
		// Another caller takes over between reserve and complete: the
		// lease is lost.
		inner.Put(k, idemstore.Record{State: idemstore.StatePending, Token: "someone-else", TTL: time.Minute})
		return nil
	})
	type ctxKey struct{}
	ctx := context.WithValue(t.Context(), ctxKey{}, "marker")
	ok, err := s.Complete(ctx, key, "tok", idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("result"), TTL: time.Hour})
	if err != nil || ok {
		t.Fatalf("Complete after the hook took the key over = %v, %v; want false, nil", ok, err)
	}
	if gotKey != key {
		t.Fatalf("hook got key %v, want %v", gotKey, key)
	}
	if gotCtx == nil || gotCtx.Value(ctxKey{}) != "marker" {
		t.Fatal("hook did not get the call's context")
	}

	s.Before(idemevent.MethodComplete, nil)
	inner.Put(key, idemstore.Record{State: idemstore.StatePending, Token: "tok", TTL: time.Minute})
	if ok, err := s.Complete(t.Context(), key, "tok", idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("result"), TTL: time.Hour}); err != nil || !ok {
		t.Fatalf("Complete after the hook was removed = %v, %v; want true, nil", ok, err)
	}
}

func TestBeforeHookError(t *testing.T) {
	s, inner := newStore(t)
	hookErr := errors.New("connection reset")
	s.Before(idemevent.MethodRelease, func(context.Context, idemstore.Key) error { return hookErr })
	s.FailOnce(idemevent.MethodRelease, nil)
	if err := call(t.Context(), s, idemevent.MethodRelease); err != hookErr {
		t.Fatalf("error %v, want the hook's %v", err, hookErr)
	}
	untouched(t, inner)

	// The hook's failure did not use up the armed one.
	s.Before(idemevent.MethodRelease, nil)
	if err := call(t.Context(), s, idemevent.MethodRelease); !errors.Is(err, faultstore.ErrInjected) {
		t.Fatalf("error after the hook was removed: %v, want %v", err, faultstore.ErrInjected)
	}
}

func TestBeforeHookHangsUntilDeadline(t *testing.T) {
	// A store that hangs until the caller gives up, like a stuck Redis. On
	// a synctest bubble's fake clock the call lasts exactly the timeout.
	synctest.Test(t, func(t *testing.T) {
		const timeout = 10 * time.Millisecond
		s, inner := newStore(t)
		s.Before(idemevent.MethodGet, func(ctx context.Context, _ idemstore.Key) error {
			<-ctx.Done()
			return ctx.Err()
		})
		ctx, cancel := context.WithTimeout(t.Context(), timeout)
		defer cancel()
		start := time.Now()
		if err := call(ctx, s, idemevent.MethodGet); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("error %v, want %v", err, context.DeadlineExceeded)
		}
		if d := time.Since(start); d != timeout {
			t.Fatalf("the hung call returned after %v, want %v: at the deadline", d, timeout)
		}
		untouched(t, inner)
	})
}

func TestHookMayCallTheStore(t *testing.T) {
	// Hooks run without the Store's lock held.
	s, _ := newStore(t)
	s.Before(idemevent.MethodGet, func(ctx context.Context, k idemstore.Key) error {
		s.FailOnce(idemevent.MethodRenew, nil)
		_ = s.Calls(idemevent.MethodGet)
		_, err := s.Renew(ctx, k, "tok", time.Minute)
		return err
	})
	if err := call(t.Context(), s, idemevent.MethodGet); !errors.Is(err, faultstore.ErrInjected) {
		t.Fatalf("error %v, want the nested Renew's %v", err, faultstore.ErrInjected)
	}
}

func TestReset(t *testing.T) {
	s, _ := newStore(t)
	for _, m := range idemevent.Methods() {
		s.Fail(m, nil)
		s.Before(m, func(context.Context, idemstore.Key) error { return errors.New("hook") })
		_ = call(t.Context(), s, m)
	}
	s.Reset()
	for _, m := range idemevent.Methods() {
		if got := s.Calls(m); got != 0 {
			t.Errorf("Calls(%s) after Reset = %d, want 0", m, got)
		}
		if m == idemevent.MethodRelease {
			continue // would delete the record the others need
		}
		if err := call(t.Context(), s, m); err != nil {
			t.Errorf("%s after Reset: %v", m, err)
		}
	}
}

func TestCallsCountsEveryMethod(t *testing.T) {
	s, _ := newStore(t)
	for i, m := range idemevent.Methods() {
		for range i + 1 {
			_ = call(t.Context(), s, m)
		}
	}
	for i, m := range idemevent.Methods() {
		if got := s.Calls(m); got != i+1 {
			t.Errorf("Calls(%s) = %d, want %d", m, got, i+1)
		}
	}
}

func TestFailTimesConcurrent(t *testing.T) {
	const goroutines, n = 64, 10
	s, _ := newStore(t)
	s.FailTimes(idemevent.MethodGet, n, nil)
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed int
	)
	for range goroutines {
		wg.Go(func() {
			if err := call(t.Context(), s, idemevent.MethodGet); err != nil {
				mu.Lock()
				failed++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if failed != n {
		t.Fatalf("%d concurrent Gets with %d failures armed: %d failed, want %d", goroutines, n, failed, n)
	}
	if got := s.Calls(idemevent.MethodGet); got != goroutines {
		t.Fatalf("Calls(get) = %d, want %d", got, goroutines)
	}
}

func TestLoseReplies(t *testing.T) {
	ctx := t.Context()
	inner := memstore.New()
	s := faultstore.Wrap(inner)
	s.LoseReplies(idemevent.MethodReserve, 1, nil)
	s.LoseReplies(idemevent.MethodComplete, 2, context.DeadlineExceeded)

	// The reservation is made, but the caller is told it failed.
	_, ok, err := s.Reserve(ctx, key, idemstore.Write{State: idemstore.StatePending, Token: "tok", TTL: time.Minute})
	if !errors.Is(err, faultstore.ErrInjected) || ok {
		t.Fatalf("Reserve with its reply lost = %v, %v; want false, %v", ok, err, faultstore.ErrInjected)
	}
	if got := inner.Snapshot(key); got.State != idemstore.StatePending || got.Token != "tok" {
		t.Fatalf("inner record after a lost Reserve reply = %+v, want pending, owned by tok", got)
	}

	// The result is stored; both replies are lost, the third passes.
	for i := range 2 {
		ok, err := s.Complete(ctx, key, "tok", idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("result"), TTL: time.Hour})
		if err != context.DeadlineExceeded || ok {
			t.Fatalf("Complete %d with its reply lost = %v, %v; want false, %v", i+1, ok, err, context.DeadlineExceeded)
		}
	}
	if got := inner.Snapshot(key); got.State != idemstore.StateCompleted || string(got.Result) != "result" {
		t.Fatalf("inner record after a lost Complete reply = %+v, want completed", got)
	}
	if ok, err := s.Complete(ctx, key, "tok", idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("again"), TTL: time.Hour}); err != nil || ok {
		t.Fatalf("third Complete = %v, %v; want the inner store's answer false, nil", ok, err)
	}
	if got := s.Calls(idemevent.MethodComplete); got != 3 {
		t.Fatalf("Calls(complete) = %d, want 3", got)
	}
}

func TestLoseRepliesStepIsDone(t *testing.T) {
	for _, m := range []idemevent.Method{idemevent.MethodComplete, idemevent.MethodRelease, idemevent.MethodRenew} {
		t.Run(string(m), func(t *testing.T) {
			s, inner := newStore(t)
			s.LoseReplies(m, 1, nil)
			if err := call(t.Context(), s, m); !errors.Is(err, faultstore.ErrInjected) {
				t.Fatalf("error %v, want %v", err, faultstore.ErrInjected)
			}
			got := inner.Snapshot(key)
			var reached bool
			switch m {
			case idemevent.MethodComplete:
				reached = got.State == idemstore.StateCompleted
			case idemevent.MethodRelease:
				reached = got.State == idemstore.StateAbsent
			case idemevent.MethodRenew:
				reached = got.TTL == 2*time.Minute
			}
			if !reached {
				t.Fatalf("inner record after a lost %s reply = %+v: the call did not reach the inner store", m, got)
			}
			if err := call(t.Context(), s, idemevent.MethodGet); err != nil {
				t.Fatalf("Get after the lost reply: %v", err)
			}
		})
	}
}
