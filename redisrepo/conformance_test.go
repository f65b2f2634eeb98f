package redisrepo_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator/storetest"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// TestConformance runs the Store conformance suite on a real standalone
// Redis, a real three-master Redis Cluster, and miniredis.
func TestConformance(t *testing.T) {
	t.Run("Redis", func(t *testing.T) {
		t.Parallel()
		client := redistest.Server(t)
		t.Logf("server: %s", redistest.ServerKind(t))
		conformance(t, client, true)
	})
	t.Run("Cluster", func(t *testing.T) {
		t.Parallel()
		conformance(t, redistest.Cluster(t), true)
	})
	// The writer of format 1, for rolling upgrades: the same contract.
	t.Run("Redis/Format1", func(t *testing.T) {
		t.Parallel()
		conformance(t, redistest.Server(t), false, redisrepo.WithRecordFormat(redisrepo.Format1))
	})
	t.Run("Cluster/Format1", func(t *testing.T) {
		t.Parallel()
		conformance(t, redistest.Cluster(t), false, redisrepo.WithRecordFormat(redisrepo.Format1))
	})
	t.Run("Miniredis", func(t *testing.T) {
		t.Parallel()
		storetest.TestStore(t, func(t *testing.T) storetest.Harness {
			client, m := redistest.Miniredis(t)
			h := harness(t, client, redistest.Prefix(t))
			h.Advance = m.FastForward
			h.Fences = true
			return h
		})
	})
}

// conformance runs the suite on client, with one Store for all subtests;
// fences says whether the Store hands them out (not with format 1).
func conformance(t *testing.T, client redisrepo.Client, fences bool, opts ...redisrepo.Option) {
	prefix := redistest.Prefix(t)
	storetest.TestStore(t, func(t *testing.T) storetest.Harness {
		h := harness(t, client, prefix, opts...)
		h.Fences = fences
		return h
	})
}

// corruptions counts the records planted by harnesses, to plant each kind
// of unreadable value in turn.
var corruptions atomic.Uint64

// harness returns a storetest harness for a Store on client whose Corrupt
// plants, in turn, each kind of value the Store cannot read.
func harness(t *testing.T, client redisrepo.Client, prefix string, opts ...redisrepo.Option) storetest.Harness {
	s := redisrepo.New(client, append([]redisrepo.Option{redisrepo.WithKeyPrefix(prefix)}, opts...)...)
	return storetest.Harness{
		Store: s,
		// GET and SET NX GET do not report a TTL; TestRecordTTL and
		// TestTTLMilliseconds check the TTLs with PTTL.
		TTLUnknown: true,
		Corrupt: func(t *testing.T, key idemstore.Key) {
			t.Helper()
			u := unreadables[corruptions.Add(1)%uint64(len(unreadables))]
			plant(t, client.(redis.Cmdable), s.Key(key), u)
		},
	}
}

// plant writes u under the Redis key name, with a time to live of two
// minutes.
func plant(t testing.TB, c redis.Cmdable, name string, u unreadable) {
	t.Helper()
	ctx := context.Background()
	if err := c.Del(ctx, name).Err(); err != nil {
		t.Fatalf("DEL %s: %v", name, err)
	}
	if err := u.plant(ctx, c, name); err != nil {
		t.Fatalf("plant %s under %s: %v", u.name, name, err)
	}
	if err := c.PExpire(ctx, name, 2*time.Minute).Err(); err != nil {
		t.Fatalf("PEXPIRE %s: %v", name, err)
	}
}
