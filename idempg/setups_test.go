package idempg_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idempg"
	"github.com/idemkit/idempotency/idempg/internal/pgtest"
)

// The PostgreSQL setups that production runs and that broke the store
// before (issue 39): a database whose default isolation is SERIALIZABLE or
// REPEATABLE READ, and a PgBouncer in transaction pooling mode (with pgx's
// exec mode, as docs/stores.md says). On each, 50 callers on 5 keys, through
// the coordinator's path (in its default on-storage-error mode, run) and
// through the transactional call, leave exactly one effect row per key, and
// no call takes the run fallback.
func TestProductionSetups(t *testing.T) {
	setups := []struct {
		name string
		open func(t *testing.T) *testDB
	}{
		{"serializable", func(t *testing.T) *testDB { return isolatedDB(t, "serializable") }},
		{"repeatable_read", func(t *testing.T) *testDB { return isolatedDB(t, "repeatable read") }},
		{"pgbouncer_transaction_mode", bouncerDB},
	}
	paths := []struct {
		name string
		call func(ctx context.Context, c *coordinator.Coordinator, db *testDB, key string) error
	}{
		{"coordinator", func(ctx context.Context, c *coordinator.Coordinator, db *testDB, key string) error {
			_, err := coordinator.Do(ctx, c, call(key), func(ctx context.Context) (string, error) {
				_, err := db.pool.Exec(ctx, "INSERT INTO ledger (key, value) VALUES ($1, 'coordinator')", key)
				return "done", err
			})
			return err
		}},
		{"transactional", func(ctx context.Context, c *coordinator.Coordinator, db *testDB, key string) error {
			_, err := idempg.Do(ctx, c, call(key), func(ctx context.Context, tx pgx.Tx) (string, error) {
				return "done", insertLedger(ctx, tx, key, "transactional")
			})
			return err
		}},
	}
	for _, setup := range setups {
		t.Run(setup.name, func(t *testing.T) {
			db := setup.open(t)
			for _, path := range paths {
				t.Run(path.name, func(t *testing.T) {
					var unprotected, conflicts atomic.Int64
					obs := idemevent.ObserverFunc(func(_ context.Context, e idemevent.Event) {
						if e.Kind == idemevent.Unprotected {
							unprotected.Add(1)
						}
						if e.Err != nil && (errors.Is(e.Err, coordinator.ErrConflict) || errors.Is(e.Err, coordinator.ErrMisconfigured)) {
							conflicts.Add(1)
						}
					})
					c := db.coord(t, coordinator.WithObserver(obs))
					keys := make([]string, 5)
					for i := range keys {
						keys[i] = uniqueKey(setup.name + "-" + path.name)
					}
					var wg sync.WaitGroup
					errs := make(chan error, 50)
					for i := range 50 {
						wg.Go(func() {
							if err := path.call(t.Context(), c, db, keys[i%len(keys)]); err != nil {
								errs <- err
							}
						})
					}
					wg.Wait()
					close(errs)
					for err := range errs {
						t.Errorf("call: %s", fmtErr(err))
					}
					for _, key := range keys {
						if n := db.ledger(t, key); n != 1 {
							t.Errorf("key %s: %d ledger rows, want 1", key, n)
						}
					}
					if n := unprotected.Load(); n != 0 {
						t.Errorf("%d calls ran unprotected", n)
					}
					if n := conflicts.Load(); n != 0 {
						t.Errorf("%d store errors were conflicts or refusals", n)
					}
				})
			}
		})
	}
}

// isolatedDB is newDB with a pool whose sessions default to isolation.
func isolatedDB(t *testing.T, isolation string) *testDB {
	t.Helper()
	db := newDB(t, 20)
	cfg := db.pool.Config()
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = isolation
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	var got string
	if err := pool.QueryRow(t.Context(), "SHOW default_transaction_isolation").Scan(&got); err != nil || got != isolation {
		t.Fatalf("default_transaction_isolation = %q (%v), want %q", got, err, isolation)
	}
	return &testDB{schema: db.schema, pool: pool}
}

// bouncerDB is a database of its own, migrated, with a ledger, whose
// default isolation is SERIALIZABLE, reached through a PgBouncer in
// transaction pooling mode with pgx's exec mode (docs/stores.md).
func bouncerDB(t *testing.T) *testDB {
	t.Helper()
	name, dsn := bouncer(t)
	pool, err := pgxpool.New(context.Background(), dsn+" pool_max_conns=20 default_query_exec_mode=exec")
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return &testDB{schema: name, pool: pool}
}

// bouncer creates a database of its own, migrated, with a ledger, whose
// default isolation is SERIALIZABLE, and starts a PgBouncer in transaction
// pooling mode in front of it; it returns the database's name and the
// connection string through the PgBouncer.
func bouncer(t *testing.T) (name, dsn string) {
	t.Helper()
	if server == nil {
		pgtest.Skip(t, serverErr)
	}
	name = "b_" + strings.ToLower(uniqueKey("db")[3:])
	if err := pgtest.CreateDatabase(t.Context(), server.DSN, name); err != nil {
		t.Fatal(err)
	}
	direct, err := pgx.Connect(t.Context(), strings.Replace(server.DSN, "dbname=postgres", "dbname="+name, 1))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer direct.Close(context.Background())
	if err := idempg.Migrate(t.Context(), direct); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	for _, sql := range []string{
		"CREATE TABLE ledger (key text NOT NULL, value text NOT NULL)",
		"ALTER DATABASE " + name + " SET default_transaction_isolation = 'serializable'",
	} {
		if _, err := direct.Exec(t.Context(), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	b, err := server.StartPgBouncer(name)
	if err != nil {
		pgtest.SkipPgBouncer(t, err)
	}
	t.Cleanup(b.Stop)
	return name, b.DSN
}

// failWrites makes the next n writes of keys that start with prefix fail
// with SQLSTATE code, through a trigger on the records table: a fault of
// the real server. The count is a sequence, which a rollback does not undo.
func (db *testDB) failWrites(t *testing.T, prefix, code string, n int) {
	t.Helper()
	db.failOn(t, "INSERT OR UPDATE", prefix, code, n)
}

// failOn is failWrites for the statements of events ("UPDATE": the
// completion of a claim, and not the claim).
func (db *testDB) failOn(t *testing.T, events, prefix, code string, n int) {
	t.Helper()
	for _, sql := range []string{
		"CREATE SEQUENCE fault_seq",
		`CREATE FUNCTION fault() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.key LIKE '` + prefix + `%' AND nextval('fault_seq') <= ` + strconv.Itoa(n) + ` THEN
		RAISE EXCEPTION 'injected fault' USING ERRCODE = '` + code + `';
	END IF;
	RETURN NEW;
END $$`,
		"CREATE TRIGGER fault BEFORE " + events + " ON idempotency_records FOR EACH ROW EXECUTE FUNCTION fault()",
	} {
		if _, err := db.pool.Exec(t.Context(), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
}

// injected returns how many writes the trigger saw, the faults it raised
// first.
func (db *testDB) injected(t *testing.T) int {
	t.Helper()
	var n int
	if err := db.pool.QueryRow(t.Context(), "SELECT last_value - CASE WHEN is_called THEN 0 ELSE 1 END FROM fault_seq").Scan(&n); err != nil {
		t.Fatalf("read fault_seq: %v", err)
	}
	return n
}

// A serialization failure or a deadlock is sent again within the deadline;
// one that lasts is a *StorageError that matches ErrConflict, and the action
// does not run in the default mode, run. A prepared statement that a pooler
// ran on the wrong connection, or a write to a read-only server, is not
// retried and matches ErrMisconfigured.
func TestStoreConflicts(t *testing.T) {
	cases := []struct {
		name, code string
		faults     int
		want       error // nil: the call goes through
		attempts   int   // faults raised
	}{
		{"serialization_failure_passes", "40001", 3, nil, 3},
		{"deadlock_passes", "40P01", 3, nil, 3},
		{"serialization_failure_lasts", "40001", 1000, coordinator.ErrConflict, -1},
		{"duplicate_prepared_statement", "42P05", 1000, coordinator.ErrMisconfigured, 1},
		{"prepared_statement_missing", "26000", 1000, coordinator.ErrMisconfigured, 1},
		// A standby, or a primary demoted by a failover, answers every
		// write so: the store is not down, and mode run must not run.
		{"read_only_sql_transaction", "25006", 1000, coordinator.ErrMisconfigured, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			db := newDB(t, 4)
			db.failWrites(t, "fault-", tc.code, tc.faults)
			c := db.coord(t) // on-storage-error mode run
			key := uniqueKey("fault")
			runs := 0
			v, err := coordinator.Do(t.Context(), c, call(key), func(context.Context) (string, error) {
				runs++
				return "ran", nil
			})
			if tc.want == nil {
				if err != nil || v != "ran" || runs != 1 {
					t.Fatalf("Do = %q, %s after %d runs, want ran once", v, fmtErr(err), runs)
				}
				if got := record(t, db.store(t), "test.op", key); got.State != idemstore.StateCompleted {
					t.Fatalf("record %v, want completed", got.State)
				}
			} else {
				var se *coordinator.StorageError
				if !errors.As(err, &se) || !errors.Is(err, tc.want) || runs != 0 {
					t.Fatalf("Do = %s after %d runs, want a *StorageError matching %v and no run", fmtErr(err), runs, tc.want)
				}
			}
			switch n := min(db.injected(t), tc.faults); {
			case tc.attempts >= 0 && n != tc.attempts:
				t.Fatalf("%d faults raised, want %d", n, tc.attempts)
			case tc.attempts < 0 && n < 2:
				t.Fatalf("%d faults raised, want retries", n)
			}
		})
	}
}
