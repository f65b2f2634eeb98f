package idemgrpc_test

import (
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemevent"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemgrpc"
)

// spanPerRPC is a stats handler that puts a span of its own into each
// RPC's context, as otelgrpc.NewServerHandler does, before any interceptor
// runs. Its span IDs count the RPCs from 1.
type spanPerRPC struct{ n atomic.Uint64 }

func (s *spanPerRPC) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	var tid trace.TraceID
	var sid trace.SpanID
	tid[0] = 1
	binary.BigEndian.PutUint64(sid[:], s.n.Add(1))
	return trace.ContextWithSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
}
func (*spanPerRPC) HandleRPC(context.Context, stats.RPCStats)                         {}
func (*spanPerRPC) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (*spanPerRPC) HandleConn(context.Context, stats.ConnStats)                       {}

// spanEvents is an Observer that keeps, for each event, the span ID of the
// span in the context it was observed with, where idemotel would record it
// (trace.SpanFromContext).
type spanEvents struct {
	mu   sync.Mutex
	seen map[idemevent.Kind][]uint64
}

func (s *spanEvents) Observe(ctx context.Context, e idemevent.Event) {
	sid := trace.SpanFromContext(ctx).SpanContext().SpanID()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen[e.Kind] = append(s.seen[e.Kind], binary.BigEndian.Uint64(sid[:]))
}

// TestEventsLandOnTheRPCSpan: the interceptor hands the handler's context,
// with the span a stats handler (otelgrpc's) started, to the coordinator,
// so an Observer such as idemotel's records each call's events on its RPC's
// span.
func TestEventsLandOnTheRPCSpan(t *testing.T) {
	obs := &spanEvents{seen: map[idemevent.Kind][]uint64{}}
	c, err := coordinator.New(memstore.New(), coordinator.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	client := serveWith(t, &payments{}, []grpc.ServerOption{
		grpc.StatsHandler(&spanPerRPC{}),
		grpc.ChainUnaryInterceptor(idemgrpc.UnaryServerInterceptor(c)),
	})
	wantOK(t, charge(withKey(t, "k"), client, chargeReq(1)), "ch_1", false) // RPC 1
	wantOK(t, charge(withKey(t, "k"), client, chargeReq(1)), "ch_1", true)  // RPC 2
	wantOK(t, charge(t.Context(), client, chargeReq(1)), "ch_2", false)     // RPC 3: no key

	obs.mu.Lock()
	defer obs.mu.Unlock()
	for kind, want := range map[idemevent.Kind][]uint64{
		idemevent.Miss:        {1},
		idemevent.Stored:      {1},
		idemevent.Hit:         {2},
		idemevent.Unprotected: {3},
	} {
		if got := obs.seen[kind]; len(got) != len(want) || got[0] != want[0] {
			t.Errorf("%v events on spans %v, want %v", kind, got, want)
		}
	}
}
