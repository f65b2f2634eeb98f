package idemgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemgrpc"
	"github.com/idemkit/idempotency/idemgrpc/internal/paymentspb"
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

// runExample serves svc behind the server interceptor over an in-memory
// listener and passes a client to use; it stops everything when use returns.
func runExample(svc paymentspb.PaymentsServer, serverOpts []idemgrpc.Option, use func(paymentspb.PaymentsClient), dial ...grpc.DialOption) {
	c, err := coordinator.New(memstore.New()) // the Redis store in production
	if err != nil {
		panic(err)
	}
	defer c.Close()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(idemgrpc.UnaryServerInterceptor(c, serverOpts...)))
	paymentspb.RegisterPaymentsServer(srv, svc)
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

// Refusals of the interceptor carry an ErrorInfo with ErrorDomain and a
// reason, which tells them from the handler's own errors of the same code.
func Example_refusals() {
	runExample(&chargeService{}, []idemgrpc.Option{idemgrpc.WithKeyRequired(true)}, func(client paymentspb.PaymentsClient) {
		_, err := client.Charge(context.Background(), &paymentspb.ChargeRequest{AmountCents: 1})
		st := status.Convert(err)
		for _, d := range st.Details() {
			if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == idemgrpc.ErrorDomain {
				fmt.Println(st.Code(), info.GetReason(), info.GetReason() == idemgrpc.ReasonKeyMissing)
			}
		}
	})
	// Output: InvalidArgument IDEMPOTENCY_KEY_MISSING true
}

func ExampleUnaryServerInterceptor() {
	c, err := coordinator.New(memstore.New()) // the Redis store in production
	if err != nil {
		panic(err)
	}
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

func ExampleOperationName() {
	fmt.Println(idemgrpc.OperationName(paymentspb.Payments_Charge_FullMethodName))
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
	// Also replay ResourceExhausted, e.g. for a handler whose quota error
	// means "this charge is refused for good", not "try again".
	_ = idemgrpc.WithStorePolicy(func(code codes.Code) bool {
		return code == codes.ResourceExhausted || idemgrpc.DefaultStorePolicy(code)
	})
	// Store successful responses only: every error status is released.
	_ = idemgrpc.WithStorePolicy(func(code codes.Code) bool { return code == codes.OK })
}

func ExampleWithKeyScope() {
	// In a real service the scope is the authenticated caller that an
	// authentication interceptor put into the context; the peer's address
	// stands in for it here.
	_ = idemgrpc.WithKeyScope(func(ctx context.Context) (string, error) {
		p, ok := peer.FromContext(ctx)
		if !ok || p.AuthInfo == nil {
			return "", errors.New("unauthenticated")
		}
		return "peer:" + p.AuthInfo.AuthType(), nil
	})
}

func ExampleWithMethods() {
	// Protect the methods that change something; reads need no key.
	_ = idemgrpc.WithMethods(
		paymentspb.Payments_Charge_FullMethodName,
		"/payments.v1.Refunds/Refund",
	)
}

func ExampleWithKeyRequired() {
	svc := &chargeService{}
	runExample(svc, []idemgrpc.Option{
		idemgrpc.WithMethods(paymentspb.Payments_Charge_FullMethodName),
		idemgrpc.WithKeyRequired(true),
	}, func(client paymentspb.PaymentsClient) {
		_, err := client.Charge(context.Background(), &paymentspb.ChargeRequest{AmountCents: 100})
		fmt.Println(status.Code(err))
	})
	// Output: InvalidArgument
}

func ExampleWithKeyHeader() {
	// Server and client must agree on the name.
	server := idemgrpc.WithKeyHeader("x-idempotency-key")
	client := idemgrpc.UnaryClientInterceptor(idemgrpc.WithKeyHeader("x-idempotency-key"))
	// Without the client interceptor, set the entry yourself.
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-idempotency-key", idemgrpc.NewKey())
	_, _, _ = server, client, ctx
}

func ExampleWithOperation() {
	// Name operations after the method alone, so that a service can move
	// to another package without changing its keys.
	_ = idemgrpc.WithOperation(func(fullMethod string) string {
		return "payments." + fullMethod[strings.LastIndex(fullMethod, "/")+1:]
	})
}

func ExampleWithTTL() {
	// Keep outcomes for a day, unless IDEMPOTENCY_OPERATION_TTLS says
	// otherwise for the operation.
	_ = idemgrpc.WithTTL(24 * time.Hour)
}

func ExampleWithRetryAfter() {
	// Ask clients to come back after 200ms at most when the first call is
	// still running or the store is down.
	_ = idemgrpc.WithRetryAfter(200 * time.Millisecond)
}

func ExampleOption() {
	// Options can be shared: the client interceptor reads WithKeyHeader and
	// WithMethods, and ignores the rest.
	opts := []idemgrpc.Option{
		idemgrpc.WithKeyHeader("x-idempotency-key"),
		idemgrpc.WithMethods(paymentspb.Payments_Charge_FullMethodName),
	}
	c, _ := coordinator.New(memstore.New())
	_ = idemgrpc.UnaryServerInterceptor(c, append(opts, idemgrpc.WithKeyRequired(true))...)
	_ = idemgrpc.UnaryClientInterceptor(opts...)
}
