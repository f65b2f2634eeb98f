package idemgrpc_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemgrpc"
	"github.com/idemkit/idempotency/idemgrpc/internal/paymentspb"
	"github.com/idemkit/idempotency/internal/redistest"
)

// TestMain checks that no test leaves a goroutine behind (gRPC servers and
// connections, the coordinator's background work, the Redis store's
// subscription), and stops the redis-server that the end-to-end test starts
// and the PostgreSQL that the transactional test starts.
func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(stopPostgresAfter{m})) }

const chargeMethod = "/payments.v1.Payments/Charge"

// events is an Observer that keeps the coordinator's events.
type events struct {
	mu  sync.Mutex
	all []idemevent.Event
}

func (e *events) Observe(_ context.Context, ev idemevent.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, ev)
}

// count returns how many events of kind k were seen, and the operations
// they named.
func (e *events) count(k idemevent.Kind) (int, []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	n, ops := 0, []string(nil)
	for _, ev := range e.all {
		if ev.Kind == k {
			n++
			ops = append(ops, ev.Key.Operation)
		}
	}
	return n, ops
}

// newCoordinator returns a coordinator over store (a fresh memstore when
// nil) with an event recorder, closed when the test ends.
func newCoordinator(t *testing.T, store idemstore.Store, opts ...coordinator.Option) (*coordinator.Coordinator, *events) {
	t.Helper()
	if store == nil {
		store = memstore.New()
	}
	ev := &events{}
	c, err := coordinator.New(store, append([]coordinator.Option{coordinator.WithObserver(ev)}, opts...)...)
	if err != nil {
		t.Fatalf("coordinator.New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() }) // waits for the coordinator's background work
	return c, ev
}

// payments is the Payments service of the tests: Charge counts its runs
// (the effect) and answers with a charge named after the run, or with what
// fail returns.
type payments struct {
	paymentspb.UnimplementedPaymentsServer
	runs atomic.Int64
	// fail, when set, is asked before each charge with the run's number;
	// a non-nil error is returned instead of the charge.
	fail func(ctx context.Context, n int64) error
}

func (p *payments) Charge(ctx context.Context, req *paymentspb.ChargeRequest) (*paymentspb.Charge, error) {
	n := p.runs.Add(1)
	if p.fail != nil {
		if err := p.fail(ctx, n); err != nil {
			return nil, err
		}
	}
	return &paymentspb.Charge{
		Id:          fmt.Sprintf("ch_%d", n),
		Account:     req.GetAccount(),
		AmountCents: req.GetAmountCents(),
		Currency:    req.GetCurrency(),
	}, nil
}

func (p *payments) GetCharge(_ context.Context, req *paymentspb.GetChargeRequest) (*paymentspb.Charge, error) {
	return &paymentspb.Charge{Id: req.GetId()}, nil
}

func (p *payments) n() int { return int(p.runs.Load()) }

// serve serves svc with the server interceptor over c (and any server
// options) on an in-memory listener, and returns a client of it; dial holds
// more dial options. Everything stops when the test ends.
func serve(t *testing.T, c *coordinator.Coordinator, svc paymentspb.PaymentsServer, opts []idemgrpc.Option, dial ...grpc.DialOption) paymentspb.PaymentsClient {
	t.Helper()
	return serveWith(t, svc, []grpc.ServerOption{grpc.ChainUnaryInterceptor(idemgrpc.UnaryServerInterceptor(c, opts...))}, dial...)
}

// serveWith is serve with the server's options in full.
func serveWith(t *testing.T, svc paymentspb.PaymentsServer, srvOpts []grpc.ServerOption, dial ...grpc.DialOption) paymentspb.PaymentsClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(srvOpts...)
	paymentspb.RegisterPaymentsServer(srv, svc)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	conn, err := grpc.NewClient("passthrough:///bufnet", append([]grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}, dial...)...)
	if err != nil {
		t.Fatalf("grpc.NewClient: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return paymentspb.NewPaymentsClient(conn)
}

// withKey returns the test's context carrying key as the idempotency key
// ("" for none).
func withKey(t *testing.T, key string) context.Context {
	t.Helper()
	if key == "" {
		return t.Context()
	}
	return idemgrpc.ContextWithKey(t.Context(), key)
}

// reply is what a test looks at in the outcome of one call.
type reply struct {
	charge   *paymentspb.Charge
	err      error
	header   metadata.MD
	trailer  metadata.MD
	replayed bool
}

// charge calls Charge with ctx, req and opts.
func charge(ctx context.Context, client paymentspb.PaymentsClient, req *paymentspb.ChargeRequest, opts ...grpc.CallOption) reply {
	var r reply
	r.charge, r.err = client.Charge(ctx, req, append(opts, grpc.Header(&r.header), grpc.Trailer(&r.trailer))...)
	vs := r.header.Get(idemgrpc.ReplayedHeader)
	r.replayed = len(vs) == 1 && vs[0] == "true"
	return r
}

func chargeReq(amount int64) *paymentspb.ChargeRequest {
	return &paymentspb.ChargeRequest{Account: "acct_1", AmountCents: amount, Currency: "EUR"}
}

// wantOK checks that r is a charge with id, replayed or not.
func wantOK(t *testing.T, r reply, id string, replayed bool) {
	t.Helper()
	if r.err != nil {
		t.Fatalf("Charge: %v, want charge %s", r.err, id)
	}
	if r.charge.GetId() != id || r.replayed != replayed {
		t.Fatalf("Charge = %v (replayed %v), want id %s (replayed %v)", r.charge, r.replayed, id, replayed)
	}
}

// wantRefusal checks that err is a status with code and an ErrorInfo of
// idemgrpc's domain with reason, and returns the status.
func wantRefusal(t *testing.T, err error, code codes.Code, reason string) *status.Status {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != code {
		t.Fatalf("error = %v, want code %v", err, code)
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			if info.GetDomain() != idemgrpc.ErrorDomain || info.GetReason() != reason {
				t.Fatalf("ErrorInfo = %v, want domain %s, reason %s", info, idemgrpc.ErrorDomain, reason)
			}
			return st
		}
	}
	t.Fatalf("status %v has no ErrorInfo (details %v)", st, st.Details())
	return nil
}

// retryInfo returns the retry delay of st's RetryInfo detail, failing the
// test when it has none.
func retryInfo(t *testing.T, st *status.Status) *errdetails.RetryInfo {
	t.Helper()
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri
		}
	}
	t.Fatalf("status %v has no RetryInfo (details %v)", st, st.Details())
	return nil
}

// deterministic returns m's deterministic encoding.
func deterministic(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
