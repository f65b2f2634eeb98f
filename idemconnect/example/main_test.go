// The test is in package main because a main package cannot be imported. It
// starts the whole app, as main builds it, on a free port with its own
// embedded Redis, and talks to it over Connect's three protocols.
package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/protobuf/types/known/structpb"

	idemfxtest "github.com/idemkit/idempotency/fxtest"
	"github.com/idemkit/idempotency/idemconnect"
)

// TestMain checks that a stopped app leaves no goroutine behind: HTTP
// server, Redis client, embedded Redis.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startApp starts the app on a free port with an embedded Redis, and
// returns its server and service; it stops when the test ends.
func startApp(t *testing.T) (*server, *payments) {
	t.Helper()
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
	return srv, p
}

func TestApp(t *testing.T) {
	srv, p := startApp(t)
	hc := h2cClient()
	t.Cleanup(hc.CloseIdleConnections) // runs before the app stops

	type result struct {
		id       string
		code     connect.Code
		replayed bool
	}
	charged := 0
	for _, protocol := range []string{"connect", "grpc", "grpcweb"} {
		t.Run(protocol, func(t *testing.T) {
			client, err := newClient(hc, srv.Addr(), protocol)
			if err != nil {
				t.Fatal(err)
			}
			call := func(tenant, key string, amount float64) result {
				t.Helper()
				ctx := t.Context()
				if key != "" {
					ctx = idemconnect.ContextWithKey(ctx, protocol+"-"+key)
				}
				req := connect.NewRequest(must(structpb.NewStruct(map[string]any{"account": "acct_1", "amount_cents": amount, "currency": "EUR"})))
				if tenant != "" {
					req.Header().Set(tenantHeader, tenant)
				}
				resp, err := client.CallUnary(ctx, req)
				if err != nil {
					var ce *connect.Error
					errors.As(err, &ce)
					return result{"", connect.CodeOf(err), ce.Meta().Get(idemconnect.ReplayedHeader) == "true"}
				}
				return result{resp.Msg.GetFields()["id"].GetStringValue(), 0, resp.Header().Get(idemconnect.ReplayedHeader) == "true"}
			}
			n := func(i int) string { return fmt.Sprintf("ch_%d", charged+i) }
			for i, tt := range []struct {
				name        string
				tenant, key string
				amount      float64
				want        result
				newCharge   bool
			}{
				{"first charge", "acme", "order-42", 1999, result{n(1), 0, false}, true},
				{"retry: the same charge", "acme", "order-42", 1999, result{n(1), 0, true}, false},
				{"the key for another request", "acme", "order-42", 5000, result{"", connect.CodeFailedPrecondition, false}, false},
				{"another tenant, the same key", "globex", "order-42", 1999, result{n(2), 0, false}, true},
				{"a bad request", "acme", "order-43", 0, result{"", connect.CodeInvalidArgument, false}, false},
				{"its retry: the stored refusal", "acme", "order-43", 0, result{"", connect.CodeInvalidArgument, true}, false},
				{"no key: the client interceptor adds one", "acme", "", 700, result{n(3), 0, false}, true},
				{"no tenant", "", "order-44", 1, result{"", connect.CodeUnauthenticated, false}, false},
			} {
				if got := call(tt.tenant, tt.key, tt.amount); got != tt.want {
					t.Fatalf("%d %s: got %+v, want %+v", i, tt.name, got, tt.want)
				}
			}
			charged += 3
			if got := p.count(); got != charged {
				t.Fatalf("%d charges made, want %d", got, charged)
			}
		})
	}

	// Without the client interceptor, a charge without a key is refused,
	// and GetCharge, which reads, needs none.
	plain := connect.NewClient[structpb.Struct, structpb.Struct](hc, "http://"+srv.Addr()+chargeProcedure)
	req := connect.NewRequest(must(structpb.NewStruct(map[string]any{"account": "acct_1", "amount_cents": 1, "currency": "EUR"})))
	req.Header().Set(tenantHeader, "acme")
	if _, err := plain.CallUnary(t.Context(), req); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("a charge without a key: %v, want invalid_argument", err)
	}
	get := connect.NewClient[structpb.Struct, structpb.Struct](hc, "http://"+srv.Addr()+getChargeProcedure, connect.WithGRPC())
	resp, err := get.CallUnary(t.Context(), connect.NewRequest(must(structpb.NewStruct(map[string]any{"id": "ch_1"}))))
	if err != nil || resp.Msg.GetFields()["amount_cents"].GetNumberValue() != 1999 {
		t.Fatalf("GetCharge = %v, %v; want ch_1 of 1999", resp, err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// The client mode charges once per key and tenant, over each protocol, and
// says when it replayed.
func TestChargeClientMode(t *testing.T) {
	srv, _ := startApp(t)
	run := func(args ...string) string {
		t.Helper()
		var out, errs strings.Builder
		if code := charge(append([]string{"-addr", srv.Addr()}, args...), &out, &errs); code != 0 {
			t.Fatalf("charge %q exited %d: %s", args, code, errs.String())
		}
		return out.String()
	}
	first := run("-key", "order-42", "-tenant", "acme")
	for _, protocol := range []string{"connect", "grpc", "grpcweb"} {
		if again := run("-key", "order-42", "-tenant", "acme", "-protocol", protocol); again != strings.Replace(first, "false", "true", 1) {
			t.Errorf("over %s: %q after %q, want the same charge, replayed", protocol, again, first)
		}
	}
	if !strings.HasSuffix(first, "(replayed: false)\n") {
		t.Errorf("first charge %q, want it not replayed", first)
	}
	if other := run("-key", "order-42", "-tenant", "shop_2"); other == first || !strings.HasSuffix(other, "(replayed: false)\n") {
		t.Errorf("another tenant's key got %q; want a new charge", other)
	}
	var errs strings.Builder
	if code := charge([]string{"-nope"}, io.Discard, &errs); code != 2 || !strings.Contains(errs.String(), "-nope") {
		t.Errorf("an unknown flag exited %d with %q; want 2 and the flag named", code, errs.String())
	}
	errs.Reset()
	if code := charge([]string{"-protocol", "soap"}, io.Discard, &errs); code != 2 || !strings.Contains(errs.String(), "soap") {
		t.Errorf("an unknown protocol exited %d with %q; want 2 and the protocol named", code, errs.String())
	}
}
