package redisrepo_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// scripterOnly hides every method of a client but those of
// redisrepo.Client: a Client that cannot pipeline, as a wrapper might be.
type scripterOnly struct{ redisrepo.Client }

func TestInspectAndForget(t *testing.T) {
	eachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		for _, tc := range []struct {
			name   string
			client redisrepo.Client
		}{
			{"pipelined", c},
			{"one key per call", scripterOnly{c}},
		} {
			t.Run(tc.name, func(t *testing.T) { testInspectAndForget(t, c, tc.client) })
		}
	})
}

func testInspectAndForget(t *testing.T, c redis.UniversalClient, client redisrepo.Client) {
	ctx := context.Background()
	s := newStore(t, client)
	before := serverTime(t, c, "any")

	absent := newKey("absent")
	pending := newKey("pending")
	mustReserve(t, s, pending, pendingWrite(token(), "fp-p", 30*time.Second))
	completed := newKey("completed")
	mustReserve(t, s, completed, completedWrite(token(), "fp-c", []byte("0123456789"), time.Hour))
	unreadable := newKey("unreadable")
	plant(t, c, s.Key(unreadable), unreadables[0])
	persistent := newKey("persistent")
	mustReserve(t, s, persistent, completedWrite(token(), "", nil, time.Hour))
	c.Persist(ctx, s.Key(persistent))

	keys := []idemstore.Key{absent, pending, completed, unreadable, persistent, completed}
	infos, err := s.Inspect(ctx, keys...)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if len(infos) != len(keys) {
		t.Fatalf("Inspect returned %d infos for %d keys", len(infos), len(keys))
	}
	for i, in := range infos {
		if in.Key != keys[i] || in.RedisKey != s.Key(keys[i]) {
			t.Errorf("infos[%d] is of %v (%q), want %v: the order of the keys", i, in.Key, in.RedisKey, keys[i])
		}
	}
	check := func(in redisrepo.Info, state idemstore.State, fp string, size int, ttlMin, ttlMax time.Duration, created bool) {
		t.Helper()
		if in.State != state || in.Fingerprint != fp || in.ResultSize != size {
			t.Errorf("%s: %+v, want state %s, fingerprint %q, result size %d", in.Key.Key, in, state, fp, size)
		}
		if in.TTL < ttlMin || in.TTL > ttlMax {
			t.Errorf("%s: TTL %v, want in [%v, %v]", in.Key.Key, in.TTL, ttlMin, ttlMax)
		}
		if created != !in.CreatedAt.IsZero() {
			t.Errorf("%s: CreatedAt %v, want set: %v", in.Key.Key, in.CreatedAt, created)
		} else if created && (in.CreatedAt.Before(before.Add(-time.Second)) || in.CreatedAt.After(before.Add(time.Minute))) {
			t.Errorf("%s: CreatedAt %v, want about %v", in.Key.Key, in.CreatedAt, before)
		}
	}
	check(infos[0], idemstore.StateAbsent, "", 0, 0, 0, false)
	// Format 2 records carry no creation time (format 1 records do; see
	// TestInspectReadsAsGet).
	check(infos[1], idemstore.StatePending, "fp-p", 0, 25*time.Second, 30*time.Second, false)
	check(infos[2], idemstore.StateCompleted, "fp-c", 10, 59*time.Minute, time.Hour, false)
	check(infos[3], idemstore.StateUnreadable, "", 0, time.Minute, 2*time.Minute, false)
	check(infos[4], idemstore.StateCompleted, "", 0, -1, -1, false)
	check(infos[5], idemstore.StateCompleted, "fp-c", 10, 59*time.Minute, time.Hour, false)

	// Forget deletes whatever is there, whoever owns it.
	n, err := s.Forget(ctx, keys...)
	if err != nil || n != 4 {
		t.Fatalf("Forget = %d, %v; want 4 (pending, completed, unreadable, persistent)", n, err)
	}
	infos, err = s.Inspect(ctx, keys...)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range infos {
		if in.State != idemstore.StateAbsent || in.TTL != 0 {
			t.Errorf("after Forget: %+v, want absent", in)
		}
	}
	// A forgotten completed key is free again.
	mustReserve(t, s, completed, pendingWrite(token(), "fp-c", time.Minute))

	if in, err := s.Inspect(ctx); in != nil || err != nil {
		t.Errorf("Inspect() = %v, %v; want nil, nil", in, err)
	}
	if n, err := s.Forget(ctx); n != 0 || err != nil {
		t.Errorf("Forget() = %v, %v; want 0, nil", n, err)
	}
	s.Forget(ctx, completed)
}

// TestForgetPendingLosesLease: forgetting a pending key frees it for a new
// caller, and the first holder's completion is refused.
func TestForgetPendingLosesLease(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, redistest.Server(t))
	key := newKey("forget-pending")
	tok := token()
	mustReserve(t, s, key, pendingWrite(tok, "", time.Minute))
	if n, err := s.Forget(ctx, key); n != 1 || err != nil {
		t.Fatalf("Forget = %d, %v", n, err)
	}
	if ok, err := s.Complete(ctx, key, tok, idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("late"), TTL: time.Minute}); ok || err != nil {
		t.Errorf("Complete after Forget = %v, %v; want false", ok, err)
	}
	if rec := mustGet(t, s, key); rec.State != idemstore.StateAbsent {
		t.Errorf("Get after Forget = %+v, want absent", rec)
	}
}

// TestBulkAcrossSlots runs Inspect and Forget on many keys spread over the
// cluster's slots and nodes, and on one hash tag, and counts the round trips:
// one pipeline per node, not one call per key, and no CROSSSLOT.
func TestBulkAcrossSlots(t *testing.T) {
	ctx := context.Background()
	opts := redistest.ClusterOptions(t)
	var rt roundTrips
	c := redis.NewClusterClient(opts)
	defer c.Close()
	c.OnNewNode(func(n *redis.Client) { n.AddHook(&rt) })
	s := newStore(t, c)
	if err := s.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}

	var keys []idemstore.Key
	for i := range 1500 {
		k := newKey(fmt.Sprint("bulk-", i))
		if i%3 == 0 {
			k.Key = fmt.Sprintf("{tenant-%d}-%d", i%2, i) // hash tags: two slots of many keys
		}
		keys = append(keys, k)
	}
	slots := map[int]bool{}
	nodes := map[string]bool{}
	for _, k := range keys {
		slots[redisrepo.HashSlot(s.Key(k))] = true
		n, err := c.MasterForKey(ctx, s.Key(k))
		if err != nil {
			t.Fatal(err)
		}
		nodes[n.Options().Addr] = true
	}
	if len(slots) < 900 || len(nodes) != 3 {
		t.Fatalf("the keys span %d slots on %d nodes; want many slots on all 3", len(slots), len(nodes))
	}
	for i, k := range keys {
		if i%2 == 0 {
			mustReserve(t, s, k, completedWrite(token(), "", []byte("r"), time.Minute))
		}
	}

	var infos []redisrepo.Info
	var err error
	if n := rt.count(func() { infos, err = s.Inspect(ctx, keys...) }); err != nil || n > 3 {
		t.Fatalf("Inspect of %d keys: %v, %d round trips; want no error and one per node", len(keys), err, n)
	}
	for i, in := range infos {
		want := idemstore.StateAbsent
		if i%2 == 0 {
			want = idemstore.StateCompleted
		}
		if in.Key != keys[i] || in.State != want {
			t.Fatalf("infos[%d] = %+v, want %s of %v", i, in, want, keys[i])
		}
	}
	var n int
	if rts := rt.count(func() { n, err = s.Forget(ctx, keys...) }); err != nil || n != 750 || rts > 3 {
		t.Fatalf("Forget = %d, %v in %d round trips; want 750 keys, one round trip per node", n, err, rts)
	}
}

// TestBulkStandaloneOneRoundTrip: on a standalone server, a bulk call of
// any size is one round trip.
func TestBulkStandaloneOneRoundTrip(t *testing.T) {
	ctx := context.Background()
	var rt roundTrips
	c := redistest.Server(t)
	c.AddHook(&rt)
	s := newStore(t, c)
	if err := s.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	keys := make([]idemstore.Key, 1300) // three batches
	for i := range keys {
		keys[i] = newKey(strings.Repeat("k", i%7))
		mustReserve(t, s, keys[i], pendingWrite(token(), "", time.Minute))
	}
	var n int
	var err error
	if rts := rt.count(func() { _, err = s.Inspect(ctx, keys...) }); err != nil || rts != 1 {
		t.Errorf("Inspect of %d keys: %v, %d round trips; want 1", len(keys), err, rts)
	}
	if rts := rt.count(func() { n, err = s.Forget(ctx, keys...) }); err != nil || rts != 1 || n != len(keys) {
		t.Errorf("Forget of %d keys: %d, %v, %d round trips; want all in 1", len(keys), n, err, rts)
	}
}
