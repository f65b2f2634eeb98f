package redisrepo_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// globPrefix returns a key prefix of t's own that holds every character a
// Redis glob pattern gives a meaning: a pattern built from it unescaped
// would miss its keys and match a sibling's.
func globPrefix(t *testing.T) string {
	return redistest.Prefix(t) + `g*l?o[b]\:`
}

// siblingPrefix is a prefix that the unescaped pattern of globPrefix(t)'s
// base matches but the prefix itself does not.
func siblingPrefix(base string) string {
	return base[:len(base)-len(`g*l?o[b]\:`)] + `gXXlxob:`
}

func TestScanKeys(t *testing.T) {
	eachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := t.Context()
		prefix := globPrefix(t)
		s := redisrepo.New(c, redisrepo.WithKeyPrefix(prefix))
		sibling := redisrepo.New(c, redisrepo.WithKeyPrefix(siblingPrefix(prefix)))

		// Keys with colons and glob characters, and enough of them for
		// several SCAN replies.
		want := []string{"k1", "a:b:c", ":", "*", "?", "[x]", `back\slash`, "{tag}-1", "op.x:k"}
		for i := range 1500 {
			want = append(want, fmt.Sprint("n-", i))
		}
		for i, k := range want {
			w := pendingWrite(token(), "", time.Minute)
			if i%2 == 0 {
				w = completedWrite(token(), "fp", []byte("result"), time.Minute)
			}
			mustReserve(t, s, idemstore.Key{Operation: "op", Key: k}, w)
		}
		// Records of other operations, one a prefix of "op" and one with it
		// as a prefix, and of the sibling prefix; none is "op"'s.
		for _, k := range []idemstore.Key{{Operation: "o", Key: "p:k1"}, {Operation: "op.x", Key: "k"}, {Operation: "op-2", Key: "k"}} {
			mustReserve(t, s, k, pendingWrite(token(), "", time.Minute))
		}
		mustReserve(t, sibling, idemstore.Key{Operation: "op", Key: "k1"}, pendingWrite(token(), "", time.Minute))
		// Names under "op"'s prefix that are no record's: an empty key, a
		// key with a space.
		for _, name := range []string{s.Key(idemstore.Key{Operation: "op"}), s.Key(idemstore.Key{Operation: "op", Key: "has space"})} {
			if err := c.Set(ctx, name, "x", time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
		}

		got := map[string]int{}
		calls := 0
		err := s.ScanKeys(ctx, "op", func(keys []idemstore.Key) error {
			calls++
			for _, k := range keys {
				if k.Operation != "op" {
					t.Errorf("ScanKeys(op) reported %v", k)
				}
				got[k.Key]++
			}
			return nil
		})
		if err != nil {
			t.Fatalf("ScanKeys: %v", err)
		}
		if calls < 2 && !strings.HasSuffix(t.Name(), "Miniredis") { // miniredis ignores SCAN's COUNT
			t.Errorf("fn called %d times for %d keys; want a call per SCAN reply", calls, len(want))
		}
		// SCAN may report a key twice; it never leaves one out.
		if !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(slices.Values(want))) {
			t.Errorf("ScanKeys(op) reported %d keys, want %d: extra %v, missing %v",
				len(got), len(want), missing(slices.Collect(maps.Keys(got)), want), missing(want, slices.Collect(maps.Keys(got))))
		}

		// The walk stops at fn's first error.
		stop := errors.New("stop")
		calls = 0
		err = s.ScanKeys(ctx, "op", func([]idemstore.Key) error { calls++; return stop })
		if !errors.Is(err, stop) || calls != 1 {
			t.Errorf("ScanKeys with a failing fn = %v after %d calls; want stop after 1", err, calls)
		}

		// Forgetting in fn deletes every key, and nothing else.
		forgotten := 0
		err = s.ScanKeys(ctx, "op", func(keys []idemstore.Key) error {
			n, err := s.Forget(ctx, keys...)
			forgotten += n
			return err
		})
		if err != nil || forgotten != len(want) {
			t.Errorf("ScanKeys with Forget: %d forgotten, %v; want %d", forgotten, err, len(want))
		}
		if err := s.ScanKeys(ctx, "op", func(keys []idemstore.Key) error {
			return fmt.Errorf("%d keys left: %v", len(keys), keys)
		}); err != nil {
			t.Error(err)
		}
		if rec := mustGet(t, sibling, idemstore.Key{Operation: "op", Key: "k1"}); rec.State != idemstore.StatePending {
			t.Errorf("the sibling prefix's record is %v, want pending", rec.State)
		}
		if rec := mustGet(t, s, idemstore.Key{Operation: "op.x", Key: "k"}); rec.State != idemstore.StatePending {
			t.Errorf("op.x's record is %v, want pending", rec.State)
		}
	})
}

// missing returns the elements of a that are not in b.
func missing(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

func TestScanKeysRefuses(t *testing.T) {
	c := redistest.Server(t)
	fn := func([]idemstore.Key) error { t.Error("fn called"); return nil }
	s := newStore(t, c)
	if err := s.ScanKeys(t.Context(), "bad:op", fn); !errors.Is(err, coordinator.ErrInvalidRequest) {
		t.Errorf("ScanKeys(bad:op) = %v, want ErrInvalidRequest", err)
	}
	if _, err := s.Count(t.Context(), "ok", ""); !errors.Is(err, coordinator.ErrInvalidRequest) {
		t.Errorf("Count(ok, \"\") = %v, want ErrInvalidRequest", err)
	}
	// A wrapper cannot be told to walk every node of a cluster.
	w := newStore(t, scripterOnly{c})
	if err := w.ScanKeys(t.Context(), "op", fn); err == nil {
		t.Error("ScanKeys through a wrapper: no error")
	}
	if _, err := w.Count(t.Context()); err == nil {
		t.Error("Count through a wrapper: no error")
	}
}

func TestScanKeysRedisDown(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1})
	defer c.Close()
	s := redisrepo.New(c)
	err := s.ScanKeys(t.Context(), "op", func([]idemstore.Key) error { return nil })
	if err == nil {
		t.Error("ScanKeys against a dead server: no error")
	}
	if _, err := s.Count(t.Context()); err == nil {
		t.Error("Count against a dead server: no error")
	}

	// A failover client's address is go-redis's "FailoverClient": not one
	// to quote.
	f := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{"127.0.0.1:1"}, MaxRetries: -1, DialerRetries: 1})
	defer f.Close()
	err = redisrepo.New(f).ScanKeys(t.Context(), "op", func([]idemstore.Key) error { return nil })
	if err == nil || strings.Contains(err.Error(), "FailoverClient") {
		t.Errorf("ScanKeys through a failover client to a dead sentinel = %v, want an error that does not say FailoverClient", err)
	}
}

func TestCount(t *testing.T) {
	eachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := t.Context()
		prefix := globPrefix(t)
		s := redisrepo.New(c, redisrepo.WithKeyPrefix(prefix))
		s1 := redisrepo.New(c, redisrepo.WithKeyPrefix(prefix), redisrepo.WithRecordFormat(redisrepo.Format1))
		sibling := redisrepo.New(c, redisrepo.WithKeyPrefix(siblingPrefix(prefix)))

		key := func(op string, i int) idemstore.Key {
			return idemstore.Key{Operation: op, Key: fmt.Sprintf("k:%d:*", i)}
		}
		want := map[string]redisrepo.Counts{
			"pay.charge": {Pending: 2 + 1, Completed: 3 + 2, Format1: 1 + 2},
			"junk":       {Unreadable: len(unreadables)},
			"o":          {Completed: 1},
		}
		i := 0
		next := func(op string) idemstore.Key { i++; return key(op, i) }
		for range 2 {
			mustReserve(t, s, next("pay.charge"), pendingWrite(token(), "fp", time.Minute))
		}
		mustReserve(t, s, next("pay.charge"), completedWrite(token(), "", nil, time.Minute)) // an empty result
		for range 2 {
			mustReserve(t, s, next("pay.charge"), completedWrite(token(), "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", []byte("result"), time.Minute))
		}
		mustReserve(t, s1, next("pay.charge"), pendingWrite(token(), "", time.Minute))
		mustReserve(t, s1, next("pay.charge"), completedWrite(token(), "", nil, time.Minute))
		mustReserve(t, s1, next("pay.charge"), completedWrite(token(), "fp", []byte("result"), time.Minute))
		for _, u := range unreadables {
			plant(t, c, s.Key(next("junk")), u)
		}
		// "o" with a key that holds "op.charge"-like colons.
		mustReserve(t, s, idemstore.Key{Operation: "o", Key: "pay.charge:k"}, completedWrite(token(), "", []byte("r"), time.Minute))
		// Not counted: another prefix, and a name that is no record's.
		mustReserve(t, sibling, next("pay.charge"), pendingWrite(token(), "", time.Minute))
		for _, name := range []string{prefix + "no-colon", prefix + "bad op:k", prefix + "op:", prefix + "op:bad key"} {
			if err := c.Set(ctx, name, "x", time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
		}

		got, err := s.Count(ctx)
		if err != nil {
			t.Fatalf("Count: %v", err)
		}
		if !maps.Equal(got, want) {
			t.Errorf("Count() = %+v\nwant      %+v", got, want)
		}
		got, err = s.Count(ctx, "pay.charge")
		if err != nil || !maps.Equal(got, map[string]redisrepo.Counts{"pay.charge": want["pay.charge"]}) {
			t.Errorf("Count(pay.charge) = %+v, %v; want %+v", got, err, want["pay.charge"])
		}
		got, err = s.Count(ctx, "junk", "none")
		if err != nil || !maps.Equal(got, map[string]redisrepo.Counts{"junk": want["junk"], "none": {}}) {
			t.Errorf("Count(junk, none) = %+v, %v; want junk %+v and none zero", got, err, want["junk"])
		}
		if n := want["pay.charge"].Total(); n != 8 {
			t.Errorf("Total = %d, want 8", n)
		}

		// Count judges each record as Inspect does.
		for op, n := range map[string]int{"pay.charge": 8, "junk": len(unreadables)} {
			var keys []idemstore.Key
			for j := 1; j <= i; j++ {
				keys = append(keys, key(op, j))
			}
			infos, err := s.Inspect(ctx, keys...)
			if err != nil {
				t.Fatal(err)
			}
			var byState redisrepo.Counts
			seen := 0
			for _, in := range infos {
				switch in.State {
				case idemstore.StatePending:
					byState.Pending++
				case idemstore.StateCompleted:
					byState.Completed++
				case idemstore.StateUnreadable:
					byState.Unreadable++
				default:
					continue
				}
				seen++
			}
			byState.Format1 = want[op].Format1
			if seen != n || byState != want[op] {
				t.Errorf("%s: Inspect says %+v (%d records), Count %+v", op, byState, seen, want[op])
			}
		}
	})
}

// With an empty prefix every key of the database is walked: a key that
// looks like a record (operation, colon, key) is counted, as unreadable
// unless it is one; the rest are skipped. On a server of the test's own, as
// every key of it is seen.
func TestCountEmptyPrefix(t *testing.T) {
	in := redistest.Start(t)
	c := in.Client(t)
	ctx := t.Context()
	s := redisrepo.New(c, redisrepo.WithKeyPrefix(""))
	mustReserve(t, s, idemstore.Key{Operation: "op", Key: "k:1"}, completedWrite(token(), "", []byte("r"), time.Minute))
	for _, name := range []string{"session:abc", "plain", "a b:c"} {
		if err := c.Set(ctx, name, "x", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Count(ctx)
	want := map[string]redisrepo.Counts{"op": {Completed: 1}, "session": {Unreadable: 1}}
	if err != nil || !maps.Equal(got, want) {
		t.Errorf("Count() = %+v, %v; want %+v", got, err, want)
	}
	var keys []idemstore.Key
	if err := s.ScanKeys(ctx, "op", func(ks []idemstore.Key) error { keys = append(keys, ks...); return nil }); err != nil ||
		!slices.Equal(keys, []idemstore.Key{{Operation: "op", Key: "k:1"}}) {
		t.Errorf("ScanKeys(op) = %v, %v; want op:k:1", keys, err)
	}
}

// An operator forgets every record of an operation, a SCAN reply at a time.
func ExampleStore_ScanKeys() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer client.Close()
	store := redisrepo.New(client)

	forgotten := 0
	err := store.ScanKeys(ctx, "payment.charge", func(keys []idemstore.Key) error {
		n, err := store.Forget(ctx, keys...)
		forgotten += n
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("forgot %d record(s); their next call runs the action again\n", forgotten)
}

// An operator counts the records of two operations by state.
func ExampleStore_Count() {
	ctx := context.Background()
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"localhost:7000"}})
	defer client.Close()
	store := redisrepo.New(client)

	counts, err := store.Count(ctx, "payment.charge", "order.create") // every master
	if err != nil {
		log.Fatal(err)
	}
	for op, c := range counts {
		fmt.Printf("%s: %d pending, %d completed, %d unreadable\n", op, c.Pending, c.Completed, c.Unreadable)
	}
}

func ExampleCounts_Total() {
	c := redisrepo.Counts{Pending: 2, Completed: 40, Unreadable: 1, Format1: 5}
	fmt.Println(c.Total())
	// Output: 43
}

// ownCluster is a two-master Redis Cluster of one test's own, which the
// test may reshard and break: node 0 serves slots 0-8191, node 1 the rest.
type ownCluster struct {
	procs [2]*redistest.Process
	ids   [2]string
	nodes [2]*redis.Client
}

// startOwnCluster starts an ownCluster, stopped when t ends, or skips t
// without redis-server.
func startOwnCluster(t *testing.T) *ownCluster {
	t.Helper()
	ctx := t.Context()
	oc := &ownCluster{}
	for i := range oc.procs {
		p, err := redistest.StartProcess(redistest.MemDir(t), "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000")
		if err != nil {
			t.Skipf("cannot start a cluster node of this test's own: %v", err)
		}
		t.Cleanup(p.Kill)
		oc.procs[i] = p
		oc.nodes[i] = redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, DialerRetries: 1})
		t.Cleanup(func() { _ = oc.nodes[i].Close() })
		id, err := oc.nodes[i].ClusterMyID(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		oc.ids[i] = id
	}
	if err := oc.nodes[0].ClusterAddSlotsRange(ctx, 0, 8191).Err(); err != nil {
		t.Fatal(err)
	}
	if err := oc.nodes[1].ClusterAddSlotsRange(ctx, 8192, 16383).Err(); err != nil {
		t.Fatal(err)
	}
	host, port, _ := strings.Cut(oc.procs[1].Addr(), ":")
	if err := oc.nodes[0].ClusterMeet(ctx, host, port).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, n := range oc.nodes {
		for {
			info, err := n.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:2") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the cluster is not ok: %q, %v", info, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return oc
}

// client returns a cluster client of oc, closed when t ends.
func (oc *ownCluster) client(t *testing.T) *redis.ClusterClient {
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: []string{oc.procs[0].Addr(), oc.procs[1].Addr()}, MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// setSlot sends CLUSTER SETSLOT slot args... to node i.
func (oc *ownCluster) setSlot(t *testing.T, i, slot int, args ...any) {
	t.Helper()
	if err := oc.nodes[i].Do(t.Context(), append([]any{"cluster", "setslot", slot}, args...)...).Err(); err != nil {
		t.Fatalf("node %d: CLUSTER SETSLOT %d %v: %v", i, slot, args, err)
	}
}

// emptySlot returns a slot of node i's, from, that holds no key.
func (oc *ownCluster) emptySlot(t *testing.T, i, from int) int {
	t.Helper()
	for slot := from; ; slot++ {
		n, err := oc.nodes[i].ClusterCountKeysInSlot(t.Context(), slot).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return slot
		}
	}
}

// On a cluster whose slots move, ScanKeys and Count fail rather than leave
// out the keys that move: a slot migrating, or moved to another master
// during the walk. A master that is down fails them too.
func TestScanClusterChanges(t *testing.T) {
	oc := startOwnCluster(t)
	c := oc.client(t)
	ctx := t.Context()
	s := redisrepo.New(c, redisrepo.WithKeyPrefix("p:"))
	for i := range 200 {
		mustReserve(t, s, idemstore.Key{Operation: "op", Key: fmt.Sprint("k", i)}, completedWrite(token(), "", []byte("r"), time.Minute))
	}
	walk := func(fn func([]idemstore.Key) error) (int, error) {
		n := 0
		err := s.ScanKeys(ctx, "op", func(keys []idemstore.Key) error {
			n += len(keys)
			if fn != nil {
				return fn(keys)
			}
			return nil
		})
		return n, err
	}
	if n, err := walk(nil); err != nil || n != 200 {
		t.Fatalf("ScanKeys of a stable cluster: %d keys, %v; want 200", n, err)
	}

	// A slot migrating from node 0 to node 1: its keys could move while
	// the walk runs.
	slot := oc.emptySlot(t, 0, 100)
	oc.setSlot(t, 1, slot, "importing", oc.ids[0])
	oc.setSlot(t, 0, slot, "migrating", oc.ids[1])
	// Either node may say so first: node 0 migrating, node 1 importing.
	migrating := fmt.Sprintf("has slot %d migrating to node %s (a resharding in progress)", slot, oc.ids[1])
	importing := fmt.Sprintf("has slot %d importing from node %s (a resharding in progress)", slot, oc.ids[0])
	if _, err := walk(nil); err == nil || !strings.Contains(err.Error(), migrating) && !strings.Contains(err.Error(), importing) {
		t.Errorf("ScanKeys while a slot migrates = %v, want a resharding error", err)
	}
	if got, err := s.Count(ctx, "op"); err == nil {
		t.Errorf("Count while a slot migrates = %v, want an error", got)
	}
	// Over: the slot moved to node 1, before the walk.
	oc.setSlot(t, 1, slot, "node", oc.ids[1])
	oc.setSlot(t, 0, slot, "node", oc.ids[1])
	if n, err := walk(nil); err != nil || n != 200 {
		t.Errorf("ScanKeys after the resharding: %d keys, %v; want 200", n, err)
	}

	// A slot that moves during the walk (here, once the walk has begun).
	slot = oc.emptySlot(t, 0, slot+1)
	moved := false
	_, err := walk(func([]idemstore.Key) error {
		if !moved {
			moved = true
			oc.setSlot(t, 1, slot, "importing", oc.ids[0])
			oc.setSlot(t, 0, slot, "migrating", oc.ids[1])
			oc.setSlot(t, 1, slot, "node", oc.ids[1])
			oc.setSlot(t, 0, slot, "node", oc.ids[1])
		}
		return nil
	})
	if err == nil {
		t.Error("ScanKeys while a slot moved: no error")
	}

	// A master down: an error, not node 0's share alone.
	oc.procs[1].Kill()
	if got, err := s.Count(ctx, "op"); err == nil {
		t.Errorf("Count with a master down = %v, want an error", got)
	}
	if n, err := walk(nil); err == nil {
		t.Errorf("ScanKeys with a master down: %d keys, no error", n)
	}
}
