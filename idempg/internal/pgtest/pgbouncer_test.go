package pgtest_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idempotency/idempg/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	server    *pgtest.Server
	serverErr error
)

func TestMain(m *testing.M) {
	server, serverErr = pgtest.Start()
	if serverErr != nil && (!errors.Is(serverErr, pgtest.ErrNotFound) || pgtest.Required()) {
		fmt.Fprintln(os.Stderr, serverErr)
		os.Exit(1)
	}
	os.Exit(pgtest.Run(m, server))
}

// startBouncer creates a database for the test and starts a bouncer in front
// of it, which the test's cleanup stops.
func startBouncer(t *testing.T) *pgtest.PgBouncer {
	t.Helper()
	if server == nil {
		pgtest.Skip(t, serverErr)
	}
	db := strings.ToLower(t.Name())
	if err := pgtest.CreateDatabase(t.Context(), server.DSN, db); err != nil {
		t.Fatal(err)
	}
	b, err := server.StartPgBouncer(db)
	if err != nil {
		pgtest.SkipPgBouncer(t, err)
	}
	t.Cleanup(b.Stop)
	return b
}

// TestPgBouncerConnects checks that a connection through the bouncer
// reaches the database it was started for, and that the bouncer hides the
// server connection: the process id the client was given is not that of
// the backend that runs its queries.
func TestPgBouncerConnects(t *testing.T) {
	b := startBouncer(t)
	if !strings.Contains(b.DSN, fmt.Sprintf("host=127.0.0.1 port=%d ", b.Port)) {
		t.Errorf("DSN %q does not connect to 127.0.0.1:%d", b.DSN, b.Port)
	}
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, b.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var db string
	var backend uint32
	if err := conn.QueryRow(ctx, "SELECT current_database(), pg_backend_pid()").Scan(&db, &backend); err != nil {
		t.Fatal(err)
	}
	if db != "testpgbouncerconnects" {
		t.Errorf("current_database() = %q through the bouncer, want testpgbouncerconnects", db)
	}
	if pid := conn.PgConn().PID(); pid == backend {
		t.Errorf("the client's backend key data has pid %d, the backend's: not talking to pgbouncer", pid)
	}
}

// TestPgBouncerTransactionPooling checks that the bouncer pools by
// transaction: two client connections, one after the other, run their
// statements on the one server connection, so the statement pgx prepares
// (under the same name, from the same SQL) on the second collides with the
// first's, which no reset query has dropped.
func TestPgBouncerTransactionPooling(t *testing.T) {
	b := startBouncer(t)
	ctx := t.Context()
	const sql = "SELECT $1::int + 1 -- TestPgBouncerTransactionPooling"
	var errs []error
	for i := range 2 {
		conn, err := pgx.Connect(ctx, b.DSN) // QueryExecModeCacheStatement
		if err != nil {
			t.Fatal(err)
		}
		var n int
		errs = append(errs, conn.QueryRow(ctx, sql, i).Scan(&n))
		if err := conn.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if errs[0] != nil {
		t.Fatalf("first connection: %v", errs[0])
	}
	var pgErr *pgconn.PgError
	if !errors.As(errs[1], &pgErr) || (pgErr.Code != "42P05" && pgErr.Code != "26000") {
		t.Fatalf("second connection: err = %v, want a prepared statement error (42P05 or 26000): not transaction pooling?", errs[1])
	}
	t.Logf("second connection, as expected: %v", pgErr)
}

// TestPgBouncerExecMode checks that with default_query_exec_mode=exec,
// which prepares no named statement, 200 concurrent transactions over a
// pool of 8 connections through the bouncer all succeed.
func TestPgBouncerExecMode(t *testing.T) {
	b := startBouncer(t)
	ctx := t.Context()
	cfg, err := pgxpool.ParseConfig(b.DSN + " pool_max_conns=8 default_query_exec_mode=exec")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	const n = 200
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			errs[i] = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var got int
				if err := tx.QueryRow(ctx, "SELECT $1::int", i).Scan(&got); err != nil {
					return err
				}
				if got != i {
					return fmt.Errorf("SELECT $1::int with %d = %d", i, got)
				}
				_, err := tx.Exec(ctx, "SELECT pg_backend_pid() WHERE $1::int >= 0", i)
				return err
			})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}
