package main

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"connectrpc.com/connect"
	"go.uber.org/zap"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/structpb"
)

// The procedures of the payments service. Generated code
// (protoc-gen-connect-go) names them PaymentsChargeProcedure and so on; the
// example has no generated code, and its messages are
// google.protobuf.Struct values.
const (
	chargeProcedure    = "/payments.v1.Payments/Charge"
	getChargeProcedure = "/payments.v1.Payments/GetCharge"
)

// tenantHeader is the header that says which tenant calls. A real service
// takes the tenant from the caller's authenticated identity (authentication
// middleware or an interceptor before the idempotency one), never from
// what the client merely asserts; a header keeps the example short.
const tenantHeader = "X-Tenant"

// tenantOf is the key scope hook: the calling tenant.
func tenantOf(_ context.Context, req connect.AnyRequest) (string, error) {
	if t := req.Header().Get(tenantHeader); t != "" {
		return "tenant:" + t, nil
	}
	return "", errors.New("no " + tenantHeader + " header")
}

// payments is the payments service: its charges stand in for calls to a
// payment provider, where money moves.
type payments struct {
	log *zap.Logger

	mu      sync.Mutex
	charges map[string]*structpb.Struct
}

func newPayments(log *zap.Logger) *payments {
	return &payments{log: log.Named("payments"), charges: make(map[string]*structpb.Struct)}
}

// Charge charges an account: {"account", "amount_cents", "currency"}. A
// refused request (InvalidArgument) is stored and replayed like a charge: a
// retry with the same key is the same bad request.
func (p *payments) Charge(_ context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
	f := req.Msg.GetFields()
	account, amount, currency := f["account"].GetStringValue(), f["amount_cents"].GetNumberValue(), f["currency"].GetStringValue()
	if amount <= 0 || account == "" || len(currency) != 3 {
		e := connect.NewError(connect.CodeInvalidArgument, errors.New("invalid charge"))
		if d, err := connect.NewErrorDetail(&errdetails.BadRequest{
			FieldViolations: []*errdetails.BadRequest_FieldViolation{{
				Field:       "amount_cents, account, currency",
				Description: "a positive amount, an account and a 3-letter currency are required",
			}},
		}); err == nil {
			e.AddDetail(d)
		}
		return nil, e
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	id := fmt.Sprintf("ch_%d", len(p.charges)+1)
	ch, err := structpb.NewStruct(map[string]any{"id": id, "account": account, "amount_cents": amount, "currency": currency})
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	p.charges[id] = ch
	p.log.Info("charged", zap.String("id", id), zap.String("account", account), zap.Float64("amount_cents", amount))
	return connect.NewResponse(ch), nil
}

// GetCharge returns a charge, {"id"}, or NotFound.
func (p *payments) GetCharge(_ context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
	id := req.Msg.GetFields()["id"].GetStringValue()
	p.mu.Lock()
	defer p.mu.Unlock()
	if ch, ok := p.charges[id]; ok {
		return connect.NewResponse(ch), nil
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no charge %q", id))
}

// count returns how many charges were made.
func (p *payments) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.charges)
}
