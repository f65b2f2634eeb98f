package redisstream_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/idemconsume/redisstream"
	"github.com/idemkit/idempotency/internal/redistest"
)

// An entry claimed (XCLAIM, after WithMinIdle) while the consumer that
// read it is still in its handler is not run a second time: in in-flight
// mode "raise" the claimer gets Retry (in_progress) with RetryAfter and
// leaves the entry pending; in mode "wait" it waits for the holder's result
// and acknowledges a duplicate. Either way the holder's acknowledgement
// drains the stream, with one effect.
func TestClaimedWhileTheHolderRuns(t *testing.T) {
	for _, mode := range []coordinator.InFlightMode{coordinator.InFlightRaise, coordinator.InFlightWait} {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t)
			id := e.publish("order-1")
			fx := newEffects()

			// The holder: a slow handler, slower than the claimer's min-idle;
			// its lease (3s) is renewed while it runs.
			started, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			e.start(e.rdb, e.processor(e.coordinator(e.store, coordinator.WithInFlight(mode))),
				func(_ context.Context, m idemconsume.Message) error {
					once.Do(func() { close(started) })
					<-release
					fx.add(m.Fields["idempotency-key"])
					return nil
				}, fast(redisstream.WithConsumerName("holder"))...)
			<-started

			// The claimer: another process, with a coordinator of its own.
			dec := newDecisions()
			var runs atomic.Int64
			e.start(e.rdb, e.processor(e.coordinator(e.store, coordinator.WithInFlight(mode))),
				func(context.Context, idemconsume.Message) error { runs.Add(1); return nil },
				fast(redisstream.WithConsumerName("claimer"), redisstream.WithOnDecision(dec.hook))...)
			owner := func() (string, int64) {
				pend, err := e.rdb.XPendingExt(t.Context(), &redis.XPendingExtArgs{Stream: e.stream, Group: e.group, Start: id, End: id, Count: 1}).Result()
				if err != nil || len(pend) != 1 {
					return "", 0
				}
				return pend[0].Consumer, pend[0].RetryCount
			}
			eventually(t, 10*time.Second, "the claimer did not claim the entry", func() bool { c, _ := owner(); return c == "claimer" })
			if mode == coordinator.InFlightRaise {
				eventually(t, 10*time.Second, "no in_progress decision", func() bool { return dec.get(idemconsume.ReasonInProgress) >= 1 })
				dec.mu.Lock()
				first := dec.d[0]
				dec.mu.Unlock()
				if first.Action != idemconsume.Retry || first.RetryAfter <= 0 || !errors.Is(first.Err, coordinator.ErrInProgress) {
					t.Errorf("claimer's decision %v: RetryAfter %v, error %v; want Retry with RetryAfter", first, first.RetryAfter, first.Err)
				}
				if _, n := owner(); n < 2 {
					t.Errorf("the claimed entry was delivered %d times, want at least 2", n)
				}
			}
			if got := dec.get(idemconsume.ReasonProcessed) + dec.get(idemconsume.ReasonDuplicate); got != 0 {
				t.Errorf("the claimer acknowledged the entry while its holder ran: %v", dec)
			}

			close(release)
			eventually(t, 10*time.Second, "the stream is not drained", e.drained)
			fx.check(t, []string{"order-1"})
			if runs.Load() != 0 {
				t.Errorf("the claimer ran the handler %d times, want 0", runs.Load())
			}
			if mode == coordinator.InFlightWait {
				eventually(t, 10*time.Second, "the waiting claimer decided nothing", func() bool { return dec.get(idemconsume.ReasonDuplicate) == 1 })
			}
		})
	}
}

// countingClient counts the reads and claims a consumer makes.
type countingClient struct {
	*redis.Client
	calls atomic.Int64
}

func (c *countingClient) XReadGroup(ctx context.Context, a *redis.XReadGroupArgs) *redis.XStreamSliceCmd {
	c.calls.Add(1)
	return c.Client.XReadGroup(ctx, a)
}

func (c *countingClient) XPendingExt(ctx context.Context, a *redis.XPendingExtArgs) *redis.XPendingExtCmd {
	c.calls.Add(1)
	return c.Client.XPendingExt(ctx, a)
}

func (c *countingClient) XClaim(ctx context.Context, a *redis.XClaimArgs) *redis.XMessageSliceCmd {
	c.calls.Add(1)
	return c.Client.XClaim(ctx, a)
}

// With Redis down, a worker backs off between failed reads instead of
// spinning (a client that fails at once would otherwise make thousands of
// calls a second); when Redis comes back, empty (a redis-server loses its
// data on a crash), the consumer makes the stream and the group again and
// consumes.
func TestRedisDownBacksOff(t *testing.T) {
	in := redistest.Start(t)
	opts := in.Options()
	opts.MaxRetries, opts.DialerRetries = -1, 1 // fail at once: only the consumer's back-off paces it
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	client := &countingClient{Client: rdb}
	e := newEnv(t)
	e.rdb = rdb // the stream lives on the server this test stops

	var failures atomic.Int64
	c, err := coordinator.New(memstore.New())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	fx := newEffects()
	e.start(client, e.processor(c), func(_ context.Context, m idemconsume.Message) error {
		fx.add(m.Fields["idempotency-key"])
		return nil
	}, fast(redisstream.WithOnError(func(context.Context, error) { failures.Add(1) }))...)
	eventually(t, 10*time.Second, "the group was not created", func() bool { return e.groupInfo().Pending == 0 })

	in.Stop(t)
	eventually(t, 10*time.Second, "no failed read was reported", func() bool { return failures.Load() > 0 })
	before, start := client.calls.Load(), time.Now()
	time.Sleep(1500 * time.Millisecond) // a window to count calls in, not a synchronisation
	calls, window := client.calls.Load()-before, time.Since(start)
	t.Logf("Redis down: %d reads and claims in %v", calls, window.Round(time.Millisecond))
	// Back-off from 100ms, doubling: 4 or 5 calls in 1.5s. Without it, a
	// call per millisecond at least.
	if calls > 10 {
		t.Errorf("%d reads and claims in %v with Redis down: no back-off", calls, window)
	}

	in.Restart(t)
	e.publish("order-1")
	eventually(t, 20*time.Second, "the stream is not drained after Redis came back", e.drained)
	fx.check(t, []string{"order-1"})
}

// A stream deleted (DEL) under a running consumer is made again, with its
// group, and the entries added to it later are consumed.
func TestStreamDeletedUnderTheConsumer(t *testing.T) {
	e := newEnv(t)
	fx := newEffects()
	e.start(e.rdb, e.processor(e.coordinator(e.store)), func(_ context.Context, m idemconsume.Message) error {
		fx.add(m.Fields["idempotency-key"])
		return nil
	}, fast()...)
	e.publish("order-1")
	eventually(t, 10*time.Second, "the stream is not drained", e.drained)

	if err := e.rdb.Del(t.Context(), e.stream).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the group was not made again", func() bool { return e.groupInfo().Pending == 0 })
	e.publish("order-2")
	eventually(t, 10*time.Second, "the stream is not drained", e.drained)
	fx.check(t, []string{"order-1", "order-2"})
}

// A group destroyed (XGROUP DESTROY) under a running consumer is created
// again from WithStartID ("0"), so the group reads the stream from its
// start again: the entries processed before are acknowledged as duplicates
// while their records live (WithTTL), without a second effect.
func TestGroupDestroyedUnderTheConsumer(t *testing.T) {
	e := newEnv(t)
	fx := newEffects()
	dec := newDecisions()
	e.start(e.rdb, e.processor(e.coordinator(e.store)), func(_ context.Context, m idemconsume.Message) error {
		fx.add(m.Fields["idempotency-key"])
		return nil
	}, fast(redisstream.WithOnDecision(dec.hook))...)
	e.publish("order-1")
	eventually(t, 10*time.Second, "the stream is not drained", e.drained)

	if err := e.rdb.XGroupDestroy(t.Context(), e.stream, e.group).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the entry was not read again", func() bool { return dec.get(idemconsume.ReasonDuplicate) == 1 })
	e.publish("order-2")
	eventually(t, 10*time.Second, "the stream is not drained", e.drained)
	fx.check(t, []string{"order-1", "order-2"})
}

// failingAdds is a client whose XADDs to the dead-letter stream fail while
// down is set.
type failingAdds struct {
	*redis.Client
	down atomic.Bool
}

func (f *failingAdds) XAdd(ctx context.Context, a *redis.XAddArgs) *redis.StringCmd {
	if f.down.Load() {
		cmd := redis.NewStringCmd(ctx)
		cmd.SetErr(errors.New("test: XADD refused"))
		return cmd
	}
	return f.Client.XAdd(ctx, a)
}

// An entry whose dead letter cannot be added is not acknowledged: it stays
// pending, is claimed again, and is dead-lettered once the dead-letter
// stream takes it: one dead letter, never a lost entry.
func TestDeadLetterFirstThenAck(t *testing.T) {
	e := newEnv(t)
	client := &failingAdds{Client: e.rdb}
	client.down.Store(true)
	var addErrors atomic.Int64
	c := e.start(client, e.processor(e.coordinator(e.store)), func(context.Context, idemconsume.Message) error {
		return idemconsume.Permanent(errors.New("not an order"))
	}, fast(redisstream.WithMinIdle(50*time.Millisecond), redisstream.WithClaimInterval(20*time.Millisecond),
		redisstream.WithOnError(func(_ context.Context, err error) { addErrors.Add(1) }))...)
	id := e.publish("order-1")

	eventually(t, 10*time.Second, "no second failed dead letter", func() bool { return addErrors.Load() >= 2 })
	if g := e.groupInfo(); g.Pending != 1 {
		t.Fatalf("%d entries pending, want the entry whose dead letter failed", g.Pending)
	}
	client.down.Store(false)
	eventually(t, 10*time.Second, "the stream is not drained", e.drained)
	dead, err := e.rdb.XRange(t.Context(), c.DeadLetterStream(), "-", "+").Result()
	if err != nil || len(dead) != 1 || dead[0].Values[redisstream.FieldDeadID] != id {
		t.Fatalf("dead letters %v, %v; want one, of %s", dead, err, id)
	}
}

// Run returns soon after its context ends, blocked read and all: within
// WithBlock and the time its handler takes to notice.
func TestRunReturnsWhenCancelled(t *testing.T) {
	e := newEnv(t)
	const block = 200 * time.Millisecond
	started := make(chan struct{})
	var once sync.Once
	sc, err := redisstream.New(e.rdb, e.processor(e.coordinator(e.store)), e.stream, e.group,
		func(ctx context.Context, _ idemconsume.Message) error {
			once.Do(func() { close(started) })
			<-ctx.Done()
			return ctx.Err()
		}, redisstream.WithWorkers(3), redisstream.WithBlock(block))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- sc.Run(ctx) }()
	e.publish("order-1") // one worker in its handler, two blocked in XREADGROUP
	<-started
	cancel()
	start := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		t.Logf("Run returned %v after its context ended", time.Since(start).Round(time.Millisecond))
	case <-time.After(block + 5*time.Second):
		t.Fatalf("Run has not returned %v after its context ended", block+5*time.Second)
	}
	if g := e.groupInfo(); g.Pending != 1 {
		t.Errorf("%d entries pending, want the interrupted one", g.Pending)
	}
}

// A consumer started while Redis is down does not give up: it retries
// creating the group, with the back-off, and consumes once Redis is back.
func TestRunStartedWhileRedisIsDown(t *testing.T) {
	in := redistest.Start(t)
	opts := in.Options()
	opts.MaxRetries, opts.DialerRetries = -1, 1
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	e := newEnv(t)
	e.rdb = rdb
	in.Stop(t)

	c, err := coordinator.New(memstore.New())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	fx := newEffects()
	var failures atomic.Int64
	sc, err := redisstream.New(rdb, e.processor(c), e.stream, e.group, func(_ context.Context, m idemconsume.Message) error {
		fx.add(m.Fields["idempotency-key"])
		return nil
	}, fast(redisstream.WithOnError(func(context.Context, error) { failures.Add(1) }))...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- sc.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	eventually(t, 10*time.Second, "no second failure to create the group", func() bool {
		select {
		case err := <-done:
			done <- err // for the cleanup
			t.Fatalf("Run returned %v while Redis was down", err)
		default:
		}
		return failures.Load() >= 2
	})
	in.Restart(t)
	e.publish("order-1")
	eventually(t, 20*time.Second, "the stream is not drained after Redis came back", e.drained)
	fx.check(t, []string{"order-1"})
}

// A key that holds something other than a stream is a mistake that no
// retry cures: Run returns at once.
func TestRunRefusesAKeyThatIsNotAStream(t *testing.T) {
	e := newEnv(t)
	if err := e.rdb.Set(t.Context(), e.stream, "not a stream", 0).Err(); err != nil {
		t.Fatal(err)
	}
	sc, err := redisstream.New(e.rdb, e.processor(e.coordinator(e.store)), e.stream, e.group,
		func(context.Context, idemconsume.Message) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := sc.Run(t.Context()); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("Run: %v, want WRONGTYPE", err)
	}
}
