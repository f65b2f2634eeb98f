// Command example is a Connect payments service that shows idemconnect in
// an fx app on the PostgreSQL store: Charge runs behind the idempotency
// handler interceptor, inside the transaction in which its idempotency
// record commits, and writes the charge through that transaction
// (idempg.Tx). A client that retries a charge with the same Idempotency-Key
// header gets the first charge back instead of a second one, over any of
// Connect's three protocols (Connect, gRPC, gRPC-Web), and a crash at any
// instant leaves the charge and its record both, or neither. GetCharge
// reads a charge back from the charges table.
//
// Run it with
//
//	go run ./example           # from the idemconnect directory
//
// Without IDEMPOTENCY_POSTGRES_URL it starts a throwaway PostgreSQL server
// (Debian's postgresql package, initdb into a temporary directory, deleted
// on exit) and says so; set the variable to use your own database. It needs
// no Redis. The app applies the store's schema and creates its own table on
// start. The server listens on ADDR (default 127.0.0.1:8080), HTTP/1.1 and
// HTTP/2 without TLS (h2c), so that gRPC clients can call it; CHARGE_DELAY
// (default 50ms) is the payment provider's latency. Its client mode sends
// one charge, from another terminal:
//
//	go run ./example charge -key order-42 -tenant acme                  # charge ch_1: 1999 EUR on acct_1 for acme (replayed: false)
//	go run ./example charge -key order-42 -tenant acme -protocol grpc   # charge ch_1: 1999 EUR on acct_1 for acme (replayed: true)
//	go run ./example charge -key order-42 -tenant shop_2                # another tenant: a new charge
//
// The second answer is the first charge, with the response header
// "Idempotent-Replayed: true"; `charge -h` lists the flags. The client mode
// retries an attempt that timed out (-timeout) or that the server refused
// with Aborted or Unavailable, up to -attempts, with the same key: the key
// is made once, before the first attempt, and every attempt's context
// carries it (idemconnect.ContextWithKey). Against a server started with
// CHARGE_DELAY=3s:
//
//	$ go run ./example charge -key order-7 -timeout 1s
//	example charge: attempt 1: deadline_exceeded: context deadline exceeded; retrying in 100ms with the same key, order-7
//	example charge: attempt 2: aborted: a call with this idempotency key is still being processed; retry it later with the same key; retrying in 1s with the same key, order-7
//	charge ch_3: 1999 EUR on acct_1 for acme (replayed: true)
//
// The first attempt's charge was made (the provider charges whatever the
// client does, and the handler records it), and the last attempt got it
// back: one charge. The messages are google.protobuf.Struct values, whose
// JSON is a plain object, so curl works too (the Connect protocol with
// JSON):
//
//	curl -i -H 'Content-Type: application/json' -H 'X-Tenant: acme' -H 'Idempotency-Key: order-42' \
//	    -d '{"account":"acct_1","amount_cents":1999,"currency":"EUR"}' \
//	    http://127.0.0.1:8080/payments.v1.Payments/Charge
//
// The files: main.go (configuration and the fx wiring), server.go (the HTTP
// server, the handlers and their interceptor), payments.go (the service and
// its charges table), client.go (the client mode).
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

func main() {
	if len(os.Args) > 1 && os.Args[1] == "charge" {
		os.Exit(charge(os.Args[2:], os.Stdout, os.Stderr))
	}
	os.Exit(run())
}

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
	// Addr is where the HTTP server listens (ADDR, default
	// 127.0.0.1:8080). Port 0 picks a free port; the log says which.
	Addr string
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
		fx.Provide(newPayments, newMux, newServer),
		fx.Invoke(func(*server) {}),
		fx.Invoke(func(log *zap.Logger) {
			if cfg.ThrowawayPostgres {
				log.Warn("IDEMPOTENCY_POSTGRES_URL is unset: using a throwaway PostgreSQL server, deleted on exit; set it to use your own database")
			}
		}),
	)
}

// newLogger returns a human-readable console logger at info.
func newLogger() (*zap.Logger, error) {
	zc := zap.NewDevelopmentConfig()
	zc.Level = zap.NewAtomicLevelAt(zapcore.InfoLevel)
	zc.DisableStacktrace = true
	return zc.Build()
}
