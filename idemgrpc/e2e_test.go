package idemgrpc_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemgrpc"
	"github.com/idemkit/idempotency/idemgrpc/internal/paymentspb"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// instance is one server process's worth of state: its own Redis client,
// store, coordinator and gRPC server, on a real TCP listener.
type instance struct {
	addr string
	svc  *payments
	srv  *grpc.Server
	done chan struct{}
	c    *coordinator.Coordinator
	rc   *redis.Client
}

func startInstance(t *testing.T, addr, prefix string) *instance {
	t.Helper()
	return startInstanceWith(t, addr, prefix, &payments{})
}

// startInstanceWith is startInstance with svc as the service and outer as
// server interceptors before the idempotency one.
func startInstanceWith(t *testing.T, addr, prefix string, svc *payments, outer ...grpc.UnaryServerInterceptor) *instance {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	rc := redis.NewClient(redistest.ServerOptions(t))
	c, err := coordinator.New(redisrepo.New(rc, redisrepo.WithKeyPrefix(prefix)))
	if err != nil {
		t.Fatal(err)
	}
	in := &instance{addr: lis.Addr().String(), svc: svc, c: c, rc: rc, done: make(chan struct{}),
		srv: grpc.NewServer(grpc.ChainUnaryInterceptor(append(outer, idemgrpc.UnaryServerInterceptor(c))...))}
	paymentspb.RegisterPaymentsServer(in.srv, in.svc)
	go func() {
		defer close(in.done)
		_ = in.srv.Serve(lis)
	}()
	t.Cleanup(in.stop)
	return in
}

// stop stops the instance as a shutdown would; it may be called again.
func (in *instance) stop() {
	in.srv.GracefulStop()
	<-in.done
	_ = in.c.Close()
	_ = in.rc.Close()
}

// TestEndToEndReplayFromRedisAfterRestart runs the first call against one
// server, restarts the server (a new gRPC server, coordinator and Redis
// client on the same address), and retries the call with its key: the retry
// is answered from the record in Redis, and the new server's handler does
// not run.
func TestEndToEndReplayFromRedisAfterRestart(t *testing.T) {
	t.Logf("Redis: %s", redistest.ServerKind(t))
	prefix := redistest.Prefix(t)
	first := startInstance(t, "127.0.0.1:0", prefix)
	target := first.addr

	client := dialTCP(t, target)

	key := idemgrpc.NewKey()
	ctx := idemgrpc.ContextWithKey(t.Context(), key)
	before := charge(ctx, client, chargeReq(1999))
	wantOK(t, before, "ch_1", false)

	first.stop()
	second := startInstance(t, target, prefix)

	after := charge(ctx, client, chargeReq(1999), grpc.WaitForReady(true))
	wantOK(t, after, "ch_1", true)
	if !proto.Equal(before.charge, after.charge) {
		t.Fatalf("replay = %v, want %v", after.charge, before.charge)
	}
	if first.svc.n() != 1 || second.svc.n() != 0 {
		t.Fatalf("handler runs: %d before the restart, %d after; want 1 and 0", first.svc.n(), second.svc.n())
	}
	rkey := redisrepo.New(second.rc, redisrepo.WithKeyPrefix(prefix)).Key(idemstore.Key{Operation: "payments.v1.Payments.Charge", Key: key})
	if n, err := redistest.Server(t).Exists(t.Context(), rkey).Result(); err != nil || n != 1 {
		t.Fatalf("EXISTS %s = %d, %v; want the record in Redis", rkey, n, err)
	}
}

// dialTCP returns a client of the server at target, with the client
// interceptor, closed when the test ends.
func dialTCP(t *testing.T, target string) paymentspb.PaymentsClient {
	t.Helper()
	conn, err := grpc.NewClient(target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return paymentspb.NewPaymentsClient(conn)
}

// typeRecorder is a server interceptor outside the idempotency one, as a
// logging or auditing interceptor would be, that records the Go type of
// every response it sees.
type typeRecorder struct {
	mu    sync.Mutex
	types []string
}

func (r *typeRecorder) intercept(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if err == nil {
		r.mu.Lock()
		r.types = append(r.types, fmt.Sprintf("%T", resp))
		r.mu.Unlock()
	}
	return resp, err
}

// TestEndToEndReplayAcrossInstances has one server write records in Redis
// and another, with its own gRPC server, coordinator and Redis client, as
// another process would have, replay them: a response as the very Go type
// the handler returns (an outer interceptor sees *paymentspb.Charge), and
// an error status with its code, message and details.
func TestEndToEndReplayAcrossInstances(t *testing.T) {
	prefix := redistest.Prefix(t)
	writer := startInstanceWith(t, "127.0.0.1:0", prefix, &payments{fail: func(ctx context.Context, n int64) error {
		if req, _ := ctx.Value(reqKey{}).(string); req == "decline" {
			st, _ := status.New(codes.FailedPrecondition, "card declined").WithDetails(&errdetails.PreconditionFailure{
				Violations: []*errdetails.PreconditionFailure_Violation{{Type: "CARD", Subject: "acct_1", Description: "insufficient funds"}},
			}, &errdetails.ErrorInfo{Reason: "CARD_DECLINED", Domain: "payments.example", Metadata: map[string]string{"n": fmt.Sprint(n)}})
			return st.Err()
		}
		return nil
	}}, markDecline)
	types := &typeRecorder{}
	reader := startInstanceWith(t, "127.0.0.1:0", prefix, &payments{}, types.intercept, markDecline)

	w, r := dialTCP(t, writer.addr), dialTCP(t, reader.addr)
	okCtx := idemgrpc.ContextWithKey(t.Context(), idemgrpc.NewKey())
	first := charge(okCtx, w, chargeReq(1999))
	wantOK(t, first, "ch_1", false)
	replay := charge(okCtx, r, chargeReq(1999))
	wantOK(t, replay, "ch_1", true)
	if !proto.Equal(first.charge, replay.charge) {
		t.Fatalf("replay = %v, want %v", replay.charge, first.charge)
	}
	if len(types.types) != 1 || types.types[0] != "*paymentspb.Charge" {
		t.Fatalf("the outer interceptor saw %q, want [*paymentspb.Charge]", types.types)
	}

	noCtx := metadata.AppendToOutgoingContext(idemgrpc.ContextWithKey(t.Context(), idemgrpc.NewKey()), "decline", "yes")
	refused := charge(noCtx, w, chargeReq(1999))
	again := charge(noCtx, r, chargeReq(1999))
	if status.Code(refused.err) != codes.FailedPrecondition || refused.replayed || !again.replayed {
		t.Fatalf("first %v (replayed %v), retry %v (replayed %v); want FailedPrecondition, then its replay",
			refused.err, refused.replayed, again.err, again.replayed)
	}
	if st1, st2 := status.Convert(refused.err), status.Convert(again.err); !proto.Equal(st1.Proto(), st2.Proto()) || len(st2.Details()) != 2 {
		t.Fatalf("replayed status %v, want %v with its 2 details", st2.Proto(), st1.Proto())
	}
	if writer.svc.n() != 2 || reader.svc.n() != 0 {
		t.Fatalf("handler runs: %d on the writer, %d on the reader; want 2 and 0", writer.svc.n(), reader.svc.n())
	}
}

// reqKey carries, in the handler's context, the "decline" metadata entry
// that markDecline copies there.
type reqKey struct{}

func markDecline(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if len(md.Get("decline")) > 0 {
		ctx = context.WithValue(ctx, reqKey{}, "decline")
	}
	return handler(ctx, req)
}

// TestEndToEndConcurrentCallersAcrossInstances sends one call, with one
// key, from many clients at once to two servers that share Redis: the
// handler runs once in all, and every caller gets its charge.
func TestEndToEndConcurrentCallersAcrossInstances(t *testing.T) {
	prefix := redistest.Prefix(t)
	release := make(chan struct{})
	hold := func(context.Context, int64) error { <-release; return nil }
	a := startInstanceWith(t, "127.0.0.1:0", prefix, &payments{fail: hold})
	b := startInstanceWith(t, "127.0.0.1:0", prefix, &payments{fail: hold})
	clients := []paymentspb.PaymentsClient{dialTCP(t, a.addr), dialTCP(t, b.addr)}

	const n = 16
	ctx := idemgrpc.ContextWithKey(t.Context(), idemgrpc.NewKey())
	replies := make([]reply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { replies[i] = charge(ctx, clients[i%2], chargeReq(1999)) })
	}
	waitFor(t, func() bool { return a.svc.n()+b.svc.n() >= 1 })
	time.Sleep(50 * time.Millisecond) // let the others find the key held
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
	if runs := a.svc.n() + b.svc.n(); runs != 1 || replayed != n-1 {
		t.Fatalf("handler ran %d times, %d replays; want 1 and %d", runs, replayed, n-1)
	}
}

// TestEndToEndNotReplayableOnRedis: a charge over the coordinator's result
// limit, called by ten concurrent clients with one key on two instances
// sharing Redis, charges once; the other calls, and a later retry on the
// other instance, get AlreadyExists IDEMPOTENCY_NOT_REPLAYABLE from the
// record in Redis.
func TestEndToEndNotReplayableOnRedis(t *testing.T) {
	prefix := redistest.Prefix(t)
	svc := &payments{fail: func(context.Context, int64) error {
		time.Sleep(20 * time.Millisecond) // let the duplicates collide
		return nil
	}}
	clients := make([]paymentspb.PaymentsClient, 2)
	for i := range clients {
		rc := redis.NewClient(redistest.ServerOptions(t))
		t.Cleanup(func() { _ = rc.Close() })
		c, _ := newCoordinator(t, redisrepo.New(rc, redisrepo.WithKeyPrefix(prefix)), coordinator.WithMaxResultBytes(64))
		clients[i] = serve(t, c, svc, nil)
	}
	big := &paymentspb.ChargeRequest{Account: fmt.Sprintf("%0200d", 1), AmountCents: 1, Currency: "EUR"}
	replies := make([]reply, 10)
	var wg sync.WaitGroup
	for i := range replies {
		wg.Go(func() { replies[i] = charge(withKey(t, "order-big"), clients[i%2], big) })
	}
	wg.Wait()
	ok := 0
	for _, r := range replies {
		if r.err == nil {
			ok++
			continue
		}
		wantRefusal(t, r.err, codes.AlreadyExists, idemgrpc.ReasonNotReplayable)
	}
	if ok != 1 || svc.n() != 1 {
		t.Fatalf("%d calls got the charge after %d runs, want 1 and 1", ok, svc.n())
	}
	for _, client := range clients {
		wantRefusal(t, charge(withKey(t, "order-big"), client, big).err, codes.AlreadyExists, idemgrpc.ReasonNotReplayable)
	}
	if svc.n() != 1 {
		t.Fatalf("handler ran %d times, want 1", svc.n())
	}
}
