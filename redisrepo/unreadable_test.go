package redisrepo_test

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// unreadable is a kind of value that a Store must report as
// coordinator.StateUnreadable.
type unreadable struct {
	name  string
	plant func(ctx context.Context, c redis.Cmdable, key string) error
}

// hset returns a plant func that writes a HASH with the fields and values kv.
func hset(kv ...any) func(ctx context.Context, c redis.Cmdable, key string) error {
	return func(ctx context.Context, c redis.Cmdable, key string) error {
		return c.HSet(ctx, key, kv...).Err()
	}
}

// unreadables lists the values no reader of format version 1 can read.
var unreadables = []unreadable{
	{"string", func(ctx context.Context, c redis.Cmdable, key string) error {
		return c.Set(ctx, key, `{"operation":"op","result":"legacy JSON record"}`, 0).Err()
	}},
	{"list", func(ctx context.Context, c redis.Cmdable, key string) error {
		return c.RPush(ctx, key, "a", "b").Err()
	}},
	{"set", func(ctx context.Context, c redis.Cmdable, key string) error {
		return c.SAdd(ctx, key, "a").Err()
	}},
	{"zset", func(ctx context.Context, c redis.Cmdable, key string) error {
		return c.ZAdd(ctx, key, redis.Z{Score: 1, Member: "a"}).Err()
	}},
	{"hash of a future version", hset("v", "2", "state", "completed", "token", "t", "fp", "", "result", "r", "created_ms", "1")},
	{"hash without a version", hset("state", "completed", "token", "t", "fp", "", "result", "r")},
	{"hash with an empty version", hset("v", "", "state", "pending", "token", "t", "fp", "")},
	{"hash with an unknown state", hset("v", "1", "state", "done", "token", "t", "fp", "", "result", "r")},
	{"hash without a state", hset("v", "1", "token", "t", "fp", "")},
	{"hash without a token", hset("v", "1", "state", "pending", "fp", "")},
	{"hash without a fingerprint", hset("v", "1", "state", "pending", "token", "t")},
	{"completed hash without a result", hset("v", "1", "state", "completed", "token", "t", "fp", "")},
	{"hash of other fields", hset("foo", "bar")},
}
