package coordinator_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
)

// ctxStore is a memstore that keeps the context of every Reserve and, when
// hang is set, answers only when that context ends.
type ctxStore struct {
	*memstore.Store
	hang bool

	mu   sync.Mutex
	ctxs []context.Context
}

func (s *ctxStore) Reserve(ctx context.Context, key idemstore.Key, w idemstore.Write) (idemstore.Record, bool, error) {
	s.mu.Lock()
	s.ctxs = append(s.ctxs, ctx)
	s.mu.Unlock()
	if s.hang {
		<-ctx.Done()
		return idemstore.Record{}, false, &coordinator.StorageError{Method: idemevent.MethodReserve, Err: ctx.Err()}
	}
	return s.Store.Reserve(ctx, key, w)
}

func (s *ctxStore) last() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ctxs[len(s.ctxs)-1]
}

type ctxKey struct{}

// A store call under a context that cannot end is still bounded by the
// storage timeout, keeps the context's values, and ends with
// context.DeadlineExceeded exactly when the timeout passes.
func TestStorageTimeoutBoundsCallsUnderContextsThatCannotEnd(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	cancel()
	parents := map[string]context.Context{
		"Background":    context.Background(),
		"TODO":          context.TODO(),
		"WithValue":     context.WithValue(context.Background(), ctxKey{}, "v"),
		"WithoutCancel": context.WithoutCancel(cancelled),
	}
	for name, parent := range parents {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := &ctxStore{Store: memstore.New(), hang: true}
				c, err := coordinator.New(store, coordinator.WithStorageTimeout(250*time.Millisecond), coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise))
				if err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				_, err = coordinator.Do(parent, c, coordinator.Call{Operation: "op", Key: "k"}, neverCalled(t))
				if took := time.Since(start); took != 250*time.Millisecond {
					t.Errorf("the call took %v, want the storage timeout, 250ms", took)
				}
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("err = %v, want context.DeadlineExceeded", err)
				}
				sctx := store.last()
				if d, ok := sctx.Deadline(); !ok || !d.Equal(start.Add(250*time.Millisecond)) {
					t.Errorf("the store call's deadline is %v, %v; want %v", d, ok, start.Add(250*time.Millisecond))
				}
				if !errors.Is(sctx.Err(), context.DeadlineExceeded) {
					t.Errorf("after the call, its context's Err is %v, want context.DeadlineExceeded", sctx.Err())
				}
				if got, want := sctx.Value(ctxKey{}), parent.Value(ctxKey{}); got != want {
					t.Errorf("the store call's context has value %v, want the caller's %v", got, want)
				}
				_ = c.Close()
			})
		})
	}
}

// The calls that start within one tick (a thousandth of the storage
// timeout, at least 1ms) share one deadline, rounded up to the tick, and
// never end before the storage timeout.
func TestStorageDeadlinesAreSharedWithinATick(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &ctxStore{Store: memstore.New()}
		c, err := coordinator.New(store, coordinator.WithStorageTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx := context.WithValue(context.Background(), ctxKey{}, "v")
		start := time.Now() // synctest's clock starts on a whole second
		var ctxs []context.Context
		for i, after := range []time.Duration{300 * time.Microsecond, 600 * time.Microsecond, 1300 * time.Microsecond} {
			time.Sleep(time.Until(start.Add(after)))
			if _, err := coordinator.Do(ctx, c, coordinator.Call{Operation: "op", Key: string(rune('a' + i))}, func(context.Context) (int, error) { return 1, nil }); err != nil {
				t.Fatal(err)
			}
			ctxs = append(ctxs, store.last())
		}
		want := []time.Time{start.Add(time.Second + time.Millisecond), start.Add(time.Second + time.Millisecond), start.Add(time.Second + 2*time.Millisecond)}
		for i, sctx := range ctxs {
			if d, _ := sctx.Deadline(); !d.Equal(want[i]) {
				t.Errorf("call %d: deadline start+%v, want start+%v", i, d.Sub(start), want[i].Sub(start))
			}
		}
		if ctxs[0].Done() != ctxs[1].Done() {
			t.Error("two calls in the same tick have deadlines of their own, want one shared")
		}
		if ctxs[1].Done() == ctxs[2].Done() {
			t.Error("calls in different ticks share a deadline")
		}
		time.Sleep(time.Until(start.Add(time.Second+time.Millisecond)) - time.Nanosecond)
		if ctxs[0].Err() != nil {
			t.Errorf("1ns before the shared deadline, Err = %v, want nil", ctxs[0].Err())
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		if !errors.Is(ctxs[0].Err(), context.DeadlineExceeded) || ctxs[2].Err() != nil {
			t.Errorf("at the first deadline, Err = %v and %v, want DeadlineExceeded and nil", ctxs[0].Err(), ctxs[2].Err())
		}
	})
}

// Under a context that can be cancelled, a store call still ends when that
// context does, not at the storage timeout.
func TestStorageCallEndsWithACancelledCaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &ctxStore{Store: memstore.New(), hang: true}
		c, err := coordinator.New(store, coordinator.WithStorageTimeout(time.Second), coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
		time.AfterFunc(10*time.Millisecond, cancel)
		start := time.Now()
		_, err = coordinator.Do(ctx, c, coordinator.Call{Operation: "op", Key: "k"}, neverCalled(t))
		if took := time.Since(start); took != 10*time.Millisecond {
			t.Errorf("the call took %v, want 10ms (until the caller's context was cancelled)", took)
		}
		if !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want context.Canceled", err)
		}
		if d, ok := store.last().Deadline(); !ok || !d.Equal(start.Add(time.Second)) {
			t.Errorf("deadline %v, %v; want start+1s", d, ok)
		}
		_ = c.Close()
	})
}

func neverCalled(t *testing.T) func(context.Context) (int, error) {
	return func(context.Context) (int, error) {
		t.Error("the action ran")
		return 0, nil
	}
}

// Under many concurrent callers on the real clock, every store call's shared
// deadline is at least the storage timeout after the call began and less
// than a tick more after the store saw it: sharing never shortens a call's
// timeout, whatever order the callers' clock readings arrive in.
func TestSharedDeadlinesNeverShortenTheTimeout(t *testing.T) {
	const timeout, tick = time.Second, time.Millisecond
	store := &timedStore{Store: memstore.New()}
	c, err := coordinator.New(store, coordinator.WithStorageTimeout(timeout))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				key := strconv.Itoa(g) + "-" + strconv.Itoa(i)
				before := time.Now()
				if _, err := coordinator.Do(context.Background(), c, coordinator.Call{Operation: "op", Key: key}, func(context.Context) (int, error) { return 1, nil }); err != nil {
					t.Error(err)
					return
				}
				seen := store.take(key)
				if d := seen.deadline.Sub(before); d < timeout {
					t.Errorf("a call's deadline is %v after it began, want at least the storage timeout, %v", d, timeout)
					return
				}
				if d := seen.deadline.Sub(seen.at); d >= timeout+tick {
					t.Errorf("a call's deadline is %v after the store saw it, want less than %v", d, timeout+tick)
					return
				}
			}
		})
	}
	wg.Wait()
}

// timedStore is a memstore that keeps, per key, when its Reserve came and
// the deadline of its context.
type timedStore struct {
	*memstore.Store
	mu   sync.Mutex
	seen map[string]timedCall
}

type timedCall struct{ at, deadline time.Time }

func (s *timedStore) Reserve(ctx context.Context, key idemstore.Key, w idemstore.Write) (idemstore.Record, bool, error) {
	at := time.Now()
	d, _ := ctx.Deadline()
	s.mu.Lock()
	if s.seen == nil {
		s.seen = map[string]timedCall{}
	}
	s.seen[key.Key] = timedCall{at: at, deadline: d}
	s.mu.Unlock()
	return s.Store.Reserve(ctx, key, w)
}

func (s *timedStore) take(id string) timedCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	tc := s.seen[id]
	delete(s.seen, id)
	return tc
}
