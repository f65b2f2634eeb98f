// The tests are in package main because a main package cannot be imported.
// Each test starts the whole app, as main builds it, on a free port with a
// database of its own on a throwaway PostgreSQL server, and talks to it over
// Connect's three protocols.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idempotency/idemconnect"
	"github.com/idemkit/idempotency/idempg/example/orders/orderstest"
)

func TestMain(m *testing.M) { orderstest.Main(m, run) }

// query returns the one integer that sql, with args, selects in the
// database at dsn.
func query(t *testing.T, dsn, sql string, args ...any) int {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(t.Context(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// testApp is a running app and its database.
type testApp struct {
	addr string // 127.0.0.1:port
	dsn  string
}

// startApp starts the app on a free port with a database of its own, the
// provider answering after delay; it stops when the test ends.
func startApp(t *testing.T, delay time.Duration) testApp {
	t.Helper()
	a := orderstest.Start(t, appOptions, delay)
	return testApp{addr: strings.TrimPrefix(a.URL, "http://"), dsn: a.DSN}
}

// result is what a test looks at in a Charge's answer.
type result struct {
	id       string
	tenant   string
	code     connect.Code
	replayed bool
}

// callCharge charges amount on acct_1 as tenant (none: no header), in ctx.
func callCharge(ctx context.Context, client *connect.Client[structpb.Struct, structpb.Struct], tenant string, amount float64) result {
	req := connect.NewRequest(must(structpb.NewStruct(map[string]any{"account": "acct_1", "amount_cents": amount, "currency": "EUR"})))
	if tenant != "" {
		req.Header().Set(tenantHeader, tenant)
	}
	resp, err := client.CallUnary(ctx, req)
	if err != nil {
		var ce *connect.Error
		if !errors.As(err, &ce) {
			return result{code: connect.CodeOf(err)}
		}
		return result{code: ce.Code(), replayed: ce.Meta().Get(idemconnect.ReplayedHeader) == "true"}
	}
	f := resp.Msg.GetFields()
	return result{id: f["id"].GetStringValue(), tenant: f["tenant"].GetStringValue(), replayed: resp.Header().Get(idemconnect.ReplayedHeader) == "true"}
}

func TestApp(t *testing.T) {
	app := startApp(t, 0)
	hc := h2cClient()
	t.Cleanup(hc.CloseIdleConnections) // runs before the app stops

	charged := 0
	for _, protocol := range []string{"connect", "grpc", "grpcweb"} {
		t.Run(protocol, func(t *testing.T) {
			client, err := newClient(hc, app.addr, protocol)
			if err != nil {
				t.Fatal(err)
			}
			call := func(tenant, key string, amount float64) result {
				t.Helper()
				ctx := t.Context()
				if key != "" {
					ctx = idemconnect.ContextWithKey(ctx, protocol+"-"+key)
				}
				return callCharge(ctx, client, tenant, amount)
			}
			n := func(i int) string { return fmt.Sprintf("ch_%d", charged+i) }
			for i, tt := range []struct {
				name        string
				tenant, key string
				amount      float64
				want        result
			}{
				{"first charge", "acme", "order-42", 1999, result{n(1), "acme", 0, false}},
				{"retry: the same charge", "acme", "order-42", 1999, result{n(1), "acme", 0, true}},
				{"the key for another request", "acme", "order-42", 5000, result{"", "", connect.CodeFailedPrecondition, false}},
				{"another tenant, the same key", "globex", "order-42", 1999, result{n(2), "globex", 0, false}},
				{"a bad request", "acme", "order-43", 0, result{"", "", connect.CodeInvalidArgument, false}},
				{"its retry: the stored refusal", "acme", "order-43", 0, result{"", "", connect.CodeInvalidArgument, true}},
				{"a fraction of a cent", "acme", "order-45", 0.5, result{"", "", connect.CodeInvalidArgument, false}},
				{"no key: the client interceptor adds one", "acme", "", 700, result{n(3), "acme", 0, false}},
				{"no tenant", "", "order-44", 1, result{"", "", connect.CodeUnauthenticated, false}},
			} {
				if got := call(tt.tenant, tt.key, tt.amount); got != tt.want {
					t.Fatalf("%d %s: got %+v, want %+v", i, tt.name, got, tt.want)
				}
			}
			charged += 3
			if got := orderstest.Count(t, app.dsn, "charges"); got != charged {
				t.Fatalf("%d charges made, want %d", got, charged)
			}
		})
	}
	// One record per call that the interceptor protected and whose outcome
	// it stored, under its scoped key, per protocol: acme's order-42,
	// globex's order-42, acme's order-43 and order-45 (their InvalidArgument
	// is stored), and the fresh key of the call without one. The charges
	// went through the same transactions: no other record.
	if got := orderstest.Count(t, app.dsn, "idempotency_records"); got != 3*5 {
		t.Errorf("%d idempotency records, want %d: 5 per protocol", got, 3*5)
	}

	// Without the client interceptor, a charge without a key is refused,
	// and GetCharge, which reads the table, needs none.
	plain := connect.NewClient[structpb.Struct, structpb.Struct](hc, "http://"+app.addr+chargeProcedure)
	req := connect.NewRequest(must(structpb.NewStruct(map[string]any{"account": "acct_1", "amount_cents": 1, "currency": "EUR"})))
	req.Header().Set(tenantHeader, "acme")
	if _, err := plain.CallUnary(t.Context(), req); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("a charge without a key: %v, want invalid_argument", err)
	}
	get := connect.NewClient[structpb.Struct, structpb.Struct](hc, "http://"+app.addr+getChargeProcedure, connect.WithGRPC())
	resp, err := get.CallUnary(t.Context(), connect.NewRequest(must(structpb.NewStruct(map[string]any{"id": "ch_1"}))))
	if err != nil || resp.Msg.GetFields()["amount_cents"].GetNumberValue() != 1999 || resp.Msg.GetFields()["tenant"].GetStringValue() != "acme" {
		t.Fatalf("GetCharge = %v, %v; want acme's ch_1 of 1999", resp, err)
	}
	for _, id := range []string{"ch_99", "order-42", ""} {
		_, err := get.CallUnary(t.Context(), connect.NewRequest(must(structpb.NewStruct(map[string]any{"id": id}))))
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("GetCharge %q: %v, want not_found", id, err)
		}
	}
	if got := orderstest.Count(t, app.dsn, "charges"); got != charged {
		t.Errorf("%d charges after the calls without a key, want %d", got, charged)
	}
}

// N concurrent calls with one key, spread over the three protocols, make
// one charge and one idempotency record: the first claims the key in its
// transaction, the others wait for it to commit and get its charge, as a
// replay.
func TestConcurrentDuplicatesChargeOnce(t *testing.T) {
	app := startApp(t, 200*time.Millisecond) // long enough for the duplicates to overlap
	hc := h2cClient()
	t.Cleanup(hc.CloseIdleConnections)
	var clients []*connect.Client[structpb.Struct, structpb.Struct]
	for _, protocol := range []string{"connect", "grpc", "grpcweb"} {
		c, err := newClient(hc, app.addr, protocol)
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}

	const n = 30
	results := make([]result, n)
	start := make(chan struct{})
	ctx := idemconnect.ContextWithKey(t.Context(), "order-42")
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			results[i] = callCharge(ctx, clients[i%len(clients)], "acme", 1999)
		})
	}
	close(start) // all at once
	wg.Wait()

	replayed := 0
	for i, r := range results {
		if r.code != 0 || r.id != "ch_1" || r.tenant != "acme" {
			t.Fatalf("call %d: %+v, want acme's ch_1", i, r)
		}
		if r.replayed {
			replayed++
		}
	}
	if replayed != n-1 {
		t.Errorf("%d replays, want %d", replayed, n-1)
	}
	if got := orderstest.Count(t, app.dsn, "charges"); got != 1 {
		t.Errorf("%d charges, want 1", got)
	}
	if got := orderstest.Count(t, app.dsn, "idempotency_records"); got != 1 {
		t.Errorf("%d idempotency records, want 1", got)
	}
}

// Two tenants who send the same key, at the same time, get a charge each,
// committed with a record each, and never see the other's: the key is
// scoped to the tenant (WithKeyScope).
func TestTenantsDoNotShareKeys(t *testing.T) {
	app := startApp(t, 100*time.Millisecond)
	hc := h2cClient()
	t.Cleanup(hc.CloseIdleConnections)
	client, err := newClient(hc, app.addr, "grpc")
	if err != nil {
		t.Fatal(err)
	}
	ctx := idemconnect.ContextWithKey(t.Context(), "k-1")
	tenants := []string{"acme", "globex"}
	first := make([]result, len(tenants))
	var wg sync.WaitGroup
	for i, tenant := range tenants {
		wg.Go(func() { first[i] = callCharge(ctx, client, tenant, 1999) })
	}
	wg.Wait()
	if first[0].id == first[1].id {
		t.Fatalf("acme and globex with one key: %+v and %+v, want a charge each", first[0], first[1])
	}
	for i, tenant := range tenants {
		if r := first[i]; r.code != 0 || r.tenant != tenant || r.replayed {
			t.Errorf("%s's first call: %+v, want its own charge, not replayed", tenant, r)
		}
		if r := callCharge(ctx, client, tenant, 1999); r.id != first[i].id || r.tenant != tenant || !r.replayed {
			t.Errorf("%s's retry: %+v, want its own charge %s replayed", tenant, r, first[i].id)
		}
		if got := query(t, app.dsn, "SELECT count(*) FROM charges WHERE tenant = $1", tenant); got != 1 {
			t.Errorf("%d charges of %s, want 1", got, tenant)
		}
	}
	if got := orderstest.Count(t, app.dsn, "idempotency_records"); got != 2 {
		t.Errorf("%d idempotency records, want 2", got)
	}
}

// The client mode's retry after a timeout keeps the key: the first attempt
// times out while the provider still charges (the handler records the
// charge all the same), a later attempt, with the same key, waits for that
// charge to commit and gets it back, replayed. One charge, one record, over
// a key of the caller's and over a fresh one (made once, not per attempt).
func TestRetryAfterTimeoutKeepsTheKey(t *testing.T) {
	for _, tt := range []struct {
		name, key, protocol string
	}{
		{"the caller's key", "order-7", "grpc"},
		{"a fresh key", "", "connect"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			app := startApp(t, 800*time.Millisecond)
			var out, errs strings.Builder
			code := charge([]string{"-addr", app.addr, "-protocol", tt.protocol, "-key=" + tt.key, "-tenant", "acme",
				"-timeout", "300ms", "-attempts", "10"}, &out, &errs)
			t.Logf("stderr:\n%s", errs.String())
			if code != 0 || out.String() != "charge ch_1: 1999 EUR on acct_1 for acme (replayed: true)\n" {
				t.Fatalf("charge exited %d with %q, want ch_1 replayed", code, out.String())
			}
			if !strings.Contains(errs.String(), "attempt 1: deadline_exceeded") || !strings.Contains(errs.String(), "retrying") {
				t.Errorf("stderr %q, want the first attempt's timeout and a retry", errs.String())
			}
			if got := orderstest.Count(t, app.dsn, "charges"); got != 1 {
				t.Errorf("%d charges, want 1", got)
			}
			if got := orderstest.Count(t, app.dsn, "idempotency_records"); got != 1 {
				t.Errorf("%d idempotency records, want 1: every attempt had one key", got)
			}
		})
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
	app := startApp(t, 0)
	run := func(args ...string) string {
		t.Helper()
		var out, errs strings.Builder
		if code := charge(append([]string{"-addr", app.addr}, args...), &out, &errs); code != 0 {
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
	if first != "charge ch_1: 1999 EUR on acct_1 for acme (replayed: false)\n" {
		t.Errorf("first charge %q, want ch_1, not replayed", first)
	}
	if other := run("-key", "order-42", "-tenant", "shop_2"); other == first || !strings.HasSuffix(other, "for shop_2 (replayed: false)\n") {
		t.Errorf("another tenant's key got %q; want a new charge", other)
	}
	if got := orderstest.Count(t, app.dsn, "charges"); got != 2 {
		t.Errorf("%d charges, want 2: one per tenant", got)
	}
	var errs strings.Builder
	if code := charge([]string{"-nope"}, io.Discard, &errs); code != 2 || !strings.Contains(errs.String(), "-nope") {
		t.Errorf("an unknown flag exited %d with %q; want 2 and the flag named", code, errs.String())
	}
	errs.Reset()
	if code := charge([]string{"-protocol", "soap"}, io.Discard, &errs); code != 2 || !strings.Contains(errs.String(), "soap") {
		t.Errorf("an unknown protocol exited %d with %q; want 2 and the protocol named", code, errs.String())
	}
	errs.Reset()
	if code := charge([]string{"-attempts", "0"}, io.Discard, &errs); code != 2 || !strings.Contains(errs.String(), "-attempts 0") {
		t.Errorf("-attempts 0 exited %d with %q; want 2 and the flag named", code, errs.String())
	}
	// A refusal that says "do not retry" is not retried: one attempt.
	errs.Reset()
	if code := charge([]string{"-addr", app.addr, "-key", "order-9", "-amount", "0"}, io.Discard, &errs); code != 1 ||
		!strings.Contains(errs.String(), "attempt 1: invalid_argument") || strings.Contains(errs.String(), "retrying") {
		t.Errorf("a bad charge exited %d with %q; want 1 after one attempt", code, errs.String())
	}
}
