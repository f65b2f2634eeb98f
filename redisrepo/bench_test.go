package redisrepo_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// The benchmarks measure each Store call next to the raw go-redis call it
// makes, on the same server in the same run, so that the difference is the
// Store's own cost (building the key and arguments, decoding the reply).
// Compare with benchstat -col /impl:
//
//	go test -run '^$' -bench . -benchmem -count 10 ./redisrepo > bench.txt
//	benchstat -col /impl bench.txt
//
// impl=redisrepo is the Store; impl=raw is the same Redis command with the
// same arguments through go-redis's typed API, reply not decoded.

// result is a typical small JSON result.
var result = []byte(`{"id":"ch_3MmlLrLkdIwHu7ix0snN0B15","amount":1099,"currency":"eur","status":"succeeded","created":1679090539}`)

func benchStore(b *testing.B) (*redisrepo.Store, *redis.Client) {
	b.Helper()
	c := redistest.Server(b)
	s := redisrepo.New(c, redisrepo.WithKeyPrefix(redistest.Prefix(b)))
	if err := s.LoadScripts(context.Background()); err != nil {
		b.Fatal(err)
	}
	return s, c
}

func BenchmarkGet(b *testing.B) {
	ctx := context.Background()
	s, c := benchStore(b)
	key := idemstore.Key{Operation: "payment.charge", Key: "order-42"}
	tok := token()
	mustReserve(b, s, key, completedWrite(tok, "fp", result, time.Hour))
	name := s.Key(key)

	b.Run("impl=redisrepo", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			rec, err := s.Get(ctx, key)
			if err != nil || rec.State != idemstore.StateCompleted {
				b.Fatal(rec, err)
			}
		}
	})
	b.Run("impl=raw", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if v, err := c.Get(ctx, name).Result(); err != nil || v == "" {
				b.Fatal(v, err)
			}
		}
	})
}

// BenchmarkReserve/existing is the replay: Reserve finds a completed record.
// BenchmarkReserve/new is a first execution's reservation, of a new key each
// time (the keys expire after a minute).
func BenchmarkReserve(b *testing.B) {
	ctx := context.Background()
	s, c := benchStore(b)
	key := idemstore.Key{Operation: "payment.charge", Key: "order-42"}
	tok := token()
	mustReserve(b, s, key, completedWrite(tok, "fp", result, time.Hour))
	name := s.Key(key)
	w := pendingWrite(token(), "fp", 30*time.Second)

	b.Run("case=existing/impl=redisrepo", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			rec, ok, err := s.Reserve(ctx, key, w)
			if err != nil || ok || rec.State != idemstore.StateCompleted {
				b.Fatal(rec, ok, err)
			}
		}
	})
	b.Run("case=existing/impl=raw", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if v, err := c.SetArgs(ctx, name, "pending", redis.SetArgs{Mode: "NX", TTL: 30 * time.Second, Get: true}).Result(); err != nil || v == "" {
				b.Fatal(v, err)
			}
		}
	})

	keys := func(n int) []idemstore.Key {
		ks := make([]idemstore.Key, n)
		for i := range ks {
			ks[i] = idemstore.Key{Operation: "payment.charge", Key: "new-" + strconv.Itoa(i) + "-" + token()}
		}
		return ks
	}
	w.TTL = time.Minute
	b.Run("case=new/impl=redisrepo", func(b *testing.B) {
		ks := keys(b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if _, ok, err := s.Reserve(ctx, ks[i], w); err != nil || !ok {
				b.Fatal(ok, err)
			}
		}
	})
	b.Run("case=new/impl=raw", func(b *testing.B) {
		ks := keys(b.N)
		names := make([]string, len(ks))
		for i, k := range ks {
			names[i] = s.Key(k)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if err := c.SetArgs(ctx, names[i], "pending", redis.SetArgs{Mode: "NX", TTL: time.Minute, Get: true}).Err(); err != redis.Nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkComplete is Reserve then Complete of a new key: a first
// execution's two round trips.
func BenchmarkComplete(b *testing.B) {
	ctx := context.Background()
	s, _ := benchStore(b)
	b.Run("impl=redisrepo", func(b *testing.B) {
		ks := make([]idemstore.Key, b.N)
		for i := range ks {
			ks[i] = idemstore.Key{Operation: "payment.charge", Key: "complete-" + strconv.Itoa(i) + "-" + token()}
		}
		tok := token()
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if _, ok, err := s.Reserve(ctx, ks[i], pendingWrite(tok, "fp", 30*time.Second)); err != nil || !ok {
				b.Fatal(ok, err)
			}
			if ok, err := s.Complete(ctx, ks[i], tok, idemstore.Completion{State: idemstore.StateCompleted, Result: result, TTL: time.Minute}); err != nil || !ok {
				b.Fatal(ok, err)
			}
		}
	})
}

// BenchmarkDo is a whole coordinator.Do over Redis next to the raw go-redis
// commands a hand-written idempotency check would send on the same server:
// for a replay one GET (impl=raw) against one SET NX GET (impl=idemkit); for
// a first execution SET NX then SET (impl=raw) against SET NX GET then the
// completion script (impl=idemkit). Both sides make the same number of round
// trips; the difference is the script's work, the engine and the JSON codec.
// The benchmarks package compares whole flows more fully (make bench).
func BenchmarkDo(b *testing.B) {
	ctx := context.Background()
	s, c := benchStore(b)
	co, err := coordinator.New(s)
	if err != nil {
		b.Fatal(err)
	}
	type charge struct {
		ID     string `json:"id"`
		Amount int    `json:"amount"`
	}
	action := func(context.Context) (charge, error) { return charge{ID: "ch_1", Amount: 1999}, nil }
	prefix := redistest.Prefix(b)

	b.Run("case=replay/impl=idemkit", func(b *testing.B) {
		call := coordinator.Call{Operation: "payment.charge", Key: "bench-replay"}
		if _, err := coordinator.Do(ctx, co, call, action); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := coordinator.Do(ctx, co, call, action); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("case=replay/impl=raw", func(b *testing.B) {
		key := prefix + "raw-replay"
		if err := c.Set(ctx, key, result, time.Hour).Err(); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if v, err := c.Get(ctx, key).Bytes(); err != nil || len(v) == 0 {
				b.Fatal(err)
			}
		}
	})
	b.Run("case=first/impl=idemkit", func(b *testing.B) {
		run := strconv.FormatInt(time.Now().UnixNano(), 36) // new keys for every -count round
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			call := coordinator.Call{Operation: "payment.charge", Key: "bench-first-" + run + "-" + strconv.Itoa(i), TTL: time.Minute}
			if _, err := coordinator.Do(ctx, co, call, action); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("case=first/impl=raw", func(b *testing.B) {
		run := strconv.FormatInt(time.Now().UnixNano(), 36)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			key := prefix + "raw-first-" + run + "-" + strconv.Itoa(i)
			if ok, err := c.SetNX(ctx, key, "pending", 30*time.Second).Result(); err != nil || !ok {
				b.Fatal(ok, err)
			}
			if err := c.Set(ctx, key, result, time.Minute).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
