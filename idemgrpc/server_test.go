package idemgrpc_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemgrpc"
	"github.com/idemkit/idempotency/idemgrpc/internal/paymentspb"
	"github.com/idemkit/idempotency/idemhttp"
)

func TestFirstCallRunsRetryReplays(t *testing.T) {
	c, ev := newCoordinator(t, nil)
	svc := &payments{}
	client := serve(t, c, svc, nil)

	first := charge(withKey(t, "order-42"), client, chargeReq(1999))
	wantOK(t, first, "ch_1", false)
	retry := charge(withKey(t, "order-42"), client, chargeReq(1999))
	wantOK(t, retry, "ch_1", true)

	if !bytes.Equal(deterministic(t, first.charge), deterministic(t, retry.charge)) || !proto.Equal(first.charge, retry.charge) {
		t.Fatalf("replay %v differs from the first response %v", retry.charge, first.charge)
	}
	if svc.n() != 1 {
		t.Fatalf("handler ran %d times, want 1", svc.n())
	}
	if _, ops := ev.count(idemevent.Miss); len(ops) != 1 || ops[0] != "payments.v1.Payments.Charge" {
		t.Fatalf("operations = %q, want [payments.v1.Payments.Charge]", ops)
	}
	// Another key is another call.
	wantOK(t, charge(withKey(t, "order-43"), client, chargeReq(1999)), "ch_2", false)
}

// TestReplayByAnotherInstance has a second coordinator and interceptor, as a
// restarted process would build them, replay a record the first wrote: the
// response type is found by its name in the protobuf registry.
func TestReplayByAnotherInstance(t *testing.T) {
	store := memstore.New()
	c1, _ := newCoordinator(t, store)
	svc1 := &payments{}
	first := charge(withKey(t, "k1"), serve(t, c1, svc1, nil), chargeReq(500))
	wantOK(t, first, "ch_1", false)

	c2, _ := newCoordinator(t, store)
	svc2 := &payments{}
	retry := charge(withKey(t, "k1"), serve(t, c2, svc2, nil), chargeReq(500))
	wantOK(t, retry, "ch_1", true)
	if !proto.Equal(first.charge, retry.charge) {
		t.Fatalf("replay = %v, want %v", retry.charge, first.charge)
	}
	if svc2.n() != 0 {
		t.Fatalf("second instance ran its handler %d times, want 0", svc2.n())
	}
}

func TestStoredErrorStatusIsReplayedWithDetails(t *testing.T) {
	c, _ := newCoordinator(t, nil)
	svc := &payments{fail: func(context.Context, int64) error {
		st, _ := status.New(codes.FailedPrecondition, "card declined").WithDetails(&errdetails.PreconditionFailure{
			Violations: []*errdetails.PreconditionFailure_Violation{{Type: "CARD", Subject: "acct_1", Description: "insufficient funds"}},
		})
		return st.Err()
	}}
	client := serve(t, c, svc, nil)

	first := charge(withKey(t, "k"), client, chargeReq(1))
	retry := charge(withKey(t, "k"), client, chargeReq(1))
	if svc.n() != 1 {
		t.Fatalf("handler ran %d times, want 1", svc.n())
	}
	if first.replayed || !retry.replayed {
		t.Fatalf("replayed: first %v, retry %v; want false, true", first.replayed, retry.replayed)
	}
	st1, st2 := status.Convert(first.err), status.Convert(retry.err)
	if st2.Code() != codes.FailedPrecondition || st2.Message() != "card declined" {
		t.Fatalf("replayed status = %v, want FailedPrecondition: card declined", st2)
	}
	if !proto.Equal(st1.Proto(), st2.Proto()) {
		t.Fatalf("replayed status %v differs from the first %v", st2.Proto(), st1.Proto())
	}
	pf, ok := st2.Details()[0].(*errdetails.PreconditionFailure)
	if !ok || pf.GetViolations()[0].GetDescription() != "insufficient funds" {
		t.Fatalf("replayed details = %v", st2.Details())
	}
}

func TestStorePolicy(t *testing.T) {
	tests := []struct {
		name   string
		code   codes.Code
		policy func(codes.Code) bool
		stored bool
	}{
		{"InvalidArgument stored", codes.InvalidArgument, nil, true},
		{"NotFound stored", codes.NotFound, nil, true},
		{"Unavailable not stored", codes.Unavailable, nil, false},
		{"Internal not stored", codes.Internal, nil, false},
		{"Aborted not stored", codes.Aborted, nil, false},
		{"Unauthenticated not stored", codes.Unauthenticated, nil, false},
		{"Unavailable stored by a policy", codes.Unavailable, func(c codes.Code) bool {
			return c == codes.Unavailable || idemgrpc.DefaultStorePolicy(c)
		}, true},
		{"InvalidArgument not stored by a policy", codes.InvalidArgument, func(c codes.Code) bool { return c == codes.OK }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := newCoordinator(t, nil)
			svc := &payments{fail: func(_ context.Context, n int64) error {
				if n == 1 {
					return status.Error(tt.code, "first attempt")
				}
				return nil
			}}
			client := serve(t, c, svc, []idemgrpc.Option{idemgrpc.WithStorePolicy(tt.policy)})
			first := charge(withKey(t, "k"), client, chargeReq(1))
			if status.Code(first.err) != tt.code || first.replayed {
				t.Fatalf("first call: %v (replayed %v), want %v", first.err, first.replayed, tt.code)
			}
			retry := charge(withKey(t, "k"), client, chargeReq(1))
			if tt.stored {
				if status.Code(retry.err) != tt.code || !retry.replayed || svc.n() != 1 {
					t.Fatalf("retry: %v (replayed %v), %d runs; want the stored %v, 1 run", retry.err, retry.replayed, svc.n(), tt.code)
				}
				return
			}
			wantOK(t, retry, "ch_2", false)
		})
	}
}

func TestDefaultStorePolicy(t *testing.T) {
	stored := map[codes.Code]bool{
		codes.OK: true, codes.InvalidArgument: true, codes.NotFound: true, codes.AlreadyExists: true,
		codes.PermissionDenied: true, codes.FailedPrecondition: true, codes.OutOfRange: true,
	}
	for code := codes.OK; code <= codes.Unauthenticated; code++ {
		if got := idemgrpc.DefaultStorePolicy(code); got != stored[code] {
			t.Errorf("DefaultStorePolicy(%v) = %v, want %v", code, got, stored[code])
		}
	}
}

// TestPlainErrorNotStored: an error that is not a status is Unknown, which
// is not stored, and reaches the client as gRPC sends it.
func TestPlainErrorNotStored(t *testing.T) {
	c, _ := newCoordinator(t, nil)
	svc := &payments{fail: func(_ context.Context, n int64) error {
		if n == 1 {
			return errors.New("provider timeout")
		}
		return nil
	}}
	client := serve(t, c, svc, nil)
	if r := charge(withKey(t, "k"), client, chargeReq(1)); status.Code(r.err) != codes.Unknown {
		t.Fatalf("first call: %v, want Unknown", r.err)
	}
	wantOK(t, charge(withKey(t, "k"), client, chargeReq(1)), "ch_2", false)
}

func TestKeyReuseIsFailedPrecondition(t *testing.T) {
	c, _ := newCoordinator(t, nil)
	svc := &payments{}
	client := serve(t, c, svc, nil)
	wantOK(t, charge(withKey(t, "k"), client, chargeReq(1999)), "ch_1", false)
	r := charge(withKey(t, "k"), client, chargeReq(5000))
	wantRefusal(t, r.err, codes.FailedPrecondition, idemgrpc.ReasonKeyReuse)
	if svc.n() != 1 || r.replayed {
		t.Fatalf("handler ran %d times (replayed %v), want 1 (false)", svc.n(), r.replayed)
	}
}

// TestFingerprintIsDeterministic: a request with a map, which the client
// encodes in a random order, is the same request on every retry.
func TestFingerprintIsDeterministic(t *testing.T) {
	c, _ := newCoordinator(t, nil)
	svc := &payments{}
	client := serve(t, c, svc, nil)
	req := chargeReq(1)
	req.Labels = map[string]string{}
	for _, k := range strings.Fields("a b c d e f g h i j k l m n o p") {
		req.Labels[k] = k + k
	}
	wantOK(t, charge(withKey(t, "k"), client, req), "ch_1", false)
	for range 10 {
		wantOK(t, charge(withKey(t, "k"), client, req), "ch_1", true)
	}
}

func TestConcurrentCallsRunTheHandlerOnce(t *testing.T) {
	c, ev := newCoordinator(t, nil)
	release := make(chan struct{})
	svc := &payments{fail: func(context.Context, int64) error {
		<-release
		return nil
	}}
	client := serve(t, c, svc, nil)

	const n = 32
	replies := make([]reply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { replies[i] = charge(withKey(t, "same"), client, chargeReq(1999)) })
	}
	// Let every other caller pile up behind the first, then let it finish.
	waitFor(t, func() bool { k, _ := ev.count(idemevent.InFlight); return k >= n-1 })
	close(release)
	wg.Wait()

	replayed := 0
	for _, r := range replies {
		if r.err != nil || r.charge.GetId() != "ch_1" {
			t.Fatalf("a caller got %v, %v; want ch_1", r.charge, r.err)
		}
		if r.replayed {
			replayed++
		}
	}
	if svc.n() != 1 || replayed != n-1 {
		t.Fatalf("handler ran %d times, %d replays; want 1 and %d", svc.n(), replayed, n-1)
	}
}

func TestInProgressRaiseIsAbortedWithRetryInfo(t *testing.T) {
	c, _ := newCoordinator(t, nil, coordinator.WithInFlight(coordinator.InFlightRaise))
	started, release := make(chan struct{}), make(chan struct{})
	svc := &payments{fail: func(context.Context, int64) error {
		close(started)
		<-release
		return nil
	}}
	client := serve(t, c, svc, nil)
	done := make(chan reply)
	go func() { done <- charge(withKey(t, "k"), client, chargeReq(1)) }()
	<-started

	r := charge(withKey(t, "k"), client, chargeReq(1))
	st := wantRefusal(t, r.err, codes.Aborted, idemgrpc.ReasonInProgress)
	if d := retryInfo(t, st).GetRetryDelay().AsDuration(); d <= 0 || d > idemgrpc.DefaultRetryAfter {
		t.Fatalf("RetryInfo delay = %v, want in (0, %v]", d, idemgrpc.DefaultRetryAfter)
	}
	if pb := r.trailer.Get("grpc-retry-pushback-ms"); len(pb) != 1 || pb[0] != "1000" {
		t.Fatalf("grpc-retry-pushback-ms = %q, want [1000]", pb)
	}
	if len(r.header.Get(idemgrpc.ReplayedHeader)) != 0 {
		t.Fatal("a refusal is marked as a replay")
	}
	close(release)
	wantOK(t, <-done, "ch_1", false)
	if svc.n() != 1 {
		t.Fatalf("handler ran %d times, want 1", svc.n())
	}
}

func TestRetryAfterOption(t *testing.T) {
	c, _ := newCoordinator(t, faultyStore(), coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise))
	client := serve(t, c, &payments{}, []idemgrpc.Option{idemgrpc.WithRetryAfter(250 * time.Millisecond)})
	r := charge(withKey(t, "k"), client, chargeReq(1))
	st := wantRefusal(t, r.err, codes.Unavailable, idemgrpc.ReasonStoreUnavailable)
	if d := retryInfo(t, st).GetRetryDelay().AsDuration(); d != 250*time.Millisecond {
		t.Fatalf("RetryInfo delay = %v, want 250ms", d)
	}
}

// faultyStore returns a store whose Reserve and Get always fail.
func faultyStore() *faultstore.Store {
	fs := faultstore.Wrap(memstore.New())
	fs.Fail(idemevent.MethodReserve, nil)
	fs.Fail(idemevent.MethodGet, nil)
	return fs
}

func TestStoreDown(t *testing.T) {
	t.Run("raise: Unavailable, handler not run", func(t *testing.T) {
		c, _ := newCoordinator(t, faultyStore(), coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise))
		svc := &payments{}
		r := charge(withKey(t, "k"), serve(t, c, svc, nil), chargeReq(1))
		st := wantRefusal(t, r.err, codes.Unavailable, idemgrpc.ReasonStoreUnavailable)
		if d := retryInfo(t, st).GetRetryDelay().AsDuration(); d != idemgrpc.DefaultRetryAfter {
			t.Fatalf("RetryInfo delay = %v, want %v", d, idemgrpc.DefaultRetryAfter)
		}
		if strings.Contains(st.Message(), faultstore.ErrInjected.Error()) {
			t.Fatalf("the message %q leaks the store's error", st.Message())
		}
		if svc.n() != 0 {
			t.Fatalf("handler ran %d times, want 0", svc.n())
		}
	})
	t.Run("run: handler runs unprotected", func(t *testing.T) {
		c, _ := newCoordinator(t, faultyStore())
		svc := &payments{}
		wantOK(t, charge(withKey(t, "k"), serve(t, c, svc, nil), chargeReq(1)), "ch_1", false)
	})
}

func TestInvalidKey(t *testing.T) {
	c, _ := newCoordinator(t, nil)
	svc := &payments{}
	client := serve(t, c, svc, nil)
	for name, ctx := range map[string]context.Context{
		"space":    withKey(t, "a b"),
		"empty":    withKey(t, ""),
		"too long": withKey(t, strings.Repeat("k", 256)),
		"two keys": metadata.AppendToOutgoingContext(t.Context(), idemgrpc.DefaultKeyHeader, "a", idemgrpc.DefaultKeyHeader, "b"),
	} {
		t.Run(name, func(t *testing.T) {
			if name == "empty" {
				ctx = metadata.AppendToOutgoingContext(t.Context(), idemgrpc.DefaultKeyHeader, "")
			}
			r := charge(ctx, client, chargeReq(1))
			wantRefusal(t, r.err, codes.InvalidArgument, idemgrpc.ReasonKeyInvalid)
		})
	}
	if svc.n() != 0 {
		t.Fatalf("handler ran %d times, want 0", svc.n())
	}
}

func TestMissingKey(t *testing.T) {
	t.Run("passes through, reported unprotected", func(t *testing.T) {
		c, ev := newCoordinator(t, nil)
		svc := &payments{}
		client := serve(t, c, svc, nil)
		wantOK(t, charge(t.Context(), client, chargeReq(1)), "ch_1", false)
		wantOK(t, charge(t.Context(), client, chargeReq(1)), "ch_2", false)
		if n, ops := ev.count(idemevent.Unprotected); n != 2 || ops[0] != "payments.v1.Payments.Charge" {
			t.Fatalf("unprotected events: %d %q, want 2 of payments.v1.Payments.Charge", n, ops)
		}
	})
	t.Run("required: InvalidArgument", func(t *testing.T) {
		c, _ := newCoordinator(t, nil)
		svc := &payments{}
		client := serve(t, c, svc, []idemgrpc.Option{idemgrpc.WithKeyRequired(true), idemgrpc.WithMethods(chargeMethod)})
		r := charge(t.Context(), client, chargeReq(1))
		wantRefusal(t, r.err, codes.InvalidArgument, idemgrpc.ReasonKeyMissing)
		if svc.n() != 0 {
			t.Fatalf("handler ran %d times, want 0", svc.n())
		}
		// GetCharge is not among the methods: it needs no key.
		if _, err := client.GetCharge(t.Context(), &paymentspb.GetChargeRequest{Id: "ch_1"}); err != nil {
			t.Fatalf("GetCharge: %v", err)
		}
	})
}

func TestWithKeyHeader(t *testing.T) {
	c, _ := newCoordinator(t, nil)
	svc := &payments{}
	client := serve(t, c, svc, []idemgrpc.Option{idemgrpc.WithKeyHeader("X-Request-Key")})
	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-request-key", "k")
	wantOK(t, charge(ctx, client, chargeReq(1)), "ch_1", false)
	wantOK(t, charge(ctx, client, chargeReq(1)), "ch_1", true)
	// The default header is not read any more.
	wantOK(t, charge(withKey(t, "k"), client, chargeReq(1)), "ch_2", false)
}

// tenantOf is a scope hook that reads the caller from a "tenant" metadata
// entry, standing in for what an authentication interceptor establishes.
func tenantOf(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if t := md.Get("tenant"); len(t) == 1 {
		return "tenant:" + t[0], nil
	}
	return "", errors.New("no tenant")
}

func TestKeyScopeSeparatesTenants(t *testing.T) {
	c, _ := newCoordinator(t, nil)
	svc := &payments{}
	client := serve(t, c, svc, []idemgrpc.Option{idemgrpc.WithKeyScope(tenantOf)})
	as := func(tenant string) context.Context {
		return metadata.AppendToOutgoingContext(withKey(t, "order-42"), "tenant", tenant)
	}
	wantOK(t, charge(as("alice"), client, chargeReq(1)), "ch_1", false)
	wantOK(t, charge(as("bob"), client, chargeReq(1)), "ch_2", false) // not alice's charge
	wantOK(t, charge(as("alice"), client, chargeReq(1)), "ch_1", true)
	wantOK(t, charge(as("bob"), client, chargeReq(1)), "ch_2", true)
	r := charge(withKey(t, "order-42"), client, chargeReq(1))
	wantRefusal(t, r.err, codes.Unauthenticated, idemgrpc.ReasonCallerUnknown)
}

func TestKillSwitchStepsAside(t *testing.T) {
	c, _ := newCoordinator(t, nil, coordinator.WithEnabled(false))
	svc := &payments{}
	client := serve(t, c, svc, []idemgrpc.Option{idemgrpc.WithKeyRequired(true)})
	wantOK(t, charge(withKey(t, "k"), client, chargeReq(1)), "ch_1", false)
	wantOK(t, charge(withKey(t, "k"), client, chargeReq(1)), "ch_2", false)
	wantOK(t, charge(withKey(t, "a b"), client, chargeReq(1)), "ch_3", false) // not even checked
	wantOK(t, charge(t.Context(), client, chargeReq(1)), "ch_4", false)
}

func TestWithOperation(t *testing.T) {
	c, ev := newCoordinator(t, nil)
	client := serve(t, c, &payments{}, []idemgrpc.Option{idemgrpc.WithOperation(func(m string) string {
		if m == chargeMethod {
			return "payment.charge"
		}
		return "bad name!"
	})})
	wantOK(t, charge(withKey(t, "k"), client, chargeReq(1)), "ch_1", false)
	if _, ops := ev.count(idemevent.Miss); len(ops) != 1 || ops[0] != "payment.charge" {
		t.Fatalf("operations = %q, want [payment.charge]", ops)
	}
	_, err := client.GetCharge(withKey(t, "k"), &paymentspb.GetChargeRequest{Id: "x"})
	if status.Code(err) != codes.Internal {
		t.Fatalf("GetCharge with an invalid operation name: %v, want Internal", err)
	}
}

func TestTTLOutsideBoundsIsInternal(t *testing.T) {
	c, _ := newCoordinator(t, nil)
	svc := &payments{}
	client := serve(t, c, svc, []idemgrpc.Option{idemgrpc.WithTTL(365 * 24 * time.Hour)})
	r := charge(withKey(t, "k"), client, chargeReq(1))
	if status.Code(r.err) != codes.Internal || svc.n() != 0 {
		t.Fatalf("Charge: %v after %d runs, want Internal and no run", r.err, svc.n())
	}
	// Nothing else reports it: the message must say what is misconfigured.
	if msg := status.Convert(r.err).Message(); !strings.Contains(msg, "TTL 8760h0m0s is outside") {
		t.Fatalf("message %q does not say that the TTL is out of bounds", msg)
	}
}

// TestUnstorableResponseIsNotReplayable: a response that is not a protobuf
// message is returned once; the key is kept as not replayable, so a retry
// does not run the handler and gets AlreadyExists IDEMPOTENCY_NOT_REPLAYABLE.
func TestUnstorableResponseIsNotReplayable(t *testing.T) {
	c, ev := newCoordinator(t, nil)
	n := 0
	intercept := idemgrpc.UnaryServerInterceptor(c)
	info := &grpc.UnaryServerInfo{FullMethod: chargeMethod}
	ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs(idemgrpc.DefaultKeyHeader, "k"))
	handler := func(context.Context, any) (any, error) {
		n++
		return "not a protobuf message", nil
	}
	if resp, err := intercept(ctx, chargeReq(1), info, handler); err != nil || resp != "not a protobuf message" {
		t.Fatalf("interceptor = %v, %v; want the handler's response", resp, err)
	}
	for range 2 {
		resp, err := intercept(ctx, chargeReq(1), info, handler)
		if resp != nil {
			t.Fatalf("retry = %v, want no response", resp)
		}
		if st := wantRefusal(t, err, codes.AlreadyExists, idemgrpc.ReasonNotReplayable); hasRetryInfo(st) {
			t.Fatalf("%v carries a RetryInfo: a retry gets the same answer", st)
		}
	}
	if n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	if got, _ := ev.count(idemevent.NotReplayable); got != 2 {
		t.Fatalf("not_replayable events = %d, want 2", got)
	}
	if _, err := intercept(ctx, "not a request message", info, handler); status.Code(err) != codes.Internal {
		t.Fatalf("a request that is not protobuf: %v, want Internal", err)
	}
}

// TestTooLargeResponseRunsOnce: a response over the coordinator's result
// limit, sent by ten concurrent calls with one key, runs the handler once;
// the first caller gets it, the others AlreadyExists.
func TestTooLargeResponseRunsOnce(t *testing.T) {
	c, ev := newCoordinator(t, nil, coordinator.WithMaxResultBytes(64))
	svc := &payments{fail: func(context.Context, int64) error {
		time.Sleep(20 * time.Millisecond) // let the duplicates collide
		return nil
	}}
	client := serve(t, c, svc, nil)
	big := &paymentspb.ChargeRequest{Account: strings.Repeat("a", 200), AmountCents: 1, Currency: "EUR"}
	replies := make([]reply, 10)
	var wg sync.WaitGroup
	for i := range replies {
		wg.Go(func() { replies[i] = charge(withKey(t, "k"), client, big) })
	}
	wg.Wait()
	if svc.n() != 1 {
		t.Fatalf("handler ran %d times for ten calls with one key, want 1", svc.n())
	}
	ok := 0
	for _, r := range replies {
		if r.err == nil {
			wantOK(t, r, "ch_1", false)
			ok++
			continue
		}
		wantRefusal(t, r.err, codes.AlreadyExists, idemgrpc.ReasonNotReplayable)
	}
	if ok != 1 {
		t.Fatalf("%d calls got the charge, want 1", ok)
	}
	wantRefusal(t, charge(withKey(t, "k"), client, big).err, codes.AlreadyExists, idemgrpc.ReasonNotReplayable)
	if n, _ := ev.count(idemevent.NotReplayable); n != 10 || svc.n() != 1 {
		t.Fatalf("not_replayable events %d, runs %d; want 10 and 1", n, svc.n())
	}
}

func TestOperationName(t *testing.T) {
	for in, want := range map[string]string{
		"/payments.v1.Payments/Charge":        "payments.v1.Payments.Charge",
		"/Greeter/SayHello":                   "Greeter.SayHello",
		"/" + strings.Repeat("a", 120) + "/M": strings.Repeat("a", 91) + "-",
	} {
		got := idemhttp.OperationName(in)
		if strings.HasSuffix(want, "-") {
			if !strings.HasPrefix(got, want) || len(got) != coordinator.MaxOperationLen {
				t.Errorf("OperationName(%q) = %q, want %q and 8 hex digits", in, got, want)
			}
			continue
		}
		if got != want {
			t.Errorf("OperationName(%q) = %q, want %q", in, got, want)
		}
	}
}

// waitFor polls cond until it holds, failing the test after 10s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestUnreadableRecordHeals: a record the interceptor cannot read (not its
// format, or a response type this process does not link) is not an outage:
// the handler runs again and its outcome replaces the record.
func TestUnreadableRecordHeals(t *testing.T) {
	for name, record := range map[string]string{
		"garbage":      "not an envelope",
		"version":      `{"v":99,"code":0,"type":"payments.v1.Charge"}` + "\n",
		"unknown type": `{"v":1,"code":0,"type":"no.such.Message"}` + "\n",
		"bad status":   `{"v":1,"code":5}` + "\n\xff\xff",
	} {
		t.Run(name, func(t *testing.T) {
			c, _ := newCoordinator(t, nil)
			call := coordinator.Call{Operation: "payments.v1.Payments.Charge", Key: "k"} // no fingerprint: never a reuse
			if _, err := c.Execute(t.Context(), call, func(context.Context) ([]byte, error) { return []byte(record), nil }); err != nil {
				t.Fatal(err)
			}
			svc := &payments{}
			client := serve(t, c, svc, nil)
			wantOK(t, charge(withKey(t, "k"), client, chargeReq(1)), "ch_1", false)
			wantOK(t, charge(withKey(t, "k"), client, chargeReq(1)), "ch_1", true)
		})
	}
}

// TestInvalidKeyMessages: a refused key's message says what the rule is
// and how this key breaks it, once.
func TestInvalidKeyMessages(t *testing.T) {
	c, _ := newCoordinator(t, nil)
	client := serve(t, c, &payments{}, nil)
	const rule = `the "idempotency-key" metadata entry must be 1 to 255 visible ASCII characters (0x21-0x7E); `
	for _, tt := range []struct{ key, want string }{
		{"", rule + "it is empty"},
		{"order 42", rule + "it has byte 0x20 at offset 5"},
		{strings.Repeat("k", 300), rule + "it is 300 bytes long"},
	} {
		ctx := metadata.AppendToOutgoingContext(t.Context(), idemgrpc.DefaultKeyHeader, tt.key)
		st := wantRefusal(t, charge(ctx, client, chargeReq(1)).err, codes.InvalidArgument, idemgrpc.ReasonKeyInvalid)
		if st.Message() != tt.want {
			t.Errorf("key %.10q: message %q, want %q", tt.key, st.Message(), tt.want)
		}
	}
	ctx := metadata.AppendToOutgoingContext(t.Context(), idemgrpc.DefaultKeyHeader, "a", idemgrpc.DefaultKeyHeader, "b")
	st := wantRefusal(t, charge(ctx, client, chargeReq(1)).err, codes.InvalidArgument, idemgrpc.ReasonKeyInvalid)
	if want := `the call has 2 "idempotency-key" metadata entries; send one`; st.Message() != want {
		t.Errorf("two keys: message %q, want %q", st.Message(), want)
	}
}
