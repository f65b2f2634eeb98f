// Command example is a Connect payments service that shows idemconnect in
// an fx app: Charge runs behind the idempotency handler interceptor, so a
// client that retries a charge with the same Idempotency-Key header gets
// the first charge back instead of a second one, over any of Connect's
// three protocols (Connect, gRPC, gRPC-Web).
//
// Run it with
//
//	go run ./example           # from the idemconnect directory
//
// Without IDEMPOTENCY_REDIS_URL it starts an embedded Redis (miniredis) and
// says so, so it needs nothing installed; set the variable to use a real
// server. The server listens on ADDR (default 127.0.0.1:8080), HTTP/1.1 and
// HTTP/2 without TLS (h2c), so that gRPC clients can call it. Its client
// mode sends one charge, from another terminal:
//
//	go run ./example charge -key order-42 -tenant acme                  # charge ch_1: 1999 EUR on acct_1 (replayed: false)
//	go run ./example charge -key order-42 -tenant acme -protocol grpc   # charge ch_1: 1999 EUR on acct_1 (replayed: true)
//	go run ./example charge -key order-42 -tenant shop_2                # another tenant: a new charge
//
// The second answer is the first charge, with the response header
// "Idempotent-Replayed: true"; `charge -h` lists the flags. The messages
// are google.protobuf.Struct values, whose JSON is a plain object, so curl
// works too (the Connect protocol with JSON):
//
//	curl -i -H 'Content-Type: application/json' -H 'X-Tenant: acme' -H 'Idempotency-Key: order-42' \
//	    -d '{"account":"acct_1","amount_cents":1999,"currency":"EUR"}' \
//	    http://127.0.0.1:8080/payments.v1.Payments/Charge
//
// The files: main.go (configuration and the fx wiring), server.go (the HTTP
// server, the handlers and their interceptor), payments.go (the service),
// client.go (the client mode).
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
	if len(os.Args) > 1 && os.Args[1] == "charge" {
		os.Exit(charge(os.Args[2:], os.Stdout, os.Stderr))
	}
	// Run starts the app, blocks until SIGINT or SIGTERM, then stops it:
	// the HTTP server drains before the Redis client and the embedded Redis
	// go away.
	fx.New(appOptions(configFromEnv())).Run()
}

// config is the app's own configuration. The library reads its settings
// (IDEMPOTENCY_*) itself; see docs/configuration.md.
type config struct {
	// Addr is where the HTTP server listens (ADDR, default
	// 127.0.0.1:8080). Port 0 picks a free port; the log says which.
	Addr string
	// EmbeddedRedis starts an in-process Redis for the library. It is true
	// when neither IDEMPOTENCY_REDIS_URL nor IDEMPOTENCY_REDIS_CLUSTER_ADDRS
	// is set.
	EmbeddedRedis bool
}

func configFromEnv() config {
	return config{
		Addr: cmp.Or(os.Getenv("ADDR"), "127.0.0.1:8080"),
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
		fx.Provide(newPayments, newMux, newServer),
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
