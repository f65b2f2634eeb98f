package redisrepo_test

// The engine's behaviour on real Redis: the coordinator's own tests run on
// the in-memory store; these run the same rules (flow, in-flight modes, the
// storage-failure table, renewal, lease loss, heal) through a redisrepo.Store
// on a real server and a real cluster, and count the round trips.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// events is an Observer that counts events by kind and error type.
type events struct {
	mu sync.Mutex
	n  map[[2]string]int
}

func (e *events) Observe(_ context.Context, ev idemevent.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == nil {
		e.n = map[[2]string]int{}
	}
	e.n[[2]string{ev.Kind.String(), ""}]++
	if ev.ErrorType != "" {
		e.n[[2]string{ev.Kind.String(), string(ev.ErrorType)}]++
	}
}

// count returns the events of kind (and of error type t, when not "").
func (e *events) count(kind idemevent.Kind, t idemevent.ErrorType) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n[[2]string{kind.String(), string(t)}]
}

// redisEngine is a coordinator on a Store on one of the real Redis backends.
type redisEngine struct {
	client redis.UniversalClient
	store  *redisrepo.Store
	rt     *roundTrips
}

// eachRealRedis runs fn on a real standalone server and a real cluster,
// with a client of its own whose round trips are counted, and the scripts
// loaded.
func eachRealRedis(t *testing.T, fn func(t *testing.T, r redisEngine)) {
	t.Helper()
	setup := func(t *testing.T, c redis.UniversalClient, rt *roundTrips) {
		s := newStore(t, c)
		if err := s.LoadScripts(context.Background()); err != nil {
			t.Fatal(err)
		}
		fn(t, redisEngine{client: c, store: s, rt: rt})
	}
	t.Run("Redis", func(t *testing.T) {
		rt := &roundTrips{}
		c := redis.NewClient(redistest.ServerOptions(t))
		defer c.Close()
		c.AddHook(rt)
		setup(t, c, rt)
	})
	t.Run("Cluster", func(t *testing.T) {
		rt := &roundTrips{}
		c := redis.NewClusterClient(redistest.ClusterOptions(t))
		defer c.Close()
		c.OnNewNode(func(n *redis.Client) { n.AddHook(rt) })
		setup(t, c, rt)
	})
}

// coord returns a coordinator on store with an events observer.
func coord(t *testing.T, store idemstore.Store, opts ...coordinator.Option) (*coordinator.Coordinator, *events) {
	t.Helper()
	ev := &events{}
	c, err := coordinator.New(store, append([]coordinator.Option{coordinator.WithObserver(ev)}, opts...)...)
	if err != nil {
		t.Fatalf("coordinator.New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() }) // waits for background saves and releases
	return c, ev
}

type charge struct {
	ID string `json:"id"`
	N  int64  `json:"n"`
}

// runs is an action that counts its runs.
type runs struct{ n atomic.Int64 }

func (r *runs) action(id string) func(context.Context) (charge, error) {
	return func(context.Context) (charge, error) {
		return charge{ID: id, N: r.n.Add(1)}, nil
	}
}

func callOf(key idemstore.Key) coordinator.Call {
	return coordinator.Call{Operation: key.Operation, Key: key.Key}
}

// TestEngineRunsOnceAndReplays: a first execution costs two round trips
// (reserve, complete), a replay one, and the action runs once.
func TestEngineRunsOnceAndReplays(t *testing.T) {
	eachRealRedis(t, func(t *testing.T, r redisEngine) {
		c, ev := coord(t, r.store)
		key := newKey("once")
		var k runs
		var first, again charge
		var err error
		if n := r.rt.count(func() { first, err = coordinator.Do(t.Context(), c, callOf(key), k.action("a")) }); err != nil || n != 2 {
			t.Fatalf("first execution: %v, %d round trips; want 2", err, n)
		}
		if n := r.rt.count(func() { again, err = coordinator.Do(t.Context(), c, callOf(key), k.action("b")) }); err != nil || n != 1 {
			t.Fatalf("replay: %v, %d round trips; want 1", err, n)
		}
		if first != again || k.n.Load() != 1 {
			t.Fatalf("first %+v, replay %+v, %d runs; want one run, one result", first, again, k.n.Load())
		}
		res, err := c.Execute(t.Context(), callOf(key), func(context.Context) ([]byte, error) { return []byte(`{}`), nil })
		if err != nil || !res.Replayed {
			t.Fatalf("Execute = %+v, %v; want a replay", res, err)
		}
		if ev.count(idemevent.Hit, "") != 2 || ev.count(idemevent.Miss, "") != 1 {
			t.Errorf("hits %d, misses %d; want 2, 1", ev.count(idemevent.Hit, ""), ev.count(idemevent.Miss, ""))
		}
	})
}

func TestEngineKeyReuse(t *testing.T) {
	eachRealRedis(t, func(t *testing.T, r redisEngine) {
		c, _ := coord(t, r.store)
		key := newKey("reuse")
		call := callOf(key)
		call.Fingerprint = "fp-a"
		var k runs
		if _, err := coordinator.Do(t.Context(), c, call, k.action("a")); err != nil {
			t.Fatal(err)
		}
		call.Fingerprint = "fp-b"
		_, err := coordinator.Do(t.Context(), c, call, k.action("b"))
		var kr *coordinator.KeyReuseError
		if !errors.As(err, &kr) || kr.Stored != "fp-a" || kr.Got != "fp-b" || k.n.Load() != 1 {
			t.Fatalf("reuse: %v after %d runs; want a KeyReuseError and no second run", err, k.n.Load())
		}
	})
}

// holdKey starts a call that reserves key and blocks in its action until
// release is closed; it returns once the action runs, and the channel that
// yields the call's result.
func holdKey(t *testing.T, c *coordinator.Coordinator, key idemstore.Key, release <-chan struct{}) <-chan charge {
	t.Helper()
	inside := make(chan struct{})
	out := make(chan charge, 1)
	go func() {
		v, err := coordinator.Do(context.Background(), c, callOf(key), func(context.Context) (charge, error) {
			close(inside)
			<-release
			return charge{ID: "holder"}, nil
		})
		if err != nil {
			t.Errorf("holder: %v", err)
		}
		out <- v
	}()
	<-inside
	return out
}

func TestEngineInFlightModes(t *testing.T) {
	eachRealRedis(t, func(t *testing.T, r redisEngine) {
		t.Run("raise", func(t *testing.T) {
			holder, _ := coord(t, r.store)
			c, _ := coord(t, r.store, coordinator.WithInFlight(coordinator.InFlightRaise))
			key := newKey("raise")
			release := make(chan struct{})
			held := holdKey(t, holder, key, release)
			var k runs
			var err error
			// SET NX GET meets the pending record: that is the refusal.
			if n := r.rt.count(func() { _, err = coordinator.Do(t.Context(), c, callOf(key), k.action("x")) }); !errors.Is(err, coordinator.ErrInProgress) || n != 1 {
				t.Errorf("raise: %v in %d round trips; want ErrInProgress in 1", err, n)
			}
			var ip *coordinator.InProgressError
			if errors.As(err, &ip) && ip.RetryAfter <= 0 {
				t.Errorf("InProgressError.RetryAfter = %v, want the lease's remaining time", ip.RetryAfter)
			}
			close(release)
			<-held
			if k.n.Load() != 0 {
				t.Errorf("the refused call ran its action")
			}
		})
		t.Run("wait", func(t *testing.T) {
			holder, _ := coord(t, r.store)
			c, _ := coord(t, r.store, coordinator.WithPollInterval(2*time.Millisecond))
			key := newKey("wait")
			release := make(chan struct{})
			held := holdKey(t, holder, key, release)
			time.AfterFunc(50*time.Millisecond, func() { close(release) })
			var k runs
			v, err := coordinator.Do(t.Context(), c, callOf(key), k.action("x"))
			if err != nil || v.ID != "holder" || k.n.Load() != 0 {
				t.Errorf("wait: %+v, %v, %d runs; want the holder's result", v, err, k.n.Load())
			}
			<-held
		})
		t.Run("run", func(t *testing.T) {
			holder, _ := coord(t, r.store)
			c, _ := coord(t, r.store, coordinator.WithInFlight(coordinator.InFlightRun))
			key := newKey("run")
			release := make(chan struct{})
			held := holdKey(t, holder, key, release)
			var k runs
			v, err := coordinator.Do(t.Context(), c, callOf(key), k.action("own"))
			if err != nil || v.ID != "own" || k.n.Load() != 1 {
				t.Errorf("run: %+v, %v, %d runs; want its own run", v, err, k.n.Load())
			}
			close(release)
			<-held
			if rec := mustGet(t, r.store, key); rec.State != idemstore.StateCompleted || string(rec.Result) != `{"id":"holder","n":0}` {
				t.Errorf("record = %+v, want the holder's result (run mode never overwrites a reservation)", rec)
			}
		})
	})
}

// TestEngineStorageDown is the original pull request's scenario on a real
// go-redis client pointed at 127.0.0.1:1 with retries off: the same key
// twice runs the action twice in mode "run", never in mode "raise", and
// each call returns within milliseconds.
func TestEngineStorageDown(t *testing.T) {
	for _, mode := range []coordinator.OnStorageErrorMode{coordinator.OnStorageErrorRun, coordinator.OnStorageErrorRaise} {
		t.Run(string(mode), func(t *testing.T) {
			client := redis.NewClient(noRetries(&redis.Options{Addr: "127.0.0.1:1"}))
			defer client.Close()
			c, ev := coord(t, redisrepo.New(client), coordinator.WithOnStorageError(mode))
			key := idemstore.Key{Operation: "payment.charge", Key: "twice"}
			var k runs
			for range 2 {
				start := time.Now()
				_, err := coordinator.Do(t.Context(), c, callOf(key), k.action("x"))
				if d := time.Since(start); d > 100*time.Millisecond {
					t.Errorf("the call took %v, want milliseconds", d)
				}
				if mode == coordinator.OnStorageErrorRun && err != nil {
					t.Errorf("run: %v", err)
				}
				if mode == coordinator.OnStorageErrorRaise {
					checkStorageError(t, "raise", err, idemevent.MethodReserve)
				}
			}
			want := map[coordinator.OnStorageErrorMode]int64{coordinator.OnStorageErrorRun: 2, coordinator.OnStorageErrorRaise: 0}[mode]
			if k.n.Load() != want {
				t.Errorf("the action ran %d times, want %d", k.n.Load(), want)
			}
			if got := ev.count(idemevent.Error, idemevent.ErrorStorageReserve); got != 2 {
				t.Errorf("storage_reserve_error = %d, want 2", got)
			}
		})
	}
}

// TestEngineStorageFailsAfterTheAction: saving, releasing and renewing fail
// (a Redis store wrapped in one that fails on demand); the caller gets the
// action's result or error all the same, in both modes.
func TestEngineStorageFailsAfterTheAction(t *testing.T) {
	boom := errors.New("connection reset")
	s := newStore(t, redistest.Server(t))
	for _, mode := range []coordinator.OnStorageErrorMode{coordinator.OnStorageErrorRun, coordinator.OnStorageErrorRaise} {
		t.Run(string(mode)+"/save", func(t *testing.T) {
			fs := faultstore.Wrap(s)
			fs.FailOnce(idemevent.MethodComplete, boom)
			c, ev := coord(t, fs, coordinator.WithOnStorageError(mode))
			var k runs
			v, err := coordinator.Do(t.Context(), c, callOf(newKey("save")), k.action("x"))
			if err != nil || v.ID != "x" || ev.count(idemevent.Error, idemevent.ErrorStorageSave) != 1 {
				t.Errorf("Do = %+v, %v; want the result, and storage_save_error counted", v, err)
			}
		})
		t.Run(string(mode)+"/release", func(t *testing.T) {
			fs := faultstore.Wrap(s)
			fs.FailOnce(idemevent.MethodRelease, boom)
			c, ev := coord(t, fs, coordinator.WithOnStorageError(mode))
			own := errors.New("declined")
			_, err := coordinator.Do(t.Context(), c, callOf(newKey("release")), func(context.Context) (charge, error) { return charge{}, own })
			if err != own || ev.count(idemevent.Error, idemevent.ErrorStorageRelease) != 1 {
				t.Errorf("Do = %v; want the action's error, and storage_release_error counted", err)
			}
		})
		t.Run(string(mode)+"/renew", func(t *testing.T) {
			fs := faultstore.Wrap(s)
			fs.FailTimes(idemevent.MethodRenew, 2, boom)
			c, ev := coord(t, fs, coordinator.WithOnStorageError(mode),
				coordinator.WithLease(300*time.Millisecond), coordinator.WithRenewInterval(20*time.Millisecond), coordinator.WithStorageTimeout(200*time.Millisecond))
			v, err := coordinator.Do(t.Context(), c, callOf(newKey("renew")), func(ctx context.Context) (charge, error) {
				time.Sleep(150 * time.Millisecond)
				return charge{ID: "done"}, context.Cause(ctx)
			})
			if err != nil || v.ID != "done" || ev.count(idemevent.Error, idemevent.ErrorStorageRenew) != 2 {
				t.Errorf("Do = %+v, %v, storage_renew_error %d; want the result after two failed renewals",
					v, err, ev.count(idemevent.Error, idemevent.ErrorStorageRenew))
			}
		})
	}
}

// TestEngineRenewalKeepsALongActionExclusive: an action three leases long
// keeps its key, renewed on Redis, and a second process is refused all along.
func TestEngineRenewalKeepsALongActionExclusive(t *testing.T) {
	eachRealRedis(t, func(t *testing.T, r redisEngine) {
		const lease = 200 * time.Millisecond
		a, ev := coord(t, r.store, coordinator.WithLease(lease), coordinator.WithRenewInterval(lease/4), coordinator.WithStorageTimeout(lease/2))
		b, _ := coord(t, r.store, coordinator.WithInFlight(coordinator.InFlightRaise))
		key := newKey("long")
		var k runs
		done := make(chan error, 1)
		holding := make(chan struct{})
		go func() {
			_, err := coordinator.Do(context.Background(), a, callOf(key), func(ctx context.Context) (charge, error) {
				close(holding)
				time.Sleep(3 * lease)
				if err := context.Cause(ctx); err != nil && ctx.Err() != nil {
					return charge{}, err
				}
				return k.action("long")(ctx)
			})
			done <- err
		}()
		// b comes second: a caller whose lease (30s) is longer than a's
		// would be a wedged record to a (see abandon.lua).
		<-holding
		deadline := time.Now().Add(3 * lease)
		for time.Now().Before(deadline) {
			if _, err := coordinator.Do(t.Context(), b, callOf(key), k.action("intruder")); !errors.Is(err, coordinator.ErrInProgress) {
				if err == nil && k.n.Load() > 0 {
					break // a finished
				}
				t.Fatalf("a second caller during a renewed lease: %v, want ErrInProgress", err)
			}
			time.Sleep(lease / 4)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if k.n.Load() != 1 || ev.count(idemevent.Error, "") != 0 {
			t.Errorf("%d runs, %d errors; want one run, no error", k.n.Load(), ev.count(idemevent.Error, ""))
		}
	})
}

// TestEngineLeaseLost: an operator forgets the key while the action runs and
// another caller reserves it; the renewal finds another owner, the action's
// context is cancelled with ErrLeaseLost, and the new owner's record stays.
func TestEngineLeaseLost(t *testing.T) {
	eachRealRedis(t, func(t *testing.T, r redisEngine) {
		c, ev := coord(t, r.store, coordinator.WithLease(300*time.Millisecond), coordinator.WithRenewInterval(20*time.Millisecond), coordinator.WithStorageTimeout(200*time.Millisecond))
		key := newKey("stolen")
		var cause error
		_, err := coordinator.Do(t.Context(), c, callOf(key), func(ctx context.Context) (charge, error) {
			if n, err := r.store.Forget(ctx, key); n != 1 || err != nil {
				t.Errorf("Forget = %d, %v", n, err)
			}
			mustReserve(t, r.store, key, pendingWrite("new-owner", "", time.Minute))
			select {
			case <-ctx.Done():
				cause = context.Cause(ctx)
			case <-time.After(2 * time.Second):
				t.Error("the action's context was not cancelled")
			}
			return charge{}, cause
		})
		if !errors.Is(cause, coordinator.ErrLeaseLost) || !errors.Is(err, coordinator.ErrLeaseLost) {
			t.Fatalf("cause %v, err %v; want ErrLeaseLost", cause, err)
		}
		if rec := mustGet(t, r.store, key); rec.State != idemstore.StatePending || rec.Token != "new-owner" {
			t.Errorf("the new owner's record = %+v", rec)
		}
		if ev.count(idemevent.Error, idemevent.ErrorLeaseLost) != 1 {
			t.Errorf("lease_lost not counted")
		}
	})
}

// TestEngineHeals plants every unreadable value: the action runs once, its
// result replaces the value, and later calls replay it; of concurrent
// healers only one runs.
func TestEngineHeals(t *testing.T) {
	eachRealRedis(t, func(t *testing.T, r redisEngine) {
		for _, storageMode := range []coordinator.OnStorageErrorMode{coordinator.OnStorageErrorRun, coordinator.OnStorageErrorRaise} {
			c, ev := coord(t, r.store, coordinator.WithOnStorageError(storageMode))
			for _, u := range unreadables {
				key := newKey("heal")
				plant(t, r.client, r.store.Key(key), u)
				var k runs
				v, err := coordinator.Do(t.Context(), c, callOf(key), k.action("fresh"))
				if err != nil || v.ID != "fresh" || k.n.Load() != 1 {
					t.Fatalf("%s/%s: Do = %+v, %v after %d runs", storageMode, u.name, v, err, k.n.Load())
				}
				if again, err := coordinator.Do(t.Context(), c, callOf(key), k.action("again")); err != nil || again != v || k.n.Load() != 1 {
					t.Fatalf("%s/%s: after the heal Do = %+v, %v after %d runs; want a replay", storageMode, u.name, again, err, k.n.Load())
				}
			}
			if got := ev.count(idemevent.Error, idemevent.ErrorDecode); got != len(unreadables) {
				t.Errorf("decode_error = %d, want %d", got, len(unreadables))
			}
		}

		c, _ := coord(t, r.store, coordinator.WithPollInterval(2*time.Millisecond))
		key := newKey("heal-concurrent")
		plant(t, r.client, r.store.Key(key), unreadables[0])
		var k runs
		slow := func(ctx context.Context) (charge, error) {
			time.Sleep(30 * time.Millisecond)
			return k.action("healed")(ctx)
		}
		results := make([]charge, 16)
		var wg sync.WaitGroup
		for i := range results {
			wg.Go(func() {
				v, err := coordinator.Do(context.Background(), c, callOf(key), slow)
				if err != nil {
					t.Error(err)
				}
				results[i] = v
			})
		}
		wg.Wait()
		if k.n.Load() != 1 {
			t.Fatalf("concurrent healers ran the action %d times, want 1", k.n.Load())
		}
		for _, v := range results {
			if v != results[0] {
				t.Fatalf("healers got %+v and %+v", v, results[0])
			}
		}
	})
}

// TestEngineRedisKilledMidCall kills redis-server between reserve and
// complete: no panic, the caller gets the action's result in both modes (the
// effect has happened), and after a restart the first call works.
func TestEngineRedisKilledMidCall(t *testing.T) {
	for _, mode := range []coordinator.OnStorageErrorMode{coordinator.OnStorageErrorRun, coordinator.OnStorageErrorRaise} {
		t.Run(string(mode), func(t *testing.T) {
			in := redistest.Start(t)
			client := redis.NewClient(noRetries(in.Options()))
			defer client.Close()
			// A short lease: miniredis, unlike redis-server, keeps the
			// reservation across the restart, and the next call waits it out.
			c, ev := coord(t, redisrepo.New(client), coordinator.WithOnStorageError(mode),
				coordinator.WithLease(300*time.Millisecond), coordinator.WithStorageTimeout(150*time.Millisecond), coordinator.WithWaitTimeout(5*time.Second))
			key := idemstore.Key{Operation: "payment.charge", Key: "killed"}
			var k runs
			v, err := coordinator.Do(t.Context(), c, callOf(key), func(ctx context.Context) (charge, error) {
				in.Stop(t)
				return k.action("x")(ctx)
			})
			if err != nil || v.ID != "x" {
				t.Fatalf("Do = %+v, %v; want the action's result", v, err)
			}
			if ev.count(idemevent.Error, idemevent.ErrorStorageSave) != 1 {
				t.Errorf("storage_save_error not counted")
			}
			in.Restart(t)
			v, err = coordinator.Do(t.Context(), c, callOf(key), k.action("y"))
			if err != nil {
				t.Fatalf("first call after the restart: %v", err)
			}
			if in.Kind() == redistest.KindRedisServer && (v.ID != "y" || k.n.Load() != 2) {
				t.Errorf("after the restart: %+v after %d runs; want a fresh run (the server lost the reservation)", v, k.n.Load())
			}
			if again, err := coordinator.Do(t.Context(), c, callOf(key), k.action("z")); err != nil || again != v {
				t.Errorf("then: %+v, %v; want a replay of %+v", again, err, v)
			}
		})
	}
}
