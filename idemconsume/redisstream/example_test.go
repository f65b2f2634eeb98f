package redisstream_test

import (
	"context"
	"fmt"
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
	// order-7 ack (processed)
	// crediting order-8
	// order-8 ack (processed)
	// order-7 ack (duplicate)
}
