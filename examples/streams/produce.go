package main

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/idemconsume"
)

// order returns the fields of order i: its idempotency key, the account it
// credits and the amount, i+1 cents.
func order(i int) []any {
	return []any{
		idemconsume.DefaultKeyField, "order-" + strconv.Itoa(i),
		"account", "acct-" + strconv.Itoa(i%5),
		"amount", strconv.Itoa(i + 1),
	}
}

// produce publishes orders 0 to messages-1, then orders 0 to duplicates-1
// again, as a producer does that retries a publish whose reply it lost:
// same idempotency key, new entry ID. Then one order whose amount does not
// parse, which the consumer dead-letters.
func produce(ctx context.Context, rdb redis.UniversalClient, n names, messages, duplicates int) error {
	pipe := rdb.Pipeline()
	for i := range messages {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: n.stream, Values: order(i)})
	}
	for i := range min(duplicates, messages) {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: n.stream, Values: order(i)})
	}
	pipe.XAdd(ctx, &redis.XAddArgs{Stream: n.stream, Values: []any{
		idemconsume.DefaultKeyField, "order-poison", "account", "acct-0", "amount", "12,50",
	}})
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	fmt.Printf("published %d entries to %s\n", messages+min(duplicates, messages)+1, n.stream)
	return nil
}
