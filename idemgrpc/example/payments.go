package main

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.uber.org/zap"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idempotency/idemgrpc/internal/paymentspb"
)

// tenantHeader is the metadata entry that says which tenant calls. A real
// service takes the tenant from the caller's authenticated identity (an
// authentication interceptor that runs before the idempotency one), never
// from what the client merely asserts; a header keeps the example short.
const tenantHeader = "x-tenant"

// tenantOf is the key scope hook: the calling tenant.
func tenantOf(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if t := md.Get(tenantHeader); len(t) == 1 && t[0] != "" {
		return "tenant:" + t[0], nil
	}
	return "", errors.New("no " + tenantHeader + " metadata entry")
}

// payments is the Payments service: its charges stand in for calls to a
// payment provider, where money moves.
type payments struct {
	paymentspb.UnimplementedPaymentsServer
	log *zap.Logger

	mu      sync.Mutex
	charges map[string]*paymentspb.Charge
}

func newPayments(log *zap.Logger) *payments {
	return &payments{log: log.Named("payments"), charges: make(map[string]*paymentspb.Charge)}
}

// Charge charges an account. A refused request (InvalidArgument) is stored
// and replayed like a charge: a retry with the same key is the same bad
// request.
func (p *payments) Charge(_ context.Context, req *paymentspb.ChargeRequest) (*paymentspb.Charge, error) {
	if req.GetAmountCents() <= 0 || req.GetAccount() == "" || len(req.GetCurrency()) != 3 {
		st, _ := status.New(codes.InvalidArgument, "invalid charge").WithDetails(&errdetails.BadRequest{
			FieldViolations: []*errdetails.BadRequest_FieldViolation{{
				Field:       "amount_cents, account, currency",
				Description: "a positive amount, an account and a 3-letter currency are required",
			}},
		})
		return nil, st.Err()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	ch := &paymentspb.Charge{
		Id:          fmt.Sprintf("ch_%d", len(p.charges)+1),
		Account:     req.GetAccount(),
		AmountCents: req.GetAmountCents(),
		Currency:    req.GetCurrency(),
	}
	p.charges[ch.GetId()] = ch
	p.log.Info("charged", zap.String("id", ch.GetId()), zap.String("account", ch.GetAccount()), zap.Int64("amount_cents", ch.GetAmountCents()))
	return ch, nil
}

// GetCharge returns a charge, or NotFound.
func (p *payments) GetCharge(_ context.Context, req *paymentspb.GetChargeRequest) (*paymentspb.Charge, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ch, ok := p.charges[req.GetId()]; ok {
		return ch, nil
	}
	return nil, status.Errorf(codes.NotFound, "no charge %q", req.GetId())
}

// count returns how many charges were made.
func (p *payments) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.charges)
}
