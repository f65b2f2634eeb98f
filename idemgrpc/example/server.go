package main

import (
	"context"
	"errors"
	"fmt"
	"net"

	"go.uber.org/fx"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemgrpc"
	"github.com/idemkit/idempotency/idemgrpc/internal/paymentspb"
)

// server is the gRPC server, started and stopped by the fx lifecycle.
type server struct {
	grpc *grpc.Server
	addr string // set once it listens
}

// Addr returns the address the server listens on (after start).
func (s *server) Addr() string { return s.addr }

func newServer(lc fx.Lifecycle, sd fx.Shutdowner, cfg config, c *coordinator.Coordinator, p *payments, log *zap.Logger) *server {
	idem := idemgrpc.UnaryServerInterceptor(c,
		// Only Charge moves money; GetCharge reads and needs no key.
		idemgrpc.WithMethods(paymentspb.Payments_Charge_FullMethodName),
		// A charge without a key is refused (InvalidArgument): clients must
		// be able to retry a charge safely.
		idemgrpc.WithKeyRequired(true),
		// Keys are per caller: two tenants who send the same key never see
		// each other's charge. See tenantOf.
		idemgrpc.WithKeyScope(tenantOf),
	)
	s := &server{grpc: grpc.NewServer(grpc.ChainUnaryInterceptor(idem))}
	paymentspb.RegisterPaymentsServer(s.grpc, p)
	reflection.Register(s.grpc) // for grpcurl

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
				if err := s.grpc.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
					log.Error("grpc server failed", zap.Error(err))
					_ = sd.Shutdown(fx.ExitCode(1))
				}
			}()
			log.Info("serving gRPC on "+s.addr, zap.String("addr", s.addr))
			return nil
		},
		OnStop: func(ctx context.Context) error {
			log.Info("shutting down: draining gRPC calls")
			stopped := make(chan struct{})
			go func() {
				s.grpc.GracefulStop()
				close(stopped)
			}()
			select {
			case <-stopped:
			case <-ctx.Done(): // fx's stop timeout: cut the calls that are left
				s.grpc.Stop()
				<-stopped
			}
			<-served
			return nil
		},
	})
	return s
}
