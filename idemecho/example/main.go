// Command example is an order service that shows idemecho in an fx app, on
// Echo v4 and the PostgreSQL store: POST /orders/:id charges an order behind
// the idempotency middleware, and the handler writes the charge through the
// transaction in which its idempotency record commits (idempg.Tx). A client
// that retries with the same Idempotency-Key gets the first charge back
// instead of a second one, and a crash at any instant leaves the charge and
// its record both, or neither. GET /ledger shows every charge really made.
//
// Run it with
//
//	go run ./example           # from the idemecho directory
//
// Without IDEMPOTENCY_POSTGRES_URL it starts a throwaway PostgreSQL server
// (Debian's postgresql package, initdb into a temporary directory, deleted
// on exit) and says so; set the variable to use your own database. It needs
// no Redis. The app applies the store's schema and its own table on start.
// It listens on ADDR (default 127.0.0.1:8080; port 0 picks a free port, the
// log says which); CHARGE_DELAY (default 50ms) is the payment provider's
// latency; LOG_LEVEL=debug logs every idempotency hit and miss. Then, from
// another terminal:
//
//	curl -i -X POST localhost:8080/orders/42 -H 'Idempotency-Key: order-42' \
//	    -H 'X-Tenant: acme' -d '{"amount":1999,"currency":"EUR"}'
//
// answers 201 and the charge. The same command again answers the same 201
// and the same body (same charge ID), with "Idempotent-Replayed: true": the
// order was not charged twice. With -H 'X-Tenant: globex' it is another
// tenant's key, and a new charge; with '{"amount":5000,"currency":"EUR"}' it
// is the key reused for another request, and a 422 problem
// (application/problem+json). Without the Idempotency-Key header the
// answer is 400, without X-Tenant 401. Then
//
//	curl -s localhost:8080/ledger
//
// lists the charges: one per tenant, whatever the retries.
//
// The files: main.go (configuration and the fx wiring), server.go (the HTTP
// server, the Echo router, its routes and the charges table).
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/fx"
	"go.uber.org/fx/fxevent"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idempg"
	"github.com/idemkit/idempotency/idempg/pgtemp"
)

func main() { os.Exit(run()) }

// run runs the app until SIGINT or SIGTERM and returns the exit code. The
// throwaway server, when there is one, outlives the app: the HTTP server
// drains, then the pool closes, then the server stops.
func run() int {
	cfg, err := configFromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if cfg.ThrowawayPostgres {
		srv, err := pgtemp.Start()
		if err != nil {
			if errors.Is(err, pgtemp.ErrNotFound) {
				err = fmt.Errorf("IDEMPOTENCY_POSTGRES_URL is unset and no PostgreSQL is installed to start a throwaway one: set the variable, or apt-get install postgresql: %w", err)
			}
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer srv.Stop()
		cfg.PostgresURL = srv.DSN
	}
	app := fx.New(appOptions(cfg))
	ctx, cancel := context.WithTimeout(context.Background(), app.StartTimeout())
	defer cancel()
	if err := app.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sig := <-app.Wait()
	ctx, cancel = context.WithTimeout(context.Background(), app.StopTimeout())
	defer cancel()
	if err := app.Stop(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return sig.ExitCode
}

// config is the app's own configuration. The library reads its settings
// (IDEMPOTENCY_*) itself; see docs/configuration.md.
type config struct {
	// Addr is where the HTTP server listens (ADDR, default 127.0.0.1:8080).
	// Port 0 picks a free port; the log says which.
	Addr string
	// LogLevel is the zap level (LOG_LEVEL, default info). At debug, Echo
	// runs in debug mode: its error responses say more.
	LogLevel string
	// ChargeDelay is the payment provider's latency (CHARGE_DELAY, a Go
	// duration, default 50ms).
	ChargeDelay time.Duration
	// ThrowawayPostgres starts a PostgreSQL server for the run, when
	// IDEMPOTENCY_POSTGRES_URL is unset; PostgresURL is then its address.
	ThrowawayPostgres bool
	PostgresURL       string
}

func configFromEnv() (config, error) {
	delay, err := time.ParseDuration(cmp.Or(os.Getenv("CHARGE_DELAY"), "50ms"))
	if err != nil || delay < 0 {
		return config{}, fmt.Errorf("CHARGE_DELAY: %q is not a duration of 0 or more, such as 50ms", os.Getenv("CHARGE_DELAY"))
	}
	return config{
		Addr:              cmp.Or(os.Getenv("ADDR"), "127.0.0.1:8080"),
		LogLevel:          cmp.Or(os.Getenv("LOG_LEVEL"), "info"),
		ChargeDelay:       delay,
		ThrowawayPostgres: os.Getenv("IDEMPOTENCY_POSTGRES_URL") == "",
	}, nil
}

// appOptions is the whole app as one fx option, so that main and the test
// build exactly the same graph.
func appOptions(cfg config) fx.Option {
	return fx.Options(
		fx.Supply(cfg),
		// The library, on PostgreSQL: *coordinator.Coordinator over the
		// idempg store, from the IDEMPOTENCY_* environment, on the app's
		// *zap.Logger.
		idempotency.Module,
		idempg.Module,
		idempotency.OverrideSettings(func(s *idempotency.Settings) {
			if cfg.PostgresURL != "" {
				s.PostgresURL = cfg.PostgresURL
			}
			// The example owns its database: it applies the schema. A
			// service whose migrations run elsewhere leaves this false.
			s.PostgresMigrate = true
		}),
		fx.Provide(newLogger),
		fx.WithLogger(func(log *zap.Logger) fxevent.Logger {
			l := &fxevent.ZapLogger{Logger: log.Named("fx")}
			l.UseLogLevel(zapcore.DebugLevel)
			return l
		}),
		// The charges live in the store's database, so that a charge and its
		// idempotency record commit together: the app uses the pool the
		// module opened.
		fx.Provide(fx.Annotate(func(p *pgxpool.Pool) *pgxpool.Pool { return p },
			fx.ParamTags(`name:"`+idempg.PoolName+`"`))),
		fx.Provide(newLedger, newRouter, newServer),
		fx.Invoke(func(*server) {}),
		fx.Invoke(func(log *zap.Logger) {
			if cfg.ThrowawayPostgres {
				log.Warn("IDEMPOTENCY_POSTGRES_URL is unset: using a throwaway PostgreSQL server, deleted on exit; set it to use your own database")
			}
		}),
	)
}

// newLogger returns a human-readable console logger at LOG_LEVEL.
func newLogger(cfg config) (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(cfg.LogLevel)
	if err != nil {
		return nil, fmt.Errorf("LOG_LEVEL: %w", err)
	}
	zc := zap.NewDevelopmentConfig()
	zc.Level = zap.NewAtomicLevelAt(level)
	zc.DisableStacktrace = true // a key reuse is a warning, not a crash
	return zc.Build()
}
