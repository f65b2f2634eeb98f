package redisstream_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
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

// A claim that keeps failing (an ACL without XCLAIM), or a search for idle
// entries that does (XPENDING), does not stop the reads of new entries,
// nor makes a hot loop: the next claim waits a claim interval.
func TestFailingClaimDoesNotStopReads(t *testing.T) {
	for _, tc := range []struct {
		name    string
		client  func(*redis.Client) redisstream.Client
		command string
	}{
		{"xclaim", func(c *redis.Client) redisstream.Client { return noClaim{c} }, redisstream.CommandClaim},
		{"xpending", func(c *redis.Client) redisstream.Client { return noIdleScan{c} }, redisstream.CommandPending},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			// An entry that a dead consumer left pending, for the claims to find.
			e.publish("order-0")
			if err := e.rdb.XGroupCreateMkStream(t.Context(), e.stream, e.group, "0").Err(); err != nil {
				t.Fatal(err)
			}
			if err := e.rdb.XReadGroup(t.Context(), &redis.XReadGroupArgs{Group: e.group, Consumer: "pod-dead", Streams: []string{e.stream, ">"}}).Err(); err != nil {
				t.Fatal(err)
			}
			var ran, refused atomic.Int64
			c := e.start(tc.client(e.rdb), e.processor(e.coordinator(e.store)),
				func(context.Context, idemconsume.Message) error { ran.Add(1); return nil },
				fast(redisstream.WithOnError(func(_ context.Context, err error) {
					var ce *idemconsume.CommandError
					if errors.As(err, &ce) && ce.Command == tc.command {
						refused.Add(1)
					}
				}))...)
			start := time.Now()
			e.publish("order-1")
			eventually(t, 5*time.Second, "the new entry processed, and two claims refused", func() bool { return ran.Load() == 1 && refused.Load() >= 2 })
			c.stop()
			// fast claims every 50ms.
			if n, most := refused.Load(), int64(time.Since(start)/(50*time.Millisecond))+1; n > most {
				t.Errorf("%d refused commands in %v, more than one a claim interval (%d)", n, time.Since(start), most)
			}
		})
	}
}

// noClaim is a client whose XCLAIM Redis refuses.
type noClaim struct{ *redis.Client }

func (noClaim) XClaim(ctx context.Context, _ *redis.XClaimArgs) *redis.XMessageSliceCmd {
	cmd := redis.NewXMessageSliceCmd(ctx)
	cmd.SetErr(errors.New("NOPERM this user has no permissions to run the 'xclaim' command"))
	return cmd
}

// noIdleScan is a client whose XPENDING ... IDLE fails.
type noIdleScan struct{ *redis.Client }

func (c noIdleScan) XPendingExt(ctx context.Context, a *redis.XPendingExtArgs) *redis.XPendingExtCmd {
	if a.Idle == 0 {
		return c.Client.XPendingExt(ctx, a)
	}
	cmd := redis.NewXPendingExtCmd(ctx)
	cmd.SetErr(errors.New("i/o timeout"))
	return cmd
}

// An idle entry that another consumer claims between a worker's search
// (XPENDING ... IDLE) and its claim is left to that consumer: the claim's
// min-idle time refuses it, and it is neither run nor charged again.
func TestEntryClaimedElsewhereMeanwhileIsSkipped(t *testing.T) {
	e := newEnv(t)
	id := e.publish("order-0")
	if err := e.rdb.XGroupCreateMkStream(t.Context(), e.stream, e.group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.XReadGroup(t.Context(), &redis.XReadGroupArgs{Group: e.group, Consumer: "pod-dead", Streams: []string{e.stream, ">"}}).Err(); err != nil {
		t.Fatal(err)
	}
	var ran, scans atomic.Int64
	c := e.start(thiefAfterScan{Client: e.rdb, stream: e.stream, group: e.group, scans: &scans}, e.processor(e.coordinator(e.store)),
		func(context.Context, idemconsume.Message) error { ran.Add(1); return nil },
		fast()...)
	eventually(t, 5*time.Second, "no search found the idle entry", func() bool { return scans.Load() >= 2 })
	c.stop()
	pend, err := e.rdb.XPendingExt(t.Context(), &redis.XPendingExtArgs{Stream: e.stream, Group: e.group, Start: id, End: id, Count: 1}).Result()
	if err != nil || len(pend) != 1 {
		t.Fatalf("pending %v, %v", pend, err)
	}
	if ran.Load() != 0 || pend[0].Consumer != "thief" || pend[0].RetryCount != 1+scans.Load() {
		t.Errorf("the handler ran %d times; the entry is %s's, delivered %d times, want the thief's, delivered %d times (once by pod-dead, once per theft)",
			ran.Load(), pend[0].Consumer, pend[0].RetryCount, 1+scans.Load())
	}
}

// thiefAfterScan is a client whose every search for idle entries that finds
// some is followed, before its reply, by a claim of them by "thief".
type thiefAfterScan struct {
	*redis.Client
	stream, group string
	scans         *atomic.Int64
}

func (c thiefAfterScan) XPendingExt(ctx context.Context, a *redis.XPendingExtArgs) *redis.XPendingExtCmd {
	cmd := c.Client.XPendingExt(ctx, a)
	if a.Idle == 0 || len(cmd.Val()) == 0 {
		return cmd
	}
	c.scans.Add(1)
	for _, p := range cmd.Val() {
		// The thief takes it (its idle time starts again: the next search
		// finds it a min-idle later, and the thief takes it again).
		if err := c.Client.XClaim(ctx, &redis.XClaimArgs{Stream: c.stream, Group: c.group, Consumer: "thief", Messages: []string{p.ID}}).Err(); err != nil {
			cmd.SetErr(err)
		}
	}
	return cmd
}

// Idle entries are claimed together while their deliveries leave room for a
// crash of a batch-mate and a delivery of their own (at most
// WithMaxDeliveries minus 2), else one at a time: with 5 deliveries, three
// entries delivered once come in one claim, three delivered four times in
// three, and each is processed with its count.
func TestClaimsTogetherWhileThereIsRoom(t *testing.T) {
	e := newEnv(t)
	var ids []string
	for i := range 6 {
		ids = append(ids, e.publish("order-"+strconv.Itoa(i)))
	}
	ctx := t.Context()
	if err := e.rdb.XGroupCreateMkStream(ctx, e.stream, e.group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: e.group, Consumer: "pod-dead", Streams: []string{e.stream, ">"}}).Err(); err != nil {
		t.Fatal(err)
	}
	for _, id := range oddOf(ids) {
		// Delivered four times: three crashes of its consumers so far.
		if err := e.rdb.Do(ctx, "XCLAIM", e.stream, e.group, "pod-dead", 0, id, "RETRYCOUNT", 4, "JUSTID").Err(); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var claims []int
	got := map[string]int64{}
	c := e.start(e.rdb, e.processor(e.coordinator(e.store), idemconsume.WithMaxDeliveries(5)),
		func(_ context.Context, m idemconsume.Message) error {
			mu.Lock()
			defer mu.Unlock()
			got[m.ID] = m.Deliveries
			return nil
		},
		fast(redisstream.WithOnClaim(func(_ context.Context, n int) {
			mu.Lock()
			defer mu.Unlock()
			claims = append(claims, n)
		}))...)
	eventually(t, 5*time.Second, "the stream is not drained", e.drained)
	c.stop()
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(claims, []int{3, 1, 1, 1}) {
		t.Errorf("claims of %v entries, want [3 1 1 1]", claims)
	}
	for i, id := range ids {
		if want := int64(2 + 3*(i%2)); got[id] != want {
			t.Errorf("entry %d processed at delivery %d, want %d", i, got[id], want)
		}
	}
}

// oddOf returns the elements of s at odd positions.
func oddOf(s []string) []string {
	var odd []string
	for i := 1; i < len(s); i += 2 {
		odd = append(odd, s[i])
	}
	return odd
}
