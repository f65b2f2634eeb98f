// Command example is a gRPC payments service that shows idemgrpc in an fx
// app: Charge runs behind the idempotency server interceptor, so a client
// that retries a charge with the same idempotency-key metadata entry gets
// the first charge back instead of a second one.
//
// Run it with
//
//	go run ./example           # from the idemgrpc directory
//
// Without IDEMPOTENCY_REDIS_URL it starts an embedded Redis (miniredis) and
// says so, so it needs nothing installed; set the variable to use a real
// server. The server listens on ADDR (default 127.0.0.1:50051) and serves
// gRPC reflection. Its client mode sends one charge, from another terminal:
//
//	go run ./example charge -key order-42 -tenant acme   # charge ch_1: 1999 EUR on acct_1 (replayed: false)
//	go run ./example charge -key order-42 -tenant acme   # charge ch_1: 1999 EUR on acct_1 (replayed: true)
//	go run ./example charge -key order-42 -tenant shop_2 # another tenant: a new charge
//
// The second answer is the first charge, with the response header
// "idempotent-replayed: true"; `charge -h` lists the flags. grpcurl works
// too, without the .proto file:
//
//	grpcurl -plaintext -H 'x-tenant: acme' -H 'idempotency-key: order-42' \
//	    -d '{"account":"acct_1","amount_cents":1999,"currency":"EUR"}' \
//	    127.0.0.1:50051 payments.v1.Payments/Charge
//
// The files: main.go (configuration and the fx wiring), server.go (the gRPC
// server and its interceptor), payments.go (the service), client.go (the
// client mode).
package main

import (
	"cmp"
	"os"

	"github.com/idemkit/idempotency/examples/embedredis"

	"go.uber.org/fx"
	"go.uber.org/fx/fxevent"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/idemkit/idempotency"
)

func main() {
	// Run starts the app, blocks until SIGINT or SIGTERM, then stops it:
	// the gRPC server drains before the Redis client and the embedded Redis
	// go away.
	if len(os.Args) > 1 && os.Args[1] == "charge" {
		os.Exit(charge(os.Args[2:], os.Stdout, os.Stderr))
	}
	fx.New(appOptions(configFromEnv())).Run()
}

// config is the app's own configuration. The library reads its settings
// (IDEMPOTENCY_*) itself; see docs/configuration.md.
type config struct {
	// Addr is where the gRPC server listens (ADDR, default
	// 127.0.0.1:50051). Port 0 picks a free port; the log says which.
	Addr string
	// EmbeddedRedis starts an in-process Redis for the library. It is true
	// when neither IDEMPOTENCY_REDIS_URL nor IDEMPOTENCY_REDIS_CLUSTER_ADDRS
	// is set.
	EmbeddedRedis bool
}

func configFromEnv() config {
	return config{
		Addr: cmp.Or(os.Getenv("ADDR"), "127.0.0.1:50051"),
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
		embedredis.When(cfg.EmbeddedRedis),
		fx.Provide(newLogger),
		fx.WithLogger(func(log *zap.Logger) fxevent.Logger {
			l := &fxevent.ZapLogger{Logger: log.Named("fx")}
			l.UseLogLevel(zapcore.DebugLevel)
			return l
		}),
		fx.Provide(newPayments, newServer),
		fx.Invoke(func(*server) {}),
	)
}

// newLogger returns a human-readable console logger at info.
func newLogger() (*zap.Logger, error) {
	zc := zap.NewDevelopmentConfig()
	zc.Level = zap.NewAtomicLevelAt(zapcore.InfoLevel)
	zc.DisableStacktrace = true
	return zc.Build()
}
