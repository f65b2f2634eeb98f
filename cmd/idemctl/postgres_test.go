package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/idemkey"
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

func stopPostgres() {
	if pgServer != nil {
		pgServer.Stop()
	}
}

// postgresDB creates a database of its own on the test server, migrated
// when migrate is set, and returns its connection string and a pool on it
// (closed when t ends). Without PostgreSQL binaries the test is skipped, or
// fails when IDEMPOTENCY_TEST_REQUIRE_POSTGRES=1 (as in CI).
func postgresDB(t *testing.T, migrate bool) (string, *pgxpool.Pool) {
	t.Helper()
	pgOnce.Do(func() { pgServer, pgErr = pgtemp.Start() })
	if pgErr != nil {
		if errors.Is(pgErr, pgtemp.ErrNotFound) && os.Getenv("IDEMPOTENCY_TEST_REQUIRE_POSTGRES") != "1" {
			t.Skipf("no PostgreSQL: %v", pgErr)
		}
		t.Fatalf("start PostgreSQL: %v", pgErr)
	}
	name := "idemctl_" + strings.ToLower(rand.Text()[:10])
	if err := pgtemp.CreateDatabase(t.Context(), pgServer.DSN, name); err != nil {
		t.Fatal(err)
	}
	dsn := strings.Replace(pgServer.DSN, "dbname=postgres", "dbname="+name, 1)
	pool, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if migrate {
		if err := idempg.Migrate(t.Context(), pool); err != nil {
			t.Fatal(err)
		}
	}
	return dsn, pool
}

// pgRecordsFixture writes, through a coordinator over idempg.Store, a
// completed record, a not replayable one and one scoped to a tenant, and a
// pending one.
func pgRecordsFixture(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	store, err := idempg.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	c, err := coordinator.New(store, coordinator.WithMaxResultBytes(16))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx := t.Context()
	for key, result := range map[string]string{
		"order-42":                           `{"id":"ch_1"}`,
		"big":                                strings.Repeat("x", 64), // over the limit: not replayable
		idemkey.Scoped("shop_1", "order-42"): `{"id":"ch_2"}`,
	} {
		call := coordinator.Call{Operation: "payment.charge", Key: key}
		if _, err := c.Execute(ctx, call, func(ctx context.Context) ([]byte, error) {
			return []byte(result), nil
		}); err != nil && !errors.Is(err, coordinator.ErrNotReplayable) {
			t.Fatalf("Do %s: %v", key, err)
		}
	}
	// A pending record as the Store's Reserve commits it (a first run of
	// the transactional path is invisible until it commits).
	if _, ok, err := store.Reserve(ctx, idemstore.Key{Operation: "payment.charge", Key: "order-43"},
		idemstore.Write{State: idemstore.StatePending, Token: "holder", TTL: time.Minute}); err != nil || !ok {
		t.Fatalf("Reserve order-43: %v %v", ok, err)
	}
}

// idemctl lookup, count, forget and check on the PostgreSQL store, with
// the same commands, flags and scopes as on Redis.
func TestPostgresRecords(t *testing.T) {
	dsn, pool := postgresDB(t, true)
	pgRecordsFixture(t, pool)
	env := map[string]string{"IDEMPOTENCY_POSTGRES_URL": dsn}

	r := idemctl(t, env, "", false, "lookup", "-result", "payment.charge", "order-42", "order-43", "big", "absent")
	if r.code != exitOK {
		t.Fatalf("lookup: exit %d\n%s", r.code, r.output())
	}
	for _, want := range []string{
		"payment.charge order-42\n  table        idempotency_records\n  state        completed\n",
		"  fingerprint  none\n  owner token  present\n  result size  13 bytes\n  result       text: {\"id\":\"ch_1\"}\n",
		"payment.charge order-43\n  table        idempotency_records\n  state        pending\n",
		"payment.charge big\n  table        idempotency_records\n  state        not_replayable\n",
		"payment.charge absent\n  table        idempotency_records\n  state        absent\n  note         a key whose first run is in progress is absent until its transaction commits\n",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("lookup printed\n%s\nwant %q in it", r.stdout, want)
		}
	}

	r = idemctl(t, env, "", false, "lookup", "-json", "-result", "-scope", "shop_1", "payment.charge", "order-42")
	var entries []lookupEntry
	if err := json.Unmarshal([]byte(r.stdout), &entries); err != nil || r.code != exitOK || len(entries) != 1 {
		t.Fatalf("lookup -json -scope: exit %d, %v\n%s", r.code, err, r.output())
	}
	if e := entries[0]; e.Key != "order-42" || e.StoredKey != idemkey.Scoped("shop_1", "order-42") || e.Table != "idempotency_records" || e.RedisKey != "" ||
		e.State != "completed" || e.Result == nil || *e.Result != `{"id":"ch_2"}` || e.TTLMillis == nil || *e.TTLMillis <= 0 || e.CreatedAt == nil {
		t.Errorf("lookup -json -scope = %+v", e)
	}

	r = idemctl(t, env, "", false, "count")
	want := "operation       total  pending  completed  not_replayable  unreadable  format1\n" +
		"payment.charge  4      1        3          1               0           0\n"
	if r.code != exitOK || r.stdout != want {
		t.Errorf("count: exit %d\n%s\nwant\n%s", r.code, r.output(), want)
	}
	r = idemctl(t, env, "", false, "count", "-json", "payment.charge", "none")
	var counts struct {
		Prefix     *string      `json:"prefix"`
		Table      string       `json:"table"`
		Operations []countEntry `json:"operations"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &counts); err != nil || counts.Prefix != nil || counts.Table != "idempotency_records" ||
		len(counts.Operations) != 2 || counts.Operations[0].Operation != "none" || counts.Operations[0].Total != 0 || counts.Operations[1].Total != 4 {
		t.Errorf("count -json: %v\n%s", err, r.output())
	}

	r = idemctl(t, env, "", false, "forget", "-scope", "shop_1", "payment.charge", "order-42", "order-44")
	if r.code != exitOK || r.stdout != "forgot 1 of 2 keys of payment.charge in scope \"shop_1\" (1 absent)\n" || !strings.Contains(r.stderr, "AGAIN") {
		t.Errorf("forget -scope: exit %d\n%s", r.code, r.output())
	}
	r = idemctl(t, env, "", false, "lookup", "payment.charge", "order-42")
	if !strings.Contains(r.stdout, "state        completed") {
		t.Errorf("the unscoped key went with the scoped one:\n%s", r.output())
	}

	r = idemctl(t, env, "", false, "forget", "-operation", "payment.charge", "-all")
	if r.code != exitUsage || !strings.Contains(r.stderr, "without -yes") {
		t.Errorf("forget -all without -yes, stdin not a terminal: exit %d\n%s", r.code, r.output())
	}
	r = idemctl(t, env, "payment.charge\n", true, "forget", "-operation", "payment.charge", "-all")
	if r.code != exitOK || !strings.HasPrefix(r.stdout, "forgot 3 records of payment.charge in idempotency_records on ") ||
		!strings.Contains(r.stderr, "About to forget 3 records of payment.charge in idempotency_records on ") {
		t.Errorf("forget -all, confirmed: exit %d\n%s", r.code, r.output())
	}
	r = idemctl(t, env, "", false, "count")
	if r.code != exitOK || !strings.HasPrefix(r.stdout, "no records in idempotency_records on ") {
		t.Errorf("count after forget -all: exit %d\n%s", r.code, r.output())
	}
}

// forget -all on PostgreSQL deletes a batch at a time, past the batch size.
func TestPostgresForgetAllBatches(t *testing.T) {
	dsn, pool := postgresDB(t, true)
	if _, err := pool.Exec(t.Context(), `INSERT INTO idempotency_records (operation, key, state, token, result, expires_at)
		SELECT 'bulk.op', 'k' || i, 'completed', 't', 'r', clock_timestamp() + interval '1 hour' FROM generate_series(1, 2500) i`); err != nil {
		t.Fatal(err)
	}
	r := idemctl(t, map[string]string{"IDEMPOTENCY_POSTGRES_URL": dsn}, "", false, "forget", "-operation", "bulk.op", "-all", "-yes")
	if r.code != exitOK || !strings.HasPrefix(r.stdout, "forgot 2500 records of bulk.op") {
		t.Errorf("forget -all -yes of 2500 records: exit %d\n%s", r.code, r.output())
	}
}

// check on PostgreSQL: OK on a migrated database, through the
// -postgres-url flag too; FAILED naming the schema on a database without
// it; unreachable, without the password, on a port where nothing listens.
func TestPostgresCheck(t *testing.T) {
	dsn, _ := postgresDB(t, true)
	r := idemctl(t, nil, "", false, "-postgres-url", dsn, "check")
	if r.code != exitOK || !strings.Contains(r.stdout, "server_version "+pgServer.Version) || !strings.HasSuffix(r.stdout, "\nOK\n") ||
		!strings.Contains(r.stdout, "IDEMPOTENCY_POSTGRES_URL") || !strings.Contains(r.stdout, "(flag -postgres-url)") {
		t.Errorf("check: exit %d\n%s", r.code, r.output())
	}

	empty, _ := postgresDB(t, false)
	env := map[string]string{"IDEMPOTENCY_POSTGRES_URL": empty}
	r = idemctl(t, env, "", false, "check")
	if r.code != exitFailure || !strings.Contains(r.stdout, "schema") || !strings.HasSuffix(r.stdout, "\nFAILED\n") {
		t.Errorf("check of a database without the schema: exit %d\n%s", r.code, r.output())
	}
	r = idemctl(t, env, "", false, "count")
	if r.code != exitFailure || !strings.Contains(r.stderr, "schema") {
		t.Errorf("count on a database without the schema: exit %d\n%s", r.code, r.output())
	}

	env = map[string]string{
		"IDEMPOTENCY_POSTGRES_URL":    "postgres://app:secret-pw@127.0.0.1:1/app?connect_timeout=1",
		"IDEMPOTENCY_STORAGE_TIMEOUT": "500ms",
	}
	for _, args := range [][]string{{"check"}, {"lookup", "op", "k"}, {"forget", "op", "k"}, {"count"}} {
		r := idemctl(t, env, "", false, args...)
		if r.code != exitFailure || !strings.Contains(r.output(), "127.0.0.1") || strings.Contains(r.output(), "secret-pw") {
			t.Errorf("idemctl %v against a closed port: exit %d\n%s", args, r.code, r.output())
		}
	}
}

// lookup shows where an idempg.Steps call stopped, and forget deletes its
// steps with its record.
func TestPostgresLookupSteps(t *testing.T) {
	dsn, pool := postgresDB(t, true)
	store, err := idempg.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	c, err := coordinator.New(store)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	call := coordinator.Call{Operation: "shop.checkout", Key: "cart-7"}
	_, err = idempg.Steps(t.Context(), c, store, call, func(ctx context.Context, r *idempg.Run) (int, error) {
		if _, err := idempg.Phase(r, "reserve", func(context.Context, pgx.Tx) (int, error) { return 1, nil }); err != nil {
			return 0, err
		}
		return idempg.Outside(r, "charge", func(context.Context) (int, error) {
			return 0, idemconsume.Permanent(errors.New("card declined"))
		})
	})
	if !errors.Is(err, idempg.ErrStepFailed) {
		t.Fatalf("Steps: %v, want the charge's failure", err)
	}
	env := map[string]string{"IDEMPOTENCY_POSTGRES_URL": dsn}
	r := idemctl(t, env, "", false, "lookup", "shop.checkout", "cart-7")
	for _, want := range []string{
		"  state        absent\n  steps        reserve phase done at ",
		"\n               charge outside failed at ",
		": card declined\n  note         no record: the call stopped after the steps above, and a retry resumes after them\n",
	} {
		if r.code != exitOK || !strings.Contains(r.stdout, want) {
			t.Errorf("lookup: exit %d\n%s\nwant %q in it", r.code, r.output(), want)
		}
	}
	r = idemctl(t, env, "", false, "lookup", "-json", "shop.checkout", "cart-7")
	var entries []lookupEntry
	if err := json.Unmarshal([]byte(r.stdout), &entries); err != nil || len(entries) != 1 || len(entries[0].Steps) != 2 {
		t.Fatalf("lookup -json: %v\n%s", err, r.output())
	}
	if st := entries[0].Steps[1]; st.Name != "charge" || st.Kind != "outside" || st.State != "failed" || st.Reason != "card declined" || st.CommittedAt.IsZero() {
		t.Errorf("lookup -json step = %+v", st)
	}
	if r = idemctl(t, env, "", false, "forget", "shop.checkout", "cart-7"); r.code != exitOK {
		t.Fatalf("forget: exit %d\n%s", r.code, r.output())
	}
	var steps int
	if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM idempotency_steps").Scan(&steps); err != nil || steps != 0 {
		t.Fatalf("%d steps left after forget (%v), want none", steps, err)
	}
}
