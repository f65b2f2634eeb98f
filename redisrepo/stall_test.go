package redisrepo_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// stallingDialer dials as net.Dialer does until stall is set; from then on
// every new connection hangs until its context ends, as a server that
// accepts no more connections would make it.
type stallingDialer struct{ stall atomic.Bool }

func (d *stallingDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if d.stall.Load() {
		<-ctx.Done()
		return nil, fmt.Errorf("stalled dial: %w", ctx.Err())
	}
	var nd net.Dialer
	return nd.DialContext(ctx, network, addr)
}

// TestWatchNeverWaitsForTheSubscription: when the wake-up subscription
// cannot come up (its new connection hangs) while reads still work on the
// pooled connections, callers that wait on a held key get the holder's
// result by polling, in both storage-error modes: no storage error, and no
// second run of the action.
func TestWatchNeverWaitsForTheSubscription(t *testing.T) {
	if redistest.ServerKind(t) == redistest.KindMiniredis {
		t.Skip("needs redis-server")
	}
	const pool = 8
	// fillPool takes pool connections of c at once and gives them back,
	// and as many of its pipeline pool (where the store's coalesced calls
	// go, redisrepo.WithCoalescing), with pipelines that block for a moment
	// each (WAIT for more replicas than there are): the reads then have theirs, the subscription needs a new one.
	fillPool := func(t *testing.T, c *redis.Client) {
		conns := make([]*redis.Conn, pool)
		for i := range conns {
			conns[i] = c.Conn()
			if err := conns[i].Ping(t.Context()).Err(); err != nil {
				t.Fatal(err)
			}
		}
		for _, cn := range conns {
			_ = cn.Close()
		}
		var wg sync.WaitGroup
		for range pool {
			wg.Go(func() {
				pipe := c.Pipeline()
				pipe.Do(t.Context(), "wait", 100, 50) // blocks for 50ms: there are never 100 replicas
				if _, err := pipe.Exec(t.Context()); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
	}
	t.Run("Redis", func(t *testing.T) {
		testStalledSubscription(t, func(t *testing.T, d *stallingDialer) (redis.UniversalClient, redis.UniversalClient) {
			opts := redistest.ServerOptions(t)
			opts.Dialer, opts.PoolSize, opts.ContextTimeoutEnabled = d.dial, pool, true
			c := redis.NewClient(opts)
			t.Cleanup(func() { _ = c.Close() })
			fillPool(t, c)
			return c, redistest.Server(t)
		})
	})
	t.Run("Cluster", func(t *testing.T) {
		testStalledSubscription(t, func(t *testing.T, d *stallingDialer) (redis.UniversalClient, redis.UniversalClient) {
			opts := redistest.ClusterOptions(t)
			opts.Dialer, opts.PoolSize, opts.ContextTimeoutEnabled = d.dial, pool, true
			c := redis.NewClusterClient(opts)
			t.Cleanup(func() { _ = c.Close() })
			if err := c.ForEachShard(t.Context(), func(_ context.Context, n *redis.Client) error {
				fillPool(t, n)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			return c, redistest.Cluster(t)
		})
	})
}

// testStalledSubscription runs TestWatchNeverWaitsForTheSubscription on the
// clients of open: one whose new connections stall once d.stall is set
// (open fills its pools), for the waiters, and one for the holder.
func testStalledSubscription(t *testing.T, open func(t *testing.T, d *stallingDialer) (stalled, other redis.UniversalClient)) {
	const waiters = 6
	for _, mode := range []coordinator.OnStorageErrorMode{coordinator.OnStorageErrorRaise, coordinator.OnStorageErrorRun} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := t.Context()
			d := &stallingDialer{}
			stalled, other := open(t, d)
			d.stall.Store(true)

			prefix := redistest.Prefix(t)
			holderStore := redisrepo.New(other, redisrepo.WithKeyPrefix(prefix))
			waiterStore := redisrepo.New(stalled, redisrepo.WithKeyPrefix(prefix))
			holder, _ := coord(t, holderStore)
			collided := make(chan struct{}, waiters)
			var errorsSeen atomic.Int64
			obs := idemevent.ObserverFunc(func(_ context.Context, ev idemevent.Event) {
				switch ev.Kind {
				case idemevent.InFlight:
					collided <- struct{}{}
				case idemevent.Error:
					errorsSeen.Add(1)
				}
			})
			c, err := coordinator.New(waiterStore, coordinator.WithObserver(obs), coordinator.WithOnStorageError(mode),
				coordinator.WithStorageTimeout(200*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()

			key := newKey("stalled-subscription")
			var k runs
			release := make(chan struct{})
			held := holdKey(t, holder, key, release)
			var wg sync.WaitGroup
			results := make(chan error, waiters)
			for range waiters {
				wg.Add(1)
				go func() {
					defer wg.Done()
					got, err := coordinator.Do(ctx, c, callOf(key), k.action("waiter"))
					if err == nil && got.ID != "holder" {
						err = fmt.Errorf("got %+v, want the holder's result", got)
					}
					results <- err
				}()
			}
			for i := range waiters {
				select {
				case <-collided:
				case <-time.After(30 * time.Second):
					t.Fatalf("%d of %d waiters met the holder in 30s (%d error events)", i, waiters, errorsSeen.Load())
				}
			}
			close(release)
			<-held
			wg.Wait()
			close(results)
			for err := range results {
				if err != nil {
					t.Errorf("waiter: %v", err)
				}
			}
			if n := k.n.Load(); n != 0 {
				t.Errorf("the waiters ran the action %d times, want 0", n)
			}
			if n := errorsSeen.Load(); n != 0 {
				t.Errorf("%d error events, want 0", n)
			}
		})
	}
}
