package idemgrpc_test

import (
	"context"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemgrpc"
	"github.com/idemkit/idempotency/idemgrpc/internal/paymentspb"
)

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestNewKey(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		k := idemgrpc.NewKey()
		if !uuidV4.MatchString(k) || coordinator.ValidateKey(k) != nil {
			t.Fatalf("NewKey() = %q, want a valid key in UUID v4 form", k)
		}
		if seen[k] {
			t.Fatalf("NewKey() returned %q twice", k)
		}
		seen[k] = true
	}
}

func TestContextWithKey(t *testing.T) {
	ctx := metadata.AppendToOutgoingContext(t.Context(), "tenant", "alice", idemgrpc.DefaultKeyHeader, "old")
	ctx2 := idemgrpc.ContextWithKey(ctx, "new")
	md, _ := metadata.FromOutgoingContext(ctx2)
	if got := md.Get(idemgrpc.DefaultKeyHeader); len(got) != 1 || got[0] != "new" {
		t.Fatalf("key = %q, want [new]", got)
	}
	if got := md.Get("tenant"); len(got) != 1 || got[0] != "alice" {
		t.Fatalf("tenant = %q, want [alice]: other metadata is kept", got)
	}
	md, _ = metadata.FromOutgoingContext(ctx)
	if got := md.Get(idemgrpc.DefaultKeyHeader); len(got) != 1 || got[0] != "old" {
		t.Fatalf("the parent's key = %q, want [old]: the parent is not changed", got)
	}
}

// keyRecorder is a server interceptor, outside the idempotency one, that
// records the key of every attempt that reaches the server.
type keyRecorder struct {
	mu   sync.Mutex
	keys []string
}

func (k *keyRecorder) intercept(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	k.mu.Lock()
	k.keys = append(k.keys, md.Get(idemgrpc.DefaultKeyHeader)...)
	k.mu.Unlock()
	return handler(ctx, req)
}

func (k *keyRecorder) seen() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.keys...)
}

func TestClientInterceptorAttachesAKeyPerCall(t *testing.T) {
	c, _ := newCoordinator(t, nil)
	rec := &keyRecorder{}
	svc := &payments{}
	client := serveWith(t, svc,
		[]grpc.ServerOption{grpc.ChainUnaryInterceptor(rec.intercept, idemgrpc.UnaryServerInterceptor(c))},
		grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.WithMethods(chargeMethod))))

	wantOK(t, charge(t.Context(), client, chargeReq(1)), "ch_1", false)
	wantOK(t, charge(t.Context(), client, chargeReq(1)), "ch_2", false) // a new call, a new key
	wantOK(t, charge(idemgrpc.ContextWithKey(t.Context(), "mine"), client, chargeReq(1)), "ch_3", false)
	wantOK(t, charge(idemgrpc.ContextWithKey(t.Context(), "mine"), client, chargeReq(1)), "ch_3", true)
	if _, err := client.GetCharge(t.Context(), &paymentspb.GetChargeRequest{Id: "ch_1"}); err != nil {
		t.Fatal(err)
	}

	keys := rec.seen()
	if len(keys) != 4 || !uuidV4.MatchString(keys[0]) || !uuidV4.MatchString(keys[1]) || keys[0] == keys[1] ||
		keys[2] != "mine" || keys[3] != "mine" {
		t.Fatalf("keys seen = %q, want two distinct UUIDs, then mine twice, and none for GetCharge", keys)
	}
}

// lossy is a server interceptor, outside the idempotency one, that lets the
// first call run and then loses its response, as a dropped connection or a
// proxy would: the client sees Unavailable although the charge was made.
type lossy struct{ lost atomic.Bool }

func (l *lossy) intercept(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if l.lost.CompareAndSwap(false, true) {
		return nil, status.Error(codes.Unavailable, "connection reset (simulated)")
	}
	return resp, err
}

// retryPolicy is a service config that retries every Payments method.
func retryPolicy(codes ...string) grpc.DialOption {
	list := `"` + codes[0] + `"`
	for _, c := range codes[1:] {
		list += `,"` + c + `"`
	}
	return grpc.WithDefaultServiceConfig(`{"methodConfig":[{"name":[{"service":"payments.v1.Payments"}],
		"retryPolicy":{"maxAttempts":5,"initialBackoff":"0.01s","maxBackoff":"0.05s","backoffMultiplier":2,
		"retryableStatusCodes":[` + list + `]}}]}`)
}

// TestRetryPolicyKeepsTheKey: grpc-go's retry policy re-sends the first
// attempt's metadata, so the retry of a call whose response was lost
// carries the same key and gets the stored charge back.
func TestRetryPolicyKeepsTheKey(t *testing.T) {
	c, _ := newCoordinator(t, nil)
	rec := &keyRecorder{}
	svc := &payments{}
	client := serveWith(t, svc,
		[]grpc.ServerOption{grpc.ChainUnaryInterceptor(rec.intercept, (&lossy{}).intercept, idemgrpc.UnaryServerInterceptor(c))},
		grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor()),
		retryPolicy("UNAVAILABLE"))

	r := charge(t.Context(), client, chargeReq(1999))
	wantOK(t, r, "ch_1", true) // the second attempt got the first one's stored charge
	keys := rec.seen()
	if len(keys) != 2 || keys[0] != keys[1] || !uuidV4.MatchString(keys[0]) {
		t.Fatalf("keys of the attempts = %q, want one generated key twice", keys)
	}
	if svc.n() != 1 {
		t.Fatalf("the charge was made %d times, want 1", svc.n())
	}
}

// retrying is a client interceptor that retries an Unavailable call once, as
// retry middleware does.
func retrying(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if status.Code(err) == codes.Unavailable {
		err = invoker(ctx, method, req, reply, cc, opts...)
	}
	return err
}

// TestRetryInterceptorOrder: retry middleware must come after the
// idempotency interceptor in the chain; before it, each attempt is a new
// call with a new key, and the charge is made twice.
func TestRetryInterceptorOrder(t *testing.T) {
	for _, tt := range []struct {
		name  string
		chain []grpc.UnaryClientInterceptor
		runs  int
	}{
		{"idempotency first", []grpc.UnaryClientInterceptor{idemgrpc.UnaryClientInterceptor(), retrying}, 1},
		{"retry first (wrong)", []grpc.UnaryClientInterceptor{retrying, idemgrpc.UnaryClientInterceptor()}, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := newCoordinator(t, nil)
			svc := &payments{}
			client := serveWith(t, svc,
				[]grpc.ServerOption{grpc.ChainUnaryInterceptor((&lossy{}).intercept, idemgrpc.UnaryServerInterceptor(c))},
				grpc.WithChainUnaryInterceptor(tt.chain...))
			if r := charge(t.Context(), client, chargeReq(1)); r.err != nil {
				t.Fatal(r.err)
			}
			if svc.n() != tt.runs {
				t.Fatalf("the charge was made %d times, want %d", svc.n(), tt.runs)
			}
		})
	}
}

// TestRetryPolicyWaitsOutInProgress: with ABORTED in the client's retry
// policy, a duplicate refused while the first call runs (in-flight mode
// "raise") is retried after the server's pushback and gets the first call's
// charge.
func TestRetryPolicyWaitsOutInProgress(t *testing.T) {
	c, ev := newCoordinator(t, nil, coordinator.WithInFlight(coordinator.InFlightRaise))
	started, release := make(chan struct{}), make(chan struct{})
	svc := &payments{fail: func(_ context.Context, n int64) error {
		if n == 1 {
			close(started)
			<-release
		}
		return nil
	}}
	client := serve(t, c, svc, []idemgrpc.Option{idemgrpc.WithRetryAfter(50 * time.Millisecond)}, retryPolicy("ABORTED"))

	first := make(chan reply)
	go func() { first <- charge(withKey(t, "k"), client, chargeReq(1)) }()
	<-started
	second := make(chan reply)
	go func() { second <- charge(withKey(t, "k"), client, chargeReq(1)) }()
	waitFor(t, func() bool { n, _ := ev.count(idemevent.InFlight); return n >= 1 }) // one refused attempt
	close(release)
	wantOK(t, <-first, "ch_1", false)
	wantOK(t, <-second, "ch_1", true)
	if svc.n() != 1 {
		t.Fatalf("the charge was made %d times, want 1", svc.n())
	}
}

// TestCallerKeyWinsUnderAnotherHeader: with WithKeyHeader on both sides, a
// key the caller set with ContextWithKey is the call's key, not a fresh one
// the client interceptor adds beside it.
func TestCallerKeyWinsUnderAnotherHeader(t *testing.T) {
	c, _ := newCoordinator(t, nil)
	const header = "x-request-key"
	var mu sync.Mutex
	var seen [][]string
	record := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		mu.Lock()
		seen = append(seen, md.Get(header))
		mu.Unlock()
		return handler(ctx, req)
	}
	svc := &payments{}
	client := serveWith(t, svc,
		[]grpc.ServerOption{grpc.ChainUnaryInterceptor(record, idemgrpc.UnaryServerInterceptor(c, idemgrpc.WithKeyHeader(header)))},
		grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.WithKeyHeader(header))))

	ctx := idemgrpc.ContextWithKey(t.Context(), "order-42")
	wantOK(t, charge(ctx, client, chargeReq(1)), "ch_1", false)
	wantOK(t, charge(ctx, client, chargeReq(1)), "ch_1", true) // the caller's retry
	// A key under the interceptor's own header wins too.
	mine := metadata.AppendToOutgoingContext(ctx, header, "mine")
	wantOK(t, charge(mine, client, chargeReq(1)), "ch_2", false)
	if len(seen) != 3 || len(seen[0]) != 1 || seen[0][0] != "order-42" || seen[1][0] != "order-42" ||
		len(seen[2]) != 1 || seen[2][0] != "mine" {
		t.Fatalf("keys seen = %q, want [order-42] twice, then [mine]", seen)
	}
}

// TestClientSendsTheActionsDownstreamKey: a call made inside a coordinator
// action carries the action's downstream key, so the action run again (its
// record lost) gets the server's stored charge back instead of a second
// one; a method the interceptor does not protect gets no key.
func TestClientSendsTheActionsDownstreamKey(t *testing.T) {
	c, _ := newCoordinator(t, nil)
	rec := &keyRecorder{}
	svc := &payments{}
	client := serveWith(t, svc,
		[]grpc.ServerOption{grpc.ChainUnaryInterceptor(rec.intercept, idemgrpc.UnaryServerInterceptor(c))},
		grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.WithMethods(chargeMethod))))
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
			r := charge(ctx, client, chargeReq(1))
			wantOK(t, r, "ch_1", run == 1)
			if _, err := client.GetCharge(ctx, &paymentspb.GetChargeRequest{Id: "ch_1"}); err != nil {
				return "", err
			}
			return r.charge.GetId(), nil
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
}

// TestRetryAfterTimeoutKeepsTheKey: a call times out on the client while
// the handler still runs (its charge is made); the client's own retry, with
// the context that ContextWithKey gave the call's key as docs/grpc.md shows,
// carries the same key, waits for the first run and gets its charge back.
func TestRetryAfterTimeoutKeepsTheKey(t *testing.T) {
	c, ev := newCoordinator(t, nil)
	release := make(chan struct{})
	svc := &payments{fail: func(_ context.Context, n int64) error {
		if n == 1 {
			<-release // a slow payment provider, which finishes whatever the client does
		}
		return nil
	}}
	rec := &keyRecorder{}
	client := serveWith(t, svc,
		[]grpc.ServerOption{grpc.ChainUnaryInterceptor(rec.intercept, idemgrpc.UnaryServerInterceptor(c))},
		grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor()))

	ctx := idemgrpc.ContextWithKey(t.Context(), idemgrpc.NewKey()) // once per logical request
	attempt, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	r := charge(attempt, client, chargeReq(1999))
	cancel()
	if status.Code(r.err) != codes.DeadlineExceeded || svc.n() != 1 {
		t.Fatalf("first attempt: %v after %d runs, want DeadlineExceeded while the handler runs", r.err, svc.n())
	}
	retried := make(chan reply)
	go func() { retried <- charge(ctx, client, chargeReq(1999)) }()
	waitFor(t, func() bool { n, _ := ev.count(idemevent.InFlight); return n >= 1 }) // the retry waits
	close(release)
	wantOK(t, <-retried, "ch_1", true)
	if svc.n() != 1 {
		t.Fatalf("the charge was made %d times, want 1", svc.n())
	}
	if keys := rec.seen(); len(keys) != 2 || keys[0] != keys[1] || !uuidV4.MatchString(keys[0]) {
		t.Fatalf("keys of the attempts = %q, want one key twice", keys)
	}
}
