package redisrepo_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// fill makes the Redis of c full: maxmemory-policy noeviction, filler keys
// until a write is refused with OOM, then a maxmemory well below what is
// used. It returns the refusal.
func fill(t *testing.T, c *redis.Client) error {
	t.Helper()
	ctx := context.Background()
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "4mb"}} {
		if err := c.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatalf("CONFIG SET %s %s: %v", kv[0], kv[1], err)
		}
	}
	filler := strings.Repeat("x", 64<<10)
	for i := range 1 << 12 {
		err := c.Set(ctx, fmt.Sprintf("filler:%d", i), filler, 0).Err()
		if err != nil {
			if !strings.HasPrefix(err.Error(), "OOM ") {
				t.Fatalf("filling Redis: %v, want an OOM refusal", err)
			}
			// Freeing the query buffer of the refused write can bring
			// Redis back under maxmemory: put it well below what is used,
			// so that every write is refused from now on.
			if err := c.ConfigSet(ctx, "maxmemory", "2mb").Err(); err != nil {
				t.Fatalf("CONFIG SET maxmemory 2mb: %v", err)
			}
			return err
		}
	}
	t.Fatal("Redis took 256 MiB of filler under maxmemory 4mb")
	return nil
}

// TestFullRedisReplays: with maxmemory reached and policy noeviction, Redis
// refuses SET NX GET with OOM even over a completed record. Reserve then
// reads the key, so completed keys still replay (in both storage-error
// modes, one extra round trip), a pending key is still seen as held, and
// only a new key, which needs a write, meets the refusal.
func TestFullRedisReplays(t *testing.T) {
	for _, f := range []redisrepo.RecordFormat{redisrepo.Format2, redisrepo.Format1} {
		t.Run(fmt.Sprintf("Format%d", f), func(t *testing.T) {
			in := redistest.Start(t)
			if in.Kind() != redistest.KindRedisServer {
				t.Skip("needs redis-server: miniredis has no maxmemory")
			}
			client := in.Client(t)
			rt := &roundTrips{}
			client.AddHook(rt)
			s := redisrepo.New(client, redisrepo.WithKeyPrefix(redistest.Prefix(t)), redisrepo.WithRecordFormat(f))
			if err := s.LoadScripts(t.Context()); err != nil {
				t.Fatal(err)
			}
			const n = 100
			keys := make([]idemstore.Key, n)
			seed, _ := coord(t, s)
			for i := range keys {
				keys[i] = newKey(fmt.Sprintf("full-%d", i))
				if _, err := coordinator.Do(t.Context(), seed, callOf(keys[i]), func(context.Context) (charge, error) {
					return charge{ID: keys[i].Key, N: int64(i)}, nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			held := newKey("full-held")
			mustReserve(t, s, held, pendingWrite(token(), "", 20*time.Second)) // within the lease: not wedged
			refusal := fill(t, client)
			t.Logf("Redis is full: %v", refusal)

			for _, mode := range []coordinator.OnStorageErrorMode{coordinator.OnStorageErrorRun, coordinator.OnStorageErrorRaise} {
				c, _ := coord(t, s, coordinator.WithOnStorageError(mode), coordinator.WithInFlight(coordinator.InFlightRaise))
				var k runs
				replayed := 0
				// Format 2: the refused SET NX GET, then a GET. Format 1:
				// reserve1.lua, which writes nothing over a record.
				wantTrips := int64(2)
				if f == redisrepo.Format1 {
					wantTrips = 1
				}
				for i, key := range keys {
					var res coordinator.Result[charge]
					var err error
					trips := rt.count(func() { res, err = coordinator.DoResult(t.Context(), c, callOf(key), k.action("again")) })
					if err == nil && res.Replayed && res.Value == (charge{ID: key.Key, N: int64(i)}) {
						replayed++
					}
					if trips != wantTrips {
						t.Errorf("%s: a replay on a full Redis cost %d round trips, want %d", mode, trips, wantTrips)
					}
				}
				if replayed != n || k.n.Load() != 0 {
					t.Errorf("%s: %d of %d completed keys replayed, the action ran %d times; want %d, 0", mode, replayed, n, k.n.Load(), n)
				}
				if _, err := coordinator.Do(t.Context(), c, callOf(held), k.action("held")); !errors.Is(err, coordinator.ErrInProgress) {
					t.Errorf("%s: a held key: %v, want ErrInProgress", mode, err)
				}
				fresh := newKey("full-new")
				_, err := coordinator.Do(t.Context(), c, callOf(fresh), k.action("new"))
				var se *coordinator.StorageError
				switch mode {
				case coordinator.OnStorageErrorRaise:
					if !errors.As(err, &se) || !strings.HasPrefix(errors.Unwrap(se).Error(), "OOM ") || k.n.Load() != 0 {
						t.Errorf("raise: a new key: %v after %d runs, want a *StorageError of the OOM refusal and no run", err, k.n.Load())
					}
				default:
					if err != nil || k.n.Load() != 1 {
						t.Errorf("run: a new key: %v after %d runs, want the action's result, run unprotected", err, k.n.Load())
					}
				}
				_ = c.Close() // waits for the best-effort write after the unprotected run
			}
		})
	}
}
