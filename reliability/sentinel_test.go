//go:build linux

package reliability_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/redistest"
)

// sentinelBackend is a master and its replica behind a sentinel, reached
// with the failover client that idempotency.NewRedisClient builds from
// IDEMPOTENCY_REDIS_SENTINEL_MASTER and IDEMPOTENCY_REDIS_SENTINEL_ADDRS.
type sentinelBackend struct{ s *redistest.Sentinel }

func (b *sentinelBackend) client(t *testing.T) redis.UniversalClient {
	t.Helper()
	s := idempotency.DefaultSettings()
	s.StorageTimeout = storageTimeout
	s.RedisSentinelMaster = redistest.SentinelMaster
	s.RedisSentinelAddrs = b.s.Addrs()
	c, err := idempotency.NewRedisClient(s)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (b *sentinelBackend) direct(t *testing.T) redis.UniversalClient { return b.client(t) }

// switchMargin is how long after the sentinel's announcement a write may
// still reach the former master, beyond one storage timeout: the client
// receives the announcement on its own Pub/Sub connection, and -race on two
// busy cores delays goroutines by tens of milliseconds.
const switchMargin = 400 * time.Millisecond

// sentinelFailoverBound bounds a Sentinel failover, the former master's
// reconfiguration included (about 20s with Redis 7.0).
const sentinelFailoverBound = time.Minute

var faultSentinelFailover = fault{
	name: "sentinel-failover",
	expect: "SENTINEL FAILOVER during the storm: the replica is promoted and the client follows the sentinel's " +
		"+switch-master; until then calls that meet the former master, read-only once the sentinel reconfigures " +
		"it, fail (raise) or run unprotected (run); a write that had not reached the replica, or that reached the " +
		"former master after the promotion, may be lost and its key run again: allowed (failover)",
	needs: "sentinel",
	inject: func(t *testing.T, env *faultEnv) faultResult {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), sentinelFailoverBound)
		defer cancel()
		from, err := env.sentinel.Master(ctx)
		if err != nil {
			t.Fatal(err)
		}
		start, began := env.now(), time.Now()
		res, err := env.sentinel.Failover(ctx)
		if err != nil {
			t.Fatal(err)
		}
		end := env.now()
		// Records written before the failover began may not have reached
		// the replica; records written after the promotion go to the
		// former master until the client switches, on the sentinel's
		// +switch-master (which go-redis handles by closing its
		// connections to the former master), and a call in flight on one
		// of those connections may still land there just after. So the
		// window in which writes may be lost spans from the start to the
		// announcement plus a margin for those calls: one storage timeout
		// and a scheduling allowance. A write after it that is lost is a
		// finding.
		announced := start + int64(res.Announced.Sub(began))
		lossEnd := min(end, announced+int64(storageTimeout+switchMargin))
		return faultResult{start: start, end: end,
			// Every key: one master holds them all.
			windows: []lossWindow{{start: start, end: lossEnd, spans: true, reason: reasonSentinel}},
			note: fmt.Sprintf("master %s failed over to %s, announced after %v; the former master a replica in sync after %v",
				from, res.Master, res.Announced.Sub(began).Round(time.Millisecond), time.Duration(end-start).Round(time.Millisecond))}
	},
}

// TestSentinel: storms on a master and replica behind Redis Sentinel, with
// SENTINEL FAILOVER while they run (IDEMPOTENCY_REDIS_SENTINEL_*). Every
// action run beyond a key's first must be one that docs/architecture.md
// allows; in raise mode none is unprotected, so every extra run must fall in
// the failover's window.
func TestSentinel(t *testing.T) {
	lv := suiteLevel(t)
	for _, m := range faultModes(lv, faultSentinelFailover) {
		sc := scenario{backend: "sentinel", modes: m, fault: faultSentinelFailover}
		t.Run(sc.name(), func(t *testing.T) {
			s := redistest.StartSentinel(t)
			check(t, lv, sc, &sentinelBackend{s: s}, &faultEnv{sentinel: s})
		})
	}
}
