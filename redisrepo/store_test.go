package redisrepo_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

func TestKey(t *testing.T) {
	k := coordinator.Key{Operation: "payment.charge", Key: "order-42"}
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

// TestRecordFormat pins the HASH that the scripts write: format version 1.
// A change here is a change of the format, which docs/architecture.md (Redis layout)
// describes; old readers must keep reading what new writers write.
func TestRecordFormat(t *testing.T) {
	eachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		s := newStore(t, c)
		key := newKey("format")
		name := s.Key(key)
		tok := token()

		before := serverTime(t, c, name)
		mustReserve(t, s, key, pendingWrite(tok, "fp-1", 30*time.Second))
		fields := hgetall(t, c, name)
		created := fields["created_ms"]
		delete(fields, "created_ms")
		wantFields(t, "pending record", fields, map[string]string{
			"v": redisrepo.FormatVersion, "state": "pending", "token": tok, "fp": "fp-1",
		})
		checkCreated(t, created, before)
		checkPTTL(t, c, name, 30*time.Second)

		if ok, err := s.Complete(ctx, key, tok, []byte("result\x00bytes"), time.Hour); err != nil || !ok {
			t.Fatalf("Complete = %v, %v; want true", ok, err)
		}
		fields = hgetall(t, c, name)
		if fields["created_ms"] != created {
			t.Errorf("Complete changed created_ms from %q to %q", created, fields["created_ms"])
		}
		delete(fields, "created_ms")
		wantFields(t, "completed record", fields, map[string]string{
			"v": "1", "state": "completed", "token": tok, "fp": "fp-1", "result": "result\x00bytes",
		})
		checkPTTL(t, c, name, time.Hour)

		key2 := newKey("format-completed")
		name2 := s.Key(key2)
		mustReserve(t, s, key2, completedWrite(tok, "", nil, time.Minute))
		fields = hgetall(t, c, name2)
		checkCreated(t, fields["created_ms"], before)
		delete(fields, "created_ms")
		wantFields(t, "record written completed", fields, map[string]string{
			"v": "1", "state": "completed", "token": tok, "fp": "", "result": "",
		})
		checkPTTL(t, c, name2, time.Minute)
		if typ := c.Type(ctx, name2).Val(); typ != "hash" {
			t.Errorf("TYPE %s = %q, want hash", name2, typ)
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
		if rec.State != coordinator.StateCompleted || rec.Token != "tok" || rec.Fingerprint != "fp" || string(rec.Result) != "r" {
			t.Errorf("Get = %+v, want the completed record", rec)
		}
		// created_ms is informative: a record without it is readable.
		c.HDel(ctx, name, "created_ms")
		if rec := mustGet(t, s, key); rec.State != coordinator.StateCompleted {
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
				want := coordinator.StateUnreadable
				if rec := mustGet(t, s, key); rec.State != want || rec.Token != "" || rec.Fingerprint != "" || rec.Result != nil || rec.TTL <= 0 {
					t.Errorf("Get = %+v, want unreadable with token \"\" and a TTL", rec)
				}
				if rec, ok, err := s.Reserve(ctx, key, pendingWrite(token(), "", time.Minute)); err != nil || ok || rec.State != want {
					t.Errorf("Reserve without Replace = %+v, %v, %v; want the unreadable record, not written", rec, ok, err)
				}
				if rec, ok, err := s.Reserve(ctx, key, replace(pendingWrite(token(), "", time.Minute), "other")); err != nil || ok || rec.State != want {
					t.Errorf("Reserve replacing token \"other\" = %+v, %v, %v; want not written", rec, ok, err)
				}
				for name, call := range map[string]func() (bool, error){
					"Complete": func() (bool, error) { return s.Complete(ctx, key, "", []byte("x"), time.Minute) },
					"Release":  func() (bool, error) { return s.Release(ctx, key, "") },
					"Renew":    func() (bool, error) { return s.Renew(ctx, key, "", time.Minute) },
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
				if rec := mustGet(t, s, key); rec.State != coordinator.StatePending || rec.Token != tok || rec.Fingerprint != "fp" {
					t.Fatalf("Get after the heal = %+v, want our pending record", rec)
				}
				if ok, err := s.Complete(ctx, key, tok, []byte("healed"), time.Minute); err != nil || !ok {
					t.Fatalf("Complete after the heal = %v, %v", ok, err)
				}
				if rec := mustGet(t, s, key); rec.State != coordinator.StateCompleted || string(rec.Result) != "healed" {
					t.Errorf("Get after completing the heal = %+v", rec)
				}
			})
		}
	})
}

func replace(w coordinator.Write, old string) coordinator.Write {
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
		checkStorageError(t, "Reserve with TTL "+ttl.String(), err, coordinator.MethodReserve)
		_, err = s.Complete(ctx, key, "t", nil, ttl)
		checkStorageError(t, "Complete with TTL "+ttl.String(), err, coordinator.MethodComplete)
		_, err = s.Renew(ctx, key, "t", ttl)
		checkStorageError(t, "Renew with TTL "+ttl.String(), err, coordinator.MethodRenew)
	}
	if n := c.Exists(ctx, s.Key(key)).Val(); n != 0 {
		t.Errorf("a refused write left the key behind")
	}
	_, _, err := s.Reserve(ctx, key, coordinator.Write{State: coordinator.StateAbsent, TTL: time.Second})
	checkStorageError(t, "Reserve of state absent", err, coordinator.MethodReserve)
}

func TestRecordTTL(t *testing.T) {
	eachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		s := newStore(t, c)
		key := newKey("record-ttl")
		mustReserve(t, s, key, pendingWrite(token(), "", time.Minute))
		if rec := mustGet(t, s, key); rec.TTL <= 50*time.Second || rec.TTL > time.Minute {
			t.Errorf("Get: TTL %v, want about a minute", rec.TTL)
		}
		// A key without expiry (someone ran PERSIST) reports TTL 0: unknown.
		c.Persist(ctx, s.Key(key))
		if rec := mustGet(t, s, key); rec.TTL != 0 || rec.State != coordinator.StatePending {
			t.Errorf("Get of a persistent record = %+v, want pending with TTL 0", rec)
		}
		c.Del(ctx, s.Key(key))
	})
}

func TestCanceledContext(t *testing.T) {
	s := newStore(t, redistest.Server(t))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.Get(ctx, newKey("canceled"))
	checkStorageError(t, "Get with a cancelled context", err, coordinator.MethodGet)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Get with a cancelled context: %v, want it to match context.Canceled", err)
	}
}

// checkStorageError fails t unless err is a *coordinator.StorageError of
// method m that does not match redis.Nil.
func checkStorageError(t testing.TB, what string, err error, m coordinator.Method) {
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

func hgetall(t testing.TB, c redis.UniversalClient, name string) map[string]string {
	t.Helper()
	m, err := c.HGetAll(context.Background(), name).Result()
	if err != nil {
		t.Fatalf("HGETALL %s: %v", name, err)
	}
	return m
}

func wantFields(t testing.TB, what string, got, want map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: fields %q, want %q", what, got, want)
		return
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: field %s = %q, want %q (all: %q)", what, k, got[k], v, got)
		}
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

// checkCreated checks that created_ms is the server's time of the write.
func checkCreated(t testing.TB, created string, before time.Time) {
	t.Helper()
	ms, err := strconv.ParseInt(created, 10, 64)
	if err != nil {
		t.Errorf("created_ms %q: %v", created, err)
		return
	}
	at := time.UnixMilli(ms)
	if at.Before(before.Truncate(time.Millisecond)) || at.After(before.Add(10*time.Second)) {
		t.Errorf("created_ms %q = %v, want the server's time, just after %v", created, at, before)
	}
}

func checkPTTL(t testing.TB, c redis.UniversalClient, name string, ttl time.Duration) {
	t.Helper()
	got := c.PTTL(context.Background(), name).Val()
	if got <= ttl-5*time.Second || got > ttl {
		t.Errorf("PTTL %s = %v, want just under %v", name, got, ttl)
	}
}
