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
		{"Reserve existing", func() error { _, _, err := s.Reserve(ctx, key, pendingWrite(token(), "", time.Minute)); return err }},
		{"Renew", func() error { _, err := s.Renew(ctx, key, tok, time.Minute); return err }},
		{"Complete", func() error { _, err := s.Complete(ctx, key, tok, []byte("r"), time.Minute); return err }},
		{"Get completed", func() error { _, err := s.Get(ctx, key); return err }},
		{"Release not owner", func() error { _, err := s.Release(ctx, key, tok); return err }},
		{"Inspect", func() error { _, err := s.Inspect(ctx, key); return err }},
		{"Forget", func() error { _, err := s.Forget(ctx, key); return err }},
	} {
		var err error
		if n := rt.count(func() { err = step.call() }); err != nil || n != 1 {
			t.Errorf("%s: %v, %d round trips; want 1", step.name, err, n)
		}
	}
}

// TestNoScriptFallback: a server without the scripts cached (a restarted
// server, a new replica promoted, SCRIPT FLUSH) costs one more round trip,
// EVALSHA refused then EVAL, once per script.
func TestNoScriptFallback(t *testing.T) {
	ctx := context.Background()
	in := redistest.Start(t) // a server of our own: we flush its script cache
	var rt roundTrips
	c := in.Client(t)
	c.AddHook(&rt)
	s := redisrepo.New(c)
	key := coordinator.Key{Operation: "op", Key: "noscript"}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	var err error
	if n := rt.count(func() { _, err = s.Get(ctx, key) }); err != nil || n != 2 {
		t.Errorf("first Get: %v, %d round trips; want 2 (EVALSHA, EVAL)", err, n)
	}
	if n := rt.count(func() { _, err = s.Get(ctx, key) }); err != nil || n != 1 {
		t.Errorf("second Get: %v, %d round trips; want 1", err, n)
	}
	// Bulk calls fall back too.
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
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
