package redisrepo_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// format1 is the previous release's store: its scripts (testdata/format1,
// verbatim), which write format 1 HASH records.
type format1 struct {
	c                 redis.UniversalClient
	reserve, complete *redis.Script
}

func newFormat1(t *testing.T, c redis.UniversalClient) format1 {
	t.Helper()
	read := func(name string) string {
		b, err := os.ReadFile("testdata/format1/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	prelude := "local VERSION = \"1\"\nlocal ABSENT, PENDING, COMPLETED, UNREADABLE = 0, 1, 2, 3\n" + read("record.lua")
	return format1{c: c, reserve: redis.NewScript(prelude + read("reserve.lua")), complete: redis.NewScript(prelude + read("complete.lua"))}
}

// run is a first execution as the previous release made it: reserve, then
// complete with result.
func (f format1) run(t *testing.T, name, token, fp string, result []byte) {
	t.Helper()
	ctx := context.Background()
	if v, err := f.reserve.Run(ctx, f.c, []string{name}, "pending", token, fp, "", 30000, "0", "").Result(); err != nil || v != int64(1) {
		t.Fatalf("format 1 reserve = %v, %v", v, err)
	}
	if result != nil {
		f.completeNow(t, name, token, result)
	}
}

func (f format1) completeNow(t *testing.T, name, token string, result []byte) {
	t.Helper()
	if v, err := f.complete.Run(context.Background(), f.c, []string{name}, token, result, 3600000).Result(); err != nil || v != int64(1) {
		t.Fatalf("format 1 complete = %v, %v", v, err)
	}
}

// TestUpgradeFromFormat1: records that the previous release wrote, in
// format 1, replay after the upgrade without running the action again; a
// key that an instance of the previous release still holds is waited on, and
// its result replayed when it completes; a fingerprint stored in format 1
// still refuses a key reused for another request.
func TestUpgradeFromFormat1(t *testing.T) {
	eachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		old := newFormat1(t, c)
		s := newStore(t, c)
		co, ev := coord(t, s, coordinator.WithPollInterval(time.Millisecond))
		fp, err := coordinator.Fingerprint("order", 42)
		if err != nil {
			t.Fatal(err)
		}

		// Completed before the upgrade: replayed, not run.
		done := newKey("upgrade-completed")
		old.run(t, s.Key(done), "3f0c9a7e5b1d2c4f6a8b0c1d2e3f4a5b", fp, []byte(`{"id":"before","n":1}`))
		var k runs
		call := coordinator.Call{Operation: done.Operation, Key: done.Key, Fingerprint: fp}
		res, err := coordinator.DoResult(ctx, co, call, k.action("after"))
		if err != nil || !res.Replayed || res.Value.ID != "before" || k.n.Load() != 0 {
			t.Errorf("replay of a format 1 record = %+v, %v, %d runs; want its result, replayed, no run", res, err, k.n.Load())
		}
		// The same key for another request is refused.
		call.Fingerprint = "0000"
		if _, err := coordinator.Do(ctx, co, call, k.action("other")); err == nil || k.n.Load() != 0 {
			t.Errorf("a reused key over a format 1 record = %v, %d runs; want ErrKeyReuse", err, k.n.Load())
		}

		// Held by the previous release during the upgrade: waited on, then
		// replayed.
		held := newKey("upgrade-held")
		old.run(t, s.Key(held), "00112233445566778899aabbccddeeff", "", nil)
		got := make(chan error, 1)
		var waited coordinator.Result[charge]
		go func() {
			var err error
			waited, err = coordinator.DoResult(ctx, co, callOf(held), k.action("waiter"))
			got <- err
		}()
		for ev.count(idemevent.InFlight, "") == 0 { // until it waits
			time.Sleep(time.Millisecond)
		}
		old.completeNow(t, s.Key(held), "00112233445566778899aabbccddeeff", []byte(`{"id":"holder","n":1}`))
		if err := <-got; err != nil || !waited.Replayed || waited.Value.ID != "holder" || k.n.Load() != 0 {
			t.Errorf("waiter on a format 1 holder = %+v, %v, %d runs; want the holder's result", waited, err, k.n.Load())
		}

		// A key completed after the upgrade is format 2, and reads back.
		fresh := newKey("upgrade-fresh")
		if _, err := coordinator.Do(ctx, co, callOf(fresh), k.action("new")); err != nil {
			t.Fatal(err)
		}
		if v, err := c.Get(ctx, s.Key(fresh)).Result(); err != nil || v[0] != 2 {
			t.Errorf("a new record: %q, %v; want format 2", v, err)
		}
		if infos, err := s.Inspect(ctx, done, fresh); err != nil || infos[0].State != idemstore.StateCompleted || infos[1].State != idemstore.StateCompleted {
			t.Errorf("Inspect of both formats = %+v, %v", infos, err)
		}
	})
}

// TestRollingUpgradeWithFormat1: while instances of the previous release
// still serve (a rolling upgrade), the new release writes format 1 with
// WithRecordFormat(Format1), and each release replays what the other
// completed: no action runs twice.
func TestRollingUpgradeWithFormat1(t *testing.T) {
	eachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		old := newFormat1(t, c)
		s := redisrepo.New(c, redisrepo.WithKeyPrefix(redistest.Prefix(t)), redisrepo.WithRecordFormat(redisrepo.Format1))
		co, _ := coord(t, s)

		// Completed by the new release: the previous one replays it.
		key := newKey("rolling-new")
		var k runs
		if _, err := coordinator.Do(ctx, co, callOf(key), k.action("new")); err != nil {
			t.Fatal(err)
		}
		if typ := c.Type(ctx, s.Key(key)).Val(); typ != "hash" {
			t.Fatalf("WithRecordFormat(Format1) wrote a %s", typ)
		}
		v, err := old.reserve.Run(ctx, c, []string{s.Key(key)}, "pending", "0badc0de", "", "", 30000, "0", "").Result()
		rec, ok := v.([]any)
		if err != nil || !ok || len(rec) != 5 || rec[0] != int64(idemstore.StateCompleted) || !strings.Contains(rec[3].(string), `"new"`) {
			t.Errorf("the previous release's reserve over it = %v, %v; want the completed record", v, err)
		}

		// Completed by the previous release: the new one replays it.
		key2 := newKey("rolling-old")
		old.run(t, s.Key(key2), "00ff00ff00ff00ff", "", []byte(`{"id":"old","n":1}`))
		res, err := coordinator.DoResult(ctx, co, callOf(key2), k.action("again"))
		if err != nil || !res.Replayed || res.Value.ID != "old" {
			t.Errorf("replay of the previous release's record = %+v, %v", res, err)
		}
		if k.n.Load() != 1 {
			t.Errorf("%d runs, want 1", k.n.Load())
		}
	})
}

// TestUpgradeFromEvalRelease: the release before issue 20 wrote format 2
// records too, and completed them with complete.lua sent whole with EVAL
// (testdata/format2-eval: that release's script text, verbatim, and the
// pending record its Reserve wrote). Its records replay after the upgrade;
// a key it reserved is completed by this release; and, in a rolling
// upgrade, a key this release reserved is completed by the old one.
func TestUpgradeFromEvalRelease(t *testing.T) {
	ctx := context.Background()
	c := redis.NewClient(redistest.ServerOptions(t))
	defer c.Close()
	s := newStore(t, c)
	read := func(name string) []byte {
		b, err := os.ReadFile("testdata/format2-eval/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	oldComplete, pending := string(read("complete.lua")), read("pending.bin")
	const oldToken = "0123456789abcdef0123456789abcdef"
	const oldFP = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"
	// oldCompleteNow runs the old release's Complete: the arguments it sent.
	oldCompleteNow := func(t *testing.T, rkey, token string, result []byte) {
		t.Helper()
		packed := make([]byte, len(token)/2)
		for i := range packed {
			var b byte
			for _, ch := range token[2*i : 2*i+2] {
				b <<= 4
				if ch >= 'a' {
					b |= byte(ch-'a') + 10
				} else {
					b |= byte(ch - '0')
				}
			}
			packed[i] = b
		}
		v, err := c.Eval(ctx, oldComplete, []string{rkey}, packed, result, 3600000, "idemkit:wake:"+redisrepo.DefaultKeyPrefix, 2, "publish").Result()
		if err != nil || v != int64(1) {
			t.Fatalf("the old release's complete = %v, %v", v, err)
		}
	}

	// Reserved and completed by the old release: this one replays it.
	done := newKey("upgrade-eval-done")
	if err := c.Set(ctx, s.Key(done), pending, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	oldCompleteNow(t, s.Key(done), oldToken, []byte(`{"id":1}`))
	rec, written, err := s.Reserve(ctx, done, pendingWrite(token(), oldFP, time.Minute))
	if err != nil || written || rec.State != idemstore.StateCompleted || string(rec.Result) != `{"id":1}` || rec.Fingerprint != oldFP || rec.Token != oldToken {
		t.Fatalf("Reserve of the old release's completed record = %+v, %v, %v", rec, written, err)
	}

	// Reserved by the old release, completed by this one.
	held := newKey("upgrade-eval-held")
	if err := c.Set(ctx, s.Key(held), pending, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Complete(ctx, held, oldToken, idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("r"), TTL: time.Minute}); !ok || err != nil {
		t.Fatalf("Complete of the old release's reservation = %v, %v", ok, err)
	}
	if rec, err := s.Get(ctx, held); err != nil || rec.State != idemstore.StateCompleted || string(rec.Result) != "r" || rec.Fingerprint != oldFP {
		t.Fatalf("Get = %+v, %v", rec, err)
	}

	// Reserved by this release, completed by the old one (a rolling upgrade).
	mixed := newKey("upgrade-eval-mixed")
	tok := token()
	mustReserve(t, s, mixed, pendingWrite(tok, oldFP, time.Minute))
	oldCompleteNow(t, s.Key(mixed), tok, []byte("old"))
	if rec, err := s.Get(ctx, mixed); err != nil || rec.State != idemstore.StateCompleted || string(rec.Result) != "old" || rec.Fingerprint != oldFP {
		t.Fatalf("Get = %+v, %v", rec, err)
	}
}
