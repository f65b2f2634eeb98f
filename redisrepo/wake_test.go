package redisrepo_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// secondClient returns another client of the backend of c: in the tests, a
// second process.
func secondClient(t *testing.T, c redis.UniversalClient) redis.UniversalClient {
	t.Helper()
	var o redis.UniversalClient
	switch c := c.(type) {
	case *redis.Client:
		o = redis.NewClient(&redis.Options{Addr: c.Options().Addr, ContextTimeoutEnabled: true})
	case *redis.ClusterClient:
		o = redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Options().Addrs, ContextTimeoutEnabled: true})
	default:
		t.Fatalf("no second client for %T", c)
	}
	t.Cleanup(func() { _ = o.Close() })
	return o
}

// publishes returns the number of PUBLISH and SPUBLISH calls the server of c has served
// (the sum over a cluster's masters), or -1 when the server does not say
// (miniredis).
func publishes(t *testing.T, c redis.UniversalClient) int64 {
	t.Helper()
	ctx := context.Background()
	count := func(cl *redis.Client) int64 {
		info, err := cl.Info(ctx, "commandstats").Result()
		if err != nil {
			return -1
		}
		var total int64
		for line := range strings.SplitSeq(info, "\r\n") {
			for _, cmd := range []string{"cmdstat_publish:calls=", "cmdstat_spublish:calls="} {
				if rest, ok := strings.CutPrefix(line, cmd); ok {
					n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
					total += n
				}
			}
		}
		return total
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		var total atomic.Int64
		err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			total.Add(count(m))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return total.Load()
	}
	return count(c.(*redis.Client))
}

// TestWatch: a caller watching a key held by another process (another
// client) is told of the completion and of the release, and a completion
// nobody watches publishes nothing.
func TestWatch(t *testing.T) {
	eachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		prefix := redistest.Prefix(t)
		holder := redisrepo.New(c, redisrepo.WithKeyPrefix(prefix))
		waiter := redisrepo.New(secondClient(t, c), redisrepo.WithKeyPrefix(prefix))

		for _, end := range []string{"Complete", "Release"} {
			key := newKey("watch-" + end)
			tok := token()
			mustReserve(t, holder, key, pendingWrite(tok, "fp", time.Minute))
			rec, changed, stop, err := waiter.Watch(ctx, key)
			if err != nil || rec.State != idemstore.StatePending || rec.Token != tok || changed == nil {
				t.Fatalf("Watch = %+v, %v, %v; want the pending record and a channel", rec, changed, err)
			}
			// A second watcher of the key in the same process shares the
			// subscription.
			_, changed2, stop2, err := waiter.Watch(ctx, key)
			if err != nil || changed2 == nil {
				t.Fatalf("second Watch: %v", err)
			}
			var ok bool
			if end == "Complete" {
				ok, err = holder.Complete(ctx, key, tok, idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("r"), TTL: time.Minute})
			} else {
				ok, err = holder.Release(ctx, key, tok)
			}
			if !ok || err != nil {
				t.Fatalf("%s = %v, %v", end, ok, err)
			}
			for _, ch := range []<-chan struct{}{changed, changed2} {
				select {
				case <-ch:
				case <-time.After(10 * time.Second): // a bound on a hang, not a budget
					t.Fatalf("%s: no notice in 10s", end)
				}
			}
			stop()
			stop2()
			stop() // idempotent
		}

		// A completion that nobody watches sends nothing.
		key := newKey("unwatched")
		tok := token()
		mustReserve(t, holder, key, pendingWrite(tok, "", time.Minute))
		before := publishes(t, c)
		if ok, err := holder.Complete(ctx, key, tok, idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("r"), TTL: time.Minute}); !ok || err != nil {
			t.Fatalf("Complete = %v, %v", ok, err)
		}
		if n := publishes(t, c) - before; before >= 0 && n != 0 {
			t.Errorf("an unwatched completion sent %d PUBLISH, want 0", n)
		}

		// Watching a record that is not pending returns it, and no channel.
		rec, changed, stop, err := waiter.Watch(ctx, key)
		stop()
		if err != nil || rec.State != idemstore.StateCompleted || changed != nil {
			t.Errorf("Watch of a completed record = %+v, %v, %v; want it and no channel", rec, changed, err)
		}
	})
}

// TestWaiterWokenAcrossProcesses: a coordinator waiting on a key that
// another coordinator (another client: another process) holds returns the
// holder's result when it completes, although its poll interval is an hour:
// only the notice can have woken it.
func TestWaiterWokenAcrossProcesses(t *testing.T) {
	eachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		prefix := redistest.Prefix(t)
		holderStore := redisrepo.New(c, redisrepo.WithKeyPrefix(prefix))
		waiterStore := redisrepo.New(secondClient(t, c), redisrepo.WithKeyPrefix(prefix))
		holder, _ := coord(t, holderStore)
		waiter, _ := coord(t, waiterStore, coordinator.WithPollInterval(time.Hour), coordinator.WithWaitTimeout(time.Minute))
		key := newKey("woken")
		release := make(chan struct{})
		held := holdKey(t, holder, key, release)

		var k runs
		done := make(chan error, 1)
		var got charge
		go func() {
			var err error
			got, err = coordinator.Do(t.Context(), waiter, callOf(key), k.action("waiter"))
			done <- err
		}()
		// Wait until the waiter has marked the record: it is then watching.
		waitMarked(t, c, waiterStore.Key(key))
		close(release)
		<-held
		if err := <-done; err != nil || got.ID != "holder" || k.n.Load() != 0 {
			t.Errorf("waiter: %+v, %v, %d runs; want the holder's result, not its own", got, err, k.n.Load())
		}
	})
}

// waitMarked waits until the pending record under name has the waiters flag.
func waitMarked(t *testing.T, c redis.UniversalClient, name string) {
	t.Helper()
	for range 1000 {
		v, err := c.Get(context.Background(), name).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		if len(v) > 2 && v[2]&1 != 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the waiter never marked the record")
}
