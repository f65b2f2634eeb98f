// Package orders is what the example services of idemgin, idemecho and
// idemconnect share, so that each shows only its framework: the order
// ledger (Ledger, the charges table beside the store's), the app's own
// configuration (Config), its fx frame (Options: the library on the
// PostgreSQL store, a logger, the HTTP server), and Main, which starts a
// throwaway PostgreSQL server (idempg/pgtemp) when IDEMPOTENCY_POSTGRES_URL
// is unset. Its test kit, orderstest, runs the same checks against each.
//
// It is example code, kept importable so that a service may start from it.
package orders

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
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

// Config is the app's own configuration. The library reads its settings
// (IDEMPOTENCY_*) itself; see docs/configuration.md.
type Config struct {
	// Addr is where the HTTP server listens (ADDR, default 127.0.0.1:8080).
	// Port 0 picks a free port; the log says which.
	Addr string
	// LogLevel is the zap level (LOG_LEVEL, default info). At debug, the
	// frameworks run in their debug modes.
	LogLevel string
	// ChargeDelay is the payment provider's latency (CHARGE_DELAY, a Go
	// duration, default 50ms).
	ChargeDelay time.Duration
	// ThrowawayPostgres starts a PostgreSQL server for the run, when
	// IDEMPOTENCY_POSTGRES_URL is unset; PostgresURL is then its address.
	ThrowawayPostgres bool
	PostgresURL       string
}

// ConfigFromEnv reads Config from ADDR, LOG_LEVEL and CHARGE_DELAY.
func ConfigFromEnv() (Config, error) {
	delay, err := time.ParseDuration(cmp.Or(os.Getenv("CHARGE_DELAY"), "50ms"))
	if err != nil || delay < 0 {
		return Config{}, fmt.Errorf("CHARGE_DELAY: %q is not a duration of 0 or more, such as 50ms", os.Getenv("CHARGE_DELAY"))
	}
	return Config{
		Addr:              cmp.Or(os.Getenv("ADDR"), "127.0.0.1:8080"),
		LogLevel:          cmp.Or(os.Getenv("LOG_LEVEL"), "info"),
		ChargeDelay:       delay,
		ThrowawayPostgres: os.Getenv("IDEMPOTENCY_POSTGRES_URL") == "",
	}, nil
}

// Main runs the app that app builds until SIGINT or SIGTERM and returns the
// exit code. The throwaway server, when there is one, outlives the app: the
// HTTP server drains, then the pool closes, then the server stops.
func Main(app func(Config) fx.Option) int {
	cfg, err := ConfigFromEnv()
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
	a := fx.New(app(cfg))
	ctx, cancel := context.WithTimeout(context.Background(), a.StartTimeout())
	defer cancel()
	if err := a.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sig := <-a.Wait()
	ctx, cancel = context.WithTimeout(context.Background(), a.StopTimeout())
	defer cancel()
	if err := a.Stop(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return sig.ExitCode
}

// Options is the app's frame as one fx option, so that main and the tests
// build exactly the same graph: cfg, the library on the PostgreSQL store
// (*coordinator.Coordinator over idempg, from the IDEMPOTENCY_*
// environment, on the app's *zap.Logger), the module's pool as the app's
// *pgxpool.Pool, the Ledger, and a *Server serving the http.Handler that
// handler provides.
func Options(cfg Config, handler fx.Option) fx.Option {
	return fx.Options(
		fx.Supply(cfg),
		idempotency.Module,
		idempg.Module,
		idempg.OverrideSettings(func(s *idempg.Settings) {
			if cfg.PostgresURL != "" {
				s.URL = cfg.PostgresURL
			}
			// The example owns its database: it applies the schema. A
			// service whose migrations run elsewhere leaves this false.
			s.Migrate = true
		}),
		fx.Provide(NewLogger),
		fx.WithLogger(func(log *zap.Logger) fxevent.Logger {
			l := &fxevent.ZapLogger{Logger: log.Named("fx")}
			l.UseLogLevel(zapcore.DebugLevel)
			return l
		}),
		// The app's tables live in the store's database, so that a charge
		// and its idempotency record commit together: the app uses the
		// pool the module opened.
		fx.Provide(fx.Annotate(func(p *pgxpool.Pool) *pgxpool.Pool { return p },
			fx.ParamTags(`name:"`+idempg.PoolName+`"`))),
		fx.Provide(NewLedger, NewServer),
		handler,
		fx.Invoke(func(*Server) {}),
		fx.Invoke(func(log *zap.Logger) {
			if cfg.ThrowawayPostgres {
				log.Warn("IDEMPOTENCY_POSTGRES_URL is unset: using a throwaway PostgreSQL server, deleted on exit; set it to use your own database")
			}
		}),
	)
}

// NewLogger returns a human-readable console logger at cfg.LogLevel.
func NewLogger(cfg Config) (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(cmp.Or(cfg.LogLevel, "info"))
	if err != nil {
		return nil, fmt.Errorf("LOG_LEVEL: %w", err)
	}
	zc := zap.NewDevelopmentConfig()
	zc.Level = zap.NewAtomicLevelAt(level)
	zc.DisableStacktrace = true // a key reuse is a warning, not a crash
	return zc.Build()
}

// Server is the HTTP server, started and stopped by the fx lifecycle.
type Server struct {
	http *http.Server
	addr string // set once it listens
}

// Addr returns the address the server listens on (after start).
func (s *Server) Addr() string { return s.addr }

// NewServer returns the server of h on cfg.Addr. It listens on start, so
// that a busy port fails start-up with a clear error, and drains on stop; a
// server that fails while serving shuts the app down with exit code 1. It
// speaks HTTP/1.1 and HTTP/2 without TLS (h2c).
func NewServer(lc fx.Lifecycle, sd fx.Shutdowner, cfg Config, h http.Handler, log *zap.Logger) *Server {
	// HTTP/1.1, and HTTP/2 without TLS (h2c) for gRPC clients (the Connect
	// example). Behind TLS, http.Server speaks HTTP/2 by itself.
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	s := &Server{http: &http.Server{
		Handler:           h,
		Protocols:         protocols,
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          zap.NewStdLog(log.Named("http")),
	}}
	served := make(chan struct{})
	lc.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			ln, err := new(net.ListenConfig).Listen(ctx, "tcp", cfg.Addr)
			if err != nil {
				return fmt.Errorf("listen on %s (ADDR): %w", cfg.Addr, err)
			}
			s.addr = ln.Addr().String()
			go func() {
				defer close(served)
				if err := s.http.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
					log.Error("http server failed", zap.Error(err))
					_ = sd.Shutdown(fx.ExitCode(1))
				}
			}()
			log.Info("serving on http://"+s.addr, zap.String("addr", s.addr))
			return nil
		},
		OnStop: func(ctx context.Context) error {
			log.Info("shutting down: draining HTTP requests")
			err := s.http.Shutdown(ctx) // until fx's stop timeout
			if err != nil {
				_ = s.http.Close() // cut the requests that are left
			}
			<-served
			return err
		},
	})
	return s
}
