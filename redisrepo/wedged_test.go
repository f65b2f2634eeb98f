package redisrepo_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/redisrepo"
)

// TestWedgedPendingIsTakenOver: a pending record that nothing expires (an
// operator's PERSIST, a restore) or whose time to live is longer than ten
// of the caller's leases is abandoned: the caller's Reserve takes it over in one
// atomic step and runs the action once, in modes wait and raise, in either
// record format, and nothing waits for the wait bound.
func TestWedgedPendingIsTakenOver(t *testing.T) {
	const lease = 2 * time.Second
	wedges := []struct {
		name  string
		wedge func(ctx context.Context, c redis.Cmdable, name string) error
	}{
		{"Persisted", func(ctx context.Context, c redis.Cmdable, name string) error { return c.Persist(ctx, name).Err() }},
		{"LongerThanTheLease", func(ctx context.Context, c redis.Cmdable, name string) error {
			return c.PExpire(ctx, name, time.Hour).Err()
		}},
	}
	eachFormat(t, func(t *testing.T, client redis.UniversalClient, s *redisrepo.Store) {
		for _, w := range wedges {
			for _, mode := range []coordinator.InFlightMode{coordinator.InFlightWait, coordinator.InFlightRaise} {
				t.Run(fmt.Sprintf("%s/%s", w.name, mode), func(t *testing.T) {
					key := newKey("wedged")
					mustReserve(t, s, key, pendingWrite(token(), "", lease))
					if err := w.wedge(t.Context(), client, s.Key(key)); err != nil {
						t.Fatal(err)
					}
					c, _ := coord(t, s, coordinator.WithInFlight(mode), coordinator.WithLease(lease), coordinator.WithWaitTimeout(time.Minute))
					var k runs
					start := time.Now()
					got, err := coordinator.Do(t.Context(), c, callOf(key), k.action("taker"))
					if err != nil || got.ID != "taker" || k.n.Load() != 1 {
						t.Fatalf("Do over a wedged pending record: %+v, %v after %d runs; want the action's result, run once", got, err, k.n.Load())
					}
					if d := time.Since(start); d > lease {
						t.Errorf("Do took %v, more than a lease: it waited", d)
					}
					again, err := coordinator.Do(t.Context(), c, callOf(key), k.action("again"))
					if err != nil || again != got || k.n.Load() != 1 {
						t.Fatalf("replay: %+v, %v after %d runs; want the taker's result", again, err, k.n.Load())
					}
				})
			}
		}
	})
}

// TestPendingWithinTheLeaseIsKept: a pending record with an expiry within
// ten of the caller's leases is a live holder's: it is not taken over.
func TestPendingWithinTheLeaseIsKept(t *testing.T) {
	eachFormat(t, func(t *testing.T, _ redis.UniversalClient, s *redisrepo.Store) {
		key := newKey("held")
		w := pendingWrite(token(), "fp", time.Minute)
		mustReserve(t, s, key, w)
		for _, second := range []coordinator.Write{
			pendingWrite(token(), "fp", time.Minute),
			// An instance whose lease is a fifth of the holder's (a
			// rolling deploy that raises the lease) keeps it too.
			pendingWrite(token(), "fp", 12*time.Second),
			completedWrite(token(), "fp", []byte("r"), time.Hour),
		} {
			rec, ok, err := s.Reserve(t.Context(), key, second)
			if err != nil || ok || rec.State != coordinator.StatePending || rec.Token != w.Token {
				t.Fatalf("Reserve of a %s write over a live pending record: %+v, %v, %v; want the holder's record, not written", second.State, rec, ok, err)
			}
		}
	})
}
