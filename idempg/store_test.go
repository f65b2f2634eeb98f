package idempg_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/coordinator/storetest"
	"github.com/idemkit/idempotency/idempg"
)

// TestConformance runs the Store conformance suite against the real server,
// on its clock (the suite sleeps).
func TestConformance(t *testing.T) {
	db := newDB(t, 16)
	s := db.store(t)
	storetest.TestStore(t, func(t *testing.T) storetest.Harness {
		return storetest.Harness{
			Store: s,
			Corrupt: func(t *testing.T, key idemstore.Key) {
				t.Helper()
				corrupt(t, db, key)
			},
		}
	})
}

// corrupt plants a row under key that the Store cannot read: a state of a
// format it does not know, alive for a minute.
func corrupt(t *testing.T, db *testDB, key idemstore.Key) {
	t.Helper()
	_, err := db.pool.Exec(context.Background(), `INSERT INTO idempotency_records
		(operation, key, state, token, fingerprint, result, expires_at)
		VALUES ($1, $2, 'v9:sealed', '', '', '\xff00'::bytea, clock_timestamp() + interval '1 minute')
		ON CONFLICT (operation, key) DO UPDATE SET state = EXCLUDED.state, token = EXCLUDED.token,
			fingerprint = EXCLUDED.fingerprint, result = EXCLUDED.result, expires_at = EXCLUDED.expires_at`,
		key.Operation, key.Key)
	if err != nil {
		t.Fatalf("plant an unreadable record: %v", err)
	}
}

func TestMigrate(t *testing.T) {
	db := newEmptyDB(t, 4)
	ctx := t.Context()
	if err := idempg.CheckSchema(ctx, db.pool); !errors.Is(err, idempg.ErrSchema) {
		t.Fatalf("CheckSchema of an empty schema = %v, want ErrSchema", err)
	}
	// Processes that start at once all migrate.
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { errs[i] = idempg.Migrate(ctx, db.pool) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent Migrate %d: %v", i, err)
		}
	}
	if err := idempg.Migrate(ctx, db.pool); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	if err := idempg.CheckSchema(ctx, db.pool); err != nil {
		t.Fatalf("CheckSchema after Migrate: %v", err)
	}
	var versions int
	if err := db.pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_schema").Scan(&versions); err != nil || versions != 1 {
		t.Fatalf("idempotency_schema rows = %d, %v; want 1", versions, err)
	}
	// The Schema constant, applied by hand, is idempotent too.
	if _, err := db.pool.Exec(ctx, idempg.Schema); err != nil {
		t.Fatalf("apply Schema over a migrated database: %v", err)
	}

	// A database migrated by a newer idempg.
	if _, err := db.pool.Exec(ctx, "INSERT INTO idempotency_schema (version) VALUES ($1)", idempg.SchemaVersion+1); err != nil {
		t.Fatal(err)
	}
	if err := idempg.CheckSchema(ctx, db.pool); !errors.Is(err, idempg.ErrSchema) {
		t.Fatalf("CheckSchema of a newer schema = %v, want ErrSchema", err)
	}
	if err := idempg.Migrate(ctx, db.pool); !errors.Is(err, idempg.ErrSchema) {
		t.Fatalf("Migrate of a newer schema = %v, want ErrSchema", err)
	}
}

// schemaV1 is schema version 1, as idempg shipped it: the records and the
// versions, no steps.
const schemaV1 = `CREATE TABLE idempotency_records (
    operation text COLLATE "C" NOT NULL, key text COLLATE "C" NOT NULL, state text NOT NULL,
    token text NOT NULL, fingerprint text NOT NULL DEFAULT '', result bytea,
    expires_at timestamptz NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (operation, key));
CREATE INDEX idempotency_records_expires_at_idx ON idempotency_records (expires_at);
CREATE TABLE idempotency_schema (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now());
INSERT INTO idempotency_schema (version) VALUES (1);`

// A database at version 1 fails CheckSchema, and Migrate brings it to
// version 2 with its records kept.
func TestMigrateFromVersion1(t *testing.T) {
	db := newEmptyDB(t, 2)
	ctx := t.Context()
	if _, err := db.pool.Exec(ctx, schemaV1+`
INSERT INTO idempotency_records (operation, key, state, token, result, expires_at)
VALUES ('op', 'k', 'completed', 't', '"kept"', clock_timestamp() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	err := idempg.CheckSchema(ctx, db.pool)
	if !errors.Is(err, idempg.ErrSchema) || !strings.Contains(err.Error(), "schema version 1, this idempg needs 2: run idempg.Migrate") {
		t.Fatalf("CheckSchema at version 1 = %v, want ErrSchema asking for Migrate", err)
	}
	if err := idempg.Migrate(ctx, db.pool); err != nil {
		t.Fatalf("Migrate from version 1: %v", err)
	}
	if err := idempg.CheckSchema(ctx, db.pool); err != nil {
		t.Fatalf("CheckSchema after Migrate: %v", err)
	}
	var steps bool
	var result string
	if err := db.pool.QueryRow(ctx, `SELECT to_regclass('idempotency_steps') IS NOT NULL,
		(SELECT convert_from(result, 'UTF8') FROM idempotency_records WHERE key = 'k')`).Scan(&steps, &result); err != nil || !steps || result != `"kept"` {
		t.Fatalf("after Migrate: steps table %v, record %q, %v; want the table and the record kept", steps, result, err)
	}
}

func TestNew(t *testing.T) {
	if _, err := idempg.New(nil); err == nil {
		t.Error("New(nil) = nil error, want one")
	}
	if _, err := idempg.New((*fakeDB)(nil)); err != nil {
		t.Errorf("New: %v", err)
	}
}

// Do needs a coordinator over an idempg Store: any other is an invalid
// request, and the action does not run.
func TestDoRefusesAnotherStore(t *testing.T) {
	other, err := coordinator.New(memstore.New())
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*coordinator.Coordinator{"nil": nil, "memstore": other} {
		_, err := idempg.Do(t.Context(), c, coordinator.Call{Operation: "test.op", Key: "k"}, func(context.Context, pgx.Tx) (int, error) {
			t.Errorf("%s: the action ran", name)
			return 0, nil
		})
		if !errors.Is(err, coordinator.ErrInvalidRequest) {
			t.Errorf("%s: Do = %v, want ErrInvalidRequest", name, err)
		}
	}
	if !strings.Contains(fmtErr(func() error {
		_, err := idempg.Do(t.Context(), other, coordinator.Call{Operation: "test.op", Key: "k"}, func(context.Context, pgx.Tx) (int, error) { return 0, nil })
		return err
	}()), "not an *idempg.Store") {
		t.Error("the error does not name the coordinator's store")
	}
}

// fakeDB is a DB that is never called.
type fakeDB struct{ idempg.DB }

// A record's TTL is the database's clock: a record planted with an
// expires_at in the past is absent for every method, and the next writer
// takes the key.
func TestExpiredRowIsAbsent(t *testing.T) {
	db := newDB(t, 4)
	s := db.store(t)
	ctx := t.Context()
	key := idemstore.Key{Operation: "test.op", Key: uniqueKey("expired")}
	if _, err := db.pool.Exec(ctx, `INSERT INTO idempotency_records (operation, key, state, token, result, expires_at)
		VALUES ($1, $2, 'completed', 'old', 'x', clock_timestamp() - interval '1 second')`, key.Operation, key.Key); err != nil {
		t.Fatal(err)
	}
	if rec := record(t, s, key.Operation, key.Key); rec.State != idemstore.StateAbsent {
		t.Fatalf("Get of an expired row = %+v, want absent", rec)
	}
	for name, f := range map[string]func() (bool, error){
		"Complete": func() (bool, error) {
			return s.Complete(ctx, key, "old", idemstore.Completion{State: idemstore.StateCompleted, TTL: time.Minute})
		},
		"Release": func() (bool, error) { return s.Release(ctx, key, "old") },
		"Renew":   func() (bool, error) { return s.Renew(ctx, key, "old", time.Minute) },
	} {
		if ok, err := f(); ok || err != nil {
			t.Errorf("%s of an expired row = %v, %v; want false, nil", name, ok, err)
		}
	}
	rec, ok, err := s.Reserve(ctx, key, idemstore.Write{State: idemstore.StatePending, Token: "new", TTL: time.Minute})
	if err != nil || !ok {
		t.Fatalf("Reserve over an expired row = %+v, %v, %v; want written", rec, ok, err)
	}
	if rec := record(t, s, key.Operation, key.Key); rec.State != idemstore.StatePending || rec.Token != "new" {
		t.Fatalf("Get after Reserve = %+v, want pending with token new", rec)
	}
}

func TestSweep(t *testing.T) {
	db := newDB(t, 4)
	s := db.store(t)
	ctx := t.Context()
	// 250 expired rows, 10 live ones.
	if _, err := db.pool.Exec(ctx, `INSERT INTO idempotency_records (operation, key, state, token, expires_at)
		SELECT 'test.op', 'expired-' || i, 'pending', 't', clock_timestamp() - i * interval '1 second'
		FROM generate_series(1, 250) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.pool.Exec(ctx, `INSERT INTO idempotency_records (operation, key, state, token, expires_at)
		SELECT 'test.op', 'live-' || i, 'pending', 't', clock_timestamp() + interval '1 hour'
		FROM generate_series(1, 10) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sweep(ctx, 0); err == nil {
		t.Error("Sweep with limit 0: nil error, want one")
	}
	n, err := s.Sweep(ctx, 100)
	if err != nil || n != 100 {
		t.Fatalf("Sweep(100) = %d, %v; want 100", n, err)
	}
	// The oldest first: the rows that expired 151 to 250 seconds ago.
	var oldest int
	if err := db.pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_records WHERE key IN ('expired-250', 'expired-151')`).Scan(&oldest); err != nil || oldest != 0 {
		t.Errorf("the oldest expired rows left after the first batch: %d, %v; want 0", oldest, err)
	}
	if n, err = s.Sweep(ctx, 100); err != nil || n != 100 {
		t.Fatalf("second Sweep(100) = %d, %v; want 100", n, err)
	}
	if n, err = s.Sweep(ctx, 100); err != nil || n != 50 {
		t.Fatalf("third Sweep(100) = %d, %v; want 50", n, err)
	}
	if got := db.rows(t); got != 10 {
		t.Fatalf("rows after sweeping = %d, want the 10 live ones", got)
	}

	// The sweeper finds expired rows through the index on expires_at (with
	// sequential scans off: on a table this small the planner would rather
	// scan it).
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, "SET LOCAL enable_seqscan = off"); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, "EXPLAIN (COSTS OFF) "+idempg.SweepSQL, 100)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(plan, "\n"), "idempotency_records_expires_at_idx") {
		t.Errorf("the sweep does not use the index on expires_at:\n%s", strings.Join(plan, "\n"))
	}
}

// A row that a transaction holds is skipped, not waited for.
func TestSweepSkipsLockedRows(t *testing.T) {
	db := newDB(t, 4)
	s := db.store(t)
	ctx := t.Context()
	if _, err := db.pool.Exec(ctx, `INSERT INTO idempotency_records (operation, key, state, token, expires_at)
		VALUES ('test.op', 'a', 'pending', 't', clock_timestamp() - interval '1 second'),
		       ('test.op', 'b', 'pending', 't', clock_timestamp() - interval '1 second')`); err != nil {
		t.Fatal(err)
	}
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, "SELECT 1 FROM idempotency_records WHERE key = 'a' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := s.Sweep(sctx, 10)
	if err != nil || n != 1 {
		t.Fatalf("Sweep with one expired row locked = %d, %v; want 1 (the other)", n, err)
	}
}

func TestSweeper(t *testing.T) {
	db := newDB(t, 4)
	s := db.store(t)
	ctx := t.Context()
	if _, err := s.StartSweeper(0, 10, nil); err == nil {
		t.Error("StartSweeper with interval 0: nil error, want one")
	}
	if _, err := db.pool.Exec(ctx, `INSERT INTO idempotency_records (operation, key, state, token, expires_at)
		SELECT 'test.op', 'expired-' || i, 'pending', 't', clock_timestamp() - interval '1 second'
		FROM generate_series(1, 35) i`); err != nil {
		t.Fatal(err)
	}
	var errs atomic.Int32
	w, err := s.StartSweeper(20*time.Millisecond, 10, func(error) { errs.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for db.rows(t) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("rows left after 10s of sweeping: %d", db.rows(t))
		}
		time.Sleep(10 * time.Millisecond)
	}
	w.Stop()
	w.Stop() // twice is fine
	if errs.Load() != 0 {
		t.Errorf("the sweeper reported %d errors", errs.Load())
	}
}

// A key that Do's transaction holds: Reserve waits for the transaction
// within its deadline, then reports a pending record, so that a
// coordinator waits rather than runs; once Do commits, Reserve gets the
// completed record.
func TestReserveWhileDoHolds(t *testing.T) {
	db := newDB(t, 8)
	c := db.coord(t)
	s := db.store(t)
	key := uniqueKey("held")
	k := idemstore.Key{Operation: "test.op", Key: key}
	inside := make(chan struct{})
	release, open := gate(t)
	done := make(chan error, 1)
	go func() {
		_, err := idempg.Do(context.Background(), c, call(key), func(ctx context.Context, tx pgx.Tx) (string, error) {
			close(inside)
			<-release
			return "held result", insertLedger(ctx, tx, key, "1")
		})
		done <- err
	}()
	<-inside

	if rec := record(t, s, k.Operation, k.Key); rec.State != idemstore.StateAbsent {
		t.Errorf("Get while Do holds the key = %+v, want absent (the claim is not committed)", rec)
	}
	// The lock wait ends at three quarters of the deadline, 1.5s: the answer
	// comes before the deadline, or the call fails with ctx's error.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	rec, ok, err := s.Reserve(ctx, k, idemstore.Write{State: idemstore.StatePending, Token: "plain", TTL: time.Minute})
	cancel()
	if err != nil || ok || rec.State != idemstore.StatePending || rec.Token != "" {
		t.Fatalf("Reserve while Do holds the key = %+v, %v, %v; want pending with no token, not written", rec, ok, err)
	}

	// A Reserve that is waiting when Do commits gets the completed record.
	type out struct {
		rec idemstore.Record
		ok  bool
		err error
	}
	got := make(chan out, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		rec, ok, err := s.Reserve(ctx, k, idemstore.Write{State: idemstore.StatePending, Token: "plain", TTL: time.Minute})
		got <- out{rec, ok, err}
	}()
	time.Sleep(100 * time.Millisecond)
	open()
	if err := <-done; err != nil {
		t.Fatalf("Do: %v", err)
	}
	o := <-got
	if o.err != nil || o.ok || o.rec.State != idemstore.StateCompleted || string(o.rec.Result) != `"held result"` {
		t.Fatalf("Reserve that waited for Do's commit = %+v, %v, %v; want the completed record", o.rec, o.ok, o.err)
	}
}
