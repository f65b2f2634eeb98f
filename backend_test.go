package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"
	"go.uber.org/zap"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/redisrepo"
)

// backend supplies b under BackendName.
func backend(b *idempotency.Backend) fx.Option {
	return fx.Supply(fx.Annotate(b, fx.ResultTags(`name:"`+idempotency.BackendName+`"`)))
}

// With a Backend, the coordinator uses its store, Module builds no Redis
// client (an unreachable Redis is never dialled, so nothing is logged about
// it), and Start and Stop run with the app, Start with the module's logger.
func TestModuleUsesTheBackend(t *testing.T) {
	clearEnv(t)
	t.Setenv("IDEMPOTENCY_REDIS_URL", "redis://127.0.0.1:1/0")
	_, regOpt := registry()
	mem := memstore.New()
	var started, stopped atomic.Int32
	var gotLogger *zap.Logger
	b := &idempotency.Backend{
		Store: mem,
		Start: func(_ context.Context, l *zap.Logger) error { started.Add(1); gotLogger = l; return nil },
		Stop:  func(context.Context) error { stopped.Add(1); return nil },
	}
	logger := zap.NewNop()
	var c *coordinator.Coordinator
	app := fxtest.New(t, idempotency.Module, backend(b), regOpt, fx.Supply(logger), fx.Populate(&c))
	app.RequireStart()
	var runs atomic.Int64
	for range 2 {
		if _, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: "op", Key: "k"}, charge(&runs)); err != nil {
			t.Fatal(err)
		}
	}
	if runs.Load() != 1 || mem.Len() != 1 {
		t.Errorf("runs=%d records=%d, want 1 and 1", runs.Load(), mem.Len())
	}
	app.RequireStop()
	if started.Load() != 1 || stopped.Load() != 1 || gotLogger != logger {
		t.Errorf("Start ran %d times, Stop %d, logger %p; want once, once, the app's %p", started.Load(), stopped.Load(), gotLogger, logger)
	}
}

// A Backend's Start error stops start-up; asking for the Redis store of an
// app whose store is a Backend is an error that says why.
func TestModuleBackendErrors(t *testing.T) {
	clearEnv(t)
	_, regOpt := registry()
	refused := errors.New("IDEMPOTENCY_POSTGRES_URL: the database refused the password")
	app := fx.New(idempotency.Module, fx.NopLogger, regOpt, fx.Supply(zap.NewNop()),
		backend(&idempotency.Backend{Store: memstore.New(), Start: func(context.Context, *zap.Logger) error { return refused }}),
		fx.Invoke(func(*coordinator.Coordinator) {}))
	if err := app.Start(t.Context()); !errors.Is(err, refused) {
		t.Errorf("start with a failing backend = %v, want its error", err)
	}

	app = fx.New(idempotency.Module, fx.NopLogger, regOpt, backend(&idempotency.Backend{Store: memstore.New()}),
		fx.Invoke(func(*redisrepo.Store) {}))
	if err := app.Err(); err == nil || !strings.Contains(err.Error(), "not Redis: there is no *redisrepo.Store") {
		t.Errorf("*redisrepo.Store with a backend: %v", err)
	}

	app = fx.New(idempotency.Module, fx.NopLogger, regOpt, backend(&idempotency.Backend{}),
		fx.Invoke(func(*coordinator.Coordinator) {}))
	if err := app.Err(); err == nil || !strings.Contains(err.Error(), "has no Store") {
		t.Errorf("a backend without a store: %v", err)
	}
}

// IDEMPOTENCY_POSTGRES_URL without a PostgreSQL store in the app fails
// start-up, naming the variable and the module to add, without the
// password.
func TestPostgresURLWithoutTheStore(t *testing.T) {
	clearEnv(t)
	t.Setenv("IDEMPOTENCY_POSTGRES_URL", "postgres://app:s3cret@db/shop")
	_, regOpt := registry()
	app := fx.New(idempotency.Module, fx.NopLogger, regOpt, fx.Invoke(func(*coordinator.Coordinator) {}))
	err := app.Err()
	if err == nil || !strings.Contains(err.Error(), "IDEMPOTENCY_POSTGRES_URL is set, but the app has no PostgreSQL store: add idempg.Module") {
		t.Fatalf("start-up error = %v", err)
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("the error shows the password: %v", err)
	}
}

// The POSTGRES_* variables are checked for form, each error naming its
// variable and none showing a password; String and Redacted mask it.
func TestPostgresSettings(t *testing.T) {
	for _, tt := range []struct {
		url       string
		max, min  int32
		variables []string
	}{
		{url: "postgres://app:pw@db:5432/shop?sslmode=disable"},
		{url: "postgresql://db/shop"},
		{url: "host=db dbname=shop password='a b'"},
		{url: "mysql://app:pw@db/shop", variables: []string{"IDEMPOTENCY_POSTGRES_URL"}},
		{url: "host=db shop", variables: []string{"IDEMPOTENCY_POSTGRES_URL"}},
		{url: "postgres://app:p%zzw@db/shop", variables: []string{"IDEMPOTENCY_POSTGRES_URL"}},
		{max: -1, variables: []string{"IDEMPOTENCY_POSTGRES_MAX_CONNS"}},
		{min: -1, variables: []string{"IDEMPOTENCY_POSTGRES_MIN_CONNS"}},
		{max: 4, min: 5, variables: []string{"IDEMPOTENCY_POSTGRES_MIN_CONNS"}},
		{max: 0, min: 5},
	} {
		s := idempotency.DefaultSettings()
		s.PostgresURL, s.PostgresMaxConns, s.PostgresMinConns = tt.url, tt.max, tt.min
		err := s.Validate()
		if len(tt.variables) == 0 {
			if err != nil {
				t.Errorf("%q max %d min %d: %v", tt.url, tt.max, tt.min, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%q max %d min %d: no error, want one naming %v", tt.url, tt.max, tt.min, tt.variables)
			continue
		}
		for _, v := range tt.variables {
			if !strings.Contains(err.Error(), v+": ") {
				t.Errorf("%q: error %q does not name %s", tt.url, err, v)
			}
		}
		if strings.Contains(err.Error(), "zzw") {
			t.Errorf("%q: the error shows the password: %v", tt.url, err)
		}
	}
	for raw, want := range map[string]string{
		"postgres://app:s3cret@db/shop":                  "postgres://app:xxxxx@db/shop",
		"postgres://db/shop?password=s3cret&sslmode=off": "postgres://db/shop?password=xxxxx&sslmode=off",
		"host=db password=s3cret dbname=shop":            "host=db password=xxxxx dbname=shop",
		"host=db password = 'a s3cret' dbname=shop":      "host=db password = xxxxx dbname=shop",
	} {
		s := idempotency.DefaultSettings()
		s.PostgresURL = raw
		if got := s.Redacted().PostgresURL; got != want {
			t.Errorf("Redacted(%q) = %q, want %q", raw, got, want)
		}
		if strings.Contains(s.String(), "s3cret") {
			t.Errorf("String shows the password of %q", raw)
		}
	}
}
