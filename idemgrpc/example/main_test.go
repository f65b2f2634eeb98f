// The test is in package main because a main package cannot be imported. It
// starts the whole app, as main builds it, on a free port with its own
// embedded Redis, and talks to it over gRPC.
package main

import (
	"context"
	"io"
	"strings"
	"testing"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	idemfxtest "github.com/idemkit/idempotency/fxtest"
	"github.com/idemkit/idempotency/idemgrpc"
	"github.com/idemkit/idempotency/idemgrpc/internal/paymentspb"
)

// TestMain checks that a stopped app leaves no goroutine behind: gRPC
// server, Redis client, embedded Redis.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestApp(t *testing.T) {
	var (
		srv *server
		p   *payments
	)
	app := fxtest.New(t,
		appOptions(config{Addr: "127.0.0.1:0", EmbeddedRedis: true}),
		// Start from the library's defaults, whatever IDEMPOTENCY_* variables
		// the developer's shell has.
		idemfxtest.IgnoreEnvironment(),
		fx.Replace(zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))),
		fx.Populate(&srv, &p),
	)
	app.RequireStart()
	t.Cleanup(app.RequireStop)

	conn, err := grpc.NewClient(srv.Addr(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(
			idemgrpc.WithMethods(paymentspb.Payments_Charge_FullMethodName))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() }) // runs before the app stops
	client := paymentspb.NewPaymentsClient(conn)

	as := func(tenant, key string) context.Context {
		ctx := metadata.AppendToOutgoingContext(t.Context(), tenantHeader, tenant)
		if key != "" {
			ctx = idemgrpc.ContextWithKey(ctx, key)
		}
		return ctx
	}
	type result struct {
		id       string
		code     codes.Code
		replayed bool
	}
	call := func(ctx context.Context, amount int64) result {
		t.Helper()
		var header metadata.MD
		ch, err := client.Charge(ctx, &paymentspb.ChargeRequest{Account: "acct_1", AmountCents: amount, Currency: "EUR"}, grpc.Header(&header))
		return result{ch.GetId(), status.Code(err), len(header.Get(idemgrpc.ReplayedHeader)) == 1}
	}

	for i, tt := range []struct {
		name   string
		ctx    context.Context
		amount int64
		want   result
	}{
		{"first charge", as("acme", "order-42"), 1999, result{"ch_1", codes.OK, false}},
		{"retry: the same charge", as("acme", "order-42"), 1999, result{"ch_1", codes.OK, true}},
		{"the key for another request", as("acme", "order-42"), 5000, result{"", codes.FailedPrecondition, false}},
		{"another tenant, the same key", as("globex", "order-42"), 1999, result{"ch_2", codes.OK, false}},
		{"a bad request", as("acme", "order-43"), 0, result{"", codes.InvalidArgument, false}},
		{"its retry: the stored refusal", as("acme", "order-43"), 0, result{"", codes.InvalidArgument, true}},
		{"no key: the client interceptor adds one", as("acme", ""), 700, result{"ch_3", codes.OK, false}},
		{"no tenant", idemgrpc.ContextWithKey(t.Context(), "order-44"), 1, result{"", codes.Unauthenticated, false}},
	} {
		if got := call(tt.ctx, tt.amount); got != tt.want {
			t.Fatalf("%d %s: got %+v, want %+v", i, tt.name, got, tt.want)
		}
	}
	if n := p.count(); n != 3 {
		t.Fatalf("%d charges made, want 3", n)
	}

	// Without the client interceptor, a charge without a key is refused,
	// and GetCharge, which reads, needs none.
	plain, err := grpc.NewClient(srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = plain.Close() })
	raw := paymentspb.NewPaymentsClient(plain)
	_, err = raw.Charge(as("acme", ""), &paymentspb.ChargeRequest{Account: "acct_1", AmountCents: 1, Currency: "EUR"})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a charge without a key: %v, want InvalidArgument", err)
	}
	if ch, err := raw.GetCharge(as("acme", ""), &paymentspb.GetChargeRequest{Id: "ch_1"}); err != nil || ch.GetAmountCents() != 1999 {
		t.Fatalf("GetCharge = %v, %v; want ch_1 of 1999", ch, err)
	}
}

// The client mode charges once per key and tenant, and says when it replayed.
func TestChargeClientMode(t *testing.T) {
	var srv *server
	app := fxtest.New(t,
		appOptions(config{Addr: "127.0.0.1:0", EmbeddedRedis: true}),
		idemfxtest.IgnoreEnvironment(),
		fx.Replace(zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))),
		fx.Populate(&srv),
	)
	app.RequireStart()
	t.Cleanup(app.RequireStop)

	run := func(args ...string) string {
		t.Helper()
		var out, errs strings.Builder
		if code := charge(append([]string{"-addr", srv.Addr()}, args...), &out, &errs); code != 0 {
			t.Fatalf("charge %q exited %d: %s", args, code, errs.String())
		}
		return out.String()
	}
	first := run("-key", "order-42", "-tenant", "acme")
	again := run("-key", "order-42", "-tenant", "acme")
	other := run("-key", "order-42", "-tenant", "shop_2")
	if !strings.HasSuffix(first, "(replayed: false)\n") || again != strings.Replace(first, "false", "true", 1) {
		t.Errorf("first %q, again %q: want the same charge, replayed the second time", first, again)
	}
	if other == first || !strings.HasSuffix(other, "(replayed: false)\n") {
		t.Errorf("another tenant's key got %q; want a new charge", other)
	}
	var errs strings.Builder
	if code := charge([]string{"-nope"}, io.Discard, &errs); code != 2 || !strings.Contains(errs.String(), "-nope") {
		t.Errorf("an unknown flag exited %d with %q; want 2 and the flag named", code, errs.String())
	}
}
