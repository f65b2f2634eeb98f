package idemconnect_test

import (
	"context"
	"regexp"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"connectrpc.com/connect"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemconnect"
)

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestNewKey(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		k := idemconnect.NewKey()
		if !uuidV4.MatchString(k) || coordinator.ValidateKey(k) != nil {
			t.Fatalf("NewKey() = %q, want a valid key in UUID v4 form", k)
		}
		if seen[k] {
			t.Fatalf("NewKey() returned %q twice", k)
		}
		seen[k] = true
	}
}

// TestClientInterceptorAttachesAKeyPerCall: a fresh key per call without
// one, the caller's key from ContextWithKey or the request header kept, and
// none for a procedure that is not protected.
func TestClientInterceptorAttachesAKeyPerCall(t *testing.T) {
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			c, _ := newCoordinator(t, nil)
			rec := &keyRecorder{}
			svc := &payments{}
			cl := dial(t, serve(t, c, svc, nil, rec.interceptor()), p, clientInterceptor(t, idemconnect.WithProcedures(chargeProcedure)))

			wantOK(t, call(t.Context(), cl, chargeReq(1)), "ch_1", false)
			wantOK(t, call(t.Context(), cl, chargeReq(1)), "ch_2", false) // a new call, a new key
			wantOK(t, call(withKey(t, "mine"), cl, chargeReq(1)), "ch_3", false)
			wantOK(t, call(withKey(t, "mine"), cl, chargeReq(1)), "ch_3", true)
			wantOK(t, call(withKey(t, "other"), cl, chargeReq(1), "header"), "ch_4", false) // the request's header wins
			if _, err := cl.get.CallUnary(t.Context(), connect.NewRequest(mustStruct(map[string]any{"id": "ch_1"}))); err != nil {
				t.Fatal(err)
			}
			keys := rec.seen()
			if len(keys) != 5 || !uuidV4.MatchString(keys[0]) || !uuidV4.MatchString(keys[1]) || keys[0] == keys[1] ||
				keys[2] != "mine" || keys[3] != "mine" || keys[4] != "header" {
				t.Fatalf("keys seen = %q, want two distinct UUIDs, mine twice, header, and none for GetCharge", keys)
			}
		})
	}
}

// TestWithKeyHeader: server and client agree on another header.
func TestWithKeyHeader(t *testing.T) {
	c, _ := newCoordinator(t, nil)
	header := idemconnect.WithKeyHeader("x-request-key")
	svc := &payments{}
	srv := serve(t, c, svc, []idemconnect.Option{header})
	cl := dial(t, srv, protocols[1], clientInterceptor(t, header))
	ctx := withKey(t, "k")
	wantOK(t, call(ctx, cl, chargeReq(1)), "ch_1", false)
	wantOK(t, call(ctx, cl, chargeReq(1)), "ch_1", true)
	// The default header is not read any more.
	plain := dial(t, srv, protocols[1])
	wantOK(t, call(t.Context(), plain, chargeReq(1), "k"), "ch_2", false)
}

// TestClientSendsTheActionsDownstreamKey: a call made inside a coordinator
// action carries the action's downstream key, so the action run again (its
// record lost) gets the server's stored charge back instead of a second
// one; a procedure the interceptor does not protect gets no key. Over each
// protocol.
func TestClientSendsTheActionsDownstreamKey(t *testing.T) {
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			c, _ := newCoordinator(t, nil)
			rec := &keyRecorder{}
			svc := &payments{}
			cl := dial(t, serve(t, c, svc, nil, rec.interceptor()), p, clientInterceptor(t, idemconnect.WithProcedures(chargeProcedure)))
			orders := memstore.New()
			oc, err := coordinator.New(orders)
			if err != nil {
				t.Fatal(err)
			}
			defer oc.Close()
			checkout := coordinator.Call{Operation: "order.checkout", Key: "order-42"}
			var want string
			for run := range 2 {
				_, err := coordinator.Do(t.Context(), oc, checkout, func(ctx context.Context) (string, error) {
					want, _ = coordinator.DownstreamKey(ctx)
					r := call(ctx, cl, chargeReq(1))
					wantOK(t, r, "ch_1", run == 1)
					if _, err := cl.get.CallUnary(ctx, connect.NewRequest(mustStruct(map[string]any{"id": "ch_1"}))); err != nil {
						return "", err
					}
					return r.id, nil
				})
				if err != nil {
					t.Fatal(err)
				}
				orders.Put(idemstore.Key{Operation: checkout.Operation, Key: checkout.Key}, idemstore.Record{}) // lost
			}
			if keys := rec.seen(); len(keys) != 2 || keys[0] != want || keys[1] != want {
				t.Fatalf("keys seen = %q, want the action's downstream key %q twice, and none for GetCharge", keys, want)
			}
			if svc.n() != 1 {
				t.Fatalf("the server charged %d times, want 1", svc.n())
			}
		})
	}
}
