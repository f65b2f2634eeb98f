package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/fx"
	"go.uber.org/zap"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idempotency/idempg"
	"github.com/idemkit/idempotency/idempg/example/orders"
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

// chargesTable is the app's own table, beside the store's.
const chargesTable = `CREATE TABLE IF NOT EXISTS charges (
    id           bigserial PRIMARY KEY,
    tenant       text NOT NULL,
    account      text NOT NULL,
    amount_cents bigint NOT NULL CHECK (amount_cents > 0),
    currency     text NOT NULL
)`

// maxAmount is the largest charge, in cents: far below what a float64 (the
// number of a google.protobuf.Struct) holds exactly.
const maxAmount = 1e12

// payments is the payments service: its charges stand in for calls to a
// payment provider, where money moves, and are recorded in the charges
// table.
type payments struct {
	log   *zap.Logger
	pool  *pgxpool.Pool
	delay time.Duration
}

type paymentsParams struct {
	fx.In

	Lifecycle fx.Lifecycle
	Config    orders.Config
	Log       *zap.Logger
	// Pool is the pool of the store's database (idempg.PoolName).
	Pool *pgxpool.Pool
	// Store is the idempotency store. Asking for it puts its start hook,
	// which checks the database and applies the store's schema, before the
	// one that creates the charges table.
	Store idemstore.Store
}

// newPayments returns the service, which creates the charges table on
// start, after the store's start hook.
func newPayments(p paymentsParams) *payments {
	p.Lifecycle.Append(fx.StartHook(func(ctx context.Context) error {
		if _, err := p.Pool.Exec(ctx, chargesTable); err != nil {
			return fmt.Errorf("create the charges table: %w", err)
		}
		return nil
	}))
	return &payments{log: p.Log.Named("payments"), pool: p.Pool, delay: p.Config.ChargeDelay}
}

// querier is what Charge writes through: the idempotency transaction, or
// the pool when there is none.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Charge charges an account: {"account", "amount_cents", "currency"}. A
// refused request (InvalidArgument) is stored and replayed like a charge: a
// retry with the same key is the same bad request.
//
// It knows nothing about idempotency but where to write: the interceptor in
// front of it makes sure it runs once per key, inside the transaction that
// holds the key (idempg.Tx), and the charge commits with the idempotency
// record and the response, or, on an error that is not stored (Internal,
// Unavailable, ...) or a crash, neither does.
func (p *payments) Charge(ctx context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
	f := req.Msg.GetFields()
	account, amount, currency := f["account"].GetStringValue(), f["amount_cents"].GetNumberValue(), f["currency"].GetStringValue()
	if amount <= 0 || amount > maxAmount || amount != math.Trunc(amount) || account == "" || len(currency) != 3 {
		e := connect.NewError(connect.CodeInvalidArgument, errors.New("invalid charge"))
		if d, err := connect.NewErrorDetail(&errdetails.BadRequest{
			FieldViolations: []*errdetails.BadRequest_FieldViolation{{
				Field:       "amount_cents, account, currency",
				Description: "a positive whole amount of cents, an account and a 3-letter currency are required",
			}},
		}); err == nil {
			e.AddDetail(d)
		}
		return nil, e
	}
	tenant := req.Header().Get(tenantHeader)

	// The payment provider, with its latency. Once asked, it charges
	// whatever our caller does, so the charge is recorded even when the
	// caller has timed out or hung up meanwhile: the rest of the handler
	// does not stop with the call. The caller's retry, with the same key,
	// gets this charge back instead of making a second one.
	ctx = context.WithoutCancel(ctx)
	time.Sleep(p.delay)

	// The idempotency transaction, in which the charge commits with its
	// record. There is none when the interceptor steps aside (the kill
	// switch, IDEMPOTENCY_ENABLED=false): the charge is then written on
	// its own, unprotected, as the kill switch means.
	var db querier = p.pool
	if tx, ok := idempg.Tx(ctx); ok {
		db = tx
	}
	var id int64
	err := db.QueryRow(ctx, `INSERT INTO charges (tenant, account, amount_cents, currency) VALUES ($1, $2, $3, $4) RETURNING id`,
		tenant, account, int64(amount), currency).Scan(&id)
	if err != nil {
		// Internal is not stored: the transaction rolls back, and a retry
		// charges.
		p.log.Error("charge not recorded", zap.Error(err))
		return nil, connect.NewError(connect.CodeInternal, errors.New("the charge could not be recorded"))
	}
	ch, err := chargeMessage(id, tenant, account, amount, currency)
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	p.log.Info("charged", zap.Int64("id", id), zap.String("tenant", tenant), zap.String("account", account), zap.Float64("amount_cents", amount))
	return connect.NewResponse(ch), nil
}

// GetCharge returns a charge, {"id"}, or NotFound. It reads the charges
// table: only what committed.
func (p *payments) GetCharge(ctx context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
	id := req.Msg.GetFields()["id"].GetStringValue()
	notFound := connect.NewError(connect.CodeNotFound, fmt.Errorf("no charge %q", id))
	digits, ok := strings.CutPrefix(id, "ch_")
	n, err := strconv.ParseInt(digits, 10, 64)
	if !ok || err != nil {
		return nil, notFound
	}
	var (
		tenant, account, currency string
		amount                    int64
	)
	err = p.pool.QueryRow(ctx, `SELECT tenant, account, amount_cents, currency FROM charges WHERE id = $1`, n).
		Scan(&tenant, &account, &amount, &currency)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, notFound
	case err != nil:
		p.log.Error("charge not read", zap.Error(err))
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the charge could not be read"))
	}
	ch, err := chargeMessage(n, tenant, account, float64(amount), currency)
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewResponse(ch), nil
}

// chargeMessage is the message of a charge: {"id", "tenant", "account",
// "amount_cents", "currency"}.
func chargeMessage(id int64, tenant, account string, amount float64, currency string) (*structpb.Struct, error) {
	return structpb.NewStruct(map[string]any{
		"id": fmt.Sprintf("ch_%d", id), "tenant": tenant, "account": account, "amount_cents": amount, "currency": currency,
	})
}
