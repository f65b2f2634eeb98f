package idemconnect_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemconnect"
)

// chargeService is the service of the examples: every charge it makes gets
// the next ID.
type chargeService struct{ charges atomic.Int64 }

func (s *chargeService) Charge(_ context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
	amount := req.Msg.GetFields()["amount_cents"].GetNumberValue()
	if amount <= 0 {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("amount must be positive"))
	}
	n := s.charges.Add(1)
	return connect.NewResponse(mustStruct(map[string]any{"id": fmt.Sprintf("ch_%d", n), "amount_cents": amount})), nil
}

// runExample serves svc's Charge behind the handler interceptor over a
// coordinator with copts (on an in-memory store; the Redis store in
// production) and passes a client of it, with clientOpts, to use.
func runExample(svc *chargeService, opts []idemconnect.Option, copts []coordinator.Option, use func(*connect.Client[structpb.Struct, structpb.Struct]), clientOpts ...connect.ClientOption) {
	runExampleOn(memstore.New(), svc, opts, copts, use, clientOpts...)
}

// runExampleOn is runExample on store.
func runExampleOn(store idemstore.Store, svc *chargeService, opts []idemconnect.Option, copts []coordinator.Option, use func(*connect.Client[structpb.Struct, structpb.Struct]), clientOpts ...connect.ClientOption) {
	c, err := coordinator.New(store, copts...)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	idem, err := idemconnect.NewInterceptor(c, opts...)
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle(chargeProcedure, connect.NewUnaryHandler(chargeProcedure, svc.Charge, connect.WithInterceptors(idem)))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	use(connect.NewClient[structpb.Struct, structpb.Struct](srv.Client(), srv.URL+chargeProcedure, clientOpts...))
}

// amount returns a charge request.
func amount(cents float64) *connect.Request[structpb.Struct] {
	return connect.NewRequest(mustStruct(map[string]any{"account": "acct_1", "amount_cents": cents}))
}

// outcome returns the charge's ID or the error's code, and whether the
// answer was a replay.
func outcome(resp *connect.Response[structpb.Struct], err error) string {
	if err != nil {
		var ce *connect.Error
		errors.As(err, &ce)
		return fmt.Sprintf("%v replayed=%v", connect.CodeOf(err), ce.Meta().Get(idemconnect.ReplayedHeader) == "true")
	}
	return fmt.Sprintf("%s replayed=%v", resp.Msg.GetFields()["id"].GetStringValue(), resp.Header().Get(idemconnect.ReplayedHeader) == "true")
}

func Example() {
	svc := &chargeService{}
	ci, err := idemconnect.NewClientInterceptor()
	if err != nil {
		panic(err)
	}
	runExample(svc, nil, nil, func(client *connect.Client[structpb.Struct, structpb.Struct]) {
		ctx := idemconnect.ContextWithKey(context.Background(), "order-42")
		fmt.Println(outcome(client.CallUnary(ctx, amount(1999)))) // the first call runs the handler
		fmt.Println(outcome(client.CallUnary(ctx, amount(1999)))) // a retry gets the stored charge
		fmt.Println(outcome(client.CallUnary(ctx, amount(5000)))) // the same key for another request
	}, connect.WithInterceptors(ci))
	fmt.Println("charges:", svc.charges.Load())
	// Output:
	// ch_1 replayed=false
	// ch_1 replayed=true
	// failed_precondition replayed=false
	// charges: 1
}

func ExampleNewInterceptor() {
	c, err := coordinator.New(memstore.New()) // the Redis store in production
	if err != nil {
		panic(err)
	}
	defer c.Close()
	idem, err := idemconnect.NewInterceptor(c,
		idemconnect.WithProcedures(chargeProcedure), // only what changes something
		idemconnect.WithKeyRequired(true),
	)
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	// Authentication (an interceptor before this one, or HTTP middleware)
	// first, so that a scope hook can read the caller.
	mux.Handle(chargeProcedure, connect.NewUnaryHandler(chargeProcedure, (&chargeService{}).Charge,
		connect.WithInterceptors(idem)))
	// Serve mux with HTTP/2 (h2c or TLS) for gRPC clients.
	fmt.Println(idemconnect.ReplayedHeader)
	// Output: Idempotent-Replayed
}

func ExampleNewClientInterceptor() {
	svc := &chargeService{}
	ci, err := idemconnect.NewClientInterceptor(idemconnect.WithProcedures(chargeProcedure))
	if err != nil {
		panic(err)
	}
	runExample(svc, []idemconnect.Option{idemconnect.WithKeyRequired(true)}, nil, func(client *connect.Client[structpb.Struct, structpb.Struct]) {
		// No key in the context: the interceptor attaches a fresh one.
		fmt.Println(outcome(client.CallUnary(context.Background(), amount(100))))
		fmt.Println(outcome(client.CallUnary(context.Background(), amount(100)))) // another call, another key
	}, connect.WithInterceptors(ci))
	fmt.Println("charges:", svc.charges.Load())
	// Output:
	// ch_1 replayed=false
	// ch_2 replayed=false
	// charges: 2
}

func ExampleContextWithKey() {
	svc := &chargeService{}
	ci, err := idemconnect.NewClientInterceptor()
	if err != nil {
		panic(err)
	}
	runExample(svc, nil, nil, func(client *connect.Client[structpb.Struct, structpb.Struct]) {
		// One key per logical request, created before the first attempt.
		ctx := idemconnect.ContextWithKey(context.Background(), idemconnect.NewKey())
		first, _ := client.CallUnary(ctx, amount(100))
		// Say the response was lost (a timeout, a dropped connection):
		// retry with the same context, so with the same key.
		retry, _ := client.CallUnary(ctx, amount(100))
		fmt.Println(first.Msg.GetFields()["id"].GetStringValue(), retry.Msg.GetFields()["id"].GetStringValue())
	}, connect.WithInterceptors(ci))
	fmt.Println("charges:", svc.charges.Load())
	// Output:
	// ch_1 ch_1
	// charges: 1
}

func ExampleNewKey() {
	key := idemconnect.NewKey()
	fmt.Println(len(key), strings.Count(key, "-"), key[14:15])
	// Output: 36 4 4
}

// reason returns the reason of the interceptor's ErrorInfo in err, or says
// that the error is the handler's own.
func reason(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		for _, d := range ce.Details() {
			if v, _ := d.Value(); v != nil {
				if info, ok := v.(*errdetails.ErrorInfo); ok && info.GetDomain() == idemconnect.ErrorDomain {
					return info.GetReason()
				}
			}
		}
	}
	return "the handler's own"
}

// Refusals of the interceptor carry an ErrorInfo with ErrorDomain and one
// of the Reason constants, which tells them from the handler's own errors
// of the same code.
func ExampleErrorDomain() {
	runExample(&chargeService{}, []idemconnect.Option{idemconnect.WithKeyRequired(true)}, nil, func(client *connect.Client[structpb.Struct, structpb.Struct]) {
		send := func(key string, cents float64) {
			req := amount(cents)
			if key != "" {
				req.Header().Set(idemconnect.DefaultKeyHeader, key)
			}
			_, err := client.CallUnary(context.Background(), req)
			fmt.Println(connect.CodeOf(err), reason(err))
		}
		send("", 100)         // no key
		send("order 42", 100) // a space
		send("order-42", 0)   // the handler refuses, and it is stored
		send("order-42", 100) // the same key, another request
	})
	// Output:
	// invalid_argument IDEMPOTENCY_KEY_MISSING
	// invalid_argument IDEMPOTENCY_KEY_INVALID
	// invalid_argument the handler's own
	// failed_precondition IDEMPOTENCY_KEY_REUSE
}

func ExampleWithKeyScope() {
	// The scope is the caller that authentication established; a header
	// that the client merely asserts stands in for it here.
	scope := idemconnect.WithKeyScope(func(_ context.Context, req connect.AnyRequest) (string, error) {
		if tenant := req.Header().Get("X-Tenant"); tenant != "" {
			return "tenant:" + tenant, nil
		}
		return "", errors.New("unauthenticated")
	})
	runExample(&chargeService{}, []idemconnect.Option{scope}, nil, func(client *connect.Client[structpb.Struct, structpb.Struct]) {
		as := func(tenant string) {
			req := amount(100)
			req.Header().Set(idemconnect.DefaultKeyHeader, "order-42")
			req.Header().Set("X-Tenant", tenant)
			fmt.Println(tenant, outcome(client.CallUnary(context.Background(), req)))
		}
		as("alice")
		as("bob") // the same key, another caller: not alice's charge
		as("alice")
		as("")
	})
	// Output:
	// alice ch_1 replayed=false
	// bob ch_2 replayed=false
	// alice ch_1 replayed=true
	//  unauthenticated replayed=false
}

func ExampleDefaultStorePolicy() {
	for _, code := range []connect.Code{idemconnect.CodeOK, connect.CodeInvalidArgument, connect.CodeNotFound, connect.CodeUnavailable, connect.CodeAborted} {
		fmt.Println(code, idemconnect.DefaultStorePolicy(code))
	}
	// Output:
	// code_0 true
	// invalid_argument true
	// not_found true
	// unavailable false
	// aborted false
}

func ExampleWithStorePolicy() {
	// Store successful responses only: an error, even one that describes
	// the request, is not stored, and a retry runs the handler.
	okOnly := idemconnect.WithStorePolicy(func(code connect.Code) bool { return code == idemconnect.CodeOK })
	runExample(&chargeService{}, []idemconnect.Option{okOnly}, nil, func(client *connect.Client[structpb.Struct, structpb.Struct]) {
		for range 2 {
			req := amount(0)
			req.Header().Set(idemconnect.DefaultKeyHeader, "order-42")
			fmt.Println(outcome(client.CallUnary(context.Background(), req)))
		}
	})
	// Output:
	// invalid_argument replayed=false
	// invalid_argument replayed=false
}

func ExampleWithRetryAfter() {
	// Ask clients to come back after 200ms at most when the first call is
	// still running or, as here, the store is down.
	down := coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise)
	runExampleOn(unreachable(), &chargeService{}, []idemconnect.Option{idemconnect.WithRetryAfter(200 * time.Millisecond)}, []coordinator.Option{down}, func(client *connect.Client[structpb.Struct, structpb.Struct]) {
		req := amount(100)
		req.Header().Set(idemconnect.DefaultKeyHeader, "order-42")
		_, err := client.CallUnary(context.Background(), req)
		var ce *connect.Error
		errors.As(err, &ce)
		for _, d := range ce.Details() {
			if v, _ := d.Value(); v != nil {
				if ri, ok := v.(*errdetails.RetryInfo); ok {
					fmt.Println(ce.Code(), reason(err), ri.GetRetryDelay().AsDuration())
				}
			}
		}
	})
	// Output: unavailable IDEMPOTENCY_STORE_UNAVAILABLE 200ms
}

// unreachable returns a store that fails every call, as Redis does when it
// is unreachable.
func unreachable() idemstore.Store {
	fs := faultstore.Wrap(memstore.New())
	fs.Fail(idemevent.MethodReserve, nil)
	return fs
}
