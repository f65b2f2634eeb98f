// Command fxapp is a small payments service that shows idemkit in an fx app:
//
//   - POST /payments charges a (fake) payment provider through the
//     idemhttp middleware: a retried request with the same Idempotency-Key
//     gets the first response back instead of a second charge.
//   - A queue consumer processes refund messages with coordinator.DoResult: a
//     redelivered message is processed once.
//   - GET /ledger shows every real charge and refund; GET /metrics the
//     idempotency_* metrics.
//
// Run it with
//
//	go run ./examples/fxapp
//
// Without IDEMPOTENCY_REDIS_URL it starts an embedded Redis, so it needs
// nothing installed. See README.md in this directory for what to try.
//
// The files, in reading order: main.go (configuration and the fx wiring),
// server.go (the HTTP server, routes and /metrics), payments.go (the payments
// API, the fake provider and the ledger), refunds.go (the queue consumer).
package main

import (
	"cmp"
	"errors"
	"fmt"
	"os"

	"github.com/idemkit/idempotency/examples/embedredis"

	"go.uber.org/fx"
	"go.uber.org/fx/fxevent"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/idemkit/idempotency"
)

func main() {
	// Run starts the app, blocks until SIGINT or SIGTERM, then stops it: the
	// OnStop hooks run in reverse order of the OnStart hooks, so the HTTP
	// server drains before the consumer, the Redis client and the embedded
	// Redis go away.
	app := fx.New(appOptions(configFromEnv()))
	// Invalid IDEMPOTENCY_* settings are reported once, as the library
	// wrote them, rather than inside fx's three error lines (see
	// quietSettings).
	var se *idempotency.SettingsError
	if errors.As(app.Err(), &se) {
		fmt.Fprintln(os.Stderr, se)
		os.Exit(2)
	}
	app.Run()
}

// quietSettings is fx's logger without the error events of invalid
// IDEMPOTENCY_* settings, which main reports itself.
type quietSettings struct{ fxevent.Logger }

func (q quietSettings) LogEvent(e fxevent.Event) {
	var err error
	switch e := e.(type) {
	case *fxevent.Run:
		err = e.Err
	case *fxevent.Invoked:
		err = e.Err
	case *fxevent.Started:
		err = e.Err
	}
	var se *idempotency.SettingsError
	if errors.As(err, &se) {
		return
	}
	q.Logger.LogEvent(e)
}

// config is the app's own configuration. The library reads its settings
// (IDEMPOTENCY_*) itself; see docs/configuration.md.
type config struct {
	// Addr is where the HTTP server listens (ADDR, default 127.0.0.1:8080).
	// Port 0 picks a free port; the log says which.
	Addr string
	// LogLevel is the zap level (LOG_LEVEL, default info). At debug, every
	// idempotency hit, miss and Redis call is logged.
	LogLevel string
	// EmbeddedRedis starts an in-process Redis for the library. It is true
	// when neither IDEMPOTENCY_REDIS_URL nor IDEMPOTENCY_REDIS_CLUSTER_ADDRS
	// is set, so that the example runs on a machine without Redis.
	EmbeddedRedis bool
}

func configFromEnv() config {
	return config{
		Addr:     cmp.Or(os.Getenv("ADDR"), "127.0.0.1:8080"),
		LogLevel: cmp.Or(os.Getenv("LOG_LEVEL"), "info"),
		EmbeddedRedis: os.Getenv("IDEMPOTENCY_REDIS_URL") == "" &&
			os.Getenv("IDEMPOTENCY_REDIS_CLUSTER_ADDRS") == "",
	}
}

// appOptions is the whole app as one fx option, so that main and the tests
// build exactly the same graph.
func appOptions(cfg config) fx.Option {
	return fx.Options(
		fx.Supply(cfg),

		// The library: it provides *coordinator.Coordinator from the
		// IDEMPOTENCY_* environment, and uses the *zap.Logger and the
		// prometheus.Registerer that this app provides below.
		idempotency.Module,
		embedredis.When(cfg.EmbeddedRedis),

		// Logging: one zap logger for the app, the library and fx itself.
		// fx's own start-up chatter is logged at debug, so it only shows with
		// LOG_LEVEL=debug; its errors still show.
		fx.Provide(newLogger),
		fx.WithLogger(func(log *zap.Logger) fxevent.Logger {
			l := &fxevent.ZapLogger{Logger: log.Named("fx")}
			l.UseLogLevel(zapcore.DebugLevel)
			return quietSettings{l}
		}),

		// The app: see server.go, payments.go and refunds.go.
		fx.Provide(
			newRegistry,
			newProvider,
			newLedger,
			newRefundQueue,
			newRefundConsumer,
			newRoutes,
			newServer,
		),
		// fx builds only what something asks for. Asking for the server
		// builds everything it needs, and registers their lifecycle hooks in
		// that order: fx starts them in that order, and stops them in reverse.
		fx.Invoke(func(*server) {}),
	)
}

// newLogger returns a human-readable console logger. A production service
// would use zap.NewProduction (JSON).
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
