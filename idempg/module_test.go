package idempg_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	idemfxtest "github.com/idemkit/idempotency/fxtest"
	"github.com/idemkit/idempotency/idemhttp"
	"github.com/idemkit/idempotency/idempg"
)

// settings starts the app from the defaults, with change applied, whatever
// the environment says.
func settings(change func(*idempotency.Settings)) fx.Option {
	if change == nil {
		return idemfxtest.IgnoreEnvironment()
	}
	return fx.Options(idemfxtest.IgnoreEnvironment(), idempotency.OverrideSettings(change))
}

// schemaURL is the test server's connection string with search_path set to
// schema, through its unix socket.
func schemaURL(schema string) string { return server.DSN + " search_path=" + schema }

// The module end to end: IDEMPOTENCY_POSTGRES_URL opens the pool, the
// schema is applied on start, Do and the HTTP middleware both run once per
// key over the coordinator the core module provides, and the metrics count
// Do's calls.
func TestModule(t *testing.T) {
	db := newEmptyDB(t, 4)
	reg := prometheus.NewRegistry()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	var c *coordinator.Coordinator
	var store *idempg.Store
	var pool *pgxpool.Pool
	app := fxtest.New(t,
		idempotency.Module, idempg.Module,
		settings(nil),
		idempg.SupplySettings(idempg.Settings{URL: schemaURL(db.schema), MaxConns: 8, Migrate: true}),
		fx.Supply(fx.Annotate(reg, fx.As(new(prometheus.Registerer)))),
		fx.Supply(zap.NewNop()),
		fx.Supply(fx.Annotate(tp, fx.As(new(trace.TracerProvider)))),
		fx.Populate(&c, &store),
		fx.Populate(fx.Annotate(&pool, fx.ParamTags(`name:"`+idempg.PoolName+`"`))),
	)
	app.RequireStart()
	if got := pool.Config().MaxConns; got != 8 {
		t.Errorf("pool MaxConns = %d, want IDEMPOTENCY_POSTGRES_MAX_CONNS's 8", got)
	}
	if _, err := pool.Exec(t.Context(), `CREATE TABLE ledger (key text NOT NULL, value text NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	for i := range 3 {
		ctx, span := tp.Tracer("test").Start(t.Context(), fmt.Sprint("call-", i))
		res, err := idempg.DoResult(ctx, c, call("order-1"), func(ctx context.Context, tx pgx.Tx) (string, error) {
			return "entry", insertLedger(ctx, tx, "order-1", "entry")
		})
		span.End()
		if err != nil || res.Value != "entry" || res.Replayed != (i > 0) {
			t.Fatalf("Do #%d = %+v, %v", i, res, err)
		}
	}
	// The calls' events are on their spans, as the coordinator's are.
	for i, want := range []string{"idempotency.miss idempotency.stored", "idempotency.hit", "idempotency.hit"} {
		var got []string
		for _, sp := range spans.Ended() {
			if sp.Name() == fmt.Sprint("call-", i) {
				for _, e := range sp.Events() {
					if e.Name != "idempotency.storage_call" {
						got = append(got, e.Name)
					}
				}
			}
		}
		if strings.Join(got, " ") != want {
			t.Errorf("span of call %d: events %q, want %q", i, got, want)
		}
	}
	if n := db.ledger(t, "order-1"); n != 1 {
		t.Errorf("ledger rows: %d, want 1", n)
	}

	var runs atomic.Int32
	h := idemhttp.Middleware(c)(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "created")
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	for i := range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader("{}"))
		req.Header.Set(idemhttp.KeyHeader, "http-key")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Errorf("request %d: status %d, want 201", i, resp.StatusCode)
		}
	}
	if runs.Load() != 1 {
		t.Errorf("the HTTP handler ran %d times, want 1", runs.Load())
	}
	for outcome, want := range map[string]float64{"hit": 3, "miss": 2} {
		var sum float64
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() != "idempotency_requests_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "outcome" && l.GetValue() == outcome {
						sum += m.GetCounter().GetValue()
					}
				}
			}
		}
		if sum != want {
			t.Errorf("idempotency_requests_total{outcome=%q} = %v, want %v", outcome, sum, want)
		}
	}
	if n := testutil.CollectAndCount(reg, "idempotency_stored_total"); n == 0 {
		t.Error("no idempotency_stored_total series")
	}
	app.RequireStop()
	if err := pool.Ping(context.Background()); err == nil {
		t.Error("the module's pool is still open after stop")
	}
}

// UsePool: the module uses the app's pool, needs no URL, and leaves the
// pool open on stop.
func TestModuleUsePool(t *testing.T) {
	db := newEmptyDB(t, 4)
	var c *coordinator.Coordinator
	app := fxtest.New(t,
		idempotency.Module, idempg.Module, idempg.UsePool[*pgxpool.Pool](),
		fx.Supply(db.pool), fx.Supply(zap.NewNop()),
		settings(func(s *idempotency.Settings) { s.MetricsEnabled = false }),
		idempg.SupplySettings(idempg.Settings{Migrate: true}),
		fx.Populate(&c))
	app.RequireStart()
	if _, err := idempg.Do(t.Context(), c, call("k"), func(context.Context, pgx.Tx) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	app.RequireStop()
	if err := db.pool.Ping(t.Context()); err != nil {
		t.Errorf("the app's pool after stop: %v, want it open", err)
	}
	if rec := record(t, db.store(t), "test.op", "k"); rec.State != idemstore.StateCompleted {
		t.Errorf("record %+v, want completed in the app's database", rec)
	}
}

// Misconfigurations stop start-up with an error that names the variable and
// never shows the password; an unreachable database is an outage: a
// warning, and calls fail with ErrStorage.
func TestModuleStartupChecks(t *testing.T) {
	admin := newEmptyDB(t, 2)
	ctx := t.Context()
	if _, err := admin.pool.Exec(ctx, `CREATE ROLE app LOGIN PASSWORD 'right-pw'`); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	old := newEmptyDB(t, 2)
	if err := idempg.Migrate(ctx, old.pool); err != nil {
		t.Fatal(err)
	}
	if _, err := old.pool.Exec(ctx, `DELETE FROM idempotency_schema; INSERT INTO idempotency_schema (version) VALUES (3)`); err != nil {
		t.Fatal(err)
	}
	tcp := func(user, pw, extra string) string {
		return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/postgres?%s", user, pw, server.Port, extra)
	}
	for _, tt := range []struct {
		name    string
		url     string
		migrate bool
		want    []string
	}{
		{"no URL", "", false, []string{"IDEMPOTENCY_POSTGRES_URL: must be set with idempg.Module"}},
		{"unparsable", "postgres://app:secret-pw@127.0.0.1:notaport/db", false, []string{"IDEMPOTENCY_POSTGRES_URL: "}},
		{"wrong password", tcp("app", "wrong-pw", "sslmode=disable"), true, []string{"IDEMPOTENCY_POSTGRES_URL: the database refused the password (28P01"}},
		{"no such database", fmt.Sprintf("postgres://app:right-pw@127.0.0.1:%d/nowhere?sslmode=disable", server.Port), true,
			[]string{"IDEMPOTENCY_POSTGRES_URL: the database does not exist (3D000"}},
		{"TLS required", tcp("app", "right-pw", "sslmode=require"), true, []string{"IDEMPOTENCY_POSTGRES_URL: the TLS connection cannot be made"}},
		{"missing table", schemaURL(newEmptyDB(t, 1).schema), false,
			[]string{"IDEMPOTENCY_POSTGRES_MIGRATE: idempg: schema mismatch: no idempg tables", "set IDEMPOTENCY_POSTGRES_MIGRATE=true"}},
		{"newer schema version", schemaURL(old.schema), false,
			[]string{"IDEMPOTENCY_POSTGRES_MIGRATE: idempg: schema mismatch: the database is at schema version 3, newer than this idempg's (2): upgrade the library"}},
		{"newer schema version, migrating", schemaURL(old.schema), true,
			[]string{"IDEMPOTENCY_POSTGRES_MIGRATE: idempg: schema mismatch: the database is at schema version 3, newer"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			app := fx.New(idempotency.Module, idempg.Module, fx.NopLogger, fx.Supply(zap.NewNop()),
				settings(func(s *idempotency.Settings) { s.MetricsEnabled = false }),
				idempg.SupplySettings(idempg.Settings{URL: tt.url, Migrate: tt.migrate}),
				fx.Invoke(func(*coordinator.Coordinator) {}))
			err := app.Err()
			if err == nil {
				err = app.Start(ctx)
				if err == nil {
					_ = app.Stop(ctx)
				}
			}
			if err == nil {
				t.Fatalf("start-up succeeded, want an error with %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("start-up error %q\ndoes not say %q", err, w)
				}
			}
			for _, secret := range []string{"wrong-pw", "right-pw", "secret-pw"} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("start-up error shows the password: %q", err)
				}
			}
		})
	}

	t.Run("unreachable", func(t *testing.T) {
		core, logs := observer.New(zap.WarnLevel)
		var c *coordinator.Coordinator
		app := fxtest.New(t, idempotency.Module, idempg.Module, fx.Supply(zap.New(core)),
			settings(func(s *idempotency.Settings) { s.MetricsEnabled = false }),
			idempg.SupplySettings(idempg.Settings{URL: "postgres://app:secret-pw@127.0.0.1:1/db?sslmode=disable&connect_timeout=1"}),
			fx.Populate(&c))
		app.RequireStart()
		defer app.RequireStop()
		warned := logs.FilterMessageSnippet("the PostgreSQL store is unreachable at start-up").All()
		if len(warned) != 1 {
			t.Fatalf("warnings: %v, want one about the unreachable store", logs.All())
		}
		if line := fmt.Sprint(warned[0].ContextMap()); strings.Contains(line, "secret-pw") {
			t.Errorf("the warning shows the password: %s", line)
		}
		_, err := idempg.Do(t.Context(), c, call("k"), func(context.Context, pgx.Tx) (int, error) {
			t.Error("the action ran without a database")
			return 0, nil
		})
		if !errors.Is(err, coordinator.ErrStorage) {
			t.Errorf("Do with the database unreachable = %v, want ErrStorage", err)
		}
	})
}

// A server that takes no writes (a standby, a demoted primary, or
// default_transaction_read_only, as here) fails start-up naming the
// variable and the fix, whether the module migrates or only checks, and
// CheckPool says the same: every reservation would fail on it.
func TestModuleRefusesAReadOnlyServer(t *testing.T) {
	db := newEmptyDB(t, 4)
	url := schemaURL(db.schema) + " options='-c default_transaction_read_only=on'"
	for _, migrate := range []bool{false, true} {
		t.Run(fmt.Sprint("migrate=", migrate), func(t *testing.T) {
			app := fx.New(idempotency.Module, idempg.Module, fx.NopLogger, fx.Supply(zap.NewNop()),
				settings(func(s *idempotency.Settings) { s.MetricsEnabled = false }),
				idempg.SupplySettings(idempg.Settings{URL: url, Migrate: migrate}), fx.Invoke(func(*coordinator.Coordinator) {}))
			err := app.Err()
			if err == nil {
				if err = app.Start(t.Context()); err == nil {
					_ = app.Stop(t.Context())
					t.Fatal("start-up on a read-only server succeeded, want it refused")
				}
			}
			for _, w := range []string{"IDEMPOTENCY_POSTGRES_URL: the server takes no writes", "target_session_attrs=read-write"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("start-up error %q\ndoes not say %q", err, w)
				}
			}
		})
	}
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := idempg.CheckPool(t.Context(), pool); err == nil || !strings.Contains(err.Error(), "the server takes no writes") {
		t.Errorf("CheckPool on a read-only server = %v, want it refused", err)
	}
}

// Behind a PgBouncer in transaction mode, pgx's default statement cache is
// refused at start-up, naming the variable and the fix; with the fix, the
// app starts and the transactional call runs once per key.
func TestModuleBehindPgBouncer(t *testing.T) {
	_, dsn := bouncer(t)
	start := func(url string, opts ...fx.Option) (*fx.App, error) {
		app := fx.New(append([]fx.Option{idempotency.Module, idempg.Module, fx.NopLogger, fx.Supply(zap.NewNop()),
			settings(func(s *idempotency.Settings) { s.MetricsEnabled = false }),
			idempg.SupplySettings(idempg.Settings{URL: url}), fx.Invoke(func(*coordinator.Coordinator) {})}, opts...)...)
		if err := app.Err(); err != nil {
			return app, err
		}
		return app, app.Start(t.Context())
	}
	t.Run("statement cache", func(t *testing.T) {
		app, err := start(dsn)
		if err == nil {
			_ = app.Stop(t.Context())
			t.Fatal("start-up succeeded, want the pooler refused")
		}
		for _, w := range []string{"IDEMPOTENCY_POSTGRES_URL: a connection pooler is between the store and PostgreSQL", "add default_query_exec_mode=exec"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("start-up error %q\ndoes not say %q", err, w)
			}
		}
	})
	t.Run("exec mode", func(t *testing.T) {
		var c *coordinator.Coordinator
		var pool *pgxpool.Pool
		app, err := start(dsn+" default_query_exec_mode=exec", fx.Populate(&c), fx.Populate(fx.Annotate(&pool, fx.ParamTags(`name:"`+idempg.PoolName+`"`))))
		if err != nil {
			t.Fatalf("start-up: %v", err)
		}
		defer func() { _ = app.Stop(context.Background()) }()
		key := uniqueKey("bounced")
		for range 3 {
			if _, err := idempg.Do(t.Context(), c, call(key), func(ctx context.Context, tx pgx.Tx) (int, error) {
				return 1, insertLedger(ctx, tx, key, "x")
			}); err != nil {
				t.Fatalf("Do: %v", err)
			}
		}
		if n := (&testDB{pool: pool}).ledger(t, key); n != 1 {
			t.Fatalf("%d ledger rows, want 1", n)
		}
	})
}
