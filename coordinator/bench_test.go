package coordinator_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/idemstore"
	"github.com/idemkit/idempotency/coordinator/memstore"
)

// The engine's own overhead, over the in-memory store. The Redis store's
// benchmarks (redisrepo) put it beside raw go-redis on one server.

func BenchmarkDo(b *testing.B) {
	c, err := coordinator.New(memstore.New())
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	action := func(context.Context) (charge, error) { return charge{ID: "ch_1", Amount: 1999}, nil }
	b.Run("replay", func(b *testing.B) {
		call := coordinator.Call{Operation: "payment.charge", Key: "bench-replay"}
		if _, err := coordinator.Do(ctx, c, call, action); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := coordinator.Do(ctx, c, call, action); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("first", func(b *testing.B) {
		run := strconv.FormatInt(time.Now().UnixNano(), 36) // new keys for every -count round
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			call := coordinator.Call{Operation: "payment.charge", Key: "bench-first-" + run + "-" + strconv.Itoa(i)}
			if _, err := coordinator.Do(ctx, c, call, action); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("refused", func(b *testing.B) {
		// A key that another caller holds, in-flight mode raise: the
		// engine's part of BenchmarkRefused's, without Redis.
		store := memstore.New()
		raise, err := coordinator.New(store, coordinator.WithInFlight(coordinator.InFlightRaise))
		if err != nil {
			b.Fatal(err)
		}
		call := coordinator.Call{Operation: "payment.charge", Key: "bench-refused"}
		held := idemstore.Write{State: idemstore.StatePending, Token: "0123456789abcdef", TTL: time.Hour}
		if _, _, err := store.Reserve(ctx, idemstore.Key{Operation: call.Operation, Key: call.Key}, held); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := coordinator.Do(ctx, raise, call, action); !errors.Is(err, coordinator.ErrInProgress) {
				b.Fatalf("got %v, want ErrInProgress", err)
			}
		}
	})
	b.Run("kill-switch", func(b *testing.B) {
		// The cost of the library with protection off: validation only.
		off, err := coordinator.New(memstore.New(), coordinator.WithEnabled(false))
		if err != nil {
			b.Fatal(err)
		}
		call := coordinator.Call{Operation: "payment.charge", Key: "bench-off"}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := coordinator.Do(ctx, off, call, action); err != nil {
				b.Fatal(err)
			}
		}
	})
}
