package redisrepo_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// TestBulkRoundTrips counts, with a go-redis hook, the round trips of the
// bulk calls on 500 keys once the scripts are loaded: one on a server, at
// most one per master on a cluster, collisions included.
func TestBulkRoundTrips(t *testing.T) {
	t.Run("Redis", func(t *testing.T) {
		var rt roundTrips
		c := redis.NewClient(redistest.ServerOptions(t))
		defer c.Close()
		c.AddHook(&rt)
		testBulkRoundTrips(t, c, &rt, 1)
	})
	t.Run("Cluster", func(t *testing.T) {
		var rt roundTrips
		c := redis.NewClusterClient(redistest.ClusterOptions(t))
		defer c.Close()
		c.OnNewNode(func(n *redis.Client) { n.AddHook(&rt) })
		var masters atomic.Int64
		if err := c.ForEachMaster(t.Context(), func(context.Context, *redis.Client) error {
			masters.Add(1)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		testBulkRoundTrips(t, c, &rt, masters.Load())
	})
}

func testBulkRoundTrips(t *testing.T, c redisrepo.Client, rt *roundTrips, most int64) {
	ctx := t.Context()
	s := newStore(t, c)
	if err := s.LoadScripts(ctx); err != nil {
		t.Fatalf("LoadScripts: %v", err)
	}
	const n = 500
	keys, ws, tokens, cs := bulkInputs("bulk-trips", n)
	for i := range keys {
		if i%50 == 0 { // a collision, met for the first time: no check for a wedge
			mustReserve(t, s, keys[i], pendingWrite(token(), "", time.Minute))
		}
	}
	for _, step := range []struct {
		name string
		call func() error
	}{
		{"GetMany", func() error { _, err := s.GetMany(ctx, keys); return err }},
		{"ReserveMany", func() error { _, _, err := s.ReserveMany(ctx, keys, ws, false); return err }},
		{"CompleteMany", func() error { _, err := s.CompleteMany(ctx, keys, tokens, cs); return err }},
		{"GetMany again", func() error { _, err := s.GetMany(ctx, keys); return err }},
		{"DeleteMany", func() error { _, err := s.DeleteMany(ctx, keys); return err }},
	} {
		var err error
		got := rt.count(func() { err = step.call() })
		t.Logf("%s of %d keys: %d round trips", step.name, n, got)
		if err != nil || got < 1 || got > most {
			t.Errorf("%s of %d keys: %v, %d round trips; want 1 to %d", step.name, n, err, got, most)
		}
	}
}

// A bulk call of more than MaxPipeline keys sends them in pipelines of at
// most MaxPipeline commands, one after the other, and decides every key as
// a smaller call does.
func TestBulkBoundsPipelines(t *testing.T) {
	var rt roundTrips
	var largest atomic.Int64
	c := redis.NewClient(redistest.ServerOptions(t))
	defer c.Close()
	c.AddHook(&rt)
	c.AddHook(pipelineSizes{&largest})
	ctx := t.Context()
	s := newStore(t, c)
	if err := s.LoadScripts(ctx); err != nil {
		t.Fatalf("LoadScripts: %v", err)
	}
	n := 2*redisrepo.MaxPipeline + redisrepo.MaxPipeline/2
	keys, ws, tokens, cs := bulkInputs("bulk-bound", n)
	for _, step := range []struct {
		name string
		want int64 // round trips
		call func() error
	}{
		{"ReserveMany", 3, func() error {
			_, written, err := s.ReserveMany(ctx, keys, ws, false)
			for i, w := range written {
				if !w && err == nil {
					err = fmt.Errorf("entry %d not written", i)
				}
			}
			return err
		}},
		{"CompleteMany", 3, func() error {
			ok, err := s.CompleteMany(ctx, keys, tokens, cs)
			for i, o := range ok {
				if !o && err == nil {
					err = fmt.Errorf("entry %d not completed", i)
				}
			}
			return err
		}},
		{"GetMany", 3, func() error {
			recs, err := s.GetMany(ctx, keys)
			for i, r := range recs {
				if err == nil && (r.State != idemstore.StateCompleted || string(r.Result) != fmt.Sprint(i)) {
					err = fmt.Errorf("entry %d: %+v", i, r)
				}
			}
			return err
		}},
		// Multi-key script calls of up to 512 keys each: 5 calls, one pipeline.
		{"DeleteMany", 1, func() error {
			d, err := s.DeleteMany(ctx, keys)
			if err == nil && d != n {
				err = fmt.Errorf("%d deleted, want %d", d, n)
			}
			return err
		}},
	} {
		largest.Store(0)
		var err error
		got := rt.count(func() { err = step.call() })
		if err != nil || got != step.want {
			t.Errorf("%s of %d keys: %v, %d round trips; want %d", step.name, n, err, got, step.want)
		}
		if l := largest.Load(); l > redisrepo.MaxPipeline {
			t.Errorf("%s of %d keys: a pipeline of %d commands, want at most %d", step.name, n, l, redisrepo.MaxPipeline)
		}
	}
}

// bulkInputs returns n keys named after prefix, a pending write of each
// with its token, and a completion of each whose result is its index.
func bulkInputs(prefix string, n int) ([]idemstore.Key, []idemstore.Write, []string, []idemstore.Completion) {
	keys := manyKeys(prefix, n)
	ws := make([]idemstore.Write, n)
	tokens := make([]string, n)
	cs := make([]idemstore.Completion, n)
	for i := range keys {
		ws[i] = pendingWrite(token(), "fp", time.Minute)
		tokens[i] = ws[i].Token
		cs[i] = idemstore.Completion{State: idemstore.StateCompleted, Result: []byte(fmt.Sprint(i)), TTL: time.Minute}
	}
	return keys, ws, tokens, cs
}

// pipelineSizes records the largest pipeline a client sends.
type pipelineSizes struct{ largest *atomic.Int64 }

func (pipelineSizes) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (pipelineSizes) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (p pipelineSizes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for n := int64(len(cmds)); ; {
			l := p.largest.Load()
			if n <= l || p.largest.CompareAndSwap(l, n) {
				break
			}
		}
		return next(ctx, cmds)
	}
}

// scenario plants one kind of record under a key, for TestBulkLikeSingle,
// and returns the token that owns it ("" for none).
type scenario struct {
	name  string
	plant func(t *testing.T, f1, f2 *redisrepo.Store, c redis.Cmdable, key idemstore.Key) string
}

var scenarios = []scenario{
	{"absent", func(*testing.T, *redisrepo.Store, *redisrepo.Store, redis.Cmdable, idemstore.Key) string { return "" }},
	{"format 2 completed", func(t *testing.T, _, f2 *redisrepo.Store, _ redis.Cmdable, key idemstore.Key) string {
		w := completedWrite(token(), "fp", []byte("done"), time.Minute)
		mustReserve(t, f2, key, w)
		return w.Token
	}},
	{"format 2 pending", func(t *testing.T, _, f2 *redisrepo.Store, c redis.Cmdable, key idemstore.Key) string {
		return plantPending(t, f2, c, key, false)
	}},
	{"format 2 pending, wedged", func(t *testing.T, _, f2 *redisrepo.Store, c redis.Cmdable, key idemstore.Key) string {
		return plantPending(t, f2, c, key, true)
	}},
	{"format 1 completed", func(t *testing.T, f1, _ *redisrepo.Store, _ redis.Cmdable, key idemstore.Key) string {
		w := completedWrite(token(), "fp", []byte("done in format 1"), time.Minute)
		mustReserve(t, f1, key, w)
		return w.Token
	}},
	{"format 1 pending", func(t *testing.T, f1, _ *redisrepo.Store, c redis.Cmdable, key idemstore.Key) string {
		return plantPending(t, f1, c, key, false)
	}},
	{"format 1 pending, wedged", func(t *testing.T, f1, _ *redisrepo.Store, c redis.Cmdable, key idemstore.Key) string {
		return plantPending(t, f1, c, key, true)
	}},
	{"list", func(t *testing.T, _, f2 *redisrepo.Store, c redis.Cmdable, key idemstore.Key) string {
		plant(t, c, f2.Key(key), unreadableNamed(t, "list"))
		return ""
	}},
	{"unreadable string", func(t *testing.T, _, f2 *redisrepo.Store, c redis.Cmdable, key idemstore.Key) string {
		plant(t, c, f2.Key(key), unreadableNamed(t, "string"))
		return ""
	}},
}

// unreadableNamed returns the unreadable value called name.
func unreadableNamed(t *testing.T, name string) unreadable {
	t.Helper()
	for _, u := range unreadables {
		if u.name == name {
			return u
		}
	}
	t.Fatalf("no unreadable value is called %q", name)
	return unreadable{}
}

// plantPending reserves key with s, and makes the record wedged (PERSIST)
// when asked; it returns the holder's token.
func plantPending(t *testing.T, s *redisrepo.Store, c redis.Cmdable, key idemstore.Key, wedged bool) string {
	t.Helper()
	w := pendingWrite(token(), "fp-held", time.Minute)
	mustReserve(t, s, key, w)
	if wedged {
		if err := c.Persist(context.Background(), s.Key(key)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	return w.Token
}

// TestBulkLikeSingle plants each kind of record twice, under a key for the
// bulk calls and under its twin for the single-key methods, and checks that
// each bulk entry does what the single-key method does with its twin, in
// both record formats: a format 1 HASH and anything that is not a STRING
// (WRONGTYPE in a batch), an unreadable STRING, a pending record met again a
// lease later (the check for a wedge), a wedged one.
func TestBulkLikeSingle(t *testing.T) {
	eachFormat(t, func(t *testing.T, c redis.UniversalClient, s *redisrepo.Store) {
		ctx := t.Context()
		prefix := strings.TrimSuffix(s.Key(idemstore.Key{}), ":") // s's own
		f1 := redisrepo.New(c, redisrepo.WithKeyPrefix(prefix), redisrepo.WithRecordFormat(redisrepo.Format1))
		f2 := redisrepo.New(c, redisrepo.WithKeyPrefix(prefix))
		clock := newFakeClock(s)
		n := len(scenarios)
		bulk, twins := make([]idemstore.Key, n), make([]idemstore.Key, n)
		owners := make([]string, n)
		for i, sc := range scenarios {
			bulk[i], twins[i] = newKey("bulk"), newKey("twin")
			if owners[i] = sc.plant(t, f1, f2, c, bulk[i]); owners[i] != "" {
				copyKey(t, c, s.Key(bulk[i]), s.Key(twins[i])) // the same holder under both, for CompleteMany
			} else {
				sc.plant(t, f1, f2, c, twins[i])
			}
		}
		for round := range 2 { // the second round a lease later: the checks for a wedge
			if round == 1 {
				clock.advance(time.Minute)
			}
			ws := make([]idemstore.Write, n)
			for i := range ws {
				ws[i] = pendingWrite(token(), "fp-new", time.Minute)
			}
			existing, written, err := s.ReserveMany(ctx, bulk, ws, false)
			if err != nil {
				t.Fatalf("round %d: ReserveMany: %v", round, err)
			}
			for i, sc := range scenarios {
				rec, ok, err := s.Reserve(ctx, twins[i], ws[i])
				if err != nil {
					t.Fatalf("round %d: Reserve(%s): %v", round, sc.name, err)
				}
				if written[i] != ok || !sameRecord(existing[i], rec) {
					t.Errorf("round %d, %s: ReserveMany entry = %v, %s; Reserve = %v, %s", round, sc.name, written[i], show(existing[i]), ok, show(rec))
				}
			}
			if round == 0 {
				checkWrongTypes(t, s, existing, written)
			}
			// Format 2 takes a wedged record over when it meets it a lease
			// after the first time; format 1 (reserve1.lua) at once.
			if want := (round == 1) != (s.Format() == redisrepo.Format1); written[3] != want {
				t.Errorf("round %d: ReserveMany over a wedged format 2 record: written %v, want %v (existing %s)", round, written[3], want, show(existing[3]))
			}
		}

		cs := make([]idemstore.Completion, n)
		for i := range cs {
			cs[i] = idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("completed"), TTL: time.Minute}
		}
		ok, err := s.CompleteMany(ctx, bulk, owners, cs)
		if err != nil {
			t.Fatalf("CompleteMany: %v", err)
		}
		for i, sc := range scenarios {
			single, err := s.Complete(ctx, twins[i], owners[i], cs[i])
			if err != nil || single != ok[i] {
				t.Errorf("%s: CompleteMany entry %v; Complete %v, %v", sc.name, ok[i], single, err)
			}
		}
		recs, err := s.GetMany(ctx, bulk)
		if err != nil {
			t.Fatalf("GetMany: %v", err)
		}
		for i, sc := range scenarios {
			if rec := mustGet(t, s, twins[i]); !sameRecord(recs[i], rec) {
				t.Errorf("%s: GetMany entry %s; Get %s", sc.name, show(recs[i]), show(rec))
			}
		}
		deleted, err := s.DeleteMany(ctx, bulk)
		forgot, ferr := s.Forget(ctx, twins...)
		if err != nil || ferr != nil || deleted != forgot || deleted != n {
			t.Errorf("DeleteMany: %d, %v; Forget of the twins: %d, %v; want %d", deleted, err, forgot, ferr, n)
		}
	})
}

// checkWrongTypes checks the entries of the first round of
// TestBulkLikeSingle whose keys are not STRINGs: the format 1 records are
// read, the list is unreadable, and none of them is written over, but the
// wedged one.
func checkWrongTypes(t *testing.T, s *redisrepo.Store, existing []idemstore.Record, written []bool) {
	t.Helper()
	for i, sc := range scenarios {
		var want idemstore.State
		switch sc.name {
		case "format 1 completed":
			want = idemstore.StateCompleted
			if r := existing[i].Result; string(r) != "done in format 1" {
				t.Errorf("ReserveMany over a completed format 1 HASH (a Store of format %d): result %q", s.Format(), r)
			}
		case "format 1 pending":
			want = idemstore.StatePending
		case "list":
			want = idemstore.StateUnreadable
		case "format 1 pending, wedged":
			if !written[i] {
				t.Errorf("ReserveMany over a wedged format 1 record: not written, existing %s", show(existing[i]))
			}
			continue
		default:
			continue
		}
		if written[i] || existing[i].State != want {
			t.Errorf("ReserveMany entry over a %s: written %v, existing %s; want the %s record", sc.name, written[i], show(existing[i]), want)
		}
	}
}

// copyKey copies the Redis key from to to, with its time to live (none
// for a wedged record).
func copyKey(t *testing.T, c redis.UniversalClient, from, to string) {
	t.Helper()
	ctx := context.Background()
	dump, err := c.Dump(ctx, from).Result()
	if err != nil {
		t.Fatal(err)
	}
	ttl, err := c.PTTL(ctx, from).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl < 0 {
		ttl = 0
	}
	if err := c.Restore(ctx, to, ttl, dump).Err(); err != nil {
		t.Fatal(err)
	}
}

// sameRecord reports whether a and b are the same record, but for their
// TTLs, which format 1 reports to the millisecond.
func sameRecord(a, b idemstore.Record) bool {
	return a.State == b.State && a.Token == b.Token && a.Fingerprint == b.Fingerprint && string(a.Result) == string(b.Result)
}

// show formats rec for a failure message.
func show(rec idemstore.Record) string {
	return fmt.Sprintf("{%s token %q fp %q result %q}", rec.State, rec.Token, rec.Fingerprint, rec.Result)
}

// TestBulkFormat1: a Store that writes format 1 writes HASHes with
// ReserveMany, reads both formats with GetMany, completes with
// CompleteMany, and an all-or-nothing ReserveMany that collides takes back
// its pending and its completed HASHes.
func TestBulkFormat1(t *testing.T) {
	for _, b := range []struct {
		name   string
		client func(t *testing.T) redis.UniversalClient
	}{
		{"Redis", func(t *testing.T) redis.UniversalClient { return redistest.Server(t) }},
		{"Cluster", func(t *testing.T) redis.UniversalClient { return redistest.Cluster(t) }},
	} {
		t.Run(b.name, func(t *testing.T) {
			ctx := t.Context()
			c := b.client(t)
			prefix := redistest.Prefix(t)
			s := redisrepo.New(c, redisrepo.WithKeyPrefix(prefix), redisrepo.WithRecordFormat(redisrepo.Format1))
			f2 := redisrepo.New(c, redisrepo.WithKeyPrefix(prefix))
			keys := manyKeys("format1-", 4)
			ws := []idemstore.Write{
				pendingWrite(token(), "fp0", time.Minute),
				completedWrite(token(), "fp1", []byte("one"), time.Minute),
				{State: idemstore.StateNotReplayable, Token: token(), Fingerprint: "fp2", Result: []byte("why"), TTL: time.Minute},
			}
			old := completedWrite(token(), "fp3", []byte("format 2"), time.Minute)
			mustReserve(t, f2, keys[3], old)
			existing, written, err := s.ReserveMany(ctx, keys[:3], ws, false)
			if err != nil || !written[0] || !written[1] || !written[2] {
				t.Fatalf("ReserveMany of free keys: %v, %v, %v", existing, written, err)
			}
			for _, k := range keys[:3] {
				if typ, err := c.Type(ctx, s.Key(k)).Result(); err != nil || typ != "hash" {
					t.Errorf("ReserveMany in format 1 wrote a %q (%v), want a hash", typ, err)
				}
			}
			recs, err := s.GetMany(ctx, keys)
			if err != nil {
				t.Fatalf("GetMany: %v", err)
			}
			for i, w := range append(ws, old) {
				want := idemstore.Record{State: w.State, Token: w.Token, Fingerprint: w.Fingerprint, Result: w.Result}
				if !sameRecord(recs[i], want) {
					t.Errorf("GetMany entry %d = %s, want %s", i, show(recs[i]), show(want))
				}
				if i < 3 && recs[i].TTL <= 0 {
					t.Errorf("GetMany entry %d of a format 1 record: TTL %v, want the record's", i, recs[i].TTL)
				}
			}
			done := idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("zero"), TTL: time.Minute}
			ok, err := s.CompleteMany(ctx, keys[:2], []string{ws[0].Token, ws[1].Token}, []idemstore.Completion{done, done})
			if err != nil || !ok[0] || ok[1] {
				t.Errorf("CompleteMany of a pending and a completed HASH: %v, %v; want [true false]", ok, err)
			}
			if rec := mustGet(t, s, keys[0]); rec.State != idemstore.StateCompleted || string(rec.Result) != "zero" || rec.Token != ws[0].Token {
				t.Errorf("Get after CompleteMany: %s", show(rec))
			}

			// All or nothing: keys[0] is taken; the two others are taken back.
			fresh := manyKeys("format1-fresh-", 2)
			aon := []idemstore.Key{fresh[0], keys[0], fresh[1]}
			aws := []idemstore.Write{pendingWrite(token(), "", time.Minute), pendingWrite(token(), "", time.Minute), completedWrite(token(), "", []byte("r"), time.Minute)}
			existing, written, err = s.ReserveMany(ctx, aon, aws, true)
			if err != nil || written[0] || written[1] || written[2] || existing[1].State != idemstore.StateCompleted {
				t.Fatalf("all-or-nothing ReserveMany that collides: %v, %v, %v", existing, written, err)
			}
			if n, err := c.Exists(ctx, s.Key(fresh[0])).Result(); err != nil || n != 0 {
				t.Errorf("the pending HASH of an all-or-nothing ReserveMany that collided is still there (%d, %v)", n, err)
			}
			if n, err := c.Exists(ctx, s.Key(fresh[1])).Result(); err != nil || n != 0 {
				t.Errorf("the completed HASH of an all-or-nothing ReserveMany that collided is still there (%d, %v)", n, err)
			}
		})
	}
}

// TestBulkReplicaAcks: the entries of an acknowledged operation are on the
// replica when ReserveMany and CompleteMany return; with the replica
// frozen, ReserveMany fails with ErrNotAcknowledged and takes its
// reservations back, all of them with allOrNothing.
func TestBulkReplicaAcks(t *testing.T) {
	master, replica, proc := replicated(t)
	s := redisrepo.New(master, redisrepo.WithKeyPrefix(redistest.Prefix(t)),
		redisrepo.WithReplicaAcks(redisrepo.ReplicaAcks{Replicas: 1, Operations: []string{"test.op"}}))
	call := func() (context.Context, context.CancelFunc) { return context.WithTimeout(t.Context(), 2*time.Second) }
	onReplica := func(key idemstore.Key) string {
		t.Helper()
		v, err := replica.Get(t.Context(), s.Key(key)).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		return v
	}
	other := func(name string) idemstore.Key {
		return idemstore.Key{Operation: "other.op", Key: newKey(name).Key}
	}

	keys := append(manyKeys("acked-", 4), other("not-acked"))
	ws := make([]idemstore.Write, len(keys))
	tokens := make([]string, len(keys))
	for i := range ws {
		ws[i] = pendingWrite(token(), "", time.Minute)
		tokens[i] = ws[i].Token
	}
	waits := waitCalls(t, master)
	ctx, cancel := call()
	_, written, err := s.ReserveMany(ctx, keys, ws, false)
	cancel()
	if err != nil || !all(written) {
		t.Fatalf("ReserveMany with the replica up: %v, %v", written, err)
	}
	for _, k := range keys[:4] {
		if onReplica(k) == "" {
			t.Errorf("the acknowledged reservation of %s is not on the replica when ReserveMany returns", k)
		}
	}
	if w := waitCalls(t, master) - waits; w < 1 || w > 4 {
		t.Errorf("ReserveMany of 4 acknowledged entries sent %d WAITs, want 1 to 4", w)
	}
	cs := make([]idemstore.Completion, len(keys))
	for i := range cs {
		cs[i] = idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("charged"), TTL: time.Hour}
	}
	ctx, cancel = call()
	ok, err := s.CompleteMany(ctx, keys, tokens, cs)
	cancel()
	if err != nil || !all(ok) {
		t.Fatalf("CompleteMany with the replica up: %v, %v", ok, err)
	}
	for _, k := range keys[:4] {
		if v := onReplica(k); !strings.HasSuffix(v, "charged") {
			t.Errorf("the acknowledged completion of %s is not on the replica when CompleteMany returns: %q", k, v)
		}
	}

	freeze(t, proc)
	for _, allOrNothing := range []bool{false, true} {
		keys := []idemstore.Key{other("frozen-other"), newKey("frozen-acked")}
		ws := []idemstore.Write{pendingWrite(token(), "", time.Minute), pendingWrite(token(), "", time.Minute)}
		ctx, cancel := call()
		_, _, err := s.ReserveMany(ctx, keys, ws, allOrNothing)
		cancel()
		var se *coordinator.StorageError
		if !errors.As(err, &se) || se.Method != idemevent.MethodReserve || !errors.Is(err, redisrepo.ErrNotAcknowledged) {
			t.Fatalf("ReserveMany (all or nothing %v) with the replica frozen: %v; want a storage error of reserve matching ErrNotAcknowledged", allOrNothing, err)
		}
		if n, err := master.Exists(t.Context(), s.Key(keys[1])).Result(); err != nil || n != 0 {
			t.Errorf("the reservation that was not acknowledged is still on the master (%d, %v)", n, err)
		}
		if n, err := master.Exists(t.Context(), s.Key(keys[0])).Result(); err != nil || n != map[bool]int64{false: 1, true: 0}[allOrNothing] {
			t.Errorf("all or nothing %v: the reservation of the operation without acknowledgement: %d keys (%v)", allOrNothing, n, err)
		}
	}
}

// all reports whether every flag is set.
func all(flags []bool) bool {
	for _, f := range flags {
		if !f {
			return false
		}
	}
	return true
}

// TestBulkFullRedis: on a Redis that refuses writes (OOM), ReserveMany
// reads instead, as Reserve does: existing records are returned, and only a
// free key fails the call.
func TestBulkFullRedis(t *testing.T) {
	in := redistest.Start(t)
	if in.Kind() != redistest.KindRedisServer {
		t.Skip("needs redis-server: miniredis has no maxmemory")
	}
	client := in.Client(t)
	s := redisrepo.New(client, redisrepo.WithKeyPrefix(redistest.Prefix(t)))
	done, busy := newKey("full-done"), newKey("full-busy")
	dw, bw := completedWrite(token(), "fp", []byte("kept"), time.Minute), pendingWrite(token(), "", time.Minute)
	mustReserve(t, s, done, dw)
	mustReserve(t, s, busy, bw)
	fill(t, client)
	keys := []idemstore.Key{done, busy}
	existing, written, err := s.ReserveMany(t.Context(), keys, []idemstore.Write{pendingWrite(token(), "", time.Minute), pendingWrite(token(), "", time.Minute)}, false)
	if err != nil || written[0] || written[1] || string(existing[0].Result) != "kept" || existing[1].Token != bw.Token {
		t.Fatalf("ReserveMany on a full Redis over a completed and a pending record: %v, %v, %v", existing, written, err)
	}
	ws := []idemstore.Write{pendingWrite(token(), "", time.Minute), pendingWrite(token(), "", time.Minute), pendingWrite(token(), "", time.Minute)}
	_, _, err = s.ReserveMany(t.Context(), append(keys, newKey("full-free")), ws, false)
	var se *coordinator.StorageError
	if !errors.As(err, &se) || se.Method != idemevent.MethodReserve || !strings.HasPrefix(errors.Unwrap(se).Error(), "OOM ") {
		t.Errorf("ReserveMany of a free key on a full Redis: %v, want a storage error of the OOM refusal", err)
	}
}

// TestBulkEmptyScriptCache: a bulk call that meets a server without its
// scripts (NOSCRIPT) loads each script once and sends those entries again:
// three round trips, whatever the number of entries, and then one again.
func TestBulkEmptyScriptCache(t *testing.T) {
	ctx := t.Context()
	in := redistest.Start(t) // a server of our own: we flush its script cache
	var rt roundTrips
	c := in.Client(t)
	c.AddHook(&rt)
	s := redisrepo.New(c)
	const n = 100
	keys := manyKeys("noscript-", n)
	tokens := make([]string, n)
	cs := make([]idemstore.Completion, n)
	for i, k := range keys {
		tokens[i] = token()
		mustReserve(t, s, k, pendingWrite(tokens[i], "", time.Minute))
		cs[i] = idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("r"), TTL: time.Minute}
	}
	for _, want := range []int64{3, 1} {
		if want == 3 {
			if err := c.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		var ok []bool
		var err error
		got := rt.count(func() { ok, err = s.CompleteMany(ctx, keys, tokens, cs) })
		if err != nil || got != want || (want == 3 && !all(ok)) {
			t.Errorf("CompleteMany of %d keys: %v, %d round trips; want %d, all completed", n, err, got, want)
		}
	}
}

// TestBulkWakesWaiters: a caller watching a key in another process is told
// when CompleteMany completes it, as by Complete, and only the watched key
// is announced.
func TestBulkWakesWaiters(t *testing.T) {
	eachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := t.Context()
		prefix := redistest.Prefix(t)
		holder := redisrepo.New(c, redisrepo.WithKeyPrefix(prefix))
		waiter := redisrepo.New(secondClient(t, c), redisrepo.WithKeyPrefix(prefix))
		keys := manyKeys("wake-", 3)
		tokens := []string{token(), token(), token()}
		for i, k := range keys {
			mustReserve(t, holder, k, pendingWrite(tokens[i], "", time.Minute))
		}
		rec, changed, stop, err := waiter.Watch(ctx, keys[1])
		if err != nil || rec.State != idemstore.StatePending || changed == nil {
			t.Fatalf("Watch = %s, %v; want the pending record and a channel", show(rec), err)
		}
		defer stop()
		waitMarked(t, c, holder.Key(keys[1]))
		before := publishes(t, c)
		done := idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("r"), TTL: time.Minute}
		if ok, err := holder.CompleteMany(ctx, keys, tokens, []idemstore.Completion{done, done, done}); err != nil || !all(ok) {
			t.Fatalf("CompleteMany = %v, %v", ok, err)
		}
		if n := publishes(t, c) - before; before >= 0 && n != 1 {
			t.Errorf("CompleteMany of 3 keys, 1 watched, published %d notices, want 1", n)
		}
		select {
		case <-changed:
		case <-time.After(10 * time.Second): // a bound on a hang, not a budget
			t.Fatal("CompleteMany: no notice in 10s")
		}
	})
}

// failKey makes the pipelined command of one Redis key fail as a timed-out
// node's would (an error that is no reply of Redis), after the pipeline
// ran: the other commands of the pipeline keep their replies.
type failKey struct{ name string }

var errNodeTimeout = errors.New("i/o timeout (injected: the key's node did not answer)")

func (failKey) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (failKey) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (f failKey) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			for _, arg := range cmd.Args() {
				if arg == f.name {
					cmd.SetErr(errNodeTimeout)
				}
			}
		}
		return err
	}
}

// TestBulkReserveOneEntryFails: a ReserveMany in which one entry's command
// fails (on a cluster, its node timed out) still decides the entries whose
// Redis answered, those that need a second step included (a format 1
// record, read after its WRONGTYPE): each is reported by what Redis said
// for it, and only the failed entry takes the error. So DoBatch in mode run
// replays the completed key instead of running it unprotected again, runs
// the free key under its reservation, and runs only the failed one
// unprotected.
func TestBulkReserveOneEntryFails(t *testing.T) {
	ctx := t.Context()
	c := redistest.Server(t)
	prefix := redistest.Prefix(t)
	s := redisrepo.New(c, redisrepo.WithKeyPrefix(prefix))
	keys := manyKeys("one-fails-", 3) // failed, format 1 completed, free
	plantFormat1 := func(key idemstore.Key) {
		t.Helper()
		name := s.Key(key)
		if err := c.HSet(ctx, name, "v", "1", "state", "completed", "token", "tok-old", "fp", "",
			"result", `"stored before"`, "created_ms", "1").Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.PExpire(ctx, name, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	plantFormat1(keys[1])
	c.AddHook(failKey{name: s.Key(keys[0])})

	ws := []idemstore.Write{pendingWrite(token(), "", time.Minute), pendingWrite(token(), "", time.Minute), pendingWrite(token(), "", time.Minute)}
	existing, written, err := s.ReserveMany(ctx, keys, ws, false)
	if !errors.Is(err, errNodeTimeout) {
		t.Fatalf("ReserveMany with one entry's node down: %v, want its error", err)
	}
	if len(existing) != 3 || len(written) != 3 {
		t.Fatalf("ReserveMany returned %d records and %d flags, want 3 and 3", len(existing), len(written))
	}
	if written[0] || existing[0].State != idemstore.StateAbsent {
		t.Errorf("the failed entry: written %v, %s; want unknown (not written, absent)", written[0], show(existing[0]))
	}
	if written[1] || existing[1].State != idemstore.StateCompleted || string(existing[1].Result) != `"stored before"` {
		t.Errorf("the format 1 entry: written %v, %s; want its completed record", written[1], show(existing[1]))
	}
	if !written[2] {
		t.Errorf("the free entry: %s, want it written", show(existing[2]))
	}

	more := manyKeys("one-fails-batch-", 3)
	plantFormat1(more[1])
	c.AddHook(failKey{name: s.Key(more[0])})
	b := batchInRunMode(t, s, more)
	for i, err := range b.errs {
		if err != nil {
			t.Fatalf("DoBatch call %d: %v", i, err)
		}
	}
	if b.runs[1].Load() != 0 || !b.res[1].Replayed || b.res[1].Value != "stored before" {
		t.Errorf("the completed key: %d runs, %+v; want its stored result replayed and no run", b.runs[1].Load(), b.res[1])
	}
	if b.runs[0].Load() != 1 || b.protected[0].Load() {
		t.Errorf("the failed key: %d runs, protected %v; want one unprotected run (mode run)", b.runs[0].Load(), b.protected[0].Load())
	}
	if b.runs[2].Load() != 1 || !b.protected[2].Load() {
		t.Errorf("the free key: %d runs, protected %v; want one run under its reservation", b.runs[2].Load(), b.protected[2].Load())
	}
}

// batchRun is what batchInRunMode saw of each call.
type batchRun struct {
	res       []coordinator.Result[string]
	errs      []error
	runs      []atomic.Int64
	protected []atomic.Bool // the action ran under a reservation
}

// batchInRunMode runs coordinator.DoBatch over s, in on-storage-error mode
// run, with one call per key, and returns what each call did.
func batchInRunMode(t *testing.T, s *redisrepo.Store, keys []idemstore.Key) *batchRun {
	t.Helper()
	co, err := coordinator.New(s, coordinator.WithOnStorageError(coordinator.OnStorageErrorRun))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = co.Close() })
	calls := make([]coordinator.Call, len(keys))
	for i, k := range keys {
		calls[i] = coordinator.Call{Operation: k.Operation, Key: k.Key}
	}
	b := &batchRun{runs: make([]atomic.Int64, len(keys)), protected: make([]atomic.Bool, len(keys))}
	b.res, b.errs = coordinator.DoBatch(t.Context(), co, calls, func(actx context.Context, i int) (string, error) {
		b.runs[i].Add(1)
		_, ok := coordinator.ReservationFromContext(actx)
		b.protected[i].Store(ok)
		return fmt.Sprint("run ", i), nil
	})
	return b
}
