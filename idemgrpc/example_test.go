package idemgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemgrpc"
	"github.com/idemkit/idempotency/idemgrpc/internal/paymentspb"
	"github.com/idemkit/idempotency/idemhttp"
)

// chargeService is the service of the examples: every charge it makes gets
// the next ID.
type chargeService struct {
	paymentspb.UnimplementedPaymentsServer
	charges atomic.Int64
}

func (s *chargeService) Charge(_ context.Context, req *paymentspb.ChargeRequest) (*paymentspb.Charge, error) {
	if req.GetAmountCents() <= 0 {
		return nil, status.Error(codes.InvalidArgument, "amount must be positive")
	}
	n := s.charges.Add(1)
	return &paymentspb.Charge{Id: fmt.Sprintf("ch_%d", n), AmountCents: req.GetAmountCents()}, nil
}

func (s *chargeService) GetCharge(_ context.Context, req *paymentspb.GetChargeRequest) (*paymentspb.Charge, error) {
	return &paymentspb.Charge{Id: req.GetId()}, nil
}

// runExample serves svc behind the server interceptor over an in-memory
// listener and passes a client to use; it stops everything when use returns.
func runExample(svc paymentspb.PaymentsServer, serverOpts []idemgrpc.Option, use func(paymentspb.PaymentsClient), dial ...grpc.DialOption) {
	runExampleWith(exampleServer{svc: svc, opts: serverOpts}, use, dial...)
}

// exampleServer is what runExampleWith serves.
type exampleServer struct {
	svc  paymentspb.PaymentsServer
	opts []idemgrpc.Option
	// store is the coordinator's store; nil: a memstore (the Redis store
	// in production).
	store idemstore.Store
	// coordinator holds the coordinator's options.
	coordinator []coordinator.Option
	// auth are interceptors before the idempotency one.
	auth []grpc.UnaryServerInterceptor
}

// runExampleWith is runExample with more of the server to choose.
func runExampleWith(s exampleServer, use func(paymentspb.PaymentsClient), dial ...grpc.DialOption) {
	if s.store == nil {
		s.store = memstore.New()
	}
	c, err := coordinator.New(s.store, s.coordinator...)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(append(s.auth, idemgrpc.UnaryServerInterceptor(c, s.opts...))...))
	paymentspb.RegisterPaymentsServer(srv, s.svc)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	conn, err := grpc.NewClient("passthrough:///bufnet", append([]grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}, dial...)...)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	use(paymentspb.NewPaymentsClient(conn))
}

func Example() {
	svc := &chargeService{}
	runExample(svc, nil, func(client paymentspb.PaymentsClient) {
		charge := func(key string, amount int64) {
			ctx := idemgrpc.ContextWithKey(context.Background(), key)
			var header metadata.MD
			ch, err := client.Charge(ctx, &paymentspb.ChargeRequest{Account: "acct_1", AmountCents: amount, Currency: "EUR"},
				grpc.Header(&header))
			fmt.Printf("%s %v replayed=%q\n", ch.GetId(), status.Code(err), header.Get(idemgrpc.ReplayedHeader))
		}
		charge("order-42", 1999) // the first call runs the handler
		charge("order-42", 1999) // a retry gets the stored charge
		charge("order-42", 5000) // the same key for another request
	})
	fmt.Println("charges:", svc.charges.Load())
	// Output:
	// ch_1 OK replayed=[]
	// ch_1 OK replayed=["true"]
	//  FailedPrecondition replayed=[]
	// charges: 1
}

// Refusals of the interceptor carry an ErrorInfo with ErrorDomain and one
// of the Reason constants, which tells them from the handler's own errors
// of the same code.
func ExampleErrorDomain() {
	runExample(&chargeService{}, []idemgrpc.Option{idemgrpc.WithKeyRequired(true)}, func(client paymentspb.PaymentsClient) {
		call := func(ctx context.Context, amount int64) {
			_, err := client.Charge(ctx, &paymentspb.ChargeRequest{AmountCents: amount})
			fmt.Println(status.Code(err), reason(err))
		}
		call(context.Background(), 100)                                      // no key
		call(idemgrpc.ContextWithKey(context.Background(), "order 42"), 100) // a space
		call(idemgrpc.ContextWithKey(context.Background(), "order-42"), 0)   // the handler refuses, and it is stored
		call(idemgrpc.ContextWithKey(context.Background(), "order-42"), 100) // the same key, another request
	})
	// Output:
	// InvalidArgument IDEMPOTENCY_KEY_MISSING
	// InvalidArgument IDEMPOTENCY_KEY_INVALID
	// InvalidArgument the handler's own
	// FailedPrecondition IDEMPOTENCY_KEY_REUSE
}

// reason returns the reason of the interceptor's ErrorInfo in err's status,
// or says that the error is the handler's own.
func reason(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == idemgrpc.ErrorDomain {
			return info.GetReason()
		}
	}
	return "the handler's own"
}

func ExampleReasonKeyMissing() {
	runExample(&chargeService{}, []idemgrpc.Option{idemgrpc.WithKeyRequired(true)}, func(client paymentspb.PaymentsClient) {
		_, err := client.Charge(context.Background(), &paymentspb.ChargeRequest{AmountCents: 100})
		fmt.Println(status.Code(err), reason(err) == idemgrpc.ReasonKeyMissing)
	})
	// Output: InvalidArgument true
}

func ExampleReasonKeyInvalid() {
	runExample(&chargeService{}, nil, func(client paymentspb.PaymentsClient) {
		_, err := client.Charge(idemgrpc.ContextWithKey(context.Background(), "order 42"), &paymentspb.ChargeRequest{AmountCents: 100})
		fmt.Println(status.Code(err), reason(err) == idemgrpc.ReasonKeyInvalid)
		fmt.Println(status.Convert(err).Message())
	})
	// Output:
	// InvalidArgument true
	// the "idempotency-key" metadata entry must be 1 to 255 visible ASCII characters (0x21-0x7E); it has byte 0x20 at offset 5
}

func ExampleReasonCallerUnknown() {
	noCaller := idemgrpc.WithKeyScope(func(context.Context) (string, error) { return "", errors.New("no token") })
	runExample(&chargeService{}, []idemgrpc.Option{noCaller}, func(client paymentspb.PaymentsClient) {
		_, err := client.Charge(idemgrpc.ContextWithKey(context.Background(), "order-42"), &paymentspb.ChargeRequest{AmountCents: 100})
		fmt.Println(status.Code(err), reason(err) == idemgrpc.ReasonCallerUnknown)
	})
	// Output: Unauthenticated true
}

// slowService is a charge service whose first charge waits for release.
type slowService struct {
	chargeService
	started, release chan struct{}
}

func (s *slowService) Charge(ctx context.Context, req *paymentspb.ChargeRequest) (*paymentspb.Charge, error) {
	close(s.started)
	<-s.release
	return s.chargeService.Charge(ctx, req)
}

func ExampleReasonInProgress() {
	svc := &slowService{started: make(chan struct{}), release: make(chan struct{})}
	server := exampleServer{svc: svc, coordinator: []coordinator.Option{coordinator.WithInFlight(coordinator.InFlightRaise)}}
	runExampleWith(server, func(client paymentspb.PaymentsClient) {
		ctx := idemgrpc.ContextWithKey(context.Background(), "order-42")
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = client.Charge(ctx, &paymentspb.ChargeRequest{AmountCents: 100})
		}()
		<-svc.started
		_, err := client.Charge(ctx, &paymentspb.ChargeRequest{AmountCents: 100})
		fmt.Println(status.Code(err), reason(err) == idemgrpc.ReasonInProgress, retryDelay(err))
		close(svc.release)
		<-done
	})
	// Output: Aborted true 1s
}

func ExampleReasonStoreUnavailable() {
	server := exampleServer{
		svc:         &chargeService{},
		store:       storeDown(),
		coordinator: []coordinator.Option{coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise)},
	}
	runExampleWith(server, func(client paymentspb.PaymentsClient) {
		_, err := client.Charge(idemgrpc.ContextWithKey(context.Background(), "order-42"), &paymentspb.ChargeRequest{AmountCents: 100})
		fmt.Println(status.Code(err), reason(err) == idemgrpc.ReasonStoreUnavailable)
	})
	// Output: Unavailable true
}

// A charge whose response is larger than the coordinator keeps is returned
// to its caller once; a retry does not charge again, and is refused.
func ExampleReasonNotReplayable() {
	svc := &chargeService{}
	server := exampleServer{svc: svc, coordinator: []coordinator.Option{coordinator.WithMaxResultBytes(16)}}
	runExampleWith(server, func(client paymentspb.PaymentsClient) {
		ctx := idemgrpc.ContextWithKey(context.Background(), "order-42")
		ch, err := client.Charge(ctx, &paymentspb.ChargeRequest{AmountCents: 100})
		fmt.Println(ch.GetId(), status.Code(err))
		_, err = client.Charge(ctx, &paymentspb.ChargeRequest{AmountCents: 100})
		fmt.Println(status.Code(err), reason(err) == idemgrpc.ReasonNotReplayable)
	})
	fmt.Println("charges:", svc.charges.Load())
	// Output:
	// ch_1 OK
	// AlreadyExists true
	// charges: 1
}

// A client tells the interceptor's refusal of a reused key from a
// FailedPrecondition of the handler's own by its reason.
func ExampleReasonKeyReuse() {
	runExample(&chargeService{}, nil, func(client paymentspb.PaymentsClient) {
		ctx := idemgrpc.ContextWithKey(context.Background(), "order-42")
		_, _ = client.Charge(ctx, &paymentspb.ChargeRequest{AmountCents: 100})
		_, err := client.Charge(ctx, &paymentspb.ChargeRequest{AmountCents: 200})
		if reason(err) == idemgrpc.ReasonKeyReuse {
			fmt.Println(status.Code(err), "a bug in the client: a new request needs a new key")
		}
	})
	// Output: FailedPrecondition a bug in the client: a new request needs a new key
}

func ExampleUnaryServerInterceptor() {
	c, err := coordinator.New(memstore.New()) // the Redis store in production
	if err != nil {
		panic(err)
	}
	defer c.Close()
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		// Authentication first, so that the scope hook can read the caller.
		idemgrpc.UnaryServerInterceptor(c,
			idemgrpc.WithMethods(paymentspb.Payments_Charge_FullMethodName),
			idemgrpc.WithKeyRequired(true),
		),
	))
	paymentspb.RegisterPaymentsServer(srv, &chargeService{})
	fmt.Println(len(srv.GetServiceInfo()), "service")
	// Output: 1 service
}

func ExampleUnaryClientInterceptor() {
	svc := &chargeService{}
	runExample(svc, nil, func(client paymentspb.PaymentsClient) {
		// No key in the context: the interceptor attaches one, which
		// grpc-go's retry policy re-sends on every attempt of the call.
		ch, err := client.Charge(context.Background(), &paymentspb.ChargeRequest{AmountCents: 100})
		fmt.Println(ch.GetId(), err)
	},
		// Put it first in the chain, before any retrying interceptor.
		grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(
			idemgrpc.WithMethods(paymentspb.Payments_Charge_FullMethodName))),
		grpc.WithDefaultServiceConfig(`{"methodConfig":[{"name":[{"service":"payments.v1.Payments"}],
			"retryPolicy":{"maxAttempts":3,"initialBackoff":"0.1s","maxBackoff":"1s","backoffMultiplier":2,
			"retryableStatusCodes":["UNAVAILABLE","ABORTED"]}}]}`),
	)
	// Output: ch_1 <nil>
}

func ExampleContextWithKey() {
	svc := &chargeService{}
	runExample(svc, nil, func(client paymentspb.PaymentsClient) {
		// One key per logical request, created before the first attempt.
		ctx := idemgrpc.ContextWithKey(context.Background(), idemgrpc.NewKey())
		req := &paymentspb.ChargeRequest{AmountCents: 100}
		first, _ := client.Charge(ctx, req)
		// Say the response was lost (a timeout, a dropped connection):
		// retry with the same context, so with the same key.
		retry, _ := client.Charge(ctx, req)
		fmt.Println(first.GetId(), retry.GetId())
	})
	fmt.Println("charges:", svc.charges.Load())
	// Output:
	// ch_1 ch_1
	// charges: 1
}

func ExampleNewKey() {
	key := idemgrpc.NewKey()
	fmt.Println(len(key), strings.Count(key, "-"), key[14:15])
	// Output: 36 4 4
}

// The default operation of a call is its full method mapped by
// idemhttp.OperationName: use these names in IDEMPOTENCY_OPERATION_TTLS.
func ExampleWithOperation_default() {
	fmt.Println(idemhttp.OperationName(paymentspb.Payments_Charge_FullMethodName))
	// Output: payments.v1.Payments.Charge
}

func ExampleDefaultStorePolicy() {
	for _, code := range []codes.Code{codes.OK, codes.InvalidArgument, codes.NotFound, codes.Unavailable, codes.Aborted} {
		fmt.Println(code, idemgrpc.DefaultStorePolicy(code))
	}
	// Output:
	// OK true
	// InvalidArgument true
	// NotFound true
	// Unavailable false
	// Aborted false
}

func ExampleWithStorePolicy() {
	// Store successful responses only: an error status, even one that
	// describes the request, is not stored, and a retry runs the handler.
	okOnly := idemgrpc.WithStorePolicy(func(code codes.Code) bool { return code == codes.OK })
	runExample(&chargeService{}, []idemgrpc.Option{okOnly}, func(client paymentspb.PaymentsClient) {
		ctx := idemgrpc.ContextWithKey(context.Background(), "order-42")
		for range 2 {
			var header metadata.MD
			_, err := client.Charge(ctx, &paymentspb.ChargeRequest{AmountCents: 0}, grpc.Header(&header))
			fmt.Println(status.Code(err), "replayed:", len(header.Get(idemgrpc.ReplayedHeader)) > 0)
		}
	})
	// Also replay ResourceExhausted, e.g. for a handler whose quota error
	// means "this charge is refused for good", not "try again".
	_ = idemgrpc.WithStorePolicy(func(code codes.Code) bool {
		return code == codes.ResourceExhausted || idemgrpc.DefaultStorePolicy(code)
	})
	// Output:
	// InvalidArgument replayed: false
	// InvalidArgument replayed: false
}

// tenantKey is the context key under which authenticate puts the caller.
type tenantKey struct{}

// authenticate stands in for an authentication interceptor: it puts the
// tenant of the call's (here unverified) token into the context.
func authenticate(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if tok := md.Get("authorization"); len(tok) == 1 {
		ctx = context.WithValue(ctx, tenantKey{}, strings.TrimPrefix(tok[0], "Bearer "))
	}
	return handler(ctx, req)
}

func ExampleWithKeyScope() {
	// The scope is the caller that authentication established, never a
	// metadata entry that the client merely asserts.
	scope := idemgrpc.WithKeyScope(func(ctx context.Context) (string, error) {
		tenant, ok := ctx.Value(tenantKey{}).(string)
		if !ok {
			return "", errors.New("unauthenticated")
		}
		return "tenant:" + tenant, nil
	})
	server := exampleServer{svc: &chargeService{}, opts: []idemgrpc.Option{scope}, auth: []grpc.UnaryServerInterceptor{authenticate}}
	runExampleWith(server, func(client paymentspb.PaymentsClient) {
		as := func(tenant string) {
			ctx := metadata.AppendToOutgoingContext(idemgrpc.ContextWithKey(context.Background(), "order-42"),
				"authorization", "Bearer "+tenant)
			ch, err := client.Charge(ctx, &paymentspb.ChargeRequest{AmountCents: 100})
			fmt.Println(tenant, ch.GetId(), status.Code(err))
		}
		as("alice")
		as("bob") // the same key, another caller: not alice's charge
		as("alice")
		_, err := client.Charge(idemgrpc.ContextWithKey(context.Background(), "order-42"), &paymentspb.ChargeRequest{AmountCents: 100})
		fmt.Println("nobody", status.Code(err))
	})
	// Output:
	// alice ch_1 OK
	// bob ch_2 OK
	// alice ch_1 OK
	// nobody Unauthenticated
}

func ExampleWithMethods() {
	// Protect the methods that change something; reads need no key.
	only := idemgrpc.WithMethods(
		paymentspb.Payments_Charge_FullMethodName,
		"/payments.v1.Refunds/Refund",
	)
	runExample(&chargeService{}, []idemgrpc.Option{only, idemgrpc.WithKeyRequired(true)}, func(client paymentspb.PaymentsClient) {
		_, err := client.Charge(context.Background(), &paymentspb.ChargeRequest{AmountCents: 100})
		fmt.Println("Charge without a key:", status.Code(err))
		ch, err := client.GetCharge(context.Background(), &paymentspb.GetChargeRequest{Id: "ch_1"})
		fmt.Println("GetCharge without a key:", ch.GetId(), status.Code(err))
	})
	// Output:
	// Charge without a key: InvalidArgument
	// GetCharge without a key: ch_1 OK
}

func ExampleWithKeyHeader() {
	// Server and client must agree on the name.
	header := idemgrpc.WithKeyHeader("x-idempotency-key")
	runExample(&chargeService{}, []idemgrpc.Option{header}, func(client paymentspb.PaymentsClient) {
		// A key of the caller's own goes under the client interceptor's
		// header.
		ctx := idemgrpc.ContextWithKey(context.Background(), "order-42")
		first, _ := client.Charge(ctx, &paymentspb.ChargeRequest{AmountCents: 100})
		retry, _ := client.Charge(ctx, &paymentspb.ChargeRequest{AmountCents: 100})
		// Without the client interceptor, set the entry yourself.
		raw := metadata.AppendToOutgoingContext(context.Background(), "x-idempotency-key", "order-42")
		again, _ := client.Charge(raw, &paymentspb.ChargeRequest{AmountCents: 100})
		fmt.Println(first.GetId(), retry.GetId(), again.GetId())
	}, grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(header)))
	// Output: ch_1 ch_1 ch_1
}

func ExampleWithOperation() {
	// Name operations after the method alone, so that a service can move
	// to another package without changing its keys.
	name := func(fullMethod string) string {
		return "payments." + fullMethod[strings.LastIndex(fullMethod, "/")+1:]
	}
	_ = idemgrpc.WithOperation(name)
	op := name(paymentspb.Payments_Charge_FullMethodName)
	fmt.Println(op, coordinator.ValidateOperation(op))
	// Output: payments.Charge <nil>
}

func ExampleWithTTL() {
	// Keep outcomes for a day, unless IDEMPOTENCY_OPERATION_TTLS says
	// otherwise for the operation.
	runExample(&chargeService{}, []idemgrpc.Option{idemgrpc.WithTTL(24 * time.Hour)}, func(client paymentspb.PaymentsClient) {
		_, err := client.Charge(idemgrpc.ContextWithKey(context.Background(), "order-42"), &paymentspb.ChargeRequest{AmountCents: 100})
		fmt.Println("24h:", status.Code(err))
	})
	// A TTL past the coordinator's bounds is a misconfiguration.
	runExample(&chargeService{}, []idemgrpc.Option{idemgrpc.WithTTL(10 * 365 * 24 * time.Hour)}, func(client paymentspb.PaymentsClient) {
		_, err := client.Charge(idemgrpc.ContextWithKey(context.Background(), "order-42"), &paymentspb.ChargeRequest{AmountCents: 100})
		fmt.Println("10 years:", status.Code(err))
	})
	// Output:
	// 24h: OK
	// 10 years: Internal
}

// storeDown returns a store that fails every call, as Redis does when it
// is unreachable.
func storeDown() idemstore.Store {
	fs := faultstore.Wrap(memstore.New())
	fs.Fail(idemevent.MethodReserve, nil)
	return fs
}

// retryDelay returns the delay advised by the RetryInfo of err's status.
func retryDelay(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}

func ExampleWithRetryAfter() {
	// Ask clients to come back after 200ms at most when the first call is
	// still running or the store is down.
	runExampleWith(exampleServer{
		svc:         &chargeService{},
		opts:        []idemgrpc.Option{idemgrpc.WithRetryAfter(200 * time.Millisecond)},
		store:       storeDown(),
		coordinator: []coordinator.Option{coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise)},
	}, func(client paymentspb.PaymentsClient) {
		_, err := client.Charge(idemgrpc.ContextWithKey(context.Background(), "order-42"), &paymentspb.ChargeRequest{AmountCents: 100})
		fmt.Println(status.Code(err), retryDelay(err))
	})
	// Output: Unavailable 200ms
}

func ExampleDefaultRetryAfter() {
	runExampleWith(exampleServer{
		svc:         &chargeService{},
		store:       storeDown(),
		coordinator: []coordinator.Option{coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise)},
	}, func(client paymentspb.PaymentsClient) {
		var trailer metadata.MD
		_, err := client.Charge(idemgrpc.ContextWithKey(context.Background(), "order-42"), &paymentspb.ChargeRequest{AmountCents: 100},
			grpc.Trailer(&trailer))
		fmt.Println(status.Code(err), retryDelay(err) == idemgrpc.DefaultRetryAfter, trailer.Get("grpc-retry-pushback-ms"))
	})
	// Output: Unavailable true [1000]
}

func ExampleDefaultKeyHeader() {
	runExample(&chargeService{}, nil, func(client paymentspb.PaymentsClient) {
		// ContextWithKey sets this entry; so can any client, in any
		// language.
		ctx := metadata.AppendToOutgoingContext(context.Background(), idemgrpc.DefaultKeyHeader, "order-42")
		first, _ := client.Charge(ctx, &paymentspb.ChargeRequest{AmountCents: 100})
		retry, _ := client.Charge(ctx, &paymentspb.ChargeRequest{AmountCents: 100})
		fmt.Println(idemgrpc.DefaultKeyHeader, first.GetId(), retry.GetId())
	})
	// Output: idempotency-key ch_1 ch_1
}

func ExampleReplayedHeader() {
	runExample(&chargeService{}, nil, func(client paymentspb.PaymentsClient) {
		ctx := idemgrpc.ContextWithKey(context.Background(), "order-42")
		for range 2 {
			var header metadata.MD
			ch, _ := client.Charge(ctx, &paymentspb.ChargeRequest{AmountCents: 100}, grpc.Header(&header))
			fmt.Println(ch.GetId(), idemgrpc.ReplayedHeader, header.Get(idemgrpc.ReplayedHeader))
		}
	})
	// Output:
	// ch_1 idempotent-replayed []
	// ch_1 idempotent-replayed [true]
}

func ExampleOption() {
	// Options can be shared: the client interceptor reads WithKeyHeader and
	// WithMethods, and ignores the rest.
	opts := []idemgrpc.Option{
		idemgrpc.WithKeyHeader("x-idempotency-key"),
		idemgrpc.WithMethods(paymentspb.Payments_Charge_FullMethodName),
	}
	runExample(&chargeService{}, append(opts, idemgrpc.WithKeyRequired(true)), func(client paymentspb.PaymentsClient) {
		// The client interceptor attaches the key the server requires.
		ch, err := client.Charge(context.Background(), &paymentspb.ChargeRequest{AmountCents: 100})
		fmt.Println(ch.GetId(), status.Code(err))
	}, grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(opts...)))
	// Output: ch_1 OK
}

func ExampleWithKeyRequired() {
	svc := &chargeService{}
	runExample(svc, []idemgrpc.Option{
		idemgrpc.WithMethods(paymentspb.Payments_Charge_FullMethodName),
		idemgrpc.WithKeyRequired(true),
	}, func(client paymentspb.PaymentsClient) {
		_, err := client.Charge(context.Background(), &paymentspb.ChargeRequest{AmountCents: 100})
		fmt.Println(status.Code(err))
		_, err = client.Charge(idemgrpc.ContextWithKey(context.Background(), "order-42"), &paymentspb.ChargeRequest{AmountCents: 100})
		fmt.Println(status.Code(err))
	})
	fmt.Println("charges:", svc.charges.Load())
	// Output:
	// InvalidArgument
	// OK
	// charges: 1
}
