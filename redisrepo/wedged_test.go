package redisrepo_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// fakeClock is the clock of a Store's sightings (when it checks a pending
// record it keeps meeting); it moves only when the test says so.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock(s *redisrepo.Store) *fakeClock {
	c := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	redisrepo.SetSightingsClock(s, c.now)
	return c
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// TestWedgedPendingIsTakenOver: a pending record that nothing expires (an
// operator's PERSIST, a restore) is abandoned, in either record format. A
// waiter's read takes it apart at once (watch.lua), and the format 1
// writer's reservation (one script) too; a refused caller (mode raise) of
// the format 2 writer, whose collision is one SET NX GET, takes it over on
// a meeting one lease after the first, when the Store checks the record it
// keeps meeting. The action runs once and replays after.
func TestWedgedPendingIsTakenOver(t *testing.T) {
	const lease = 2 * time.Second
	eachFormat(t, func(t *testing.T, client redis.UniversalClient, s *redisrepo.Store) {
		format1 := s.Format() == redisrepo.Format1
		for _, mode := range []coordinator.InFlightMode{coordinator.InFlightWait, coordinator.InFlightRaise} {
			t.Run(string(mode), func(t *testing.T) {
				clock := newFakeClock(s)
				key := newKey("wedged")
				mustReserve(t, s, key, pendingWrite(token(), "", lease))
				if err := client.Persist(t.Context(), s.Key(key)).Err(); err != nil {
					t.Fatal(err)
				}
				c, _ := coord(t, s, coordinator.WithInFlight(mode), coordinator.WithLease(lease), coordinator.WithWaitTimeout(time.Minute))
				var k runs
				start := time.Now()
				got, err := coordinator.Do(t.Context(), c, callOf(key), k.action("taker"))
				if mode == coordinator.InFlightRaise && !format1 {
					if !errors.Is(err, coordinator.ErrInProgress) || k.n.Load() != 0 {
						t.Fatalf("first meeting of a wedged record in mode raise: %+v, %v after %d runs; want ErrInProgress (no second round trip)", got, err, k.n.Load())
					}
					clock.advance(lease)
					got, err = coordinator.Do(t.Context(), c, callOf(key), k.action("taker"))
				}
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
	})
}

// TestWedgedPendingHealsInModeRun: in in-flight mode run, a pending record
// that nothing expires is met by the write of each call's result; the
// second call's write checks it and stores its result over it, whatever the
// result's TTL, so the key is protected again within one lease (no clock
// moves here), and the calls after replay.
func TestWedgedPendingHealsInModeRun(t *testing.T) {
	const lease = 2 * time.Second
	eachFormat(t, func(t *testing.T, client redis.UniversalClient, s *redisrepo.Store) {
		newFakeClock(s) // never advanced
		key := newKey("wedged-run")
		mustReserve(t, s, key, pendingWrite(token(), "", lease))
		if err := client.Persist(t.Context(), s.Key(key)).Err(); err != nil {
			t.Fatal(err)
		}
		c, _ := coord(t, s, coordinator.WithInFlight(coordinator.InFlightRun), coordinator.WithLease(lease), coordinator.WithDefaultTTL(24*time.Hour))
		var k runs
		var stored string
		for i := range 2 {
			got, err := coordinator.Do(t.Context(), c, callOf(key), k.action(fmt.Sprint("run", i)))
			if err != nil {
				t.Fatalf("call %d over a wedged pending record in mode run: %v", i, err)
			}
			stored = got.ID
			rec, err := s.Get(t.Context(), key)
			if err != nil {
				t.Fatal(err)
			}
			if rec.State == idemstore.StateCompleted {
				break
			}
			if i == 1 {
				t.Fatalf("after 2 calls in mode run the record is %v, want the second call's result stored over the wedged one", rec.State)
			}
		}
		runs := k.n.Load()
		for i := range 3 {
			again, err := coordinator.Do(t.Context(), c, callOf(key), k.action("again"))
			if err != nil || again.ID != stored || k.n.Load() != runs {
				t.Fatalf("call %d after the heal: %+v, %v after %d runs; want %s replayed", i, again, err, k.n.Load(), stored)
			}
		}
		if pttl, err := client.PTTL(t.Context(), s.Key(key)).Result(); err != nil || pttl <= time.Hour {
			t.Errorf("the healed record's PTTL = %v, %v; want the result's TTL", pttl, err)
		}
	})
}

// TestLiveHolderIsNotJudgedByTheReadersLease: a pending record whose time
// to live is far longer than the reader's lease (its holder runs with a
// longer lease: a rolling deploy that raised it) is a live holder's, however
// often the reader meets it and checks it: no write of any kind takes it
// over, a waiter's read keeps it, and a caller with another fingerprint
// gets ErrKeyReuse.
func TestLiveHolderIsNotJudgedByTheReadersLease(t *testing.T) {
	eachFormat(t, func(t *testing.T, _ redis.UniversalClient, s *redisrepo.Store) {
		clock := newFakeClock(s)
		key := newKey("held")
		w := pendingWrite(token(), "fp", time.Hour)
		mustReserve(t, s, key, w)
		for i := range 3 {
			for _, second := range []idemstore.Write{
				pendingWrite(token(), "fp", 2*time.Second),
				pendingWrite(token(), "other", 50*time.Millisecond),
				completedWrite(token(), "fp", []byte("r"), time.Hour),
			} {
				rec, ok, err := s.Reserve(t.Context(), key, second)
				if err != nil || ok || rec.State != idemstore.StatePending || rec.Token != w.Token {
					t.Fatalf("meeting %d: Reserve of a %s write with TTL %v over a live pending record with TTL 1h: %+v, %v, %v; want the holder's record, not written",
						i, second.State, second.TTL, rec, ok, err)
				}
			}
			clock.advance(time.Minute) // every meeting after the first checks the record
		}
		rec, _, stop, err := s.Watch(t.Context(), key)
		stop()
		if err != nil || rec.State != idemstore.StatePending || rec.Token != w.Token {
			t.Fatalf("Watch of a live pending record: %+v, %v; want it pending", rec, err)
		}
		for _, mode := range []coordinator.InFlightMode{coordinator.InFlightWait, coordinator.InFlightRaise} {
			c, _ := coord(t, s, coordinator.WithInFlight(mode), coordinator.WithLease(2*time.Second), coordinator.WithWaitTimeout(200*time.Millisecond))
			var k runs
			_, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: key.Operation, Key: key.Key, Fingerprint: "another"}, k.action("reuse"))
			if !errors.Is(err, coordinator.ErrKeyReuse) || k.n.Load() != 0 {
				t.Errorf("mode %s, another fingerprint over a live pending record: %v after %d runs; want ErrKeyReuse", mode, err, k.n.Load())
			}
		}
	})
}

// TestMixedLeases is the fleet in the middle of a deploy that changes the
// lease: a holder with one lease and a second caller with another, on one
// key, in modes wait and raise, standalone and cluster. The action runs
// once whichever of the two is longer: a 2s-lease caller meets a 30s-lease
// holder (and checks it a lease later), and a 30s-lease caller meets a
// holder that renews its 600ms lease for 1.5s.
func TestMixedLeases(t *testing.T) {
	for _, b := range []struct {
		name   string
		client func(t *testing.T) redis.UniversalClient
	}{
		{"Redis", func(t *testing.T) redis.UniversalClient { return redistest.Server(t) }},
		{"Cluster", func(t *testing.T) redis.UniversalClient { return redistest.Cluster(t) }},
	} {
		t.Run(b.name, func(t *testing.T) {
			client := b.client(t)
			for _, leases := range []struct{ holder, caller time.Duration }{
				{30 * time.Second, 2 * time.Second},
				{600 * time.Millisecond, 30 * time.Second},
			} {
				for _, mode := range []coordinator.InFlightMode{coordinator.InFlightWait, coordinator.InFlightRaise} {
					t.Run(fmt.Sprintf("holder=%v/caller=%v/%s", leases.holder, leases.caller, mode), func(t *testing.T) {
						mixedLeases(t, client, leases.holder, leases.caller, mode)
					})
				}
			}
		})
	}
}

func mixedLeases(t *testing.T, client redis.UniversalClient, holderLease, callerLease time.Duration, mode coordinator.InFlightMode) {
	prefix := redistest.Prefix(t)
	// Two processes: two Stores (two sightings) and two coordinators.
	hs := redisrepo.New(client, redisrepo.WithKeyPrefix(prefix))
	cs := redisrepo.New(client, redisrepo.WithKeyPrefix(prefix))
	clock := newFakeClock(cs)
	holder, _ := coord(t, hs, coordinator.WithLease(holderLease), coordinator.WithStorageTimeout(100*time.Millisecond))
	caller, _ := coord(t, cs, coordinator.WithLease(callerLease), coordinator.WithStorageTimeout(100*time.Millisecond), coordinator.WithInFlight(mode), coordinator.WithWaitTimeout(time.Minute))
	key := newKey("mixed")
	var k runs
	started, release := make(chan struct{}), make(chan struct{})
	type answer struct {
		v   charge
		err error
	}
	held := make(chan answer, 1)
	go func() {
		v, err := coordinator.Do(t.Context(), holder, callOf(key), func(ctx context.Context) (charge, error) {
			close(started)
			<-release
			return k.action("holder")(ctx)
		})
		held <- answer{v, err}
	}()
	<-started
	// The holder keeps running past the shorter lease (its renewals keep a
	// short lease alive), and the caller meets it twice, a lease apart.
	time.Sleep(300 * time.Millisecond)
	for range 2 {
		if mode == coordinator.InFlightRaise {
			if _, err := coordinator.Do(t.Context(), caller, callOf(key), k.action("caller")); !errors.Is(err, coordinator.ErrInProgress) {
				t.Fatalf("caller in mode raise: %v, want ErrInProgress", err)
			}
		} else if rec, _, err := cs.Reserve(t.Context(), key, pendingWrite(token(), "", callerLease)); err != nil || rec.State != idemstore.StatePending {
			t.Fatalf("caller's Reserve: %+v, %v; want the holder's pending record", rec, err)
		}
		clock.advance(callerLease)
	}
	var waited chan answer
	if mode == coordinator.InFlightWait {
		waited = make(chan answer, 1)
		go func() {
			v, err := coordinator.Do(t.Context(), caller, callOf(key), k.action("caller"))
			waited <- answer{v, err}
		}()
	}
	time.Sleep(1200 * time.Millisecond) // 1.5s in all: two of the short lease's renewals
	close(release)
	h := <-held
	if h.err != nil || h.v.ID != "holder" {
		t.Fatalf("holder: %+v, %v", h.v, h.err)
	}
	if waited != nil {
		if w := <-waited; w.err != nil || w.v != h.v {
			t.Fatalf("waiter: %+v, %v; want the holder's %+v", w.v, w.err, h.v)
		}
	}
	if n := k.n.Load(); n != 1 {
		t.Fatalf("the action ran %d times, want once", n)
	}
}
