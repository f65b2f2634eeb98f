package redisrepo_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/faultproxy"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// The safety edges of docs/architecture.md ("The lease and its renewal") on a real Redis, with the network between one
// instance and Redis broken by a fault proxy. These tests run on the real
// clock (Redis's expiry is real); their margins are a tenth of a lease.

// proxied returns a client of the shared test server that goes through a
// fault proxy, the proxy, and a direct client.
func proxied(t *testing.T) (*redis.Client, *faultproxy.Proxy, *redis.Client) {
	t.Helper()
	direct := redistest.Server(t)
	opts := redistest.ServerOptions(t)
	p, err := faultproxy.Start(opts.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	opts.Addr = p.Addr()
	opts.ContextTimeoutEnabled = true // the storage timeout bounds each call on the socket
	opts.DialerRetries = 1
	opts.DialTimeout = 100 * time.Millisecond
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return c, p, direct
}

// An instance cut off from Redis (every byte dropped, as in a partition)
// has its action cancelled with ErrLeaseLost by the watchdog before another
// instance can take its key over.
func TestCutOffHolderStopsBeforeAnotherInstanceTakesOver(t *testing.T) {
	const lease = 2 * time.Second
	cut, p, direct := proxied(t)
	a, aEv := coord(t, redisrepo.New(cut), coordinator.WithLease(lease),
		coordinator.WithRenewInterval(lease/5), coordinator.WithStorageTimeout(lease/10))
	b, _ := coord(t, redisrepo.New(direct), coordinator.WithInFlight(coordinator.InFlightRaise))
	key := newKey("cut-off")

	var aStopped atomic.Int64 // unix nanoseconds when a's action saw its context end
	var aCause error
	reserved := make(chan struct{})
	aDone := make(chan error, 1)
	go func() {
		_, err := coordinator.Do(context.Background(), a, callOf(key), func(ctx context.Context) (charge, error) {
			close(reserved)
			<-ctx.Done()
			aStopped.Store(time.Now().UnixNano())
			aCause = context.Cause(ctx)
			return charge{}, aCause
		})
		aDone <- err
	}()
	<-reserved
	<-time.After(lease / 4) // a renewal or so goes through
	p.Cut(true)             // a is cut off from Redis

	// b tries the key until it gets it: only once a's lease expired in Redis.
	var bStarted int64
	deadline := time.Now().Add(3 * lease)
	for bStarted == 0 && time.Now().Before(deadline) {
		_, err := coordinator.Do(t.Context(), b, callOf(key), func(context.Context) (charge, error) {
			bStarted = time.Now().UnixNano()
			return charge{ID: "b"}, nil
		})
		if err != nil && !errors.Is(err, coordinator.ErrInProgress) {
			t.Fatalf("b: %v", err)
		}
		<-time.After(10 * time.Millisecond)
	}
	if err := <-aDone; !errors.Is(err, coordinator.ErrLeaseLost) || !errors.Is(aCause, coordinator.ErrLeaseLost) {
		t.Fatalf("a's Do = %v with cause %v, want ErrLeaseLost", err, aCause)
	}
	if bStarted == 0 {
		t.Fatal("b never got the key")
	}
	if stopped := aStopped.Load(); stopped >= bStarted {
		t.Fatalf("a was cancelled %v after b started: two holders ran at once", time.Duration(stopped-bStarted))
	} else {
		t.Logf("a was cancelled %v before b could take the key", time.Duration(bStarted-stopped))
	}
	if aEv.count(idemevent.Error, idemevent.ErrorLeaseLost) != 1 {
		t.Fatalf("a's lease_lost = %d, want 1", aEv.count(idemevent.Error, idemevent.ErrorLeaseLost))
	}
	p.Cut(false)
	_ = a.Close()
}

// A completion that times out and is delivered late, after what the
// coordinator sent later on other connections (held bytes delivered newest
// first): the result is stored, and the client's retry replays it. Before the
// fix the coordinator released the key after the timeout, the release
// overtook the late completion, and the retry ran the action again.
func TestLateCompletionDeliveredNewestFirstIsNotLost(t *testing.T) {
	const trials = 20
	reruns := 0
	for i := range trials {
		held, p, direct := proxied(t)
		a, _ := coord(t, redisrepo.New(held), coordinator.WithLease(2*time.Second),
			coordinator.WithRenewInterval(time.Second), coordinator.WithStorageTimeout(100*time.Millisecond))
		key := newKey("late")
		var k runs
		first, err := coordinator.Do(t.Context(), a, callOf(key), func(ctx context.Context) (charge, error) {
			p.Hold() // the completion leaves, and arrives late
			return k.action("first")(ctx)
		})
		if err != nil || first.ID != "first" {
			t.Fatalf("trial %d: Do = %+v, %v", i, first, err)
		}
		<-time.After(300 * time.Millisecond) // the completion timed out; retries are held too
		p.Release(faultproxy.NewestFirst)
		_ = a.Close() // the background save has ended

		// The client retries, through another instance.
		b, _ := coord(t, redisrepo.New(direct), coordinator.WithWaitTimeout(5*time.Second))
		again, err := coordinator.Do(t.Context(), b, callOf(key), k.action("retry"))
		if err != nil {
			t.Fatalf("trial %d: retry: %v", i, err)
		}
		if again.ID != "first" {
			reruns++
		}
	}
	if reruns != 0 {
		t.Fatalf("%d of %d trials ran the action again after a late completion", reruns, trials)
	}
}

// A Redis that stalls for 3 seconds right after the action ran (DEBUG
// SLEEP): in mode raise, the save waits for Redis to come back within the
// lease, and no retry runs the action again.
func TestStallAfterTheActionDoesNotRunItAgain(t *testing.T) {
	in := redistest.Start(t)
	if in.Kind() != redistest.KindRedisServer {
		t.Skip("DEBUG SLEEP needs redis-server")
	}
	client := in.Client(t)
	staller := in.Client(t)
	c, _ := coord(t, redisrepo.New(client), coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise),
		coordinator.WithLease(10*time.Second), coordinator.WithRenewInterval(time.Second),
		coordinator.WithStorageTimeout(500*time.Millisecond), coordinator.WithWaitTimeout(10*time.Second))
	key := newKey("stall")
	var k runs
	stalled := make(chan error, 1)
	first, err := coordinator.Do(t.Context(), c, callOf(key), func(ctx context.Context) (charge, error) {
		go func() { stalled <- staller.Do(context.Background(), "DEBUG", "SLEEP", "3").Err() }()
		<-time.After(50 * time.Millisecond) // the stall has begun
		return k.action("first")(ctx)
	})
	if err != nil || first.ID != "first" {
		t.Fatalf("Do = %+v, %v; want the result: the effect has happened", first, err)
	}
	// The client retries until it gets an answer other than 503 or 409.
	deadline := time.Now().Add(15 * time.Second)
	var again charge
	for time.Now().Before(deadline) {
		again, err = coordinator.Do(t.Context(), c, callOf(key), k.action("retry"))
		if err == nil {
			break
		}
		if !errors.Is(err, coordinator.ErrStorage) && !errors.Is(err, coordinator.ErrInProgress) {
			t.Fatalf("retry: %v", err)
		}
		<-time.After(100 * time.Millisecond)
	}
	if err := <-stalled; err != nil {
		t.Fatalf("DEBUG SLEEP: %v", err)
	}
	if err != nil || again.ID != "first" || k.n.Load() != 1 {
		t.Fatalf("retry = %+v, %v after %d runs; want the stored first result after 1 run", again, err, k.n.Load())
	}
	_ = c.Close()
}
