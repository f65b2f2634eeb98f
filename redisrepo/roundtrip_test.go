package redisrepo_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
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
			_, err := s.Complete(ctx, key, tok, coordinator.Completion{State: coordinator.StateCompleted, Result: []byte("r"), TTL: time.Minute})
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
	// A collision: SET NX GET meets a pending record, and abandon.lua
	// checks that it is not wedged.
	held := newKey("round-trips-held")
	mustReserve(t, s, held, pendingWrite(tok, "", time.Minute))
	var err error
	if n := rt.count(func() { _, _, err = s.Reserve(ctx, held, pendingWrite(token(), "", time.Minute)) }); err != nil || n != 2 {
		t.Errorf("Reserve pending: %v, %d round trips; want 2", err, n)
	}
}

// TestEmptyScriptCache: the common paths never depend on the script cache,
// so a server that has lost it (a restart, a replica promoted, SCRIPT FLUSH)
// costs them nothing: a replay is one round trip, a first run two, a refused
// duplicate two (SET NX GET, then abandon.lua's check for a wedged record),
// right after a flush. The scripts of the rare paths (format
// 1 records, heals, the operator calls) cost one more round trip, EVALSHA
// refused then EVAL, once per script.
func TestEmptyScriptCache(t *testing.T) {
	ctx := context.Background()
	in := redistest.Start(t) // a server of our own: we flush its script cache
	var rt roundTrips
	c := in.Client(t)
	c.AddHook(&rt)
	s := redisrepo.New(c)
	flush := func() {
		t.Helper()
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	key := coordinator.Key{Operation: "op", Key: "noscript"}
	tok := token()
	for _, step := range []struct {
		name string
		n    int64
		call func() error
	}{
		{"first run: Reserve", 1, func() error { _, _, err := s.Reserve(ctx, key, pendingWrite(tok, "fp", time.Minute)); return err }},
		{"refused duplicate: Reserve (and abandon.lua)", 2, func() error { _, _, err := s.Reserve(ctx, key, pendingWrite(token(), "fp", time.Minute)); return err }},
		{"Renew", 1, func() error { _, err := s.Renew(ctx, key, tok, time.Minute); return err }},
		{"first run: Complete", 1, func() error {
			_, err := s.Complete(ctx, key, tok, coordinator.Completion{State: coordinator.StateCompleted, Result: []byte("r"), TTL: time.Minute})
			return err
		}},
		{"replay: Reserve", 1, func() error { _, _, err := s.Reserve(ctx, key, pendingWrite(token(), "fp", time.Minute)); return err }},
		{"Get", 1, func() error { _, err := s.Get(ctx, key); return err }},
		{"Release", 1, func() error { _, err := s.Release(ctx, key, tok); return err }},
		{"heal: Reserve with Replace", 2, func() error {
			_, _, err := s.Reserve(ctx, key, replace(pendingWrite(token(), "fp", time.Minute), tok))
			return err
		}},
	} {
		flush()
		var err error
		if n := rt.count(func() { err = step.call() }); err != nil || n != step.n {
			t.Errorf("%s right after SCRIPT FLUSH: %v, %d round trips; want %d", step.name, err, n, step.n)
		}
	}
	// A script of the rare paths is cached by its EVAL: once.
	var err error
	if n := rt.count(func() { _, _, err = s.Reserve(ctx, key, replace(pendingWrite(token(), "fp", time.Minute), "x")) }); err != nil || n != 1 {
		t.Errorf("second heal: %v, %d round trips; want 1", err, n)
	}
	// Bulk calls fall back too.
	flush()
	keys := []coordinator.Key{key, {Operation: "op", Key: "other"}}
	if _, err := s.Inspect(ctx, keys...); err != nil {
		t.Errorf("Inspect without the script cached: %v", err)
	}
}

// TestNoScriptFallbackCluster: bulk calls on a cluster whose masters lost
// their script cache fall back to EVAL in a second pipeline.
func TestNoScriptFallbackCluster(t *testing.T) {
	ctx := context.Background()
	c := redistest.Cluster(t)
	if redistest.ClusterKind(t) != redistest.KindRedisServer {
		t.Skip("flushes the script cache: only on a cluster the tests started")
	}
	s := newStore(t, c)
	var keys []coordinator.Key
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
		if in.State != coordinator.StatePending {
			t.Fatalf("Inspect: %+v, want pending", in)
		}
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Forget(ctx, keys...); err != nil || n != len(keys) {
		t.Fatalf("Forget without the script cached = %d, %v", n, err)
	}
}
