package redisrepo_test

import (
	"context"
	"strconv"
	"testing"
	"time"

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
// impl=redisrepo is the Store; impl=evalsha is client.EvalSha of the same
// script with the same arguments, reply not decoded; impl=hgetall is a plain
// HGETALL of the record, the cheapest read of a hash (without its TTL, and
// without the type and version checks).

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
	key := coordinator.Key{Operation: "payment.charge", Key: "order-42"}
	tok := token()
	mustReserve(b, s, key, completedWrite(tok, "fp", result, time.Hour))
	name := s.Key(key)

	b.Run("impl=redisrepo", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			rec, err := s.Get(ctx, key)
			if err != nil || rec.State != coordinator.StateCompleted {
				b.Fatal(rec, err)
			}
		}
	})
	b.Run("impl=evalsha", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := c.EvalSha(ctx, redisrepo.GetScript.Hash(), []string{name}).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("impl=hgetall", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if m, err := c.HGetAll(ctx, name).Result(); err != nil || len(m) == 0 {
				b.Fatal(m, err)
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
	key := coordinator.Key{Operation: "payment.charge", Key: "order-42"}
	tok := token()
	mustReserve(b, s, key, completedWrite(tok, "fp", result, time.Hour))
	name := s.Key(key)
	w := pendingWrite(token(), "fp", 30*time.Second)

	b.Run("case=existing/impl=redisrepo", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			rec, ok, err := s.Reserve(ctx, key, w)
			if err != nil || ok || rec.State != coordinator.StateCompleted {
				b.Fatal(rec, ok, err)
			}
		}
	})
	b.Run("case=existing/impl=evalsha", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := c.EvalSha(ctx, redisrepo.ReserveScript.Hash(), []string{name},
				"pending", w.Token, w.Fingerprint, "", int64(30000), "0", "").Err(); err != nil {
				b.Fatal(err)
			}
		}
	})

	keys := func(n int) []coordinator.Key {
		ks := make([]coordinator.Key, n)
		for i := range ks {
			ks[i] = coordinator.Key{Operation: "payment.charge", Key: "new-" + strconv.Itoa(i) + "-" + token()}
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
	b.Run("case=new/impl=evalsha", func(b *testing.B) {
		ks := keys(b.N)
		names := make([]string, len(ks))
		for i, k := range ks {
			names[i] = s.Key(k)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if err := c.EvalSha(ctx, redisrepo.ReserveScript.Hash(), names[i:i+1],
				"pending", w.Token, w.Fingerprint, "", int64(60000), "0", "").Err(); err != nil {
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
		ks := make([]coordinator.Key, b.N)
		for i := range ks {
			ks[i] = coordinator.Key{Operation: "payment.charge", Key: "complete-" + strconv.Itoa(i) + "-" + token()}
		}
		tok := token()
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if _, ok, err := s.Reserve(ctx, ks[i], pendingWrite(tok, "fp", 30*time.Second)); err != nil || !ok {
				b.Fatal(ok, err)
			}
			if ok, err := s.Complete(ctx, ks[i], tok, result, time.Minute); err != nil || !ok {
				b.Fatal(ok, err)
			}
		}
	})
}
