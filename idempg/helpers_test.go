package idempg_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idempg"
	"github.com/idemkit/idempotency/idempg/internal/pgtest"
)

// testDB is a schema of its own on the test server, with the idempg tables
// (migrated) and a ledger table for the actions' effects.
type testDB struct {
	schema string
	pool   *pgxpool.Pool
}

// newDB creates a fresh schema, migrated, and a pool of up to maxConns
// connections whose search_path is that schema; both go away with t.
func newDB(t *testing.T, maxConns int32) *testDB {
	t.Helper()
	db := newEmptyDB(t, maxConns)
	if err := idempg.Migrate(t.Context(), db.pool); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if _, err := db.pool.Exec(t.Context(), `CREATE TABLE ledger (key text NOT NULL, value text NOT NULL)`); err != nil {
		t.Fatalf("create ledger: %v", err)
	}
	return db
}

// newEmptyDB is newDB without the tables.
func newEmptyDB(t *testing.T, maxConns int32) *testDB {
	t.Helper()
	if server == nil {
		pgtest.Skip(t, serverErr)
	}
	schema := "t_" + strings.ToLower(rand.Text()[:12])
	admin, err := pgx.Connect(t.Context(), server.DSN)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(t.Context(), "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	pool := newPool(t, schema, maxConns)
	return &testDB{schema: schema, pool: pool}
}

// newPool returns a pool on the test server with search_path schema.
func newPool(t *testing.T, schema string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(server.DSN)
	if err != nil {
		t.Fatalf("parse DSN: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// store returns a Store on db; it fails the test on an error.
func (db *testDB) store(t *testing.T) *idempg.Store {
	t.Helper()
	s, err := idempg.New(db.pool)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

// coord returns a coordinator with opts over a Store on db, as the
// transactional call takes it; it fails the test on an error.
func (db *testDB) coord(t *testing.T, opts ...coordinator.Option) *coordinator.Coordinator {
	t.Helper()
	c, err := coordinator.New(db.store(t), opts...)
	if err != nil {
		t.Fatalf("coordinator.New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// ledger returns the number of ledger rows of key.
func (db *testDB) ledger(t *testing.T, key string) int {
	t.Helper()
	var n int
	if err := db.pool.QueryRow(context.Background(), "SELECT count(*) FROM ledger WHERE key = $1", key).Scan(&n); err != nil {
		t.Fatalf("count ledger rows: %v", err)
	}
	return n
}

// rows returns the number of rows of idempotency_records, expired or not.
func (db *testDB) rows(t *testing.T) int {
	t.Helper()
	var n int
	if err := db.pool.QueryRow(context.Background(), "SELECT count(*) FROM idempotency_records").Scan(&n); err != nil {
		t.Fatalf("count records: %v", err)
	}
	return n
}

// record returns the live record of key as the Store reports it.
func record(t *testing.T, s idemstore.Store, op, key string) idemstore.Record {
	t.Helper()
	rec, err := s.Get(context.Background(), idemstore.Key{Operation: op, Key: key})
	if err != nil {
		t.Fatalf("Get(%s:%s): %v", op, key, err)
	}
	return rec
}

// insertLedger is an action's effect: a ledger row of key, through tx.
func insertLedger(ctx context.Context, tx pgx.Tx, key, value string) error {
	_, err := tx.Exec(ctx, "INSERT INTO ledger (key, value) VALUES ($1, $2)", key, value)
	return err
}

// uniqueKey returns a key nobody else uses.
func uniqueKey(name string) string { return name + "-" + rand.Text()[:10] }

// within fails the test unless d is at most limit.
func within(t *testing.T, what string, d, limit time.Duration) {
	t.Helper()
	if d > limit {
		t.Errorf("%s took %v, want at most %v", what, d, limit)
	}
}

// call returns a Call of operation "test.op" with key.
func call(key string) coordinator.Call {
	return coordinator.Call{Operation: "test.op", Key: key}
}

func fmtErr(err error) string {
	if err == nil {
		return "nil"
	}
	return fmt.Sprintf("%T %v", err, err)
}

// gate returns a channel that open closes, once however often it is
// called; t's cleanup opens it too, so that an action blocked on it after a
// failed test lets its transaction, and the pool, go.
func gate(t *testing.T) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	open := sync.OnceFunc(func() { close(ch) })
	t.Cleanup(open)
	return ch, open
}
