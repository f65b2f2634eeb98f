package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
)

// txStore is an in-memory idemstore.Transactor: a claim is a reservation
// that the key's mutex holds until the claim ends, the action's writes are
// buffered in the claim and applied to effects only on Commit, and a claim
// of a held key waits for the mutex up to its wait.
type txStore struct {
	*memstore.Store
	mu      sync.Mutex
	held    map[idemstore.Key]chan struct{}
	effects map[string]int

	failClaim, failCommit, failBegin error
	claims, commits, rollbacks       atomic.Int32
}

var _ idemstore.Transactor = (*txStore)(nil)

func newTxStore() *txStore {
	return &txStore{Store: memstore.New(), held: map[idemstore.Key]chan struct{}{}, effects: map[string]int{}}
}

func (s *txStore) Claim(ctx context.Context, key idemstore.Key, w idemstore.Write, wait time.Duration) (idemstore.Claim, idemstore.Record, error) {
	s.claims.Add(1)
	if s.failClaim != nil {
		return nil, idemstore.Record{}, s.failClaim
	}
	t := time.NewTimer(max(wait, 0))
	defer t.Stop()
	for {
		s.mu.Lock()
		busy, ok := s.held[key]
		if !ok {
			free := make(chan struct{})
			s.held[key] = free
			s.mu.Unlock()
			rec, written, err := s.Reserve(ctx, key, w)
			if err != nil || !written {
				s.leave(key, free)
				return nil, rec, err
			}
			return &txClaim{s: s, key: key, token: w.Token, free: free}, idemstore.Record{}, nil
		}
		s.mu.Unlock()
		select {
		case <-busy:
		case <-t.C:
			return nil, idemstore.Record{}, &coordinator.InProgressError{Operation: key.Operation, Key: key.Key}
		case <-ctx.Done():
			return nil, idemstore.Record{}, ctx.Err()
		}
	}
}

func (s *txStore) Begin(context.Context) (idemstore.Claim, error) {
	if s.failBegin != nil {
		return nil, s.failBegin
	}
	return &txClaim{s: s}, nil
}

func (s *txStore) leave(key idemstore.Key, free chan struct{}) {
	s.mu.Lock()
	delete(s.held, key)
	s.mu.Unlock()
	close(free)
}

func (s *txStore) effect(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.effects[name]
}

type txClaim struct {
	s      *txStore
	key    idemstore.Key
	token  string
	free   chan struct{}
	writes []string
}

type txCtxKey struct{}

// write is an action's write through its claim's transaction.
func write(ctx context.Context, name string) error {
	c, ok := ctx.Value(txCtxKey{}).(*txClaim)
	if !ok {
		return errors.New("no transaction in the context")
	}
	c.writes = append(c.writes, name)
	return nil
}

func (c *txClaim) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, txCtxKey{}, c)
}

func (c *txClaim) Commit(ctx context.Context, comp idemstore.Completion) error {
	c.s.commits.Add(1)
	defer c.end(ctx)
	if c.s.failCommit != nil {
		return c.s.failCommit
	}
	if c.free != nil {
		if ok, err := c.s.Complete(ctx, c.key, c.token, comp); err != nil || !ok {
			return errors.New("the claim is gone")
		}
	}
	c.s.mu.Lock()
	for _, w := range c.writes {
		c.s.effects[w]++
	}
	c.s.mu.Unlock()
	c.writes = nil
	return nil
}

func (c *txClaim) Rollback(ctx context.Context) error {
	c.s.rollbacks.Add(1)
	c.writes = nil
	c.end(ctx)
	return nil
}

// end undoes an uncompleted claim, as a rollback undoes its row, and frees
// the key.
func (c *txClaim) end(ctx context.Context) {
	if c.free == nil {
		return
	}
	_, _ = c.s.Release(ctx, c.key, c.token)
	c.s.leave(c.key, c.free)
	c.free = nil
}

// Over a Transactor, the coordinator's one flow claims the key in a
// transaction, runs the action with it, and commits its writes with the
// record: 50 callers of 5 keys make 5 effects, and the others replay.
func TestTransactorConcurrentCallers(t *testing.T) {
	s := newTxStore()
	f := newFixture(t, s)
	keys := []string{"a", "b", "c", "d", "e"}
	var wg sync.WaitGroup
	var replays atomic.Int32
	for i := range 50 {
		wg.Go(func() {
			key := keys[i%len(keys)]
			res, err := coordinator.DoResult(t.Context(), f.c, call(key), func(ctx context.Context) (string, error) {
				time.Sleep(time.Millisecond)
				return "done " + key, write(ctx, key)
			})
			if err != nil || res.Value != "done "+key {
				t.Errorf("Do(%s) = %+v, %v", key, res, err)
			}
			if res.Replayed {
				replays.Add(1)
			}
		})
	}
	wg.Wait()
	for _, key := range keys {
		if n := s.effect(key); n != 1 {
			t.Errorf("key %s: %d effects, want 1", key, n)
		}
	}
	if replays.Load() != 45 {
		t.Errorf("%d replays, want 45", replays.Load())
	}
	if f.rec.calls(idemevent.MethodRenew) != 0 {
		t.Error("a claim was renewed: the transaction is the lease")
	}
}

// The rows of a transactional call's outcomes: an action's error or panic
// rolls its writes back and frees the key; a failed commit is a
// *StorageError with the action's value, and nothing is kept; a failed
// claim never runs the action, in either on-storage-error mode; a key held
// past the wait is ErrInProgress.
func TestTransactorOutcomes(t *testing.T) {
	t.Run("action error rolls back", func(t *testing.T) {
		s := newTxStore()
		f := newFixture(t, s)
		boom := errors.New("boom")
		_, err := coordinator.Do(t.Context(), f.c, call("k"), func(ctx context.Context) (int, error) {
			return 0, errors.Join(write(ctx, "k"), boom)
		})
		if !errors.Is(err, boom) || s.effect("k") != 0 || s.rollbacks.Load() != 1 {
			t.Fatalf("err %v, effects %d, rollbacks %d; want boom, 0, 1", err, s.effect("k"), s.rollbacks.Load())
		}
		v, err := coordinator.Do(t.Context(), f.c, call("k"), func(ctx context.Context) (int, error) { return 7, write(ctx, "k") })
		if err != nil || v != 7 || s.effect("k") != 1 {
			t.Fatalf("retry = %d, %v with %d effects; want a run", v, err, s.effect("k"))
		}
	})
	t.Run("panic rolls back", func(t *testing.T) {
		s := newTxStore()
		f := newFixture(t, s)
		func() {
			defer func() { _ = recover() }()
			_, _ = coordinator.Do(t.Context(), f.c, call("k"), func(ctx context.Context) (int, error) {
				_ = write(ctx, "k")
				panic("boom")
			})
		}()
		if s.effect("k") != 0 || s.rollbacks.Load() != 1 {
			t.Fatalf("effects %d, rollbacks %d; want 0, 1", s.effect("k"), s.rollbacks.Load())
		}
		if rec, _ := s.Get(t.Context(), idemstore.Key{Operation: "payment.charge", Key: "k"}); rec.State != idemstore.StateAbsent {
			t.Fatalf("record %v, want absent", rec.State)
		}
	})
	t.Run("commit fails", func(t *testing.T) {
		s := newTxStore()
		s.failCommit = errors.New("connection reset")
		f := newFixture(t, s)
		v, err := coordinator.Do(t.Context(), f.c, call("k"), func(ctx context.Context) (int, error) { return 7, write(ctx, "k") })
		var se *coordinator.StorageError
		if !errors.As(err, &se) || se.Method != idemevent.MethodComplete || v != 7 || s.effect("k") != 0 {
			t.Fatalf("Do = %d, %v with %d effects; want 7 and a *StorageError of complete, no effect", v, err, s.effect("k"))
		}
		if f.rec.errors(idemevent.ErrorStorageSave) != 1 {
			t.Fatal("the failed commit was not reported")
		}
	})
	for _, mode := range storageModes {
		t.Run("claim fails/"+string(mode), func(t *testing.T) {
			s := newTxStore()
			s.failClaim = errConnRefused
			f := newFixture(t, s, coordinator.WithOnStorageError(mode))
			var k counter
			_, err := coordinator.Do(t.Context(), f.c, call("k"), k.action("x"))
			wantStorageError(t, err, idemevent.MethodReserve)
			if k.n() != 0 {
				t.Fatalf("the action ran %d times without its transaction", k.n())
			}
		})
	}
	for _, mode := range []coordinator.InFlightMode{coordinator.InFlightWait, coordinator.InFlightRaise, coordinator.InFlightRun} {
		t.Run("held/"+string(mode), func(t *testing.T) {
			s := newTxStore()
			f := newFixture(t, s, coordinator.WithInFlight(mode), coordinator.WithWaitTimeout(50*time.Millisecond))
			inside, release := make(chan struct{}), make(chan struct{})
			done := make(chan error)
			go func() {
				_, err := coordinator.Do(context.Background(), f.c, call("k"), func(ctx context.Context) (int, error) {
					close(inside)
					<-release
					return 1, write(ctx, "k")
				})
				done <- err
			}()
			<-inside
			var k counter
			_, err := coordinator.Do(t.Context(), f.c, call("k"), k.action("x"))
			close(release)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if !errors.Is(err, coordinator.ErrInProgress) || k.n() != 0 {
				t.Fatalf("Do on a held key = %v after %d runs, want ErrInProgress and no run", err, k.n())
			}
			if s.effect("k") != 1 {
				t.Fatalf("%d effects, want 1", s.effect("k"))
			}
			// A wait is reported with the time it took, bounded by the
			// caller's deadline as by the wait timeout.
			for _, w := range f.rec.waits() {
				if w.Outcome != idemevent.WaitTimeout || w.Duration > 5*time.Second {
					t.Errorf("wait event %v after %v, want a timeout after about 50ms", w.Outcome, w.Duration)
				}
			}
		})
	}
	t.Run("held past the caller's deadline", func(t *testing.T) {
		s := newTxStore()
		f := newFixture(t, s, coordinator.WithWaitTimeout(time.Minute))
		inside, release := make(chan struct{}), make(chan struct{})
		done := make(chan error)
		go func() {
			_, err := coordinator.Do(context.Background(), f.c, call("k"), func(ctx context.Context) (int, error) {
				close(inside)
				<-release
				return 1, nil
			})
			done <- err
		}()
		<-inside
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		_, err := coordinator.Do(ctx, f.c, call("k"), func(context.Context) (int, error) { return 2, nil })
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if !errors.Is(err, coordinator.ErrInProgress) {
			t.Fatalf("Do past its deadline on a held key = %v, want ErrInProgress", err)
		}
		// The wait is reported with the time it took (about the deadline),
		// not the wait timeout's minute.
		waits := f.rec.waits()
		if len(waits) != 1 || waits[0].Outcome != idemevent.WaitTimeout || waits[0].Duration > 10*time.Second {
			t.Fatalf("wait events %+v, want one timeout after about 100ms", waits)
		}
	})
	t.Run("kill switch", func(t *testing.T) {
		s := newTxStore()
		f := newFixture(t, s, coordinator.WithEnabled(false))
		for range 2 {
			if _, err := coordinator.Do(t.Context(), f.c, call("k"), func(ctx context.Context) (int, error) { return 1, write(ctx, "k") }); err != nil {
				t.Fatal(err)
			}
		}
		if s.effect("k") != 2 || s.claims.Load() != 0 || s.commits.Load() != 2 || len(f.rec.all()) != 0 {
			t.Fatalf("effects %d, claims %d, commits %d, events %d; want 2 runs in transactions, nothing claimed or reported",
				s.effect("k"), s.claims.Load(), s.commits.Load(), len(f.rec.all()))
		}
		s.failBegin = errConnRefused
		var k counter
		_, err := coordinator.Do(t.Context(), f.c, call("k"), k.action("x"))
		if !errors.Is(err, coordinator.ErrStorage) || k.n() != 0 {
			t.Fatalf("Do without a transaction = %v after %d runs, want ErrStorage and no run", err, k.n())
		}
	})
}

// Over a Transactor, a call claims first while most recent calls were first
// runs, and reads first once most found a record: after five first runs,
// eleven replays claim and the twelfth reads; after twenty-eight replays,
// eight first runs read before the score falls back, and the ninth claims
// first. The outcome is the same either way.
func TestTransactorReadOrder(t *testing.T) {
	s := newTxStore()
	f := newFixture(t, s)
	do := func(key string) coordinator.Result[string] {
		t.Helper()
		res, err := coordinator.DoResult(t.Context(), f.c, call(key), func(ctx context.Context) (string, error) {
			return "done " + key, write(ctx, key)
		})
		if err != nil || res.Value != "done "+key {
			t.Fatalf("Do(%s) = %+v, %v", key, res, err)
		}
		return res
	}
	want := func(step string, gets, claims int) {
		t.Helper()
		if g, c := f.rec.calls(idemevent.MethodGet), int(s.claims.Load()); g != gets || c != claims {
			t.Fatalf("%s: %d reads and %d claims, want %d and %d", step, g, c, gets, claims)
		}
	}
	for _, key := range []string{"a", "b", "c", "d", "e"} {
		do(key)
	}
	want("five first runs", 0, 5)
	for i := range 11 {
		if !do("a").Replayed {
			t.Fatalf("replay %d ran", i+1)
		}
	}
	want("eleven replays", 0, 16)
	do("a")
	want("the twelfth replay", 1, 16)
	for range 16 {
		do("a")
	}
	want("twenty-eight replays", 17, 16)
	for i := range 8 {
		do(fmt.Sprintf("new-%d", i))
	}
	want("eight first runs", 25, 24)
	do("new-8")
	want("the ninth first run", 25, 25)
	for _, key := range []string{"a", "new-0", "new-8"} {
		if n := s.effect(key); n != 1 {
			t.Errorf("key %s: %d effects, want 1", key, n)
		}
	}
}

// sweptStore is a txStore whose first claim of each key finds the key's row
// gone: the row it met had expired, and the sweeper deleted it before the
// claim could take it over.
type sweptStore struct {
	*txStore
	met sync.Map // keys whose first claim has run
}

func (s *sweptStore) Claim(ctx context.Context, key idemstore.Key, w idemstore.Write, wait time.Duration) (idemstore.Claim, idemstore.Record, error) {
	if _, seen := s.met.LoadOrStore(key, true); !seen {
		return nil, idemstore.Record{}, nil
	}
	return s.txStore.Claim(ctx, key, w, wait)
}

// A claim that found its key's row swept away found no record: first runs
// that meet it keep claiming first, and none reads first.
func TestTransactorReadOrderSwept(t *testing.T) {
	s := &sweptStore{txStore: newTxStore()}
	f := newFixture(t, s)
	for i := range 20 {
		key := fmt.Sprintf("swept-%d", i)
		res, err := coordinator.DoResult(t.Context(), f.c, call(key), func(ctx context.Context) (string, error) {
			return "done", write(ctx, key)
		})
		if err != nil || res.Replayed {
			t.Fatalf("Do(%s) = %+v, %v", key, res, err)
		}
		if n := s.effect(key); n != 1 {
			t.Fatalf("key %s: %d effects, want 1", key, n)
		}
	}
	if g := f.rec.calls(idemevent.MethodGet); g != 0 {
		t.Errorf("20 first runs whose first claim found the row swept: %d reads first, want 0", g)
	}
}
