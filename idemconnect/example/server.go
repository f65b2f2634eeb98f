package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/fx"
	"go.uber.org/zap"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemconnect"
)

// newMux returns the service's routes: the handlers of the payments
// service, Charge behind the idempotency interceptor over the coordinator
// that the fx module provides.
func newMux(c *coordinator.Coordinator, p *payments) (*http.ServeMux, error) {
	idem, err := idemconnect.NewInterceptor(c,
		// Only Charge moves money; GetCharge reads and needs no key.
		idemconnect.WithProcedures(chargeProcedure),
		// A charge without a key is refused (InvalidArgument): clients must
		// be able to retry a charge safely.
		idemconnect.WithKeyRequired(true),
		// Keys are per caller: two tenants who send the same key never see
		// each other's charge. See tenantOf.
		idemconnect.WithKeyScope(tenantOf),
	)
	if err != nil {
		return nil, fmt.Errorf("idempotency interceptor: %w", err)
	}
	with := connect.WithInterceptors(idem)
	mux := http.NewServeMux()
	mux.Handle(chargeProcedure, connect.NewUnaryHandler(chargeProcedure, p.Charge, with))
	mux.Handle(getChargeProcedure, connect.NewUnaryHandler(getChargeProcedure, p.GetCharge, with))
	return mux, nil
}

// server is the HTTP server, started and stopped by the fx lifecycle.
type server struct {
	http *http.Server
	addr string // set once it listens
}

// Addr returns the address the server listens on (after start).
func (s *server) Addr() string { return s.addr }

func newServer(lc fx.Lifecycle, sd fx.Shutdowner, cfg config, mux *http.ServeMux, log *zap.Logger) *server {
	// HTTP/1.1 for the Connect protocol and gRPC-Web from browsers, HTTP/2
	// without TLS (h2c) for gRPC. Behind TLS, http.Server speaks HTTP/2 by
	// itself.
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	s := &server{http: &http.Server{Handler: mux, Protocols: protocols, ReadHeaderTimeout: 10 * time.Second}}

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
				if err := s.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
					log.Error("http server failed", zap.Error(err))
					_ = sd.Shutdown(fx.ExitCode(1))
				}
			}()
			log.Info("serving Connect, gRPC and gRPC-Web on http://"+s.addr, zap.String("addr", s.addr))
			return nil
		},
		OnStop: func(ctx context.Context) error {
			log.Info("shutting down: draining calls")
			err := s.http.Shutdown(ctx) // until fx's stop timeout
			if err != nil {
				_ = s.http.Close() // cut the calls that are left
			}
			<-served
			return err
		},
	})
	return s
}
