package redisrepo_test

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// unreadable is a kind of value that a Store must report as
// idemstore.StateUnreadable.
type unreadable struct {
	name   string
	plant  func(ctx context.Context, c redis.Cmdable, key string) error
	string bool // a STRING, read with GET: its TTL is unknown
}

// set returns a plant func that writes the STRING v.
func set(v string) func(ctx context.Context, c redis.Cmdable, key string) error {
	return func(ctx context.Context, c redis.Cmdable, key string) error {
		return c.Set(ctx, key, v, 0).Err()
	}
}

// hset returns a plant func that writes a HASH with the fields and values kv.
func hset(kv ...any) func(ctx context.Context, c redis.Cmdable, key string) error {
	return func(ctx context.Context, c redis.Cmdable, key string) error {
		return c.HSet(ctx, key, kv...).Err()
	}
}

// unreadables lists the values no reader of format version 2 or 1 can read.
var unreadables = []unreadable{
	{"string", set(`{"operation":"op","result":"legacy JSON record"}`), true},
	{"empty string", set(""), true},
	{"string shorter than a header", set("\x02\x02\x00\x00\x00"), true},
	{"string of a future version", set("\x03\x02\x00\x00\x00\x00result"), true},
	{"string of an unknown state", set("\x02\x03\x00\x00\x00\x00"), true},
	{"string of state absent", set("\x02\x00\x00\x00\x00\x00"), true},
	{"string with a token past its end", set("\x02\x02\x00\x05\x00\x00tok"), true},
	{"string with a fingerprint past its end", set("\x02\x02\x00\x01\x01\x00tfp"), true},
	{"pending string with a result", set("\x02\x01\x00\x01\x00\x00tresult"), true},
	{name: "list", plant: func(ctx context.Context, c redis.Cmdable, key string) error {
		return c.RPush(ctx, key, "a", "b").Err()
	}},
	{name: "set", plant: func(ctx context.Context, c redis.Cmdable, key string) error {
		return c.SAdd(ctx, key, "a").Err()
	}},
	{name: "zset", plant: func(ctx context.Context, c redis.Cmdable, key string) error {
		return c.ZAdd(ctx, key, redis.Z{Score: 1, Member: "a"}).Err()
	}},
	{name: "hash of a future version", plant: hset("v", "2", "state", "completed", "token", "t", "fp", "", "result", "r", "created_ms", "1")},
	{name: "hash without a version", plant: hset("state", "completed", "token", "t", "fp", "", "result", "r")},
	{name: "hash with an empty version", plant: hset("v", "", "state", "pending", "token", "t", "fp", "")},
	{name: "hash with an unknown state", plant: hset("v", "1", "state", "done", "token", "t", "fp", "", "result", "r")},
	{name: "hash without a state", plant: hset("v", "1", "token", "t", "fp", "")},
	{name: "hash without a token", plant: hset("v", "1", "state", "pending", "fp", "")},
	{name: "hash without a fingerprint", plant: hset("v", "1", "state", "pending", "token", "t")},
	{name: "completed hash without a result", plant: hset("v", "1", "state", "completed", "token", "t", "fp", "")},
	{name: "hash of other fields", plant: hset("foo", "bar")},
}
