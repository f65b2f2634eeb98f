package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/fx"
	"go.uber.org/zap"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemhttp"
)

// registryOut provides the app's metrics registry twice: as itself, for
// /metrics, and as a prometheus.Registerer, which is the type the idempotency
// module asks for. fx matches types exactly: without the Registerer the
// module would register its metrics on prometheus.DefaultRegisterer, and
// /metrics would not show them.
type registryOut struct {
	fx.Out

	Registry   *prometheus.Registry
	Registerer prometheus.Registerer
}

func newRegistry() (registryOut, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return registryOut{}, err
	}
	return registryOut{Registry: reg, Registerer: reg}, nil
}

// newRoutes is the HTTP API.
func newRoutes(c *coordinator.Coordinator, reg *prometheus.Registry, p *provider, l *ledger, q *refundQueue, rc *refundConsumer) http.Handler {
	// The middleware is wrapped around each route's handler inside the mux,
	// not around the mux, so that it knows the route: the pattern
	// "POST /payments" becomes the operation "POST.payments", the label of
	// the idempotency_* metrics and part of every Redis key.
	idem := idemhttp.Middleware(c,
		// A payment without a key is refused (400): clients must be able to
		// retry a charge safely.
		idemhttp.WithKeyRequired(true),
		// Keys are per caller: two tenants who happen to send the same key
		// never see each other's response. See tenantOf.
		idemhttp.WithKeyScope(tenantOf),
	)

	mux := http.NewServeMux()
	mux.Handle("POST /payments", idem(createPayment(p, l)))
	mux.Handle("GET /ledger", showLedger(l, rc))
	mux.Handle("POST /refunds", publishRefund(q))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	return mux
}

// server is the HTTP server, started and stopped by the fx lifecycle.
type server struct {
	http *http.Server
	addr string // set once it listens
}

// Addr returns the address the server listens on (after start).
func (s *server) Addr() string { return s.addr }

func newServer(lc fx.Lifecycle, sd fx.Shutdowner, cfg config, h http.Handler, log *zap.Logger) *server {
	s := &server{http: &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          zap.NewStdLog(log.Named("http")),
	}}
	served := make(chan struct{})
	lc.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			// Listen here, not in the goroutine, so that a busy port fails
			// start-up with a clear error.
			ln, err := new(net.ListenConfig).Listen(ctx, "tcp", cfg.Addr)
			if err != nil {
				return fmt.Errorf("listen on %s (ADDR): %w", cfg.Addr, err)
			}
			s.addr = ln.Addr().String()
			go func() {
				defer close(served)
				if err := s.http.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
					log.Error("http server failed", zap.Error(err))
					_ = sd.Shutdown(fx.ExitCode(1)) // stop the whole app
				}
			}()
			log.Info("serving on http://"+s.addr, zap.String("addr", s.addr))
			return nil
		},
		OnStop: func(ctx context.Context) error {
			log.Info("shutting down: draining HTTP requests")
			// Shutdown stops accepting and waits for running requests
			// (bounded by fx's stop timeout, 15s by default).
			err := s.http.Shutdown(ctx)
			<-served
			return err
		},
	})
	return s
}
