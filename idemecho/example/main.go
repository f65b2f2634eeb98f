// Command example is an order service that shows idemecho in an fx app, on
// Echo v4: POST /orders/:id charges an order behind the idempotency
// middleware, so a client that retries with the same Idempotency-Key gets
// the first charge back instead of a second one, and GET /ledger shows every
// charge really made.
//
// Run it with
//
//	go run ./example           # from the idemecho directory
//
// Without IDEMPOTENCY_REDIS_URL it starts an embedded Redis (miniredis) and
// says so, so it needs nothing installed; set the variable to use a real
// server. It listens on ADDR (default 127.0.0.1:8080; port 0 picks a free
// port, the log says which); LOG_LEVEL=debug logs every idempotency hit and
// miss. Then, from another terminal:
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
// server, the Echo router and its routes).
package main

import (
	"cmp"
	"fmt"
	"os"

	"github.com/alicebob/miniredis/v2"
	"go.uber.org/fx"
	"go.uber.org/fx/fxevent"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/idemkit/idempotency"
)

func main() {
	// Run starts the app, blocks until SIGINT or SIGTERM, then stops it:
	// the HTTP server drains before the Redis client and the embedded Redis
	// go away.
	fx.New(appOptions(configFromEnv())).Run()
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
	// EmbeddedRedis starts an in-process Redis for the library. It is true
	// when neither IDEMPOTENCY_REDIS_URL nor IDEMPOTENCY_REDIS_CLUSTER_ADDRS
	// is set.
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

// appOptions is the whole app as one fx option, so that main and the test
// build exactly the same graph.
func appOptions(cfg config) fx.Option {
	return fx.Options(
		fx.Supply(cfg),
		// The library: *coordinator.Coordinator from the IDEMPOTENCY_*
		// environment, on the app's *zap.Logger.
		idempotency.Module,
		embeddedRedisIf(cfg.EmbeddedRedis),
		fx.Provide(newLogger),
		fx.WithLogger(func(log *zap.Logger) fxevent.Logger {
			l := &fxevent.ZapLogger{Logger: log.Named("fx")}
			l.UseLogLevel(zapcore.DebugLevel)
			return l
		}),
		fx.Provide(newLedger, newRouter, newServer),
		fx.Invoke(func(*server) {}),
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

// embeddedRedisIf, when on, starts an embedded Redis (miniredis) and points
// the idempotency module at it, through the module's settings override
// group, so that the module still builds, pings and closes its own client.
func embeddedRedisIf(on bool) fx.Option {
	if !on {
		return fx.Options()
	}
	return fx.Options(
		fx.Provide(startEmbeddedRedis),
		fx.Provide(fx.Annotate(
			func(m *miniredis.Miniredis) idempotency.SettingsOverride {
				return func(s *idempotency.Settings) { s.RedisURL = "redis://" + m.Addr() + "/0" }
			},
			fx.ResultTags(`group:"`+idempotency.SettingsOverrides+`"`),
		)),
	)
}

// startEmbeddedRedis starts miniredis on a free port while fx builds the
// graph (the module needs its address to build its client) and closes it
// when the app stops, after the module closed its client.
func startEmbeddedRedis(lc fx.Lifecycle, log *zap.Logger) (*miniredis.Miniredis, error) {
	m := miniredis.NewMiniRedis()
	if err := m.StartAddr("127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("start embedded redis: %w", err)
	}
	log.Warn(fmt.Sprintf("IDEMPOTENCY_REDIS_URL is unset: using an embedded Redis (miniredis) at %s; set it to use a real server", m.Addr()))
	lc.Append(fx.StopHook(m.Close))
	return m, nil
}
