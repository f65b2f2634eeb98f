package redisrepo_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// eachFormat runs fn on a real standalone server and a real cluster, with a
// Store that writes each record format.
func eachFormat(t *testing.T, fn func(t *testing.T, c redis.UniversalClient, s *redisrepo.Store)) {
	t.Helper()
	for _, b := range []struct {
		name   string
		client func(t *testing.T) redis.UniversalClient
	}{
		{"Redis", func(t *testing.T) redis.UniversalClient { return redistest.Server(t) }},
		{"Cluster", func(t *testing.T) redis.UniversalClient { return redistest.Cluster(t) }},
	} {
		for _, f := range []redisrepo.RecordFormat{redisrepo.Format2, redisrepo.Format1} {
			name := b.name
			if f == redisrepo.Format1 {
				name += "/Format1"
			}
			t.Run(name, func(t *testing.T) {
				c := b.client(t)
				fn(t, c, redisrepo.New(c, redisrepo.WithKeyPrefix(redistest.Prefix(t)), redisrepo.WithRecordFormat(f)))
			})
		}
	}
}

// TestNotReplayableEndToEnd: a result larger than WithMaxResultBytes is
// kept as a not-replayable record on Redis, in either format, so the action
// runs once and every later call gets ErrNotReplayable, in each in-flight
// mode (wait and raise complete a reservation; run writes the record
// without one).
func TestNotReplayableEndToEnd(t *testing.T) {
	eachFormat(t, func(t *testing.T, _ redis.UniversalClient, s *redisrepo.Store) {
		for _, mode := range []coordinator.InFlightMode{coordinator.InFlightWait, coordinator.InFlightRaise, coordinator.InFlightRun} {
			t.Run(string(mode), func(t *testing.T) {
				c, first := coord(t, s, coordinator.WithInFlight(mode), coordinator.WithMaxResultBytes(16))
				key := newKey("not-replayable")
				key.Operation = "not-replayable." + string(mode) // counted alone
				var k runs
				big := func(ctx context.Context) (string, error) {
					k.n.Add(1)
					return strings.Repeat("x", 64), nil
				}
				if got, err := coordinator.Do(t.Context(), c, callOf(key), big); err != nil || len(got) != 64 {
					t.Fatalf("first call: %q, %v; want the action's result", got, err)
				}
				if err := c.Close(); err != nil { // waits for a background save
					t.Fatal(err)
				}
				if n := first.count(idemevent.Error, idemevent.ErrorRecordValidation); n != 1 {
					t.Errorf("%d record_validation_error events on the first call, want 1", n)
				}
				c, ev := coord(t, s, coordinator.WithInFlight(mode), coordinator.WithMaxResultBytes(16))
				for i := range 3 {
					_, err := coordinator.Do(t.Context(), c, callOf(key), big)
					var nr *coordinator.NotReplayableError
					if !errors.Is(err, coordinator.ErrNotReplayable) || !errors.As(err, &nr) || nr.Reason == "" {
						t.Fatalf("call %d after the first: %v, want a *NotReplayableError with a reason", i+2, err)
					}
				}
				if n := k.n.Load(); n != 1 {
					t.Fatalf("the action ran %d times, want once", n)
				}
				if n := ev.count(idemevent.NotReplayable, ""); n != 3 {
					t.Errorf("%d not-replayable events, want 3", n)
				}
				infos, err := s.Inspect(t.Context(), key)
				if err != nil || infos[0].State != idemstore.StateNotReplayable || infos[0].ResultSize == 0 || infos[0].TTL <= 0 {
					t.Fatalf("Inspect = %+v, %v; want a not-replayable record with its reason and a TTL", infos, err)
				}
				counts, err := s.Count(t.Context(), key.Operation)
				if got := counts[key.Operation]; err != nil || got.Completed != 1 || got.NotReplayable != 1 || got.Total() != 1 {
					t.Fatalf("Count = %+v, %v; want one completed record, not replayable", counts, err)
				}
			})
		}
	})
}

// TestNotReplayableWakesWaiter: a caller that waits on a key whose holder
// completes it as not replayable gets ErrNotReplayable, and does not run
// the action.
func TestNotReplayableWakesWaiter(t *testing.T) {
	eachFormat(t, func(t *testing.T, _ redis.UniversalClient, s *redisrepo.Store) {
		collided := make(chan struct{}, 1)
		obs := idemevent.ObserverFunc(func(_ context.Context, ev idemevent.Event) {
			if ev.Kind == idemevent.InFlight {
				select {
				case collided <- struct{}{}:
				default:
				}
			}
		})
		c, err := coordinator.New(s, coordinator.WithMaxResultBytes(16), coordinator.WithObserver(obs))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		key := newKey("not-replayable-waiter")
		var k runs
		release := make(chan struct{})
		holder := make(chan error, 1)
		go func() {
			_, err := coordinator.Do(t.Context(), c, callOf(key), func(context.Context) (string, error) {
				k.n.Add(1)
				<-release
				return strings.Repeat("x", 64), nil
			})
			holder <- err
		}()
		waiter := make(chan error, 1)
		go func() {
			// The holder reserved first: wait until the key is held.
			for {
				rec, err := s.Get(t.Context(), key)
				if err != nil || rec.State == idemstore.StatePending {
					break
				}
			}
			_, err := coordinator.Do(t.Context(), c, callOf(key), func(context.Context) (string, error) {
				k.n.Add(1)
				return "", nil
			})
			waiter <- err
		}()
		<-collided
		close(release)
		if err := <-holder; err != nil {
			t.Fatalf("holder: %v", err)
		}
		if err := <-waiter; !errors.Is(err, coordinator.ErrNotReplayable) {
			t.Fatalf("waiter: %v, want ErrNotReplayable", err)
		}
		if n := k.n.Load(); n != 1 {
			t.Fatalf("the action ran %d times, want once", n)
		}
	})
}
