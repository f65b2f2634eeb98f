package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/coordinator/memstore"
)

// calls returns a batch of calls of keys.
func calls(keys ...string) []coordinator.Call {
	cs := make([]coordinator.Call, len(keys))
	for i, k := range keys {
		cs[i] = call(k)
	}
	return cs
}

// batchAction counts the runs of each call's action and returns the key.
type batchAction struct {
	mu   sync.Mutex
	runs map[string]int
	cs   []coordinator.Call
	fail map[string]error
}

func newBatchAction(cs []coordinator.Call) *batchAction {
	return &batchAction{runs: map[string]int{}, cs: cs, fail: map[string]error{}}
}

func (a *batchAction) run(_ context.Context, i int) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := a.cs[i].Key
	a.runs[k]++
	return "result of " + k, a.fail[k]
}

func TestDoBatchOneRoundTripEach(t *testing.T) {
	fs := faultstore.Wrap(memstore.New())
	fx := newFixture(t, fs)
	cs := calls("a", "b", "c", "d", "e")
	act := newBatchAction(cs)
	res, errs := coordinator.DoBatch(t.Context(), fx.c, cs, act.run)
	for i, c := range cs {
		if errs[i] != nil || res[i].Replayed || res[i].Value != "result of "+c.Key || act.runs[c.Key] != 1 {
			t.Errorf("call %d: %+v, %v, %d runs; want its own result, run once", i, res[i], errs[i], act.runs[c.Key])
		}
	}
	// The completions: the first result is sent at once, and those that
	// are ready while it is in flight go in the next CompleteMany.
	completions := fs.Calls(idemevent.MethodCompleteMany)
	if r := fs.Calls(idemevent.MethodReserveMany); r != 1 || completions < 1 || completions > 5 || fs.Calls(idemevent.MethodReserve)+fs.Calls(idemevent.MethodComplete) != 0 {
		t.Errorf("store calls: %d reserve_many, %d complete_many, %d reserve, %d complete; want one ReserveMany and 1 to 5 CompleteMany",
			r, completions, fs.Calls(idemevent.MethodReserve), fs.Calls(idemevent.MethodComplete))
	}
	if n := fx.rec.calls(idemevent.MethodReserveMany); n != 1 {
		t.Errorf("%d reserve_many storage call events, want 1", n)
	}
	if n := fx.rec.count(idemevent.Miss, ""); n != 5 {
		t.Errorf("%d miss events, want 5", n)
	}
	if n := fx.rec.count(idemevent.Stored, ""); n != 5 {
		t.Errorf("%d stored events, want 5", n)
	}
	wantBulk(t, fx.rec, 0, 5)

	// Again: every key replays, in one ReserveMany and no completion.
	res, errs = coordinator.DoBatch(t.Context(), fx.c, cs, act.run)
	for i, c := range cs {
		if errs[i] != nil || !res[i].Replayed || res[i].Value != "result of "+c.Key || act.runs[c.Key] != 1 {
			t.Errorf("replayed call %d: %+v, %v, %d runs; want the stored result", i, res[i], errs[i], act.runs[c.Key])
		}
	}
	if r, c := fs.Calls(idemevent.MethodReserveMany), fs.Calls(idemevent.MethodCompleteMany); r != 2 || c != completions {
		t.Errorf("store calls after the replay: %d reserve, %d complete; want 2 and 1", r, c)
	}
	wantBulk(t, fx.rec, 5, 5)
}

// wantBulk fails the test unless the bulk events counted hits and misses.
func wantBulk(t *testing.T, rec *recorder, hits, misses int) {
	t.Helper()
	var h, m int
	for _, e := range rec.all() {
		switch e.Kind {
		case idemevent.BulkHit:
			h += e.Count
		case idemevent.BulkMiss:
			m += e.Count
		}
	}
	if h != hits || m != misses {
		t.Errorf("bulk events counted %d hits and %d misses, want %d and %d", h, m, hits, misses)
	}
}

// TestDoBatchGroupsCompletions holds the first completion in flight while
// the other actions end: they all go in the second CompleteMany.
func TestDoBatchGroupsCompletions(t *testing.T) {
	fs := faultstore.Wrap(memstore.New())
	fx := newFixture(t, fs)
	release, sentA := make(chan struct{}), make(chan struct{})
	var sizes []int
	var mu sync.Mutex
	fs.Before(idemevent.MethodCompleteMany, func(ctx context.Context, k idemstore.Key) error {
		mu.Lock()
		defer mu.Unlock()
		// The call is counted before its hook runs for each of its keys.
		for len(sizes) < fs.Calls(idemevent.MethodCompleteMany) {
			sizes = append(sizes, 0)
		}
		sizes[len(sizes)-1]++
		if k.Key == "a" {
			close(sentA)
			<-release
		}
		return nil
	})
	cs := calls("a", "b", "c", "d")
	res, errs := coordinator.DoBatch(t.Context(), fx.c, cs, func(_ context.Context, i int) (string, error) {
		switch i {
		case 1:
			<-sentA // the first completion is on its way
		case len(cs) - 1:
			close(release) // the last action ends: let the first completion return
		}
		return cs[i].Key, nil
	})
	for i := range cs {
		if errs[i] != nil || res[i].Value != cs[i].Key {
			t.Fatalf("call %d: %+v, %v", i, res[i], errs[i])
		}
	}
	if fmt.Sprint(sizes) != "[1 3]" {
		t.Errorf("CompleteMany sizes %v, want [1 3]: the first alone, the rest together", sizes)
	}
}

func TestDoBatchMixed(t *testing.T) {
	fx, s := newMem(t, coordinator.WithInFlight(coordinator.InFlightRaise))
	done := idemstore.Key{Operation: "payment.charge", Key: "done"}
	s.Put(done, idemstore.Record{State: idemstore.StateCompleted, Token: "t", Result: []byte(`"stored"`), TTL: time.Hour})
	s.Put(idemstore.Key{Operation: "payment.charge", Key: "held"}, idemstore.Record{State: idemstore.StatePending, Token: "other", TTL: time.Hour})
	s.Put(idemstore.Key{Operation: "payment.charge", Key: "reused"}, idemstore.Record{State: idemstore.StateCompleted, Token: "t", Fingerprint: "fp-old", Result: []byte(`"x"`), TTL: time.Hour})
	s.Put(idemstore.Key{Operation: "payment.charge", Key: "gone"}, idemstore.Record{State: idemstore.StateNotReplayable, Token: "t", Result: []byte("too big"), TTL: time.Hour})
	s.Put(idemstore.Key{Operation: "payment.charge", Key: "bad"}, idemstore.Record{State: idemstore.StateUnreadable, TTL: time.Hour})
	cs := calls("new", "done", "held", "reused", "gone", "bad", "", "new", "fails")
	cs[3].Fingerprint = "fp-new"
	act := newBatchAction(cs)
	boom := errors.New("boom")
	act.fail["fails"] = boom
	res, errs := coordinator.DoBatch(t.Context(), fx.c, cs, act.run)

	want := []struct {
		value    string
		replayed bool
		err      error
	}{
		{"result of new", false, nil},
		{"stored", true, nil},
		{"", false, coordinator.ErrInProgress},
		{"", false, coordinator.ErrKeyReuse},
		{"", false, coordinator.ErrNotReplayable},
		{"result of bad", false, nil}, // healed: run
		{"", false, coordinator.ErrInvalidRequest},
		{"result of new", true, nil}, // the same key again: replayed
		{"result of fails", false, boom},
	}
	for i, w := range want {
		if res[i].Value != w.value || res[i].Replayed != w.replayed || !errors.Is(errs[i], w.err) || (w.err == nil) != (errs[i] == nil) {
			t.Errorf("call %d (%q): %+v, %v; want %+v", i, cs[i].Key, res[i], errs[i], w)
		}
	}
	for k, n := range map[string]int{"new": 1, "bad": 1, "fails": 1, "done": 0, "held": 0, "reused": 0, "gone": 0} {
		if act.runs[k] != n {
			t.Errorf("%q ran %d times, want %d", k, act.runs[k], n)
		}
	}
	if rec := s.Snapshot(idemstore.Key{Operation: "payment.charge", Key: "fails"}); rec.State != idemstore.StateAbsent {
		t.Errorf("the key whose action failed holds %v, want it released", rec.State)
	}
	if rec := s.Snapshot(idemstore.Key{Operation: "payment.charge", Key: "new"}); rec.State != idemstore.StateCompleted {
		t.Errorf("the new key holds %v, want completed", rec.State)
	}
	// Replays: "done", and "new" a second time; misses: new and fails
	// under the batch's reservations ("bad" is healed by its own call).
	wantBulk(t, fx.rec, 1, 2)
}

func TestDoBatchWaitsForAHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fx, s := newMem(t, coordinator.WithInFlight(coordinator.InFlightWait))
		held := idemstore.Key{Operation: "payment.charge", Key: "held"}
		s.Put(held, idemstore.Record{State: idemstore.StatePending, Token: "other", TTL: time.Hour})
		go func() {
			time.Sleep(3 * time.Second)
			if ok, err := s.Complete(context.Background(), held, "other", idemstore.Completion{State: idemstore.StateCompleted, Result: []byte(`"theirs"`), TTL: time.Hour}); !ok || err != nil {
				panic(fmt.Sprint("complete: ", ok, err))
			}
		}()
		cs := calls("a", "held", "b")
		act := newBatchAction(cs)
		res, errs := coordinator.DoBatch(t.Context(), fx.c, cs, act.run)
		if errs[1] != nil || res[1].Value != "theirs" || !res[1].Replayed {
			t.Errorf("the held key: %+v, %v; want the holder's result", res[1], errs[1])
		}
		for _, i := range []int{0, 2} {
			if errs[i] != nil || res[i].Value != "result of "+cs[i].Key {
				t.Errorf("call %d: %+v, %v", i, res[i], errs[i])
			}
		}
		// memstore has no Watch: the wait polls, and ends at the first
		// poll after the completion.
		if w := fx.rec.waits(); len(w) != 1 || w[0].Outcome != idemevent.WaitHit || w[0].Duration < 3*time.Second {
			t.Errorf("waits %+v, want one that ended with a hit after 3s or more", w)
		}
	})
}

// A key another caller held at the batch's read, and finished while an
// earlier action of the batch ran, is decided on what the store says at
// its turn: a replay in mode raise too, as Do at that moment would answer,
// not the InProgressError of the batch's read. (Mode run takes the calls
// one by one.)
func TestDoBatchReadsAHeldKeyAgainAtItsTurn(t *testing.T) {
	for _, mode := range []coordinator.InFlightMode{coordinator.InFlightRaise, coordinator.InFlightWait} {
		t.Run(string(mode), func(t *testing.T) {
			fx, s := newMem(t, coordinator.WithInFlight(mode))
			held := idemstore.Key{Operation: "payment.charge", Key: "held"}
			s.Put(held, idemstore.Record{State: idemstore.StatePending, Token: "other", TTL: time.Hour})
			cs := calls("a", "held")
			var runs [2]atomic.Int64
			res, errs := coordinator.DoBatch(t.Context(), fx.c, cs, func(_ context.Context, i int) (string, error) {
				runs[i].Add(1)
				if i == 0 {
					if ok, err := s.Complete(context.Background(), held, "other", idemstore.Completion{State: idemstore.StateCompleted, Result: []byte(`"theirs"`), TTL: time.Hour}); !ok || err != nil {
						return "", fmt.Errorf("complete: %v, %v", ok, err)
					}
				}
				return "mine", nil
			})
			if errs[0] != nil {
				t.Fatalf("a: %v", errs[0])
			}
			if errs[1] != nil || !res[1].Replayed || res[1].Value != "theirs" || runs[1].Load() != 0 {
				t.Errorf("the held key: %+v, %v, %d runs; want the holder's result replayed", res[1], errs[1], runs[1].Load())
			}
		})
	}
}

func TestDoBatchKeepsLeasesWhileItRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lease := 3 * time.Second
		fx, s := newMem(t, coordinator.WithLease(lease))
		cs := calls("slow", "next")
		res, errs := coordinator.DoBatch(t.Context(), fx.c, cs, func(ctx context.Context, i int) (string, error) {
			if i == 0 {
				time.Sleep(4 * lease) // the second key's lease would have run out
			}
			if ctx.Err() != nil {
				return "", context.Cause(ctx)
			}
			return cs[i].Key, nil
		})
		for i := range cs {
			if errs[i] != nil || res[i].Value != cs[i].Key {
				t.Fatalf("call %d: %+v, %v", i, res[i], errs[i])
			}
			if rec := s.Snapshot(idemstore.Key{Operation: "payment.charge", Key: cs[i].Key}); rec.State != idemstore.StateCompleted {
				t.Errorf("key %q holds %v, want completed", cs[i].Key, rec.State)
			}
		}
		if n := fx.rec.errors(idemevent.ErrorLeaseLost); n != 0 {
			t.Errorf("%d lease_lost errors, want none", n)
		}
		if n := fx.rec.calls(idemevent.MethodRenew); n < 2*4 {
			t.Errorf("%d renewals, want both leases renewed through the slow action", n)
		}
	})
}

// An entry whose lease is lost, or whose watchdog fires, while it waits
// for its turn does not start its action on that reservation: it reserves
// again, and so meets the caller that took the key over (and, when the
// lease only may have run out, runs on a new reservation).
func TestDoBatchEntryLosesItsLeaseBeforeItsTurn(t *testing.T) {
	b := idemstore.Key{Operation: "payment.charge", Key: "b"}
	t.Run("taken over", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			lease := 3 * time.Second
			fx, s := newMem(t, coordinator.WithLease(lease), coordinator.WithInFlight(coordinator.InFlightRaise))
			var runs [2]atomic.Int64
			_, errs := coordinator.DoBatch(t.Context(), fx.c, calls("slow", "b"), func(_ context.Context, i int) (string, error) {
				runs[i].Add(1)
				if i == 0 {
					// b's record goes, its renewal finds it gone, and
					// another caller takes the key.
					if _, err := s.DeleteMany(context.Background(), []idemstore.Key{b}); err != nil {
						return "", err
					}
					time.Sleep(2 * lease)
					if _, _, err := s.Reserve(context.Background(), b, idemstore.Write{State: idemstore.StatePending, Token: "other", TTL: time.Hour}); err != nil {
						return "", err
					}
				}
				return "done", nil
			})
			if errs[0] != nil {
				t.Fatalf("slow: %v", errs[0])
			}
			if n := runs[1].Load(); n != 0 {
				t.Errorf("b's action ran %d times on a lost lease, want 0", n)
			}
			if ip := (*coordinator.InProgressError)(nil); !errors.As(errs[1], &ip) {
				t.Errorf("b: %v, want the other caller's key in progress", errs[1])
			}
			if rec := s.Snapshot(b); rec.State != idemstore.StatePending || rec.Token != "other" {
				t.Errorf("b holds %+v, want the other caller's reservation", rec)
			}
		})
	})
	t.Run("watchdog", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			lease := 3 * time.Second
			fs := faultstore.Wrap(memstore.New())
			fx := newFixture(t, fs, coordinator.WithLease(lease))
			var runs [2]atomic.Int64
			var bCtxErr error
			res, errs := coordinator.DoBatch(t.Context(), fx.c, calls("slow", "b"), func(ctx context.Context, i int) (string, error) {
				runs[i].Add(1)
				if i == 0 {
					// No renewal is confirmed for a lease: both watchdogs fire.
					fs.Fail(idemevent.MethodRenew, nil)
					time.Sleep(2 * lease)
					fs.Reset()
				} else {
					bCtxErr = ctx.Err()
				}
				return "done", nil
			})
			if errs[1] != nil {
				t.Fatalf("b: %v", errs[1])
			}
			if n := runs[1].Load(); n != 1 || bCtxErr != nil {
				t.Errorf("b's action ran %d times, its context ended: %v; want once, on a live reservation", n, bCtxErr)
			}
			if res[1].Replayed || res[1].Value != "done" {
				t.Errorf("b: %+v, want its own run", res[1])
			}
			if rec, err := fs.Get(context.Background(), b); err != nil || rec.State != idemstore.StateCompleted {
				t.Errorf("b holds %+v (%v), want completed", rec, err)
			}
		})
	})
}

func TestDoBatchPanicKeepsWhatRan(t *testing.T) {
	fx, s := newMem(t)
	cs := calls("first", "panics", "never")
	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Fatalf("recovered %v, want the action's panic", v)
			}
		}()
		coordinator.DoBatch(t.Context(), fx.c, cs, func(_ context.Context, i int) (string, error) {
			if i == 1 {
				panic("boom")
			}
			return cs[i].Key, nil
		})
	}()
	want := map[string]idemstore.State{"first": idemstore.StateCompleted, "panics": idemstore.StateAbsent, "never": idemstore.StateAbsent}
	for k, st := range want {
		if got := s.Snapshot(idemstore.Key{Operation: "payment.charge", Key: k}).State; got != st {
			t.Errorf("after the panic, %q holds %v, want %v", k, got, st)
		}
	}
}

func TestDoBatchStoreFails(t *testing.T) {
	for _, mode := range []coordinator.OnStorageErrorMode{coordinator.OnStorageErrorRaise, coordinator.OnStorageErrorRun} {
		t.Run(string(mode), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				fs := faultstore.Wrap(memstore.New())
				fx := newFixture(t, fs, coordinator.WithOnStorageError(mode))
				fs.FailOnce(idemevent.MethodReserveMany, nil)
				cs := calls("a", "b")
				act := newBatchAction(cs)
				res, errs := coordinator.DoBatch(t.Context(), fx.c, cs, act.run)
				for i := range cs {
					switch mode {
					case coordinator.OnStorageErrorRaise:
						if !errors.Is(errs[i], coordinator.ErrStorage) || act.runs[cs[i].Key] != 0 {
							t.Errorf("call %d: %v, %d runs; want a storage error and no run", i, errs[i], act.runs[cs[i].Key])
						}
					default:
						if errs[i] != nil || res[i].Value != "result of "+cs[i].Key || act.runs[cs[i].Key] != 1 {
							t.Errorf("call %d: %+v, %v, %d runs; want an unprotected run", i, res[i], errs[i], act.runs[cs[i].Key])
						}
					}
				}
				synctest.Wait() // the background saves of mode run
			})
		})
	}
}

func TestDoBatchCompleteManyFailsIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inner := memstore.New()
		fs := faultstore.Wrap(inner)
		fx := newFixture(t, fs)
		fs.FailOnce(idemevent.MethodCompleteMany, nil)
		cs := calls("a", "b")
		act := newBatchAction(cs)
		_, errs := coordinator.DoBatch(t.Context(), fx.c, cs, act.run)
		if errs[0] != nil || errs[1] != nil {
			t.Fatalf("errors %v: the actions ran, want their results", errs)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		for _, c := range cs {
			if rec := inner.Snapshot(idemstore.Key{Operation: c.Operation, Key: c.Key}); rec.State != idemstore.StateCompleted {
				t.Errorf("%q holds %v after the background retry, want completed", c.Key, rec.State)
			}
		}
	})
}

// noBulk is a store without bulk operations.
type noBulk struct{ idemstore.Store }

func TestDoBatchWithoutBulkStore(t *testing.T) {
	fx := newFixture(t, noBulk{memstore.New()})
	cs := calls("a", "b", "a")
	act := newBatchAction(cs)
	res, errs := coordinator.DoBatch(t.Context(), fx.c, cs, act.run)
	if errs[0] != nil || errs[1] != nil || errs[2] != nil || !res[2].Replayed || act.runs["a"] != 1 {
		t.Errorf("results %+v, errors %v, runs %v; want one run per key", res, errs, act.runs)
	}
	if n := fx.rec.calls(idemevent.MethodReserveMany); n != 0 {
		t.Errorf("%d reserve_many calls on a store without bulk operations", n)
	}
}

func TestDoBatchDisabled(t *testing.T) {
	fx, s := newMem(t, coordinator.WithEnabled(false))
	cs := calls("a", "a")
	act := newBatchAction(cs)
	_, errs := coordinator.DoBatch(t.Context(), fx.c, cs, act.run)
	if errs[0] != nil || errs[1] != nil || act.runs["a"] != 2 || s.Len() != 0 {
		t.Errorf("errors %v, runs %v, %d records; want every action run, nothing stored", errs, act.runs, s.Len())
	}
}

func TestDoBatchNilAction(t *testing.T) {
	fx, _ := newMem(t)
	_, errs := coordinator.DoBatch[string](t.Context(), fx.c, calls("a"), nil)
	if !errors.Is(errs[0], coordinator.ErrInvalidRequest) {
		t.Errorf("nil action: %v, want ErrInvalidRequest", errs[0])
	}
}

// TestDoBatchConcurrent runs overlapping batches at once: every key's
// action runs exactly once, and every call gets its result.
func TestDoBatchConcurrent(t *testing.T) {
	fx, _ := newMem(t)
	const batches, keys = 16, 40
	var runs [keys]atomic.Int32
	var wg sync.WaitGroup
	for g := range batches {
		wg.Go(func() {
			cs := make([]coordinator.Call, keys)
			for j := range cs {
				cs[j] = call(fmt.Sprint("k", (j+g*7)%keys))
			}
			res, errs := coordinator.DoBatch(context.Background(), fx.c, cs, func(_ context.Context, i int) (string, error) {
				var n int
				fmt.Sscan(cs[i].Key[1:], &n)
				runs[n].Add(1)
				return cs[i].Key, nil
			})
			for i := range cs {
				if errs[i] != nil || res[i].Value != cs[i].Key {
					t.Errorf("batch %d call %d: %+v, %v", g, i, res[i], errs[i])
				}
			}
		})
	}
	wg.Wait()
	for k := range runs {
		if n := runs[k].Load(); n != 1 {
			t.Errorf("key k%d ran %d times, want once", k, n)
		}
	}
}

// TestDoBatchBulkCallsHang hangs the bulk calls while the single-key ones
// answer: a hung ReserveMany ends at the storage timeout and fails every
// key as its mode says; a hung CompleteMany ends there too, and the results
// are stored by the per-key retries.
func TestDoBatchBulkCallsHang(t *testing.T) {
	hang := func(ctx context.Context, _ idemstore.Key) error {
		<-ctx.Done()
		return ctx.Err()
	}
	t.Run("reserve_many", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			fs := faultstore.Wrap(memstore.New())
			fx := newFixture(t, fs, coordinator.WithStorageTimeout(time.Second), coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise))
			fs.Before(idemevent.MethodReserveMany, hang)
			cs := calls("a", "b")
			act := newBatchAction(cs)
			start := time.Now()
			_, errs := coordinator.DoBatch(t.Context(), fx.c, cs, act.run)
			if d := time.Since(start); d != time.Second {
				t.Errorf("DoBatch returned after %v, want the storage timeout, 1s", d)
			}
			for i := range cs {
				if !errors.Is(errs[i], coordinator.ErrStorage) || act.runs[cs[i].Key] != 0 {
					t.Errorf("call %d: %v, %d runs; want a storage error, no run", i, errs[i], act.runs[cs[i].Key])
				}
			}
			synctest.Wait()
		})
	})
	t.Run("complete_many", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			inner := memstore.New()
			fs := faultstore.Wrap(inner)
			fx := newFixture(t, fs, coordinator.WithStorageTimeout(time.Second))
			fs.Before(idemevent.MethodCompleteMany, hang)
			cs := calls("a", "b")
			act := newBatchAction(cs)
			start := time.Now()
			_, errs := coordinator.DoBatch(t.Context(), fx.c, cs, act.run)
			if errs[0] != nil || errs[1] != nil {
				t.Fatalf("errors %v, want the actions' results", errs)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("DoBatch returned after %v, want at most two storage timeouts", d)
			}
			time.Sleep(5 * time.Second)
			synctest.Wait()
			for _, c := range cs {
				if rec := inner.Snapshot(idemstore.Key{Operation: c.Operation, Key: c.Key}); rec.State != idemstore.StateCompleted {
					t.Errorf("%q holds %v after the per-key retries, want completed", c.Key, rec.State)
				}
			}
			if n := fx.rec.errors(idemevent.ErrorStorageSave); n < 1 {
				t.Errorf("%d storage_save_error events, want the hung CompleteMany reported", n)
			}
		})
	})
}

// halfDown is a bulk store whose ReserveMany reaches only the first half of
// its entries, as a batch across two nodes of which one is down: it
// returns their outcomes with the error.
type halfDown struct{ *memstore.Store }

var errNodeDown = errors.New("dial tcp: connection refused")

func (s halfDown) ReserveMany(ctx context.Context, keys []idemstore.Key, ws []idemstore.Write, allOrNothing bool) ([]idemstore.Record, []bool, error) {
	h := len(keys) / 2
	existing, written, err := s.Store.ReserveMany(ctx, keys[:h], ws[:h], allOrNothing)
	if err != nil {
		return nil, nil, err
	}
	return append(existing, make([]idemstore.Record, len(keys)-h)...), append(written, make([]bool, len(keys)-h)...), errNodeDown
}

func TestDoBatchPartOfTheStoreDown(t *testing.T) {
	s := memstore.New()
	fx := newFixture(t, halfDown{s}, coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise))
	s.Put(idemstore.Key{Operation: "payment.charge", Key: "done"}, idemstore.Record{State: idemstore.StateCompleted, Token: "t", Result: []byte(`"stored"`), TTL: time.Hour})
	cs := calls("a", "done", "c", "d") // a and done reach the store; c and d do not
	act := newBatchAction(cs)
	res, errs := coordinator.DoBatch(t.Context(), fx.c, cs, act.run)
	if errs[0] != nil || res[0].Value != "result of a" || act.runs["a"] != 1 {
		t.Errorf("a, on the node that answered: %+v, %v, %d runs; want its run", res[0], errs[0], act.runs["a"])
	}
	if errs[1] != nil || !res[1].Replayed || res[1].Value != "stored" {
		t.Errorf("done, on the node that answered: %+v, %v; want the replay", res[1], errs[1])
	}
	for _, i := range []int{2, 3} {
		if !errors.Is(errs[i], coordinator.ErrStorage) || !errors.Is(errs[i], errNodeDown) || act.runs[cs[i].Key] != 0 {
			t.Errorf("%s, on the node that is down: %v, %d runs; want its storage error and no run", cs[i].Key, errs[i], act.runs[cs[i].Key])
		}
	}
}
