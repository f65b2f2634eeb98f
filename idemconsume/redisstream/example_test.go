package redisstream_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/idemconsume/redisstream"
	"github.com/idemkit/idempotency/redisrepo"
)

func Example() {
	// miniredis stands in for Redis so that the example runs anywhere; point
	// the client at your server instead.
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	// The producer publishes order-7 twice: a retried XADD whose reply was
	// lost. Same idempotency key, two entry IDs.
	for _, key := range []string{"order-7", "order-8", "order-7"} {
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: "orders", Values: []any{"idempotency-key", key, "amount", "5"}})
	}

	c, _ := coordinator.New(redisrepo.New(rdb))
	defer c.Close()
	p, _ := idemconsume.New(c, "billing.credit")
	credit := func(ctx context.Context, m idemconsume.Message) error {
		fmt.Println("crediting", m.Fields["idempotency-key"])
		return nil
	}

	runCtx, stop := context.WithCancel(ctx)
	decided := 0
	consumer, err := redisstream.New(rdb, p, "orders", "billing", credit,
		redisstream.WithBlock(10*time.Millisecond),
		redisstream.WithOnDecision(func(_ context.Context, m idemconsume.Message, d idemconsume.Decision) {
			fmt.Println(m.Fields["idempotency-key"], d)
			if decided++; decided == 3 {
				stop()
			}
		}))
	if err != nil {
		panic(err)
	}
	if err := consumer.Run(runCtx); err != nil { // returns once stop is called
		panic(err)
	}
	// Output:
	// crediting order-7
	// crediting order-8
	// order-7 ack (processed)
	// order-8 ack (processed)
	// order-7 ack (duplicate)
}

// demo is the Redis (a miniredis), the processor and the context of one of
// the examples below.
type demo struct {
	m    *miniredis.Miniredis
	rdb  *redis.Client
	c    *coordinator.Coordinator
	p    *idemconsume.Processor
	ctx  context.Context
	stop context.CancelFunc

	mu      sync.Mutex
	decided int
}

// newDemo starts a miniredis and publishes an entry to "orders" for each
// key.
func newDemo(keys ...string) *demo {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	d := &demo{m: m, rdb: redis.NewClient(&redis.Options{Addr: m.Addr()})}
	d.c, _ = coordinator.New(redisrepo.New(d.rdb))
	d.p, _ = idemconsume.New(d.c, "billing.credit")
	d.ctx, d.stop = context.WithCancel(context.Background())
	d.publish(keys...)
	return d
}

func (d *demo) publish(keys ...string) {
	for _, k := range keys {
		d.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: "orders", Values: []any{"idempotency-key", k, "amount", "5"}})
	}
}

// stopAfter returns the option that stops the demo's context after n
// decisions, printing each one if print is set.
func (d *demo) stopAfter(n int, print bool) redisstream.Option {
	return redisstream.WithOnDecision(func(_ context.Context, m idemconsume.Message, dec idemconsume.Decision) {
		d.mu.Lock()
		defer d.mu.Unlock()
		if print {
			fmt.Printf("%s (delivery %d): %v\n", m.Fields["idempotency-key"], m.Deliveries, dec)
		}
		if d.decided++; d.decided == n {
			d.stop()
		}
	})
}

func (d *demo) close() {
	d.stop()
	_ = d.c.Close()
	_ = d.rdb.Close()
	d.m.Close()
}

// run runs a consumer of "orders" in group "billing" until the demo stops.
func (d *demo) run(handle idemconsume.Handler, opts ...redisstream.Option) *redisstream.Consumer {
	opts = append([]redisstream.Option{redisstream.WithBlock(10 * time.Millisecond)}, opts...)
	consumer, err := redisstream.New(d.rdb, d.p, "orders", "billing", handle, opts...)
	if err != nil {
		panic(err)
	}
	if err := consumer.Run(d.ctx); err != nil {
		panic(err)
	}
	return consumer
}

func credit(context.Context, idemconsume.Message) error { return nil }

// leavePending makes consumer read every entry of "orders" in group
// "billing" and die without acknowledging them; a minute passes.
func (d *demo) leavePending(consumer string) {
	d.rdb.XGroupCreateMkStream(context.Background(), "orders", "billing", "0")
	d.m.SetTime(time.Now())
	d.rdb.XReadGroup(context.Background(), &redis.XReadGroupArgs{Group: "billing", Consumer: consumer, Streams: []string{"orders", ">"}})
	d.m.SetTime(time.Now().Add(time.Minute))
}

func ExampleNew() {
	d := newDemo()
	defer d.close()
	_, err := redisstream.New(d.rdb, d.p, "orders", "", nil)
	fmt.Println(err)
	consumer, err := redisstream.New(d.rdb, d.p, "orders", "billing", credit, redisstream.WithConsumerName("pod-7"))
	fmt.Println(consumer.Name(), consumer.DeadLetterStream(), err)
	// Output:
	// redisstream: handler is nil
	// group is empty
	// pod-7 orders:dead <nil>
}

// A Consumer runs until its context ends; an fx app starts Run in OnStart
// and cancels it in OnStop (docs/consumers.md).
func ExampleConsumer() {
	d := newDemo("order-1", "order-2")
	defer d.close()
	consumer, _ := redisstream.New(d.rdb, d.p, "orders", "billing", credit,
		redisstream.WithBlock(10*time.Millisecond), d.stopAfter(2, true))
	done := make(chan error)
	go func() { done <- consumer.Run(d.ctx) }()
	fmt.Println("Run returned", <-done)
	// Output:
	// order-1 (delivery 1): ack (processed)
	// order-2 (delivery 1): ack (processed)
	// Run returned <nil>
}

func ExampleConsumer_Run() {
	d := newDemo("order-1")
	defer d.close()
	consumer, _ := redisstream.New(d.rdb, d.p, "orders", "billing", credit,
		redisstream.WithBlock(10*time.Millisecond), d.stopAfter(1, true))
	err := consumer.Run(d.ctx) // creates the group, consumes until d.ctx ends
	pending, _ := d.rdb.XPending(context.Background(), "orders", "billing").Result()
	fmt.Println(err, pending.Count)
	// Output:
	// order-1 (delivery 1): ack (processed)
	// <nil> 0
}

func ExampleConsumer_Name() {
	d := newDemo()
	defer d.close()
	named, _ := redisstream.New(d.rdb, d.p, "orders", "billing", credit, redisstream.WithConsumerName("pod-7"))
	generated, _ := redisstream.New(d.rdb, d.p, "orders", "billing", credit)
	host, _ := os.Hostname()
	fmt.Println(named.Name(), strings.HasPrefix(generated.Name(), host+"-"))
	// Output: pod-7 true
}

func ExampleConsumer_DeadLetterStream() {
	d := newDemo()
	defer d.close()
	byDefault, _ := redisstream.New(d.rdb, d.p, "orders", "billing", credit)
	named, _ := redisstream.New(d.rdb, d.p, "orders", "billing", credit, redisstream.WithDeadLetterStream("billing:dead"))
	fmt.Println(byDefault.DeadLetterStream(), named.DeadLetterStream())
	// Output: orders:dead billing:dead
}

// ackLogger is a Client that logs every acknowledgement.
type ackLogger struct{ redisstream.Client }

func (a ackLogger) XAck(ctx context.Context, stream, group string, ids ...string) *redis.IntCmd {
	fmt.Println("XACK", stream, group, len(ids))
	return a.Client.XAck(ctx, stream, group, ids...)
}

// Any go-redis client is a Client; so is a wrapper of one, for logging or
// fault injection.
func ExampleClient() {
	d := newDemo("order-1")
	defer d.close()
	consumer, _ := redisstream.New(ackLogger{d.rdb}, d.p, "orders", "billing", credit,
		redisstream.WithBlock(10*time.Millisecond), d.stopAfter(1, false))
	_ = consumer.Run(d.ctx)
	// Output: XACK orders billing 1
}

func ExampleOption() {
	d := newDemo("order-1", "order-2")
	defer d.close()
	opts := []redisstream.Option{redisstream.WithWorkers(2), redisstream.WithBatchSize(1)}
	if testing := true; testing {
		opts = append(opts, redisstream.WithBlock(10*time.Millisecond), d.stopAfter(2, false))
	}
	consumer, _ := redisstream.New(d.rdb, d.p, "orders", "billing", credit, opts...)
	fmt.Println(consumer.Run(d.ctx))
	// Output: <nil>
}

// A consumer that restarts under its name takes back the entries it left
// pending at once, without waiting for them to be idle.
func ExampleWithConsumerName() {
	d := newDemo("order-1")
	defer d.close()
	d.leavePending("pod-7") // pod-7 read the entry and was killed
	d.run(credit, redisstream.WithConsumerName("pod-7"), d.stopAfter(1, true))
	// Output: order-1 (delivery 2): ack (processed)
}

// Each worker is a consumer of the group, named "<name>-<i>".
func ExampleWithWorkers() {
	d := newDemo("order-1", "order-2", "order-3", "order-4")
	defer d.close()
	var mu sync.Mutex
	var credited []string
	// The first delivery waits until a second one is being handled, so
	// that both workers have read from the group however busy the machine
	// is (with a bound, should there be only one).
	both := make(chan struct{})
	var calls atomic.Int32
	d.run(func(_ context.Context, m idemconsume.Message) error {
		switch calls.Add(1) {
		case 1:
			select {
			case <-both:
			case <-time.After(10 * time.Second):
			}
		case 2:
			close(both)
		}
		mu.Lock()
		defer mu.Unlock()
		credited = append(credited, m.Fields["idempotency-key"])
		return nil
	}, redisstream.WithWorkers(2), redisstream.WithBatchSize(1), redisstream.WithConsumerName("pod"), d.stopAfter(4, false))
	slices.Sort(credited)
	consumers, _ := d.rdb.XInfoConsumers(context.Background(), "orders", "billing").Result()
	var names []string
	for _, c := range consumers {
		names = append(names, c.Name)
	}
	slices.Sort(names)
	fmt.Println(credited, names)
	// Output: [order-1 order-2 order-3 order-4] [pod-0 pod-1]
}

func ExampleWithBatchSize() {
	d := newDemo("order-1", "order-2", "order-3")
	defer d.close()
	d.run(credit, redisstream.WithBatchSize(2), d.stopAfter(3, true))
	// Output:
	// order-1 (delivery 1): ack (processed)
	// order-2 (delivery 1): ack (processed)
	// order-3 (delivery 1): ack (processed)
}

// WithBlock bounds how long Run takes to notice that its context ended.
func ExampleWithBlock() {
	d := newDemo()
	defer d.close()
	consumer, _ := redisstream.New(d.rdb, d.p, "orders", "billing", credit, redisstream.WithBlock(50*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := consumer.Run(ctx)
	fmt.Println(err, time.Since(start) < time.Second)
	// Output: <nil> true
}

// An entry that a dead consumer left pending for WithMinIdle is claimed
// (XCLAIM) by a live one, and counts as delivered again.
func ExampleWithMinIdle() {
	d := newDemo("order-1")
	defer d.close()
	d.leavePending("pod-dead") // a minute ago
	d.run(credit, redisstream.WithMinIdle(30*time.Second), d.stopAfter(1, true))
	// Output: order-1 (delivery 2): ack (processed)
}

func ExampleWithClaimInterval() {
	d := newDemo("order-1")
	defer d.close()
	d.leavePending("pod-dead")
	d.run(credit, redisstream.WithMinIdle(30*time.Second), redisstream.WithClaimInterval(time.Second), d.stopAfter(1, true))
	// Output: order-1 (delivery 2): ack (processed)
}

// The acknowledgement outlives Run's context for up to WithAckTimeout: an
// effect made while the consumer stops is still acknowledged.
func ExampleWithAckTimeout() {
	d := newDemo("order-1")
	defer d.close()
	d.run(func(context.Context, idemconsume.Message) error {
		d.stop() // the consumer is told to stop while the handler runs
		return nil
	}, redisstream.WithAckTimeout(2*time.Second))
	pending, _ := d.rdb.XPending(context.Background(), "orders", "billing").Result()
	fmt.Println("pending:", pending.Count)
	// Output: pending: 0
}

// A group created with "$" skips what the stream held before it.
func ExampleWithStartID() {
	d := newDemo("order-old")
	defer d.close()
	go func() {
		for { // publish once Run has created the group
			if groups, _ := d.rdb.XInfoGroups(context.Background(), "orders").Result(); len(groups) > 0 {
				d.publish("order-new")
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	d.run(credit, redisstream.WithStartID("$"), d.stopAfter(1, true))
	// Output: order-new (delivery 1): ack (processed)
}

func ExampleWithDeadLetterStream() {
	d := newDemo("order-1")
	defer d.close()
	d.run(func(context.Context, idemconsume.Message) error {
		return idemconsume.Permanent(errors.New("account closed"))
	}, redisstream.WithDeadLetterStream("billing:dead"), d.stopAfter(1, false))
	dead, _ := d.rdb.XRange(context.Background(), "billing:dead", "-", "+").Result()
	v := dead[0].Values
	fmt.Println(v["idempotency-key"], v[redisstream.FieldDeadReason], v[redisstream.FieldDeadError], v[redisstream.FieldDeadDeliveries])
	// Output: order-1 permanent_error account closed 1
}

// WithOnDecision is where logs and metrics go.
func ExampleWithOnDecision() {
	d := newDemo("order-1", "order-1")
	defer d.close()
	counts := map[idemconsume.Reason]int{}
	d.run(credit, redisstream.WithOnDecision(func(_ context.Context, _ idemconsume.Message, dec idemconsume.Decision) {
		if counts[dec.Reason]++; counts[idemconsume.ReasonProcessed]+counts[idemconsume.ReasonDuplicate] == 2 {
			d.stop()
		}
	}))
	fmt.Println(counts)
	// Output: map[duplicate:1 processed:1]
}

// lostAcks is a Client whose acknowledgements fail.
type lostAcks struct{ redisstream.Client }

func (lostAcks) XAck(ctx context.Context, _, _ string, _ ...string) *redis.IntCmd {
	cmd := redis.NewIntCmd(ctx)
	cmd.SetErr(errors.New("connection reset"))
	return cmd
}

// A failed stream command is reported as an *idemconsume.CommandError, and
// the entry stays pending to be claimed again.
func ExampleWithOnError() {
	d := newDemo("order-1")
	defer d.close()
	consumer, _ := redisstream.New(lostAcks{d.rdb}, d.p, "orders", "billing", credit,
		redisstream.WithBlock(10*time.Millisecond), d.stopAfter(1, false),
		redisstream.WithOnError(func(_ context.Context, err error) {
			if ce := (*idemconsume.CommandError)(nil); errors.As(err, &ce) {
				fmt.Println(ce.Command, errors.Unwrap(ce.Err))
			}
		}))
	_ = consumer.Run(d.ctx)
	pending, _ := d.rdb.XPending(context.Background(), "orders", "billing").Result()
	fmt.Println("pending:", pending.Count)
	// Output:
	// xack connection reset
	// pending: 1
}
