package redisstream_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/idemconsume/redisstream"
)

// Stop lets the handler in hand finish and acknowledges its entry.
func TestStopWaitsForTheMessageInHand(t *testing.T) {
	e := newEnv(t)
	handling, release := make(chan struct{}), make(chan struct{})
	var done atomic.Int64
	sc, err := redisstream.New(e.rdb, e.processor(e.coordinator(e.store)), e.stream, e.group,
		func(ctx context.Context, _ idemconsume.Message) error {
			close(handling)
			<-release
			done.Add(1)
			return ctx.Err()
		}, fast()...)
	if err != nil {
		t.Fatal(err)
	}
	if err := sc.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := sc.Start(t.Context()); err == nil || !strings.Contains(err.Error(), "running") {
		t.Errorf("a second Start = %v, want an error", err)
	}
	e.publish("order-1")
	<-handling
	stopped := make(chan error, 1)
	go func() { stopped <- sc.Stop(t.Context()) }()
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned with a handler running: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if done.Load() != 1 || e.groupInfo().Pending != 0 {
		t.Errorf("handled %d, %d pending; want the entry handled and acknowledged", done.Load(), e.groupInfo().Pending)
	}
	if err := sc.Stop(t.Context()); err != nil {
		t.Errorf("Stop of a stopped consumer = %v", err)
	}
}

// A Stop whose context ends cancels the handler's context; the entry stays
// pending, and Stop returns the context's error.
func TestStopBoundedByItsContext(t *testing.T) {
	e := newEnv(t)
	handling, ended := make(chan struct{}), make(chan struct{})
	sc, err := redisstream.New(e.rdb, e.processor(e.coordinator(e.store)), e.stream, e.group,
		func(ctx context.Context, _ idemconsume.Message) error {
			close(handling)
			<-ctx.Done()
			close(ended)
			return ctx.Err()
		}, fast()...)
	if err != nil {
		t.Fatal(err)
	}
	if err := sc.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.publish("order-1")
	<-handling
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if err := sc.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Stop = %v, want its context's error", err)
	}
	<-ended
	// The workers end within the ack timeout; a Stop without a deadline
	// waits for them.
	if err := sc.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	if g := e.groupInfo(); g.Pending != 1 {
		t.Errorf("%d entries pending, want the interrupted one", g.Pending)
	}
}

// Start fails on a key Redis will not make a group of.
func TestStartRefusesAKeyThatIsNotAStream(t *testing.T) {
	e := newEnv(t)
	if err := e.rdb.Set(t.Context(), e.stream, "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	sc, err := redisstream.New(e.rdb, e.processor(e.coordinator(e.store)), e.stream, e.group,
		func(context.Context, idemconsume.Message) error { return nil }, fast()...)
	if err != nil {
		t.Fatal(err)
	}
	err = sc.Start(t.Context())
	var ce *idemconsume.CommandError
	if !errors.As(err, &ce) || ce.Command != redisstream.CommandGroupCreate || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("Start = %v, want the xgroup_create CommandError of WRONGTYPE", err)
	}
	if err := sc.Stop(t.Context()); err != nil {
		t.Errorf("Stop after a failed Start = %v", err)
	}
}

// WithOnClaim hears of entries claimed from a dead consumer, and every
// WithOnDecision, WithOnError and WithOnClaim is called, in order.
func TestHooksAddUp(t *testing.T) {
	e := newEnv(t)
	// A consumer that read the entry and died.
	e.publish("order-1")
	if err := e.rdb.XGroupCreateMkStream(t.Context(), e.stream, e.group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.XReadGroup(t.Context(), &redis.XReadGroupArgs{
		Group: e.group, Consumer: "dead", Streams: []string{e.stream, ">"}, Count: 1, Block: -1,
	}).Err(); err != nil {
		t.Fatal(err)
	}
	var order []string
	var claimed atomic.Int64
	c := e.start(e.rdb, e.processor(e.coordinator(e.store)), func(context.Context, idemconsume.Message) error { return nil },
		fast(redisstream.WithMinIdle(time.Millisecond),
			redisstream.WithOnClaim(func(_ context.Context, n int) { claimed.Add(int64(n)) }),
			redisstream.WithOnClaim(nil),
			redisstream.WithOnDecision(func(context.Context, idemconsume.Message, idemconsume.Decision) { order = append(order, "first") }),
			redisstream.WithOnDecision(func(context.Context, idemconsume.Message, idemconsume.Decision) { order = append(order, "second") }),
		)...)
	eventually(t, 10*time.Second, "the entry is not claimed", e.drained)
	c.stop()
	if claimed.Load() != 1 {
		t.Errorf("WithOnClaim heard of %d claimed entries, want 1", claimed.Load())
	}
	if strings.Join(order, ",") != "first,second" {
		t.Errorf("decision hooks called %v, want first,second", order)
	}
}

// An entry that a read blocked when Stop began returns is in hand: Redis
// counted its delivery, so it is processed and acknowledged, not left
// pending to come back one delivery nearer its limit.
func TestStopProcessesWhatTheBlockedReadReturns(t *testing.T) {
	e := newEnv(t)
	var ran atomic.Int64
	sc, err := redisstream.New(e.rdb, e.processor(e.coordinator(e.store), idemconsume.WithMaxDeliveries(1)), e.stream, e.group,
		func(context.Context, idemconsume.Message) error { ran.Add(1); return nil },
		redisstream.WithBlock(2*time.Second), redisstream.WithConsumerName("a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := sc.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the worker blocked in XREADGROUP", func() bool {
		info, _ := e.rdb.Info(t.Context(), "clients").Result()
		return strings.Contains(info, "blocked_clients:1")
	})
	stopped := make(chan error, 1)
	go func() { stopped <- sc.Stop(t.Context()) }()
	time.Sleep(100 * time.Millisecond) // Stop has begun; the read still blocks
	e.publish("order-1")
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if n := ran.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want 1", n)
	}
	if g := e.groupInfo(); g.Pending != 0 {
		t.Errorf("%d entries pending after Stop, want 0", g.Pending)
	}
}

// A claim that keeps failing (an ACL without XAUTOCLAIM) does not stop the
// reads of new entries: the next claim waits a claim interval.
func TestFailingClaimDoesNotStopReads(t *testing.T) {
	e := newEnv(t)
	var ran atomic.Int64
	var claimErrs atomic.Int64
	c := e.start(noAutoClaim{e.rdb}, e.processor(e.coordinator(e.store)),
		func(context.Context, idemconsume.Message) error { ran.Add(1); return nil },
		fast(redisstream.WithOnError(func(_ context.Context, err error) {
			var ce *idemconsume.CommandError
			if errors.As(err, &ce) && ce.Command == redisstream.CommandAutoClaim {
				claimErrs.Add(1)
			}
		}))...)
	e.publish("order-1")
	eventually(t, 5*time.Second, "the entry processed", func() bool { return ran.Load() == 1 && e.drained() })
	c.stop()
	if claimErrs.Load() == 0 {
		t.Error("no XAUTOCLAIM error reported: the test did not refuse the claim")
	}
}

// noAutoClaim is a client whose XAUTOCLAIM Redis refuses.
type noAutoClaim struct{ *redis.Client }

func (noAutoClaim) XAutoClaim(ctx context.Context, _ *redis.XAutoClaimArgs) *redis.XAutoClaimCmd {
	cmd := redis.NewXAutoClaimCmd(ctx)
	cmd.SetErr(errors.New("NOPERM this user has no permissions to run the 'xautoclaim' command"))
	return cmd
}
