package redisrepo_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

func TestKey(t *testing.T) {
	k := idemstore.Key{Operation: "payment.charge", Key: "order-42"}
	if got, want := redisrepo.New(nil).Key(k), "idempotency:payment.charge:order-42"; got != want {
		t.Errorf("default prefix: Key = %q, want %q", got, want)
	}
	if got, want := redisrepo.New(nil, redisrepo.WithKeyPrefix("app:{idem}:")).Key(k), "app:{idem}:payment.charge:order-42"; got != want {
		t.Errorf("WithKeyPrefix: Key = %q, want %q", got, want)
	}
	if got, want := redisrepo.New(nil, redisrepo.WithKeyPrefix("")).Key(k), "payment.charge:order-42"; got != want {
		t.Errorf("empty prefix: Key = %q, want %q", got, want)
	}
}

// TestRecordFormat pins the STRING that the Store writes, byte by byte:
// format version 2. A change here is a change of the format, which
// docs/architecture.md (The record) describes; old readers must keep reading
// what new writers write.
func TestRecordFormat(t *testing.T) {
	eachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		s := newStore(t, c)
		key := newKey("format")
		name := s.Key(key)
		tok := "00112233445566778899aabbccddeeff" // packed: 16 bytes
		fp := "FP-1"                              // not lowercase hex: as is

		mustReserve(t, s, key, pendingWrite(tok, fp, 30*time.Second))
		packedTok := "\x00\x11\x22\x33\x44\x55\x66\x77\x88\x99\xaa\xbb\xcc\xdd\xee\xff"
		wantValue(t, c, "pending record", name, "\x02\x01\x02\x10\x00\x04"+packedTok+"FP-1")
		checkPTTL(t, c, name, 30*time.Second)

		if ok, err := s.Complete(ctx, key, tok, idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("result\x00bytes"), TTL: time.Hour}); err != nil || !ok {
			t.Fatalf("Complete = %v, %v; want true", ok, err)
		}
		wantValue(t, c, "completed record", name, "\x02\x02\x02\x10\x00\x04"+packedTok+"FP-1result\x00bytes")
		checkPTTL(t, c, name, time.Hour)

		// A fingerprint of lowercase hex digits is packed too; a token that
		// is not hex is kept as is.
		key2 := newKey("format-completed")
		name2 := s.Key(key2)
		mustReserve(t, s, key2, completedWrite("tok", "0aff", nil, time.Minute))
		wantValue(t, c, "record written completed", name2, "\x02\x02\x04\x03\x00\x02tok\x0a\xff")
		checkPTTL(t, c, name2, time.Minute)
		if rec := mustGet(t, s, key2); rec.Token != "tok" || rec.Fingerprint != "0aff" || rec.Result == nil || len(rec.Result) != 0 {
			t.Errorf("Get = %+v, want token tok, fingerprint 0aff and an empty result", rec)
		}
	})
}

// wantValue checks the STRING under name.
func wantValue(t testing.TB, c redis.UniversalClient, what, name, want string) {
	t.Helper()
	got, err := c.Get(context.Background(), name).Result()
	if err != nil {
		t.Fatalf("%s: GET %s: %v", what, name, err)
	}
	if got != want {
		t.Errorf("%s: %q, want %q", what, got, want)
	}
}

// TestLegacyRecords: records of format 1, which releases before format 2
// wrote, still read as they did: pending and completed, with their TTL.
func TestLegacyRecords(t *testing.T) {
	eachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		s := newStore(t, c)
		key := newKey("legacy")
		name := s.Key(key)
		if err := c.HSet(ctx, name, "v", "1", "state", "pending", "token", "tok-1", "fp", "fp-1", "created_ms", "1").Err(); err != nil {
			t.Fatal(err)
		}
		c.PExpire(ctx, name, time.Minute)
		want := idemstore.Record{State: idemstore.StatePending, Token: "tok-1", Fingerprint: "fp-1"}
		for _, how := range []string{"Get", "Reserve", "Watch"} {
			var rec idemstore.Record
			var err error
			switch how {
			case "Get":
				rec, err = s.Get(ctx, key)
			case "Reserve":
				var ok bool
				rec, ok, err = s.Reserve(ctx, key, pendingWrite(token(), "fp-1", time.Minute))
				if ok {
					t.Fatalf("Reserve wrote over a format 1 record")
				}
			case "Watch":
				var stop func()
				rec, _, stop, err = s.Watch(ctx, key)
				if stop != nil {
					stop()
				}
			}
			if err != nil || rec.State != want.State || rec.Token != want.Token || rec.Fingerprint != want.Fingerprint || rec.TTL <= 0 {
				t.Errorf("%s of a pending format 1 record = %+v, %v; want %+v with a TTL", how, rec, err, want)
			}
		}
		// The owner scripts of format 2 never act on a format 1 record.
		if ok, err := s.Complete(ctx, key, "tok-1", idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("r"), TTL: time.Minute}); ok || err != nil {
			t.Errorf("Complete of a format 1 record = %v, %v; want false", ok, err)
		}
		if err := c.HSet(ctx, name, "state", "completed", "result", "r\x00").Err(); err != nil {
			t.Fatal(err)
		}
		rec, ok, err := s.Reserve(ctx, key, pendingWrite(token(), "fp-1", time.Minute))
		if err != nil || ok || rec.State != idemstore.StateCompleted || string(rec.Result) != "r\x00" || rec.Token != "tok-1" {
			t.Errorf("Reserve over a completed format 1 record = %+v, %v, %v; want it", rec, ok, err)
		}
		// A heal replaces it with a format 2 record, by its token.
		if _, ok, err := s.Reserve(ctx, key, replace(completedWrite("00ff", "fp-1", []byte("new"), time.Minute), "tok-1")); err != nil || !ok {
			t.Fatalf("Reserve replacing the format 1 record = %v, %v; want written", ok, err)
		}
		if rec := mustGet(t, s, key); rec.State != idemstore.StateCompleted || rec.Token != "00ff" || string(rec.Result) != "new" {
			t.Errorf("Get after the heal = %+v, want the new record", rec)
		}
	})
}

// TestRecordExtraFieldsIgnored: a reader ignores fields it does not know,
// so a later version may add fields without a new format version.
func TestRecordExtraFieldsIgnored(t *testing.T) {
	eachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		s := newStore(t, c)
		key := newKey("extra")
		name := s.Key(key)
		if err := c.HSet(ctx, name, "v", "1", "state", "completed", "token", "tok", "fp", "fp",
			"result", "r", "created_ms", "1", "added_later", "x").Err(); err != nil {
			t.Fatal(err)
		}
		c.PExpire(ctx, name, time.Minute)
		rec := mustGet(t, s, key)
		if rec.State != idemstore.StateCompleted || rec.Token != "tok" || rec.Fingerprint != "fp" || string(rec.Result) != "r" {
			t.Errorf("Get = %+v, want the completed record", rec)
		}
		// created_ms is informative: a record without it is readable.
		c.HDel(ctx, name, "created_ms")
		if rec := mustGet(t, s, key); rec.State != idemstore.StateCompleted {
			t.Errorf("Get without created_ms = %+v, want completed", rec)
		}
	})
}

// TestUnreadable plants every kind of value a reader cannot read and checks
// that each is reported as StateUnreadable with token "", is left alone by
// the owner scripts, and is healed by a Replace with ReplaceToken "".
func TestUnreadable(t *testing.T) {
	eachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		s := newStore(t, c)
		for _, u := range unreadables {
			t.Run(u.name, func(t *testing.T) {
				key := newKey("unreadable")
				plant(t, c, s.Key(key), u)
				want := idemstore.StateUnreadable
				// Read with GET, a STRING's TTL is unknown; the others are
				// read by a script, which reports it.
				if rec := mustGet(t, s, key); rec.State != want || rec.Token != "" || rec.Fingerprint != "" || rec.Result != nil || (rec.TTL <= 0) != u.string {
					t.Errorf("Get = %+v, want unreadable with token \"\" (and a TTL unless a STRING)", rec)
				}
				if rec, ok, err := s.Reserve(ctx, key, pendingWrite(token(), "", time.Minute)); err != nil || ok || rec.State != want {
					t.Errorf("Reserve without Replace = %+v, %v, %v; want the unreadable record, not written", rec, ok, err)
				}
				if rec, ok, err := s.Reserve(ctx, key, replace(pendingWrite(token(), "", time.Minute), "other")); err != nil || ok || rec.State != want {
					t.Errorf("Reserve replacing token \"other\" = %+v, %v, %v; want not written", rec, ok, err)
				}
				for name, call := range map[string]func() (bool, error){
					"Complete": func() (bool, error) {
						return s.Complete(ctx, key, "", idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("x"), TTL: time.Minute})
					},
					"Release": func() (bool, error) { return s.Release(ctx, key, "") },
					"Renew":   func() (bool, error) { return s.Renew(ctx, key, "", time.Minute) },
				} {
					if ok, err := call(); ok || err != nil {
						t.Errorf("%s with token \"\" = %v, %v; want false, nil", name, ok, err)
					}
				}
				if rec := mustGet(t, s, key); rec.State != want {
					t.Fatalf("Get after the refused calls = %+v, want still unreadable", rec)
				}

				tok := token()
				if rec, ok, err := s.Reserve(ctx, key, replace(pendingWrite(tok, "fp", time.Minute), "")); err != nil || !ok {
					t.Fatalf("Reserve replacing token \"\" = %+v, %v, %v; want written", rec, ok, err)
				}
				if rec := mustGet(t, s, key); rec.State != idemstore.StatePending || rec.Token != tok || rec.Fingerprint != "fp" {
					t.Fatalf("Get after the heal = %+v, want our pending record", rec)
				}
				if ok, err := s.Complete(ctx, key, tok, idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("healed"), TTL: time.Minute}); err != nil || !ok {
					t.Fatalf("Complete after the heal = %v, %v", ok, err)
				}
				if rec := mustGet(t, s, key); rec.State != idemstore.StateCompleted || string(rec.Result) != "healed" {
					t.Errorf("Get after completing the heal = %+v", rec)
				}
			})
		}
	})
}

func replace(w idemstore.Write, old string) idemstore.Write {
	w.Replace, w.ReplaceToken = true, old
	return w
}

// TestTTLMilliseconds: time to live goes to Redis in whole milliseconds,
// rounded up, and a time to live that is not positive is refused before
// Redis is touched.
func TestTTLMilliseconds(t *testing.T) {
	ctx := context.Background()
	c := redistest.Server(t)
	s := newStore(t, c)

	key := newKey("ttl-round")
	mustReserve(t, s, key, pendingWrite(token(), "", 1500*time.Millisecond+time.Microsecond))
	if ms := c.PTTL(ctx, s.Key(key)).Val(); ms <= 1400*time.Millisecond || ms > 1501*time.Millisecond {
		t.Errorf("PTTL after a lease of 1.500001s = %v, want at most 1.501s", ms)
	}

	key = newKey("ttl-zero")
	for _, ttl := range []time.Duration{0, -time.Second} {
		_, _, err := s.Reserve(ctx, key, pendingWrite(token(), "", ttl))
		checkStorageError(t, "Reserve with TTL "+ttl.String(), err, idemevent.MethodReserve)
		_, err = s.Complete(ctx, key, "t", idemstore.Completion{State: idemstore.StateCompleted, Result: nil, TTL: ttl})
		checkStorageError(t, "Complete with TTL "+ttl.String(), err, idemevent.MethodComplete)
		_, err = s.Renew(ctx, key, "t", ttl)
		checkStorageError(t, "Renew with TTL "+ttl.String(), err, idemevent.MethodRenew)
	}
	if n := c.Exists(ctx, s.Key(key)).Val(); n != 0 {
		t.Errorf("a refused write left the key behind")
	}
	_, _, err := s.Reserve(ctx, key, idemstore.Write{State: idemstore.StateAbsent, TTL: time.Second})
	checkStorageError(t, "Reserve of state absent", err, idemevent.MethodReserve)
}

func TestRecordTTL(t *testing.T) {
	eachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		s := newStore(t, c)
		key := newKey("record-ttl")
		name := s.Key(key)
		tok := token()
		mustReserve(t, s, key, pendingWrite(tok, "", time.Minute))
		checkPTTL(t, c, name, time.Minute)
		// GET does not report it: 0, unknown.
		if rec := mustGet(t, s, key); rec.TTL != 0 || rec.State != idemstore.StatePending {
			t.Errorf("Get = %+v, want pending with TTL 0", rec)
		}
		// Refused writes leave the TTL alone.
		if _, ok, err := s.Reserve(ctx, key, pendingWrite(token(), "", time.Hour)); ok || err != nil {
			t.Fatalf("second Reserve = %v, %v", ok, err)
		}
		if _, ok, err := s.Reserve(ctx, key, replace(pendingWrite(token(), "", time.Hour), tok)); ok || err != nil {
			t.Fatalf("Reserve replacing a pending record = %v, %v", ok, err)
		}
		checkPTTL(t, c, name, time.Minute)
		if ok, err := s.Renew(ctx, key, tok, 2*time.Minute); !ok || err != nil {
			t.Fatalf("Renew = %v, %v", ok, err)
		}
		checkPTTL(t, c, name, 2*time.Minute)
		if ok, err := s.Complete(ctx, key, tok, idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("r"), TTL: time.Hour}); !ok || err != nil {
			t.Fatalf("Complete = %v, %v", ok, err)
		}
		checkPTTL(t, c, name, time.Hour)
		if _, ok, err := s.Reserve(ctx, key, replace(completedWrite(token(), "", nil, 3*time.Minute), tok)); !ok || err != nil {
			t.Fatalf("Reserve replacing the completed record = %v, %v", ok, err)
		}
		checkPTTL(t, c, name, 3*time.Minute)
		c.Del(ctx, name)
	})
}

func TestCanceledContext(t *testing.T) {
	s := newStore(t, redistest.Server(t))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.Get(ctx, newKey("canceled"))
	checkStorageError(t, "Get with a cancelled context", err, idemevent.MethodGet)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Get with a cancelled context: %v, want it to match context.Canceled", err)
	}
}

// checkStorageError fails t unless err is a *coordinator.StorageError of
// method m that does not match redis.Nil.
func checkStorageError(t testing.TB, what string, err error, m idemevent.Method) {
	t.Helper()
	var se *coordinator.StorageError
	switch {
	case err == nil:
		t.Errorf("%s: nil error, want a *coordinator.StorageError", what)
	case !errors.As(err, &se):
		t.Errorf("%s: %T %v, want a *coordinator.StorageError", what, err, err)
	case se.Method != m:
		t.Errorf("%s: StorageError.Method = %q, want %q", what, se.Method, m)
	case !errors.Is(err, coordinator.ErrStorage):
		t.Errorf("%s: %v does not match coordinator.ErrStorage", what, err)
	case errors.Is(err, redis.Nil):
		t.Errorf("%s: %v matches redis.Nil", what, err)
	}
}

// serverTime returns the time of the Redis server that holds name.
func serverTime(t testing.TB, c redis.UniversalClient, name string) time.Time {
	t.Helper()
	ctx := context.Background()
	if cc, ok := c.(*redis.ClusterClient); ok {
		n, err := cc.MasterForKey(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return n.Time(ctx).Val()
	}
	tm, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

func checkPTTL(t testing.TB, c redis.UniversalClient, name string, ttl time.Duration) {
	t.Helper()
	got := c.PTTL(context.Background(), name).Val()
	if got <= ttl-5*time.Second || got > ttl {
		t.Errorf("PTTL %s = %v, want just under %v", name, got, ttl)
	}
}
