// Command example is a transfer service that shows the PostgreSQL store in
// an fx app: POST /transfers moves money between two accounts behind the
// HTTP idempotency middleware (idemhttp), and its handler writes through the
// transaction that holds the key (idempg.Tx), so the transfer, its two
// ledger entries, the answer and the idempotency record commit in one
// transaction. A client that retries with the same Idempotency-Key gets the
// first transfer back, and a crash at any instant leaves the transfer and
// its record both, or neither: exactly once.
//
// Run it with
//
//	go run ./example           # from the idempg directory
//
// Without IDEMPOTENCY_POSTGRES_URL it starts a throwaway PostgreSQL server
// (Debian's postgresql package, initdb into a temporary directory) and says
// so; set the variable to use your own database. The app applies the
// store's schema and its own tables on start. It listens on ADDR (default
// 127.0.0.1:8080; port 0 picks a free port, the log says which). Then, from
// another terminal:
//
//	curl -i -X POST localhost:8080/transfers -H 'Idempotency-Key: t-1' \
//	    -d '{"from":"alice","to":"bob","amount":1999}'
//
// answers 201 and the transfer. The same command again answers the same 201
// and body (same transfer ID) with "Idempotent-Replayed: true": no second
// transfer. With '{"from":"alice","to":"bob","amount":5000}' it is the key
// reused for another request: a 422 problem (application/problem+json).
// Without the header: 400. Then
//
//	curl -s localhost:8080/ledger
//
// lists the ledger entries and balances: one debit and one credit per key,
// whatever the retries.
//
// The files: main.go (configuration and the fx wiring), server.go (the HTTP
// API and the transfer).
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"

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
	cfg := configFromEnv()
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
	// LogLevel is the zap level (LOG_LEVEL, default info).
	LogLevel string
	// ThrowawayPostgres starts a PostgreSQL server for the run, when
	// IDEMPOTENCY_POSTGRES_URL is unset; PostgresURL is then its address.
	ThrowawayPostgres bool
	PostgresURL       string
}

func configFromEnv() config {
	return config{
		Addr:              cmp.Or(os.Getenv("ADDR"), "127.0.0.1:8080"),
		LogLevel:          cmp.Or(os.Getenv("LOG_LEVEL"), "info"),
		ThrowawayPostgres: os.Getenv("IDEMPOTENCY_POSTGRES_URL") == "",
	}
}

// appOptions is the whole app as one fx option, so that main and the test
// build exactly the same graph.
func appOptions(cfg config) fx.Option {
	return fx.Options(
		fx.Supply(cfg),
		// The library, on PostgreSQL: *coordinator.Coordinator over the
		// idempg store, from the IDEMPOTENCY_* environment.
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
		// The app's tables live in the store's database, so that a transfer
		// and its idempotency record commit together: the app uses the pool
		// the module opened.
		fx.Provide(fx.Annotate(func(p *pgxpool.Pool) *pgxpool.Pool { return p },
			fx.ParamTags(`name:"`+idempg.PoolName+`"`))),
		fx.Provide(newBank, newServer),
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
	zc.DisableStacktrace = true
	return zc.Build()
}
