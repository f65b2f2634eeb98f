package redisrepo_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// TestOneRoundTripPerMethod counts, with a go-redis hook, the round trips of
// each Store method once the scripts are loaded: exactly one each.
func TestOneRoundTripPerMethod(t *testing.T) {
	t.Run("Redis", func(t *testing.T) {
		var rt roundTrips
		c := redis.NewClient(redistest.ServerOptions(t))
		defer c.Close()
		c.AddHook(&rt)
		testOneRoundTrip(t, c, &rt)
	})
	t.Run("Cluster", func(t *testing.T) {
		var rt roundTrips
		c := redis.NewClusterClient(redistest.ClusterOptions(t))
		defer c.Close()
		c.OnNewNode(func(n *redis.Client) { n.AddHook(&rt) })
		testOneRoundTrip(t, c, &rt)
	})
}

func testOneRoundTrip(t *testing.T, c redisrepo.Client, rt *roundTrips) {
	ctx := context.Background()
	s := newStore(t, c)
	if err := s.LoadScripts(ctx); err != nil {
		t.Fatalf("LoadScripts: %v", err)
	}
	key := newKey("round-trips")
	tok := token()
	for _, step := range []struct {
		name string
		call func() error
	}{
		{"Get absent", func() error { _, err := s.Get(ctx, key); return err }},
		{"Reserve absent", func() error { _, _, err := s.Reserve(ctx, key, pendingWrite(tok, "", time.Minute)); return err }},
		{"Renew", func() error { _, err := s.Renew(ctx, key, tok, time.Minute); return err }},
		{"Complete", func() error {
			_, err := s.Complete(ctx, key, tok, idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("r"), TTL: time.Minute})
			return err
		}},
		{"Get completed", func() error { _, err := s.Get(ctx, key); return err }},
		{"Reserve completed", func() error { _, _, err := s.Reserve(ctx, key, pendingWrite(token(), "", time.Minute)); return err }},
		{"Release not owner", func() error { _, err := s.Release(ctx, key, tok); return err }},
		{"Inspect", func() error { _, err := s.Inspect(ctx, key); return err }},
		{"Forget", func() error { _, err := s.Forget(ctx, key); return err }},
	} {
		var err error
		if n := rt.count(func() { err = step.call() }); err != nil || n != 1 {
			t.Errorf("%s: %v, %d round trips; want 1", step.name, err, n)
		}
	}
	// A collision: SET NX GET meets a pending record, and that is all,
	// however often it meets it within a lease; a meeting a lease after
	// the first checks that the record is not wedged (abandon.lua), once a
	// lease.
	clock := newFakeClock(s)
	held := newKey("round-trips-held")
	mustReserve(t, s, held, pendingWrite(tok, "", time.Minute))
	for i, want := range []int64{1, 1, 2, 1} {
		if i == 2 {
			clock.advance(time.Minute)
		}
		var err error
		if n := rt.count(func() { _, _, err = s.Reserve(ctx, held, pendingWrite(token(), "", time.Minute)) }); err != nil || n != want {
			t.Errorf("Reserve pending, meeting %d: %v, %d round trips; want %d", i, err, n, want)
		}
	}
}

// TestEmptyScriptCache: a server that has lost its script cache (a restart,
// a replica promoted, SCRIPT FLUSH) costs a call at most one more round
// trip, once per script: a replay and a first run's reservation never use a
// script and take one round trip right after a flush; a completion, a
// renewal, a release, a waiter's read and a collision's check for a wedged
// record send EVALSHA, meet NOSCRIPT and send the script whole with EVAL,
// which caches it again, so the same call right after takes one round trip
// again. The scripts of the rare paths (format 1 records, heals, the operator
// calls) do the same.
func TestEmptyScriptCache(t *testing.T) {
	ctx := context.Background()
	in := redistest.Start(t) // a server of our own: we flush its script cache
	var rt roundTrips
	c := in.Client(t)
	c.AddHook(&rt)
	s := redisrepo.New(c)
	clock := newFakeClock(s)
	flush := func() {
		t.Helper()
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	key := idemstore.Key{Operation: "op", Key: "noscript"}
	tok := token()
	const once = -1 // a step that cannot be repeated as it is
	for _, step := range []struct {
		name     string
		n, thenN int64 // round trips right after a flush, and of the same call right after that
		call     func() error
	}{
		{"first run: Reserve", 1, once, func() error { _, _, err := s.Reserve(ctx, key, pendingWrite(tok, "fp", time.Minute)); return err }},
		{"refused duplicate: Reserve", 1, 1, func() error { _, _, err := s.Reserve(ctx, key, pendingWrite(token(), "fp", time.Minute)); return err }},
		{"refused duplicate a lease later: Reserve and abandon.lua", 3, 2, func() error {
			clock.advance(time.Minute)
			_, _, err := s.Reserve(ctx, key, pendingWrite(token(), "fp", time.Minute))
			return err
		}},
		{"Renew", 2, 1, func() error { _, err := s.Renew(ctx, key, tok, time.Minute); return err }},
		{"first run: Complete", 2, 1, func() error {
			_, err := s.Complete(ctx, key, tok, idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("r"), TTL: time.Minute})
			return err
		}},
		{"replay: Reserve", 1, 1, func() error { _, _, err := s.Reserve(ctx, key, pendingWrite(token(), "fp", time.Minute)); return err }},
		{"Get", 1, 1, func() error { _, err := s.Get(ctx, key); return err }},
		{"Watch", 2, 1, func() error { _, _, stop, err := s.Watch(ctx, key); stop(); return err }},
		{"Release", 2, 1, func() error { _, err := s.Release(ctx, key, tok); return err }},
		{"heal: Reserve with Replace", 2, 1, func() error {
			_, _, err := s.Reserve(ctx, key, replace(pendingWrite(token(), "fp", time.Minute), tok))
			return err
		}},
	} {
		flush()
		var err error
		if n := rt.count(func() { err = step.call() }); err != nil || n != step.n {
			t.Errorf("%s right after SCRIPT FLUSH: %v, %d round trips; want %d", step.name, err, n, step.n)
		}
		if step.thenN == once {
			continue
		}
		if n := rt.count(func() { err = step.call() }); err != nil || n != step.thenN {
			t.Errorf("%s again: %v, %d round trips; want %d", step.name, err, n, step.thenN)
		}
	}
	// Bulk calls fall back too.
	flush()
	keys := []idemstore.Key{key, {Operation: "op", Key: "other"}}
	if _, err := s.Inspect(ctx, keys...); err != nil {
		t.Errorf("Inspect without the script cached: %v", err)
	}
}

// TestNoScriptFallbackCluster: bulk calls on a cluster whose masters lost
// their script cache fall back to EVAL in a second pipeline, and the hot
// scripts to EVAL on the key's master.
func TestNoScriptFallbackCluster(t *testing.T) {
	ctx := context.Background()
	c := redistest.Cluster(t)
	if redistest.ClusterKind(t) != redistest.KindRedisServer {
		t.Skip("flushes the script cache: only on a cluster the tests started")
	}
	s := newStore(t, c)
	var keys []idemstore.Key
	for i := range 50 {
		k := newKey("noscript-" + strings.Repeat("x", i))
		keys = append(keys, k)
		mustReserve(t, s, k, pendingWrite(token(), "", time.Minute))
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	infos, err := s.Inspect(ctx, keys...)
	if err != nil {
		t.Fatalf("Inspect without the script cached: %v", err)
	}
	for _, in := range infos {
		if in.State != idemstore.StatePending {
			t.Fatalf("Inspect: %+v, want pending", in)
		}
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Forget(ctx, keys...); err != nil || n != len(keys) {
		t.Fatalf("Forget without the script cached = %d, %v", n, err)
	}
	// The hot scripts, on each key's own master.
	for _, k := range keys[:10] {
		tok := token()
		mustReserve(t, s, k, pendingWrite(tok, "", time.Minute))
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.Renew(ctx, k, tok, time.Minute); !ok || err != nil {
			t.Fatalf("Renew without the script cached = %v, %v", ok, err)
		}
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.Complete(ctx, k, tok, idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("r"), TTL: time.Minute}); !ok || err != nil {
			t.Fatalf("Complete without the script cached = %v, %v", ok, err)
		}
	}
}

// TestEmptyScriptCacheAutoPipeline: the NOSCRIPT fallback works inside an
// AutoPipeliner's batches too.
func TestEmptyScriptCacheAutoPipeline(t *testing.T) {
	ctx := context.Background()
	in := redistest.Start(t) // a server of our own: we flush its script cache
	c := in.Client(t)
	ap, err := c.AutoPipeline()
	if err != nil {
		t.Fatal(err)
	}
	s := redisrepo.New(ap)
	flush := func() {
		t.Helper()
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 20 {
		key := idemstore.Key{Operation: "op", Key: "ap-" + strings.Repeat("x", i)}
		tok := token()
		mustReserve(t, s, key, pendingWrite(tok, "fp", time.Minute))
		flush()
		if ok, err := s.Renew(ctx, key, tok, time.Minute); !ok || err != nil {
			t.Fatalf("Renew after SCRIPT FLUSH = %v, %v", ok, err)
		}
		flush()
		if ok, err := s.Complete(ctx, key, tok, idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("r"), TTL: time.Minute}); !ok || err != nil {
			t.Fatalf("Complete after SCRIPT FLUSH = %v, %v", ok, err)
		}
		flush()
		rec, err := s.Get(ctx, key)
		if err != nil || rec.State != idemstore.StateCompleted || string(rec.Result) != "r" || rec.Fingerprint != "fp" {
			t.Fatalf("Get = %+v, %v; want the completed record", rec, err)
		}
	}
}
