package benchmarks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
)

// The flows. In each, impl=idemkit is coordinator.Do[Payment] with the
// default settings over redisrepo.New(client), and impl=raw the fewest
// go-redis commands that do the same job correctly, with the same JSON
// encoding, key names, lease and TTL. Keys are made before the timed loop.
// idemkit's calls carry a fingerprint (computed once, outside the loop);
// the raw impl has none.

func name(callers int, pipe, impl string) string {
	return fmt.Sprintf("callers=%d/pipe=%s/impl=%s", callers, pipe, impl)
}

// sides returns a side per go-redis mode, with opts for the coordinators.
func sides(b *testing.B, opts ...coordinator.Option) map[string]*side {
	m := map[string]*side{}
	for _, pipe := range pipes {
		m[pipe] = newSide(b, pipe, opts...)
	}
	return m
}

// BenchmarkReplay is a call whose key is completed: idemkit replays the
// stored result (one Reserve that finds it), raw GETs it and decodes it.
func BenchmarkReplay(b *testing.B) {
	ctx := context.Background()
	adm := admin(b)
	flush(b, adm)
	sides := sides(b)
	vk := valkeyClient(b)
	fxco := fxCoordinator(b, nil)
	keys := newKeyGen()

	// The records, written once by each impl's own means.
	call := coordinator.Call{Operation: operation, Key: keys.key(0), Fingerprint: fingerprint()}
	if _, err := coordinator.Do(ctx, sides[pipeOff].coordinator(b), call, runAction); err != nil {
		b.Fatal(err)
	}
	rawKey := sides[pipeOff].rawKey(keys.key(1))
	data, err := json.Marshal(payment)
	if err != nil {
		b.Fatal(err)
	}
	if err := sides[pipeOff].cmd.Set(ctx, rawKey, data, ttl).Err(); err != nil {
		b.Fatal(err)
	}

	for _, callers := range callerCounts {
		for _, pipe := range pipes {
			s := sides[pipe]
			b.Run(name(callers, pipe, "idemkit"), func(b *testing.B) {
				co := s.coordinator(b)
				measure(b, adm, callers, func(int) error {
					p, err := coordinator.Do(ctx, co, call, neverRun)
					if err != nil {
						return err
					}
					return check(p)
				})
			})
			b.Run(name(callers, pipe, "raw"), func(b *testing.B) {
				measure(b, adm, callers, func(int) error { return checkEncoded(s.cmd.Get(ctx, rawKey).Bytes()) })
			})
		}
		b.Run(name(callers, pipeOff, implValkey), func(b *testing.B) {
			measure(b, adm, callers, func(int) error { return valkeyReplay(ctx, vk, rawKey) })
		})
		b.Run(name(callers, pipeOff, implFx), func(b *testing.B) {
			measure(b, adm, callers, func(int) error {
				p, err := coordinator.Do(ctx, fxco, call, neverRun)
				if err != nil {
					return err
				}
				return check(p)
			})
		})
	}
}

// rawCmds are the two commands of a raw first run, in one client or
// another.
type rawCmds interface {
	// take is SET key token NX PX lease; it reports whether it took key.
	take(ctx context.Context, key string) (bool, error)
	// store is SET key data PX ttl.
	store(ctx context.Context, key string, data []byte) error
}

// goRedisRaw is raw's first run through go-redis.
type goRedisRaw struct{ cmd redis.UniversalClient }

func (g goRedisRaw) take(ctx context.Context, key string) (bool, error) {
	return g.cmd.SetNX(ctx, key, rawToken, lease).Result()
}

func (g goRedisRaw) store(ctx context.Context, key string, data []byte) error {
	return g.cmd.Set(ctx, key, data, ttl).Err()
}

// rawFirstRun is a raw impl's first run of key: take it, run the action,
// and store its result over it.
func rawFirstRun(ctx context.Context, impl string, c rawCmds, key string) error {
	ok, err := c.take(ctx, key)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%s: %s is taken", impl, key)
	}
	p, err := runAction(ctx)
	if err != nil {
		return err
	}
	data, err := json.Marshal(p)
	if err != nil {
		return err
	}
	return c.store(ctx, key, data)
}

// checkEncoded decodes v, a raw impl's replay, unless err, and checks it.
func checkEncoded(v []byte, err error) error {
	if err != nil {
		return err
	}
	var p Payment
	if err := json.Unmarshal(v, &p); err != nil {
		return err
	}
	return check(p)
}

func check(p Payment) error {
	if p != payment {
		return fmt.Errorf("got %+v, want %+v", p, payment)
	}
	return nil
}

// BenchmarkFirstRun is a call with a new key, whose action returns at once:
// idemkit reserves, runs and completes (Reserve, Complete); raw takes the key
// with SET NX PX lease, runs, encodes, and stores the result over it with
// SET PX ttl. Every iteration has a key of its own; the server is flushed
// before each round.
func BenchmarkFirstRun(b *testing.B) {
	ctx := context.Background()
	adm := admin(b)
	sides := sides(b)
	vk := valkeyClient(b)
	fxco := fxCoordinator(b, nil)
	for _, callers := range callerCounts {
		for _, pipe := range pipes {
			s := sides[pipe]
			b.Run(name(callers, pipe, "idemkit"), func(b *testing.B) {
				co := s.coordinator(b)
				flush(b, adm)
				keys := newKeyGen().keys(b.N)
				fp := fingerprint()
				measure(b, adm, callers, func(i int) error {
					p, err := coordinator.Do(ctx, co, coordinator.Call{Operation: operation, Key: keys[i], Fingerprint: fp}, runAction)
					if err != nil {
						return err
					}
					return check(p)
				})
			})
			b.Run(name(callers, pipe, "raw"), func(b *testing.B) {
				flush(b, adm)
				g := newKeyGen()
				keys := make([]string, b.N)
				for i := range keys {
					keys[i] = s.rawKey(g.key(i))
				}
				var cmds rawCmds = goRedisRaw{s.cmd} // once: a conversion per call would allocate
				measure(b, adm, callers, func(i int) error { return rawFirstRun(ctx, "raw", cmds, keys[i]) })
			})
		}
		b.Run(name(callers, pipeOff, implValkey), func(b *testing.B) {
			flush(b, adm)
			g := newKeyGen()
			keys := make([]string, b.N)
			for i := range keys {
				keys[i] = sides[pipeOff].rawKey(g.key(i))
			}
			var cmds rawCmds = valkeyRaw{vk}
			measure(b, adm, callers, func(i int) error { return rawFirstRun(ctx, implValkey, cmds, keys[i]) })
		})
		b.Run(name(callers, pipeOff, implFx), func(b *testing.B) {
			flush(b, adm)
			keys := newKeyGen().keys(b.N)
			fp := fingerprint()
			measure(b, adm, callers, func(i int) error {
				p, err := coordinator.Do(ctx, fxco, coordinator.Call{Operation: operation, Key: keys[i], Fingerprint: fp}, runAction)
				if err != nil {
					return err
				}
				return check(p)
			})
		})
	}
}

// BenchmarkRefused is a call on a key that another caller holds (its action
// still runs), with in-flight mode raise: idemkit returns ErrInProgress
// after one Reserve; raw's SET NX PX fails.
func BenchmarkRefused(b *testing.B) {
	ctx := context.Background()
	adm := admin(b)
	flush(b, adm)
	sides := sides(b, coordinator.WithInFlight(coordinator.InFlightRaise))
	vk := valkeyClient(b)
	fxco := fxCoordinator(b, func(s *idempotency.Settings) { s.InFlight = coordinator.InFlightRaise })
	keys := newKeyGen()

	// The holder: another coordinator, on a client of its own, whose action
	// runs until the benchmark ends (renewing its lease meanwhile).
	holder := newSide(b, pipeOff)
	call := coordinator.Call{Operation: operation, Key: keys.key(0), Fingerprint: fingerprint()}
	hco := holder.coordinator(b)
	started, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := coordinator.Do(ctx, hco, call, func(context.Context) (Payment, error) {
			close(started)
			<-release
			return payment, nil
		})
		done <- err
	}()
	select {
	case <-started:
	case err := <-done:
		b.Fatalf("the holder's Do returned before its action ran: %v", err)
	}
	b.Cleanup(func() {
		close(release)
		<-done
	})
	// The raw holder's pending value. Its TTL is an hour so that it
	// outlives any -benchtime; a lease's TTL would cost SET NX the same.
	rawKey := sides[pipeOff].rawKey(keys.key(1))
	if err := sides[pipeOff].cmd.Set(ctx, rawKey, "holder-token", time.Hour).Err(); err != nil {
		b.Fatal(err)
	}

	for _, callers := range callerCounts {
		for _, pipe := range pipes {
			s := sides[pipe]
			b.Run(name(callers, pipe, "idemkit"), func(b *testing.B) {
				co := s.coordinator(b)
				measure(b, adm, callers, func(int) error {
					_, err := coordinator.Do(ctx, co, call, neverRun)
					if !errors.Is(err, coordinator.ErrInProgress) {
						return fmt.Errorf("got %v, want ErrInProgress", err)
					}
					return nil
				})
			})
			b.Run(name(callers, pipe, "raw"), func(b *testing.B) {
				measure(b, adm, callers, func(int) error { return rawRefused(ctx, s.cmd, rawKey) })
			})
		}
		b.Run(name(callers, pipeOff, implValkey), func(b *testing.B) {
			measure(b, adm, callers, func(int) error { return valkeyRefused(ctx, vk, rawKey) })
		})
		b.Run(name(callers, pipeOff, implFx), func(b *testing.B) {
			measure(b, adm, callers, func(int) error {
				_, err := coordinator.Do(ctx, fxco, call, neverRun)
				if !errors.Is(err, coordinator.ErrInProgress) {
					return fmt.Errorf("got %v, want ErrInProgress", err)
				}
				return nil
			})
		})
	}
}

// rawRefused is raw's refusal: a SET NX PX on key, which another caller
// holds, that fails.
func rawRefused(ctx context.Context, cmd redis.UniversalClient, key string) error {
	ok, err := cmd.SetNX(ctx, key, rawToken, lease).Result()
	if err != nil {
		return err
	}
	if ok {
		return fmt.Errorf("raw: took %s, which another caller holds", key)
	}
	return nil
}

// wakePairs is how many holder-waiter pairs BenchmarkWake runs at once, each
// on a key of its own, so that a second of it gathers enough samples for a
// p99. They share the two coordinators, as concurrent requests of two
// processes would.
const wakePairs = 16

// maxHold bounds how long the holder's action goes on after the waiter has
// started waiting.
const maxHold = 200 * time.Millisecond

// hold is how long the holder's action goes on after the waiter of iteration
// i has started waiting: spread evenly over [0, maxHold) (a golden-ratio
// sequence), so that a waiter that polls with a backoff is met at the same
// mix of phases in every run, as actions that end at any moment would meet
// it.
func hold(i int) time.Duration {
	_, frac := math.Modf(float64(i+1) * 0.6180339887498949)
	return time.Duration(frac * float64(maxHold))
}

// BenchmarkWake is a second request arriving while the first runs, in
// another process, in mode wait: A holds a key (its action blocks), B calls
// Do on the same key and waits; A's action is released a while later (hold)
// and the benchmark measures the time from A's Do returning (its result
// stored) to B's Do returning with it, reported as p50-wake-ms and
// p99-wake-ms over the b.N iterations. ns/op is the wall time of an
// iteration divided by the pairs running at once (mostly the hold), and
// redis-µs/op the server's work for the pair (all that B does to learn of
// the completion included).
//
// A and B stand for two processes: two coordinators on two stores on two
// go-redis clients, so that nothing in this process is shared between them
// and B can learn of A's completion only through Redis.
func BenchmarkWake(b *testing.B) {
	ctx := context.Background()
	adm := admin(b)
	flush(b, adm)
	a := newSide(b, pipeOff)

	var mu sync.Mutex
	waiting := map[string]chan struct{}{} // key → told when B sees A's reservation
	observer := idemevent.ObserverFunc(func(_ context.Context, e idemevent.Event) {
		if e.Kind != idemevent.InFlight {
			return
		}
		mu.Lock()
		ch := waiting[e.Key.Key]
		mu.Unlock()
		if ch != nil {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	})
	bs := newSide(b, pipeOff, coordinator.WithObserver(observer))
	coA, coB := a.coordinator(b), bs.coordinator(b)

	b.Run(fmt.Sprintf("pairs=%d/impl=idemkit", wakePairs), func(b *testing.B) {
		keys := newKeyGen().keys(b.N)
		fp := fingerprint()
		wakes := make([]time.Duration, b.N)
		measure(b, adm, wakePairs, func(i int) error {
			call := coordinator.Call{Operation: operation, Key: keys[i], Fingerprint: fp}
			inFlight := make(chan struct{}, 1)
			mu.Lock()
			waiting[call.Key] = inFlight
			mu.Unlock()
			defer func() {
				mu.Lock()
				delete(waiting, call.Key)
				mu.Unlock()
			}()

			type ret struct {
				p   Payment
				err error
				at  time.Time
			}
			started, release := make(chan struct{}), make(chan struct{})
			aRet, bRet := make(chan ret, 1), make(chan ret, 1)
			go func() {
				p, err := coordinator.Do(ctx, coA, call, func(context.Context) (Payment, error) {
					close(started)
					<-release
					return payment, nil
				})
				aRet <- ret{p, err, time.Now()}
			}()
			select {
			case <-started:
			case r := <-aRet:
				return fmt.Errorf("A: Do returned before its action ran: %v", r.err)
			}
			go func() {
				p, err := coordinator.Do(ctx, coB, call, neverRun)
				bRet <- ret{p, err, time.Now()}
			}()
			var rb *ret
			select {
			case <-inFlight:
			case r := <-bRet:
				rb = &r // B did not wait: reported below
			}
			time.Sleep(hold(i))
			close(release)
			ra := <-aRet
			if rb == nil {
				r := <-bRet
				rb = &r
			}
			if ra.err != nil {
				return fmt.Errorf("A: %w", ra.err)
			}
			if rb.err != nil {
				return fmt.Errorf("B: %w", rb.err)
			}
			if err := check(rb.p); err != nil {
				return fmt.Errorf("B: %w", err)
			}
			// B cannot have its result before A stored it, but may return
			// a hair before A's Do does.
			wakes[i] = max(rb.at.Sub(ra.at), 0)
			return nil
		})
		ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
		b.ReportMetric(ms(percentile(wakes, 0.50)), "p50-wake-ms")
		b.ReportMetric(ms(percentile(wakes, 0.99)), "p99-wake-ms")
	})
}

// memRecords is how many completed records BenchmarkMemory writes per impl.
const memRecords = 20000

// BenchmarkMemory reports the server's used_memory per completed record
// (B/record): memRecords records with the same 109-byte result and keys of
// the same shape, written by idemkit (Do) and by raw (SET key result PX ttl)
// on a flushed server, before the timed loop. The timed loop then writes one
// more record per iteration, one caller, so ns/op is the time to write a
// record that way. idemkit's records carry a SHA-256 fingerprint
// (fp=sha256, as an HTTP request's) or none (fp=none).
func BenchmarkMemory(b *testing.B) {
	adm := admin(b)
	s := newSide(b, pipeOff)
	co := s.coordinator(b)
	data, err := json.Marshal(payment)
	if err != nil {
		b.Fatal(err)
	}
	// With the fingerprint coordinator.Fingerprint makes (an HTTP request's),
	// and without one; raw stores the result alone either way.
	for _, fp := range []struct{ name, value string }{{"sha256", fingerprint()}, {"none", ""}} {
		memory(b, adm, s, co, data, fp.name, fp.value)
	}
}

// memory is BenchmarkMemory with the fingerprint fp.
func memory(b *testing.B, adm *redis.Client, s *side, co *coordinator.Coordinator, data []byte, fpName, fp string) {
	ctx := context.Background()
	impls := []struct {
		name  string
		write func(key string) error
	}{
		{"idemkit", func(key string) error {
			_, err := coordinator.Do(ctx, co, coordinator.Call{Operation: operation, Key: key, Fingerprint: fp}, runAction)
			return err
		}},
		{"raw", func(key string) error {
			return s.cmd.Set(ctx, s.rawKey(key), data, ttl).Err()
		}},
	}
	for _, impl := range impls {
		b.Run(fmt.Sprintf("records=%d/fp=%s/impl=%s", memRecords, fpName, impl.name), func(b *testing.B) {
			b.ReportAllocs()
			flush(b, adm)
			keys := newKeyGen()
			before := usedMemory(b, adm)
			var wg sync.WaitGroup
			errs := make(chan error, 16)
			for w := range 16 {
				wg.Go(func() {
					for i := w; i < memRecords; i += 16 {
						if err := impl.write(keys.key(i)); err != nil {
							errs <- err
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
			perRecord := float64(usedMemory(b, adm)-before) / memRecords

			i := memRecords
			for b.Loop() {
				if err := impl.write(keys.key(i)); err != nil {
					b.Fatal(err)
				}
				i++
			}
			// After the loop: its first iteration drops the metrics
			// reported before it.
			b.ReportMetric(perRecord, "B/record")
		})
	}
}
