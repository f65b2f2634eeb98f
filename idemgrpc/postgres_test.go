package idemgrpc_test

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idempotency/idemgrpc"
	"github.com/idemkit/idempotency/idemgrpc/internal/paymentspb"
	"github.com/idemkit/idempotency/idempg"
	"github.com/idemkit/idempotency/idempg/pgtemp"
)

// The throwaway PostgreSQL of the tests, started by the first test that
// needs it and stopped by TestMain.
var (
	pgOnce   sync.Once
	pgServer *pgtemp.Server
	pgErr    error
)

// stopPostgresAfter stops the tests' PostgreSQL, if one started, after m.
type stopPostgresAfter struct{ m interface{ Run() int } }

func (s stopPostgresAfter) Run() int {
	defer func() {
		if pgServer != nil {
			pgServer.Stop()
		}
	}()
	return s.m.Run()
}

// postgresPool returns a pool on a database of its own, with idempg's
// schema and a ledger table. Without PostgreSQL binaries the test is
// skipped, or fails when IDEMPOTENCY_TEST_REQUIRE_POSTGRES=1 (as in CI).
func postgresPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pgOnce.Do(func() { pgServer, pgErr = pgtemp.Start() })
	if pgErr != nil {
		if errors.Is(pgErr, pgtemp.ErrNotFound) && os.Getenv("IDEMPOTENCY_TEST_REQUIRE_POSTGRES") != "1" {
			t.Skipf("no PostgreSQL: %v", pgErr)
		}
		t.Fatalf("start PostgreSQL: %v", pgErr)
	}
	name := "idemgrpc_" + strings.ToLower(rand.Text()[:10])
	if err := pgtemp.CreateDatabase(t.Context(), pgServer.DSN, name); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(t.Context(), strings.Replace(pgServer.DSN, "dbname=postgres", "dbname="+name, 1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := idempg.Migrate(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), `CREATE TABLE ledger (key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return pool
}

// The server interceptor over the PostgreSQL store runs the handler inside
// the claim's transaction: what the handler writes through idempg.Tx
// commits with the response and the record, so 3 calls with one key make 1
// row and 1 record; a stored code commits too; an error that is not stored
// rolls the write back and frees the key; a
// commit that fails is an Unavailable error, never the handler's response.
func TestServerInsideThePostgresTransaction(t *testing.T) {
	pool := postgresPool(t)
	store, err := idempg.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := newCoordinator(t, store)
	var (
		mu      sync.Mutex
		failure error
	)
	svc := &payments{fail: func(ctx context.Context, _ int64) error {
		tx, ok := idempg.Tx(ctx)
		if !ok {
			return status.Error(codes.Internal, "no transaction in the handler's context")
		}
		md, _ := metadata.FromIncomingContext(ctx)
		key := strings.Join(md.Get(idemgrpc.DefaultKeyHeader), ",")
		if _, err := tx.Exec(ctx, `INSERT INTO ledger (key) VALUES ($1)`, key); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		return failure
	}}
	client := serve(t, c, svc, nil)
	ledger := func(key string) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM ledger WHERE key = $1`, key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	charge := func(key string) (*paymentspb.Charge, error) {
		return client.Charge(withKey(t, key), &paymentspb.ChargeRequest{Account: "acct", AmountCents: 100, Currency: "EUR"})
	}

	var first string
	for i := range 3 {
		got, err := charge("order-1")
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if i == 0 {
			first = got.GetId()
		} else if got.GetId() != first {
			t.Errorf("call %d answered %s, want the first answer %s replayed", i, got.GetId(), first)
		}
	}
	if n := ledger("order-1"); n != 1 || svc.n() != 1 {
		t.Errorf("3 calls with one key: %d ledger rows, %d runs; want 1 and 1", n, svc.n())
	}
	var records int
	var state string
	if err := pool.QueryRow(t.Context(), `SELECT count(*), min(state) FROM idempotency_records WHERE key = 'order-1'`).Scan(&records, &state); err != nil ||
		records != 1 || state != "completed" {
		t.Errorf("the records of order-1: %d, %q, %v; want 1 completed", records, state, err)
	}

	// A stored code (FailedPrecondition) is the request's outcome: it
	// commits with what the handler wrote before it, and a retry gets the
	// code replayed without a second run.
	mu.Lock()
	failure = status.Error(codes.FailedPrecondition, "card declined")
	mu.Unlock()
	for i := range 2 {
		if _, err := charge("order-3"); status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("call %d of a declining handler: %v, want its FailedPrecondition", i, err)
		}
	}
	if n := ledger("order-3"); n != 1 {
		t.Errorf("a stored code left %d ledger rows, want 1: committed with its record", n)
	}

	// An error that is not stored (Unavailable): its write rolls back and
	// the key is free.
	mu.Lock()
	failure = status.Error(codes.Unavailable, "provider down")
	mu.Unlock()
	if _, err := charge("order-2"); status.Code(err) != codes.Unavailable {
		t.Fatalf("a failing handler: %v, want its Unavailable", err)
	}
	if n := ledger("order-2"); n != 0 {
		t.Errorf("a failing handler left %d ledger rows, want 0: rolled back", n)
	}
	mu.Lock()
	failure = nil
	mu.Unlock()
	if _, err := charge("order-2"); err != nil || ledger("order-2") != 1 {
		t.Errorf("the retry after an error: %v, %d ledger rows; want success and 1", err, ledger("order-2"))
	}

	// The completion fails inside the transaction (a trigger refuses it):
	// the client gets an error, not the handler's charge, and nothing stays.
	for _, sql := range []string{
		`CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.key LIKE 'broken%' THEN RAISE EXCEPTION 'injected fault' USING ERRCODE = 'XX000'; END IF;
	RETURN NEW;
END $$`,
		`CREATE TRIGGER refuse BEFORE UPDATE ON idempotency_records FOR EACH ROW EXECUTE FUNCTION refuse()`,
	} {
		if _, err := pool.Exec(t.Context(), sql); err != nil {
			t.Fatal(err)
		}
	}
	got, err := charge("broken-1")
	if err == nil || got != nil {
		t.Fatalf("a failed commit answered %v, %v; want an error", got, err)
	}
	if status.Code(err) != codes.Unavailable {
		t.Errorf("a failed commit: %v, want Unavailable", err)
	}
	if n := ledger("broken-1"); n != 0 {
		t.Errorf("a failed commit left %d ledger rows, want 0", n)
	}
}
