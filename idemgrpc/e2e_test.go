package idemgrpc_test

import (
	"net"
	"testing"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
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
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	rc := redis.NewClient(redistest.ServerOptions(t))
	c, err := coordinator.New(redisrepo.New(rc, redisrepo.WithKeyPrefix(prefix)))
	if err != nil {
		t.Fatal(err)
	}
	in := &instance{addr: lis.Addr().String(), svc: &payments{}, c: c, rc: rc, done: make(chan struct{}),
		srv: grpc.NewServer(grpc.ChainUnaryInterceptor(idemgrpc.UnaryServerInterceptor(c)))}
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

	conn, err := grpc.NewClient(target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := paymentspb.NewPaymentsClient(conn)

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
	rkey := redisrepo.New(second.rc, redisrepo.WithKeyPrefix(prefix)).Key(coordinator.Key{Operation: "payments.v1.Payments.Charge", Key: key})
	if n, err := redistest.Server(t).Exists(t.Context(), rkey).Result(); err != nil || n != 1 {
		t.Fatalf("EXISTS %s = %d, %v; want the record in Redis", rkey, n, err)
	}
}
