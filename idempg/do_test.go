package idempg_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idempg"
)

// 50 concurrent callers per key, on several keys at once: each key's action
// commits exactly one ledger row, and every caller of a key gets the same
// result, all but one as a replay.
func TestDoConcurrentCallers(t *testing.T) {
	const keys, callers = 4, 50
	db := newDB(t, keys*callers+8)
	s := db.coord(t)
	var runs atomic.Int32
	type out struct {
		res coordinator.Result[string]
		err error
	}
	outs := make([][]out, keys)
	names := make([]string, keys)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for k := range keys {
		names[k] = uniqueKey("concurrent")
		outs[k] = make([]out, callers)
		for i := range callers {
			wg.Go(func() {
				<-start
				res, err := idempg.DoResult(t.Context(), s, call(names[k]), func(ctx context.Context, tx pgx.Tx) (string, error) {
					runs.Add(1)
					v := fmt.Sprintf("caller %d", i)
					if err := insertLedger(ctx, tx, names[k], v); err != nil {
						return "", err
					}
					time.Sleep(20 * time.Millisecond) // hold the key while the others arrive
					return v, nil
				})
				outs[k][i] = out{res, err}
			})
		}
	}
	close(start)
	wg.Wait()

	for k, name := range names {
		if n := db.ledger(t, name); n != 1 {
			t.Errorf("key %d: %d ledger rows, want 1", k, n)
		}
		var want string
		if err := db.pool.QueryRow(t.Context(), "SELECT value FROM ledger WHERE key = $1", name).Scan(&want); err != nil {
			t.Fatalf("key %d: ledger row: %v", k, err)
		}
		fresh := 0
		for i, o := range outs[k] {
			if o.err != nil {
				t.Errorf("key %d caller %d: %v", k, i, o.err)
				continue
			}
			if o.res.Value != want {
				t.Errorf("key %d caller %d got %q, want the committed %q", k, i, o.res.Value, want)
			}
			if !o.res.Replayed {
				fresh++
			}
		}
		if fresh != 1 {
			t.Errorf("key %d: %d callers got a fresh result, want 1 (the others replay)", k, fresh)
		}
	}
	if got := runs.Load(); got != keys {
		t.Errorf("the action ran %d times for %d keys, want once per key", got, keys)
	}
}

// An action that fails leaves no record and no ledger row; a retry runs.
func TestDoActionErrorRollsBack(t *testing.T) {
	db := newDB(t, 4)
	s := db.coord(t)
	key := uniqueKey("fails")
	boom := errors.New("boom")
	v, err := idempg.Do(t.Context(), s, call(key), func(ctx context.Context, tx pgx.Tx) (int, error) {
		if err := insertLedger(ctx, tx, key, "first"); err != nil {
			return 0, err
		}
		return 7, boom
	})
	if !errors.Is(err, boom) || v != 7 {
		t.Fatalf("Do with a failing action = %d, %v; want 7 and the action's error", v, err)
	}
	if n := db.ledger(t, key); n != 0 {
		t.Errorf("ledger rows after the failed action: %d, want 0", n)
	}
	if n := db.rows(t); n != 0 {
		t.Errorf("records after the failed action: %d, want 0", n)
	}
	res, err := idempg.DoResult(t.Context(), s, call(key), func(ctx context.Context, tx pgx.Tx) (int, error) {
		return 8, insertLedger(ctx, tx, key, "retry")
	})
	if err != nil || res.Value != 8 || res.Replayed {
		t.Fatalf("retry = %+v, %v; want a fresh 8", res, err)
	}
	if n := db.ledger(t, key); n != 1 {
		t.Errorf("ledger rows after the retry: %d, want 1", n)
	}
	// And now it replays without running.
	res, err = idempg.DoResult(t.Context(), s, call(key), func(context.Context, pgx.Tx) (int, error) {
		t.Error("the action ran for a completed key")
		return 0, nil
	})
	if err != nil || res.Value != 8 || !res.Replayed {
		t.Fatalf("third call = %+v, %v; want a replayed 8", res, err)
	}
}

// A panicking action rolls back and the panic goes on.
func TestDoActionPanics(t *testing.T) {
	db := newDB(t, 4)
	s := db.coord(t)
	key := uniqueKey("panics")
	func() {
		defer func() {
			if p := recover(); p != "kaboom" {
				t.Errorf("recovered %v, want the action's panic", p)
			}
		}()
		_, _ = idempg.Do(t.Context(), s, call(key), func(ctx context.Context, tx pgx.Tx) (int, error) {
			if err := insertLedger(ctx, tx, key, "x"); err != nil {
				return 0, err
			}
			panic("kaboom")
		})
	}()
	if n, r := db.ledger(t, key), db.rows(t); n != 0 || r != 0 {
		t.Errorf("after a panic: %d ledger rows and %d records, want none", n, r)
	}
}

// holdKey runs Do on key in the background with an action that writes a
// ledger row and holds the transaction open until release is closed. It
// returns once the action runs, with a channel of Do's error.
func holdKey(t *testing.T, s *coordinator.Coordinator, key string, release <-chan struct{}) <-chan error {
	t.Helper()
	inside := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := idempg.Do(context.Background(), s, call(key), func(ctx context.Context, tx pgx.Tx) (string, error) {
			if err := insertLedger(ctx, tx, key, "holder"); err != nil {
				return "", err
			}
			close(inside)
			<-release
			return "holder's", nil
		})
		done <- err
	}()
	select {
	case <-inside:
	case err := <-done:
		t.Fatalf("holder: %v", err)
	}
	return done
}

func TestDoRaiseWhileHeld(t *testing.T) {
	db := newDB(t, 8)
	holder := db.coord(t)
	raise := db.coord(t, coordinator.WithInFlight(coordinator.InFlightRaise))
	key := uniqueKey("raise")
	release, open := gate(t)
	done := holdKey(t, holder, key, release)

	start := time.Now()
	_, err := idempg.Do(t.Context(), raise, call(key), func(context.Context, pgx.Tx) (string, error) {
		t.Error("the action ran while another transaction held the key")
		return "", nil
	})
	var ip *coordinator.InProgressError
	if !errors.Is(err, coordinator.ErrInProgress) || !errors.As(err, &ip) || ip.RetryAfter <= 0 {
		t.Fatalf("Do in mode raise while held = %s, want an *InProgressError with a RetryAfter", fmtErr(err))
	}
	// At once, not at the wait bound (30s), however busy the machine.
	within(t, "Do in mode raise", time.Since(start), 10*time.Second)

	open()
	if err := <-done; err != nil {
		t.Fatalf("holder: %v", err)
	}
	// Once committed, mode raise replays.
	v, err := idempg.Do(t.Context(), raise, call(key), func(context.Context, pgx.Tx) (string, error) {
		t.Error("the action ran for a completed key")
		return "", nil
	})
	if err != nil || v != "holder's" {
		t.Fatalf("Do in mode raise after the commit = %q, %v; want the holder's result", v, err)
	}
	if n := db.ledger(t, key); n != 1 {
		t.Errorf("ledger rows: %d, want 1", n)
	}
}

// A caller whose wait bound is shorter than the holder's transaction gets
// ErrInProgress without running; one with a longer bound replays.
func TestDoWaitBound(t *testing.T) {
	db := newDB(t, 8)
	holder := db.coord(t)
	short := db.coord(t, coordinator.WithWaitTimeout(200*time.Millisecond))
	key := uniqueKey("bound")
	release, open := gate(t)
	done := holdKey(t, holder, key, release)

	never := func(context.Context, pgx.Tx) (string, error) {
		t.Error("the action ran while another transaction held the key")
		return "", nil
	}
	start := time.Now()
	if _, err := idempg.Do(t.Context(), short, call(key), never); !errors.Is(err, coordinator.ErrInProgress) {
		t.Fatalf("Do with a 200ms wait bound = %s, want ErrInProgress", fmtErr(err))
	}
	if d := time.Since(start); d < 150*time.Millisecond || d > time.Second {
		t.Errorf("Do with a 200ms wait bound returned after %v", d)
	}

	// The context's deadline bounds the wait too.
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	_, err := idempg.Do(ctx, holder, call(key), never)
	cancel()
	if !errors.Is(err, coordinator.ErrInProgress) {
		t.Fatalf("Do with a 200ms context = %s, want ErrInProgress", fmtErr(err))
	}

	// A waiter that outlasts the holder replays its result.
	got := make(chan string, 1)
	go func() {
		v, err := idempg.Do(context.Background(), holder, call(key), never)
		if err != nil {
			v = err.Error()
		}
		got <- v
	}()
	time.Sleep(100 * time.Millisecond)
	open()
	if err := <-done; err != nil {
		t.Fatalf("holder: %v", err)
	}
	if v := <-got; v != "holder's" {
		t.Errorf("waiter got %q, want the holder's result", v)
	}
}

// A holder's backend terminated mid-action leaves neither its ledger row nor
// a record; a retry runs once.
func TestDoHolderBackendTerminated(t *testing.T) {
	db := newDB(t, 8)
	s := db.coord(t)
	key := uniqueKey("terminated")
	pid := make(chan uint32, 1)
	terminated, terminate := gate(t)
	done := make(chan error, 1)
	go func() {
		_, err := idempg.Do(context.Background(), s, call(key), func(ctx context.Context, tx pgx.Tx) (string, error) {
			if err := insertLedger(ctx, tx, key, "doomed"); err != nil {
				return "", err
			}
			pid <- tx.Conn().PgConn().PID()
			<-terminated
			return "doomed", nil
		})
		done <- err
	}()
	var killed bool
	if err := db.pool.QueryRow(t.Context(), "SELECT pg_terminate_backend($1)", int32(<-pid)).Scan(&killed); err != nil || !killed {
		t.Fatalf("pg_terminate_backend = %v, %v", killed, err)
	}
	terminate()
	err := <-done
	if !errors.Is(err, coordinator.ErrStorage) {
		t.Fatalf("Do whose backend was terminated = %s, want ErrStorage", fmtErr(err))
	}
	if n, r := db.ledger(t, key), db.rows(t); n != 0 || r != 0 {
		t.Fatalf("after the termination: %d ledger rows and %d records, want none", n, r)
	}
	var runs int
	for range 3 {
		v, err := idempg.Do(t.Context(), s, call(key), func(ctx context.Context, tx pgx.Tx) (string, error) {
			runs++
			return "retried", insertLedger(ctx, tx, key, "retried")
		})
		if err != nil || v != "retried" {
			t.Fatalf("retry = %q, %v", v, err)
		}
	}
	if runs != 1 || db.ledger(t, key) != 1 {
		t.Errorf("retries ran the action %d times and left %d ledger rows, want 1 and 1", runs, db.ledger(t, key))
	}
}

// A commit that fails (here: a deferred constraint the action's write
// breaks) rolls everything back: the key stays free.
func TestDoCommitFails(t *testing.T) {
	db := newDB(t, 4)
	s := db.coord(t)
	ctx := t.Context()
	if _, err := db.pool.Exec(ctx, `CREATE TABLE checked (v int, CONSTRAINT positive CHECK (v > 0));
		CREATE TABLE parent (id int PRIMARY KEY);
		CREATE TABLE child (parent_id int REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	key := uniqueKey("commit-fails")
	_, err := idempg.Do(ctx, s, call(key), func(ctx context.Context, tx pgx.Tx) (string, error) {
		_, err := tx.Exec(ctx, "INSERT INTO child VALUES (42)") // checked at COMMIT
		return "never", err
	})
	if !errors.Is(err, coordinator.ErrStorage) {
		t.Fatalf("Do whose COMMIT fails = %s, want ErrStorage", fmtErr(err))
	}
	if r := db.rows(t); r != 0 {
		t.Fatalf("records after a failed COMMIT: %d, want 0", r)
	}
	v, err := idempg.Do(ctx, s, call(key), func(context.Context, pgx.Tx) (string, error) { return "ok", nil })
	if err != nil || v != "ok" {
		t.Fatalf("retry = %q, %v", v, err)
	}
}

func TestDoKeyReuse(t *testing.T) {
	db := newDB(t, 4)
	s := db.coord(t)
	key := uniqueKey("reuse")
	c := call(key)
	c.Fingerprint = "fp-1"
	if _, err := idempg.Do(t.Context(), s, c, func(context.Context, pgx.Tx) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	c.Fingerprint = "fp-2"
	_, err := idempg.Do(t.Context(), s, c, func(context.Context, pgx.Tx) (int, error) {
		t.Error("the action ran for a reused key")
		return 2, nil
	})
	var kr *coordinator.KeyReuseError
	if !errors.As(err, &kr) || kr.Stored != "fp-1" || kr.Got != "fp-2" {
		t.Fatalf("Do with another fingerprint = %s, want a *KeyReuseError fp-1/fp-2", fmtErr(err))
	}
}

func TestDoInvalid(t *testing.T) {
	db := newDB(t, 4)
	s := db.coord(t, coordinator.WithOperationTTLs(map[string]time.Duration{"test.short": 2 * time.Second}))
	ok := func(context.Context, pgx.Tx) (int, error) { return 1, nil }
	for name, f := range map[string]func() error{
		"nil store":  func() error { _, err := idempg.Do(t.Context(), nil, call("k"), ok); return err },
		"nil action": func() error { _, err := idempg.Do[int](t.Context(), s, call("k"), nil); return err },
		"nil codec": func() error {
			_, err := idempg.DoWithCodec[int](t.Context(), s, call("k"), nil, ok)
			return err
		},
		"empty key":      func() error { _, err := idempg.Do(t.Context(), s, call(""), ok); return err },
		"key with space": func() error { _, err := idempg.Do(t.Context(), s, call("a b"), ok); return err },
		"bad operation": func() error {
			_, err := idempg.Do(t.Context(), s, coordinator.Call{Operation: "a b", Key: "k"}, ok)
			return err
		},
		"TTL too long": func() error {
			_, err := idempg.Do(t.Context(), s, coordinator.Call{Operation: "test.op", Key: "k", TTL: 1000 * time.Hour}, ok)
			return err
		},
	} {
		if err := f(); !errors.Is(err, coordinator.ErrInvalidRequest) {
			t.Errorf("%s: %s, want ErrInvalidRequest", name, fmtErr(err))
		}
	}
	if db.rows(t) != 0 {
		t.Error("an invalid call wrote a record")
	}

	// The operator's TTL wins over the call's.
	c := coordinator.Call{Operation: "test.short", Key: uniqueKey("ttl"), TTL: time.Hour}
	if _, err := idempg.Do(t.Context(), s, c, ok); err != nil {
		t.Fatal(err)
	}
	if rec := record(t, db.store(t), c.Operation, c.Key); rec.TTL <= 0 || rec.TTL > 2*time.Second {
		t.Errorf("TTL of a record of an operation with a 2s TTL: %v", rec.TTL)
	}
}

// A result that cannot be kept leaves a not-replayable record, committed
// with the action's writes; later calls get ErrNotReplayable, never a
// second run.
func TestDoNotReplayable(t *testing.T) {
	db := newDB(t, 4)
	s := db.coord(t, coordinator.WithMaxResultBytes(10))
	key := uniqueKey("large")
	v, err := idempg.Do(t.Context(), s, call(key), func(ctx context.Context, tx pgx.Tx) (string, error) {
		return strings.Repeat("x", 100), insertLedger(ctx, tx, key, "large")
	})
	if err != nil || len(v) != 100 {
		t.Fatalf("Do with a large result = %d bytes, %v; want the result", len(v), err)
	}
	_, err = idempg.Do(t.Context(), s, call(key), func(context.Context, pgx.Tx) (string, error) {
		t.Error("the action ran again")
		return "", nil
	})
	var nr *coordinator.NotReplayableError
	if !errors.As(err, &nr) || !strings.Contains(nr.Reason, "limit of 10") {
		t.Fatalf("second Do = %s, want a *NotReplayableError naming the limit", fmtErr(err))
	}
	if n := db.ledger(t, key); n != 1 {
		t.Errorf("ledger rows: %d, want 1", n)
	}
}

// A record nobody can read heals: Do runs and replaces it in its
// transaction. A stored result the codec cannot decode heals the same way.
func TestDoHealsUnreadable(t *testing.T) {
	db := newDB(t, 4)
	s := db.coord(t)
	k := idemstore.Key{Operation: "test.op", Key: uniqueKey("unreadable")}
	corrupt(t, db, k)
	v, err := idempg.Do(t.Context(), s, call(k.Key), func(context.Context, pgx.Tx) (int, error) { return 5, nil })
	if err != nil || v != 5 {
		t.Fatalf("Do over an unreadable record = %d, %v; want a fresh 5", v, err)
	}
	if rec := record(t, db.store(t), k.Operation, k.Key); rec.State != idemstore.StateCompleted || string(rec.Result) != "5" {
		t.Fatalf("record after the heal = %+v, want completed 5", rec)
	}
	// As a string, "5" is not JSON it can decode: run again and replace.
	got, err := idempg.DoResult(t.Context(), s, call(k.Key), func(context.Context, pgx.Tx) (string, error) { return "five", nil })
	if err != nil || got.Value != "five" || got.Replayed {
		t.Fatalf("Do over an undecodable result = %+v, %v; want a fresh run", got, err)
	}
}

// Do and a coordinator over the same Store: each replays the other's
// results, and Do waits for a coordinator's reservation.
func TestDoWithCoordinator(t *testing.T) {
	db := newDB(t, 8)
	s := db.coord(t, coordinator.WithPollInterval(5*time.Millisecond))
	c, err := coordinator.New(db.store(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := t.Context()

	// Do first, the coordinator replays.
	key := uniqueKey("do-first")
	if _, err := idempg.Do(ctx, s, call(key), func(context.Context, pgx.Tx) (map[string]int, error) {
		return map[string]int{"n": 1}, nil
	}); err != nil {
		t.Fatal(err)
	}
	res, err := coordinator.DoResult(ctx, c, call(key), func(context.Context) (map[string]int, error) {
		t.Error("the coordinator ran a key Do completed")
		return nil, nil
	})
	if err != nil || !res.Replayed || res.Value["n"] != 1 {
		t.Fatalf("coordinator after Do = %+v, %v; want a replay of n=1", res, err)
	}

	// The coordinator first, Do replays.
	key = uniqueKey("coordinator-first")
	if _, err := coordinator.Do(ctx, c, call(key), func(context.Context) (string, error) { return "plain", nil }); err != nil {
		t.Fatal(err)
	}
	got, err := idempg.DoResult(ctx, s, call(key), func(context.Context, pgx.Tx) (string, error) {
		t.Error("Do ran a key the coordinator completed")
		return "", nil
	})
	if err != nil || !got.Replayed || got.Value != "plain" {
		t.Fatalf("Do after the coordinator = %+v, %v; want a replay of plain", got, err)
	}

	// The coordinator holds the key (a committed pending record): Do waits
	// and replays.
	key = uniqueKey("coordinator-holds")
	inside := make(chan struct{})
	release, open := gate(t)
	done := make(chan error, 1)
	go func() {
		_, err := coordinator.Do(context.Background(), c, call(key), func(context.Context) (string, error) {
			close(inside)
			<-release
			return "held by the coordinator", nil
		})
		done <- err
	}()
	<-inside
	waited := make(chan coordinator.Result[string], 1)
	go func() {
		res, err := idempg.DoResult(context.Background(), s, call(key), func(context.Context, pgx.Tx) (string, error) {
			return "Do ran", nil
		})
		if err != nil {
			res.Value = err.Error()
		}
		waited <- res
	}()
	time.Sleep(100 * time.Millisecond)
	open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if res := <-waited; res.Value != "held by the coordinator" || !res.Replayed {
		t.Fatalf("Do that waited for the coordinator = %+v, want its replayed result", res)
	}

	// Raise mode refuses a coordinator's reservation at once.
	raise := db.coord(t, coordinator.WithInFlight(coordinator.InFlightRaise))
	key = uniqueKey("coordinator-holds-raise")
	if _, _, err := db.store(t).Reserve(ctx, idemstore.Key{Operation: "test.op", Key: key},
		idemstore.Write{State: idemstore.StatePending, Token: "someone", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	_, err = idempg.Do(ctx, raise, call(key), func(context.Context, pgx.Tx) (string, error) { return "", nil })
	var ip *coordinator.InProgressError
	if !errors.As(err, &ip) || ip.RetryAfter <= 50*time.Second {
		t.Fatalf("Do in mode raise on a reservation = %s, want an *InProgressError with the lease left as RetryAfter", fmtErr(err))
	}

	// A reservation whose lease runs out is taken over.
	key = uniqueKey("coordinator-expires")
	if _, _, err := db.store(t).Reserve(ctx, idemstore.Key{Operation: "test.op", Key: key},
		idemstore.Write{State: idemstore.StatePending, Token: "crashed", TTL: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	v, err := idempg.Do(ctx, s, call(key), func(context.Context, pgx.Tx) (string, error) { return "took over", nil })
	if err != nil || v != "took over" {
		t.Fatalf("Do on an expiring reservation = %q, %v", v, err)
	}
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Errorf("Do took a live reservation over after %v", d)
	}
}

// A coordinator meets a key that Do's transaction holds: it waits, and
// replays Do's result instead of running.
func TestCoordinatorWaitsForDo(t *testing.T) {
	db := newDB(t, 8)
	s := db.coord(t)
	c, err := coordinator.New(db.store(t), coordinator.WithStorageTimeout(300*time.Millisecond), coordinator.WithOnStorageError(coordinator.OnStorageErrorRun))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key := uniqueKey("do-holds")
	release, open := gate(t)
	done := holdKey(t, s, key, release)
	got := make(chan coordinator.Result[string], 1)
	go func() {
		res, err := coordinator.DoResult(context.Background(), c, call(key), func(context.Context) (string, error) {
			return "coordinator ran", nil
		})
		if err != nil {
			res.Value = err.Error()
		}
		got <- res
	}()
	time.Sleep(700 * time.Millisecond) // more than one storage timeout
	open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if res := <-got; res.Value != "holder's" || !res.Replayed {
		t.Fatalf("coordinator on a key Do held = %+v, want Do's replayed result", res)
	}
}

// The database down (nothing listens on port 1): Do returns ErrStorage and
// does not run the action.
func TestDoDatabaseDown(t *testing.T) {
	cfg, err := pgxpool.ParseConfig("host=127.0.0.1 port=1 user=nobody dbname=none sslmode=disable connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := idempg.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	s, err := coordinator.New(store)
	if err != nil {
		t.Fatal(err)
	}
	_, err = idempg.Do(t.Context(), s, call("down"), func(context.Context, pgx.Tx) (int, error) {
		t.Error("the action ran without a database")
		return 0, nil
	})
	var se *coordinator.StorageError
	if !errors.As(err, &se) || !errors.Is(err, coordinator.ErrStorage) {
		t.Fatalf("Do without a database = %s, want a *StorageError", fmtErr(err))
	}
}

// The action may not end Do's transaction.
func TestDoActionCannotCommit(t *testing.T) {
	db := newDB(t, 4)
	s := db.coord(t)
	key := uniqueKey("owned")
	_, err := idempg.Do(t.Context(), s, call(key), func(ctx context.Context, tx pgx.Tx) (int, error) {
		if err := tx.Commit(ctx); err == nil {
			t.Error("Commit of Do's transaction by the action: nil error")
		}
		if err := tx.Rollback(ctx); err == nil {
			t.Error("Rollback of Do's transaction by the action: nil error")
		}
		// A savepoint is the action's own.
		sp, err := tx.Begin(ctx)
		if err != nil {
			return 0, err
		}
		if err := insertLedger(ctx, sp, key, "savepoint"); err != nil {
			return 0, err
		}
		return 1, sp.Commit(ctx)
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := db.ledger(t, key); n != 1 {
		t.Errorf("ledger rows: %d, want 1", n)
	}
}

// A completed record lives for its TTL, on the database's clock; then the
// key runs again.
func TestDoRecordExpires(t *testing.T) {
	db := newDB(t, 4)
	s := db.coord(t, coordinator.WithMinTTL(time.Millisecond))
	key := uniqueKey("expires")
	c := call(key)
	c.TTL = 150 * time.Millisecond
	runs := 0
	action := func(ctx context.Context, tx pgx.Tx) (int, error) {
		runs++
		return runs, insertLedger(ctx, tx, key, fmt.Sprint(runs))
	}
	for _, want := range []int{1, 1} { // a run, then a replay within the TTL
		if v, err := idempg.Do(t.Context(), s, c, action); err != nil || v != want {
			t.Fatalf("Do = %d, %v; want %d", v, err, want)
		}
	}
	time.Sleep(300 * time.Millisecond)
	if rec := record(t, db.store(t), c.Operation, key); rec.State != idemstore.StateAbsent {
		t.Fatalf("record after its TTL = %+v, want absent", rec)
	}
	if v, err := idempg.Do(t.Context(), s, c, action); err != nil || v != 2 {
		t.Fatalf("Do after the TTL = %d, %v; want a second run", v, err)
	}
	if n := db.ledger(t, key); n != 2 {
		t.Errorf("ledger rows: %d, want 2", n)
	}
}

// The action runs with the session's lock_timeout, not the one Do's claim
// waits with.
func TestDoRestoresLockTimeout(t *testing.T) {
	db := newDB(t, 4)
	cfg := db.pool.Config()
	cfg.ConnConfig.RuntimeParams["lock_timeout"] = "7s"
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, mode := range []coordinator.InFlightMode{coordinator.InFlightWait, coordinator.InFlightRaise} {
		store, err := idempg.New(pool)
		if err != nil {
			t.Fatal(err)
		}
		s, err := coordinator.New(store, coordinator.WithInFlight(mode))
		if err != nil {
			t.Fatal(err)
		}
		got, err := idempg.Do(t.Context(), s, call(uniqueKey("lock-timeout")), func(ctx context.Context, tx pgx.Tx) (string, error) {
			var v string
			err := tx.QueryRow(ctx, "SHOW lock_timeout").Scan(&v)
			return v, err
		})
		if err != nil || got != "7s" {
			t.Errorf("mode %s: lock_timeout in the action = %q, %v; want the session's 7s", mode, got, err)
		}
	}
}

// eventLog is an Observer that keeps the kinds of the events of one key.
type eventLog struct {
	mu    sync.Mutex
	kinds []string
}

func (l *eventLog) Observe(_ context.Context, e idemevent.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := e.Kind.String()
	switch e.Kind {
	case idemevent.StorageCall:
		s += ":" + string(e.Method)
	case idemevent.InFlight:
		s += ":" + string(e.Mode)
	case idemevent.Waited:
		s += ":" + string(e.Outcome)
	case idemevent.Error:
		s += ":" + string(e.ErrorType)
	}
	l.kinds = append(l.kinds, s)
}

func (l *eventLog) take() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := strings.Join(l.kinds, " ")
	l.kinds = nil
	return s
}

// Do reports to the coordinator's observer what c.Do reports, so metrics,
// logs and spans see its calls; with the kill switch off it reports nothing
// and keeps no record.
func TestDoReportsEvents(t *testing.T) {
	db := newDB(t, 8)
	log := &eventLog{}
	c := db.coord(t, coordinator.WithObserver(log))
	raise := db.coord(t, coordinator.WithObserver(log), coordinator.WithInFlight(coordinator.InFlightRaise))
	key := uniqueKey("events")
	action := func(ctx context.Context, tx pgx.Tx) (string, error) { return "v", insertLedger(ctx, tx, key, "v") }

	steps := []struct {
		name string
		do   func() error
		want string
	}{
		{"first run", func() error { _, err := idempg.Do(t.Context(), c, call(key), action); return err },
			"storage_call:reserve miss storage_call:complete stored"},
		{"replay", func() error { _, err := idempg.Do(t.Context(), c, call(key), action); return err },
			"storage_call:reserve hit"},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := log.take(); got != st.want {
			t.Errorf("%s: events %q, want %q", st.name, got, st.want)
		}
	}
	first := call(key + "-fp")
	first.Fingerprint = "request-a"
	if _, err := idempg.Do(t.Context(), c, first, action); err != nil {
		t.Fatal(err)
	}
	log.take()
	reused := first
	reused.Fingerprint = "request-b"
	if _, err := idempg.Do(t.Context(), c, reused, action); !errors.Is(err, coordinator.ErrKeyReuse) {
		t.Fatalf("key reuse: %v", err)
	}
	if got, want := log.take(), "storage_call:reserve error:key_reuse"; got != want {
		t.Errorf("key reuse: events %q, want %q", got, want)
	}

	// A collision in mode raise with a transaction that holds the key.
	held := uniqueKey("events-held")
	release, open := gate(t)
	done := holdKey(t, c, held, release)
	log.take()
	if _, err := idempg.Do(t.Context(), raise, call(held), action); !errors.Is(err, coordinator.ErrInProgress) {
		t.Fatalf("raise: %v, want ErrInProgress", err)
	}
	if got, want := log.take(), "storage_call:reserve in_flight:raise"; got != want {
		t.Errorf("raise on a held key: events %q, want %q", got, want)
	}
	open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	log.take()

	// The kill switch off: the action runs in a transaction, no record, no
	// event.
	off := db.coord(t, coordinator.WithObserver(log), coordinator.WithEnabled(false))
	free := uniqueKey("events-off")
	for range 2 {
		if _, err := idempg.Do(t.Context(), off, call(free), func(ctx context.Context, tx pgx.Tx) (string, error) {
			return "", insertLedger(ctx, tx, free, "off")
		}); err != nil {
			t.Fatal(err)
		}
	}
	if n := db.ledger(t, free); n != 2 {
		t.Errorf("kill switch off: %d ledger rows, want 2 (every call runs)", n)
	}
	if rec := record(t, db.store(t), "test.op", free); rec.State != idemstore.StateAbsent {
		t.Errorf("kill switch off: record %+v, want none", rec)
	}
	if got := log.take(); got != "" {
		t.Errorf("kill switch off: events %q, want none", got)
	}
}

// Many callers meet an expired record at once: one takes the row over and
// runs, the others wait for its transaction and replay its result.
func TestDoConcurrentTakeover(t *testing.T) {
	db := newDB(t, 24)
	s := db.coord(t, coordinator.WithMinTTL(time.Millisecond))
	key := uniqueKey("takeover")
	c := call(key)
	c.TTL = 100 * time.Millisecond
	var runs atomic.Int32
	action := func(ctx context.Context, tx pgx.Tx) (int32, error) {
		n := runs.Add(1)
		time.Sleep(20 * time.Millisecond) // long enough for the others to meet the held row
		return n, insertLedger(ctx, tx, key, fmt.Sprint(n))
	}
	if _, err := idempg.Do(t.Context(), s, c, action); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the record expires (the row stays: no sweeper)
	c.TTL = time.Minute
	got := make([]int32, 20)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() {
			v, err := idempg.Do(t.Context(), s, c, action)
			if err != nil {
				t.Errorf("caller %d: %v", i, err)
			}
			got[i] = v
		})
	}
	wg.Wait()
	if runs.Load() != 2 || db.ledger(t, key) != 2 {
		t.Fatalf("runs %d, ledger rows %d; want 2 and 2 (the first, then one takeover)", runs.Load(), db.ledger(t, key))
	}
	for i, v := range got {
		if v != 2 {
			t.Errorf("caller %d got %d, want the takeover's 2", i, v)
		}
	}
}

// A session statement_timeout shorter than the wait does not cut the wait
// for a held key: Do answers ErrInProgress at its wait bound, not a storage
// error, and a coordinator over the same table waits instead of running
// unprotected (its default on-storage-error mode); the action still runs
// with the session's statement_timeout.
func TestSessionStatementTimeoutDoesNotCutTheWait(t *testing.T) {
	db := newDB(t, 8)
	cfg := db.pool.Config()
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = "200ms"
	short, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer short.Close()
	store, err := idempg.New(short)
	if err != nil {
		t.Fatal(err)
	}
	waiter, err := coordinator.New(store, coordinator.WithWaitTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()

	key := uniqueKey("statement-timeout")
	release, open := gate(t)
	done := holdKey(t, db.coord(t), key, release)

	_, err = idempg.Do(t.Context(), waiter, call(key), func(context.Context, pgx.Tx) (string, error) {
		t.Error("Do's action ran while the key was held")
		return "", nil
	})
	if !errors.Is(err, coordinator.ErrInProgress) {
		t.Errorf("Do on a held key with statement_timeout 200ms = %s, want ErrInProgress at the 1s wait bound", fmtErr(err))
	}
	_, err = coordinator.Do(t.Context(), waiter, call(key), func(context.Context) (string, error) {
		t.Error("the coordinator's action ran while Do held the key")
		return "", nil
	})
	if !errors.Is(err, coordinator.ErrInProgress) {
		t.Errorf("coordinator.Do on a key Do holds, statement_timeout 200ms = %s, want ErrInProgress", fmtErr(err))
	}
	open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	got, err := idempg.Do(t.Context(), waiter, call(uniqueKey("statement-timeout-action")), func(ctx context.Context, tx pgx.Tx) (string, error) {
		var v string
		err := tx.QueryRow(ctx, "SHOW statement_timeout").Scan(&v)
		return v, err
	})
	if err != nil || got != "200ms" {
		t.Errorf("statement_timeout in the action = %q, %v; want the session's 200ms", got, err)
	}
}

// A first run is three round trips: the claim (one batch of four
// statements: BEGIN, the settings with the lock wait, the INSERT, the read
// that puts the session's timeouts back), the action's own statement, and
// the completion with the COMMIT (one batch of two). A replay is the claim
// and its ROLLBACK until replays are most of the coordinator's calls, and
// then the read alone, before any claim. The first claim on a connection
// sends its BEGIN on its own, one round trip more (connTxs).
func TestDoRoundTrips(t *testing.T) {
	db := newDB(t, 1) // one connection, so that which claim is its first is known
	tr := &tracer{}
	c, err := coordinator.New(tracedStore(t, db, tr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx := t.Context()
	run := func(key string) func(ctx context.Context, tx pgx.Tx) (string, error) {
		return func(ctx context.Context, tx pgx.Tx) (string, error) {
			return "charged", insertLedger(ctx, tx, key, "trips")
		}
	}
	first, key := uniqueKey("trips-first"), uniqueKey("trips")
	for _, want := range []struct {
		name                     string
		key                      string
		batches, queries, maxLen int
		replayed                 bool
	}{
		{"the connection's first claim", first, 2, 2, 3, false},
		{"first run", key, 2, 1, 4, false},
		{"replay", key, 1, 1, 4, true},
		{"replay 2", key, 1, 1, 4, true},
		{"replay 3", key, 1, 1, 4, true},
		{"replay 4", key, 1, 1, 4, true},
		{"replay 5", key, 1, 1, 4, true},
		{"replay 6", key, 1, 1, 4, true},
		{"replay 7", key, 1, 1, 4, true},
		{"replay 8", key, 1, 1, 4, true},
		{"replay 9", key, 1, 1, 4, true},
		{"replay 10", key, 1, 1, 4, true},
		{"replay 11", key, 1, 1, 4, true},
		// Eleven replays in a row after two first runs: the coordinator
		// reads first.
		{"replay 12", key, 0, 1, 0, true},
		{"first run, reading first", uniqueKey("trips-read"), 2, 2, 4, false},
	} {
		tr.reset()
		res, err := idempg.DoResult(ctx, c, call(want.key), run(want.key))
		if err != nil || res.Value != "charged" || res.Replayed != want.replayed {
			t.Fatalf("%s = %+v, %s", want.name, res, fmtErr(err))
		}
		b, q := tr.counts()
		if b != want.batches || q != want.queries {
			t.Errorf("%s: %d batches and %d queries, want %d and %d", want.name, b, q, want.batches, want.queries)
		}
		if m := int(tr.maxStatements.Load()); m != want.maxLen {
			t.Errorf("%s: %d statements in its largest batch, want %d", want.name, m, want.maxLen)
		}
	}
	for _, k := range []string{first, key} {
		if n := db.ledger(t, k); n != 1 {
			t.Errorf("ledger rows of %s: %d, want 1", k, n)
		}
	}
}

// An action that deletes or changes its own key's record does not commit:
// the completion finds no claim to complete, and the COMMIT sent with it
// is not run.
func TestDoActionChangesItsRecord(t *testing.T) {
	db := newDB(t, 4)
	c := db.coord(t)
	ctx := t.Context()
	for name, sql := range map[string]string{
		"delete": `DELETE FROM idempotency_records WHERE key = $1`,
		"update": `UPDATE idempotency_records SET token = 'another' WHERE key = $1`,
	} {
		key := uniqueKey("changes-" + name)
		_, err := idempg.Do(ctx, c, call(key), func(ctx context.Context, tx pgx.Tx) (string, error) {
			if err := insertLedger(ctx, tx, key, name); err != nil {
				return "", err
			}
			_, err := tx.Exec(ctx, sql, key)
			return "charged", err
		})
		if !errors.Is(err, coordinator.ErrStorage) || !strings.Contains(err.Error(), "changed or deleted the key's record") {
			t.Errorf("%s: Do = %s, want ErrStorage saying the record changed", name, fmtErr(err))
		}
		if n := db.ledger(t, key); n != 0 {
			t.Errorf("%s: ledger rows: %d, want 0 (rolled back)", name, n)
		}
		v, err := idempg.Do(ctx, c, call(key), func(context.Context, pgx.Tx) (string, error) { return "retried", nil })
		if err != nil || v != "retried" {
			t.Errorf("%s: retry = %q, %s; want the action to run", name, v, fmtErr(err))
		}
	}
}

// The transaction an action kept is closed once Do returns, committed or
// rolled back: its connection serves other callers by then, so every use
// of it, or of a savepoint of it, is refused with pgx.ErrTxClosed and sends
// nothing.
func TestDoTxClosedAfterReturn(t *testing.T) {
	db := newDB(t, 1) // one connection: a statement that got through would run on the next caller's
	c := db.coord(t)
	ctx := t.Context()
	for _, fail := range []bool{false, true} {
		key := uniqueKey(fmt.Sprintf("kept-%t", fail))
		var kept, keptSP pgx.Tx
		_, err := idempg.Do(ctx, c, call(key), func(ctx context.Context, tx pgx.Tx) (string, error) {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return "", err
			}
			kept, keptSP = tx, sp
			if fail {
				return "", errors.New("declined")
			}
			return "charged", nil
		})
		if (err != nil) != fail {
			t.Fatalf("fail=%t: Do = %s", fail, fmtErr(err))
		}
		for name, tx := range map[string]pgx.Tx{"tx": kept, "savepoint": keptSP} {
			if _, err := tx.Exec(ctx, `INSERT INTO ledger (key, value) VALUES ($1, 'late')`, key); !errors.Is(err, pgx.ErrTxClosed) {
				t.Errorf("fail=%t: %s.Exec after Do returned = %v, want pgx.ErrTxClosed", fail, name, err)
			}
			var one int
			if err := tx.QueryRow(ctx, `SELECT 1`).Scan(&one); !errors.Is(err, pgx.ErrTxClosed) {
				t.Errorf("fail=%t: %s.QueryRow after Do returned = %v, want pgx.ErrTxClosed", fail, name, err)
			}
			if err := tx.SendBatch(ctx, &pgx.Batch{}).Close(); !errors.Is(err, pgx.ErrTxClosed) {
				t.Errorf("fail=%t: %s.SendBatch after Do returned = %v, want pgx.ErrTxClosed", fail, name, err)
			}
			if _, err := tx.Begin(ctx); !errors.Is(err, pgx.ErrTxClosed) {
				t.Errorf("fail=%t: %s.Begin after Do returned = %v, want pgx.ErrTxClosed", fail, name, err)
			}
		}
		if n := db.ledger(t, key); n != 0 {
			t.Errorf("fail=%t: ledger rows: %d, want 0", fail, n)
		}
	}
}

// The claims on one connection share the pgx.Tx that pgx began for its first
// claim (connTxs): each is a transaction of its own, whose savepoints and
// large objects work, whose rollback leaves nothing, and after which the
// next claim on the connection begins anew.
func TestDoReusesTheConnectionsTx(t *testing.T) {
	db := newDB(t, 1) // every claim on the one connection
	c := db.coord(t)
	ctx := t.Context()
	errBoom := errors.New("boom")
	for i := range 6 {
		key := uniqueKey(fmt.Sprintf("reuse-%d", i))
		fail := i%3 == 1
		got, err := idempg.Do(ctx, c, call(key), func(ctx context.Context, tx pgx.Tx) (string, error) {
			var status string
			if err := tx.QueryRow(ctx, "SELECT current_setting('transaction_isolation')").Scan(&status); err != nil {
				return "", err
			}
			if status != "read committed" {
				return "", fmt.Errorf("isolation %q, want read committed", status)
			}
			// A savepoint rolled back leaves nothing; one released keeps its row.
			sp, err := tx.Begin(ctx)
			if err != nil {
				return "", err
			}
			if err := insertLedger(ctx, sp, key, "rolled back"); err != nil {
				return "", err
			}
			if err := sp.Rollback(ctx); err != nil {
				return "", err
			}
			sp, err = tx.Begin(ctx)
			if err != nil {
				return "", err
			}
			if err := insertLedger(ctx, sp, key, "kept"); err != nil {
				return "", err
			}
			if err := sp.Commit(ctx); err != nil {
				return "", err
			}
			// A large object, written and read back in the transaction.
			los := tx.LargeObjects()
			oid, err := los.Create(ctx, 0)
			if err != nil {
				return "", err
			}
			lo, err := los.Open(ctx, oid, pgx.LargeObjectModeRead|pgx.LargeObjectModeWrite)
			if err != nil {
				return "", err
			}
			if _, err := lo.Write([]byte(key)); err != nil {
				return "", err
			}
			if _, err := lo.Seek(0, io.SeekStart); err != nil {
				return "", err
			}
			back, err := io.ReadAll(lo)
			if err != nil {
				return "", err
			}
			if err := lo.Close(); err != nil {
				return "", err
			}
			if err := los.Unlink(ctx, oid); err != nil {
				return "", err
			}
			if fail {
				return "", errBoom
			}
			return string(back), nil
		})
		want := 1
		switch {
		case fail && !errors.Is(err, errBoom):
			t.Fatalf("claim %d: Do = %s, want the action's error", i, fmtErr(err))
		case fail:
			want = 0
		case err != nil || got != key:
			t.Fatalf("claim %d: Do = %q, %s; want %q", i, got, fmtErr(err), key)
		}
		if n := db.ledger(t, key); n != want {
			t.Errorf("claim %d: %d ledger rows, want %d", i, n, want)
		}
	}
	var idle string
	if err := db.pool.QueryRow(ctx, "SELECT current_setting('idle_in_transaction_session_timeout')").Scan(&idle); err != nil {
		t.Fatal(err)
	}
	if idle != "0" {
		t.Errorf("idle_in_transaction_session_timeout after the claims = %q, want the session's 0: a claim's settings are its transaction's", idle)
	}
}

// The Tx kept for connections that have closed are dropped: a pool whose
// connections are replaced keeps a bounded number.
func TestDoDropsTheTxOfClosedConnections(t *testing.T) {
	db := newDB(t, 1)
	s := db.store(t)
	c, err := coordinator.New(s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx := t.Context()
	for i := range 200 {
		key := uniqueKey(fmt.Sprintf("closed-%d", i))
		if _, err := idempg.Do(ctx, c, call(key), func(ctx context.Context, tx pgx.Tx) (string, error) {
			return "ok", insertLedger(ctx, tx, key, "x")
		}); err != nil {
			t.Fatalf("claim %d: %s", i, fmtErr(err))
		}
		db.pool.Reset() // closes the connection: the next claim gets a new one
	}
	if n := s.KeptTxs(); n < 1 || n > 65 {
		t.Errorf("%d Tx kept after 200 connections, want 1 to 65", n)
	}
}
