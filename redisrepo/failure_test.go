package redisrepo_test

import (
	"context"
	"errors"
	"fmt"
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

// calls returns one call of every Store method on key, each returning its
// error, with the method it should name in a *coordinator.StorageError.
func calls(s *redisrepo.Store, key idemstore.Key) []struct {
	method idemevent.Method
	call   func(ctx context.Context) error
} {
	return []struct {
		method idemevent.Method
		call   func(ctx context.Context) error
	}{
		{idemevent.MethodReserve, func(ctx context.Context) error {
			_, _, err := s.Reserve(ctx, key, pendingWrite(token(), "", time.Minute))
			return err
		}},
		{idemevent.MethodGet, func(ctx context.Context) error { _, err := s.Get(ctx, key); return err }},
		{idemevent.MethodComplete, func(ctx context.Context) error {
			_, err := s.Complete(ctx, key, "t", idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("r"), TTL: time.Minute})
			return err
		}},
		{idemevent.MethodRelease, func(ctx context.Context) error { _, err := s.Release(ctx, key, "t"); return err }},
		{idemevent.MethodRenew, func(ctx context.Context) error { _, err := s.Renew(ctx, key, "t", time.Minute); return err }},
	}
}

// noRetries returns opts with go-redis's retries off: no retry of a failed
// command (MaxRetries -1) and one dial per connection attempt (DialerRetries
// 1; go-redis v9.23 otherwise dials 5 times, 100ms apart, which makes every
// call on a dead server take 400ms or more).
func noRetries(opts *redis.Options) *redis.Options {
	opts.MaxRetries = -1
	opts.DialerRetries = 1
	opts.DialTimeout = 200 * time.Millisecond
	return opts
}

// TestUnreachable: a server nobody listens on (the original pull request's
// scenario: 127.0.0.1:1, retries off) gives a *coordinator.StorageError
// within milliseconds from every method.
func TestUnreachable(t *testing.T) {
	c := redis.NewClient(noRetries(&redis.Options{Addr: "127.0.0.1:1"}))
	defer c.Close()
	s := redisrepo.New(c)
	key := idemstore.Key{Operation: "op", Key: "k"}
	for _, m := range calls(s, key) {
		start := time.Now()
		err := m.call(context.Background())
		d := time.Since(start)
		if d > 100*time.Millisecond {
			t.Errorf("%s took %v against an unreachable server, want milliseconds", m.method, d)
		}
		t.Logf("%s: %v after %v", m.method, err, d)
		checkStorageError(t, string(m.method), err, m.method)
		if errors.Is(err, coordinator.ErrMisconfigured) {
			t.Errorf("%s: %v matches ErrMisconfigured; an unreachable server is an outage", m.method, err)
		}
	}
	if _, err := s.Inspect(context.Background(), key, key); err == nil || errors.Is(err, redis.Nil) {
		t.Errorf("Inspect against an unreachable server: %v, want an error", err)
	}
	if _, err := s.Forget(context.Background(), key); err == nil {
		t.Errorf("Forget against an unreachable server: nil error")
	}
	if err := s.LoadScripts(context.Background()); err == nil {
		t.Errorf("LoadScripts against an unreachable server: nil error")
	}
}

// TestServerKilledMidCall kills redis-server between Reserve and Complete:
// every call fails with a *coordinator.StorageError (no panic, no hang), and
// after a restart on the same port the first call works (the restarted
// server has neither the data nor the scripts cached).
//
// The client has retries off. Note that go-redis stops dialing after
// PoolSize failed dials in a row and then fails every call at once until a
// probe, once a second, reaches the server again: a client that failed that
// often may fail for up to a second after the server is back.
func TestServerKilledMidCall(t *testing.T) {
	ctx := context.Background()
	in := redistest.Start(t)
	c := redis.NewClient(noRetries(in.Options()))
	defer c.Close()
	s := redisrepo.New(c)
	key := idemstore.Key{Operation: "op", Key: "killed"}
	tok := token()
	mustReserve(t, s, key, pendingWrite(tok, "", time.Minute))

	in.Stop(t)
	start := time.Now()
	_, err := s.Complete(ctx, key, tok, idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("r"), TTL: time.Minute})
	checkStorageError(t, "Complete on a killed server", err, idemevent.MethodComplete)
	for _, m := range calls(s, key) {
		checkStorageError(t, string(m.method)+" on a killed server", m.call(ctx), m.method)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the calls on a killed server took %v", d)
	}

	in.Restart(t)
	rec, err := s.Get(ctx, key)
	if err != nil {
		t.Fatalf("first Get after the restart: %v", err)
	}
	if in.Kind() == redistest.KindRedisServer && rec.State != idemstore.StateAbsent {
		t.Errorf("Get after the restart = %+v, want absent (redis-server kept nothing)", rec)
	}
	if ok, err := s.Complete(ctx, key, tok, idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("r"), TTL: time.Minute}); err != nil {
		t.Errorf("Complete after the restart: %v", err)
	} else if in.Kind() == redistest.KindRedisServer && ok {
		t.Errorf("Complete after the restart = true: the reservation did not survive, want false (lease lost)")
	}
	mustReserve(t, s, idemstore.Key{Operation: "op", Key: "after-restart"}, pendingWrite(token(), "", time.Minute))

	// A restart that no call saw: the pooled connections are dead, and the
	// first call still works.
	in.Stop(t)
	in.Restart(t)
	if _, err := s.Get(ctx, key); err != nil {
		t.Errorf("first Get after an unseen restart: %v", err)
	}
}

// fakeScripter answers every command and script call with reply.
type fakeScripter struct {
	redis.Scripter
	reply func() *redis.Cmd
}

func (f fakeScripter) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return f.reply()
}

func (f fakeScripter) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return f.reply()
}

func (f fakeScripter) Process(ctx context.Context, cmd redis.Cmder) error {
	r := f.reply()
	switch c := cmd.(type) {
	case *redis.Cmd:
		c.SetVal(r.Val())
		c.SetErr(r.Err())
	case *redis.RawCmd: // the reply as Redis would have sent it
		switch v := r.Val().(type) {
		case nil:
			if r.Err() == redis.Nil {
				c.SetVal([]byte("$-1\r\n"))
			} else {
				c.SetErr(r.Err())
			}
		case string:
			c.SetVal(fmt.Appendf(nil, "$%d\r\n%s\r\n", len(v), v))
		case int64:
			c.SetVal(fmt.Appendf(nil, ":%d\r\n", v))
		default:
			c.SetVal([]byte("*1\r\n:1\r\n"))
		}
	}
	return cmd.Err()
}

// TestNilNeverEscapes: whatever go-redis returns, the Store never returns
// redis.Nil, and a reply of a shape Redis never sends is an error, not a
// panic and not a record. A nil reply is what GET and SET NX GET answer for
// an absent key, and a string what they answer for a record (readable or
// not): Get and Reserve take those as replies, the scripts as errors.
func TestNilNeverEscapes(t *testing.T) {
	key := idemstore.Key{Operation: "op", Key: "k"}
	for _, tc := range []struct {
		name  string
		reply func() *redis.Cmd
	}{
		{"redis.Nil", func() *redis.Cmd { return redis.NewCmdResult(nil, redis.Nil) }},
		{"wrapped redis.Nil", func() *redis.Cmd { return redis.NewCmdResult(nil, errors.Join(errors.New("x"), redis.Nil)) }},
		{"string", func() *redis.Cmd { return redis.NewCmdResult("OK", nil) }},
		{"integer 7", func() *redis.Cmd { return redis.NewCmdResult(int64(7), nil) }},
		{"short array", func() *redis.Cmd { return redis.NewCmdResult([]any{int64(1)}, nil) }},
		{"array of the wrong types", func() *redis.Cmd {
			return redis.NewCmdResult([]any{"1", int64(2), nil, "r", "ttl"}, nil)
		}},
		{"unknown state", func() *redis.Cmd { return redis.NewCmdResult([]any{int64(9), "", "", "", int64(1)}, nil) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := redisrepo.New(fakeScripter{reply: tc.reply})
			for _, m := range calls(s, key) {
				plain := m.method == idemevent.MethodGet || m.method == idemevent.MethodReserve
				if plain && (tc.name == "redis.Nil" || tc.name == "string") {
					if err := m.call(context.Background()); err != nil {
						t.Errorf("%s: %v, want a record", m.method, err)
					}
					continue
				}
				checkStorageError(t, string(m.method), m.call(context.Background()), m.method)
			}
			if _, err := s.Inspect(context.Background(), key); err == nil || errors.Is(err, redis.Nil) {
				t.Errorf("Inspect: %v, want an error that is not redis.Nil", err)
			}
			if _, err := s.Forget(context.Background(), key); errors.Is(err, redis.Nil) {
				t.Errorf("Forget: %v matches redis.Nil", err)
			}
		})
	}
}

// TestOldRedisIsNamed: a server before Redis 7.0 refuses SET with NX and
// GET as a syntax error; the storage error says what is needed.
func TestOldRedisIsNamed(t *testing.T) {
	s := redisrepo.New(fakeScripter{reply: func() *redis.Cmd {
		return redis.NewCmdResult(nil, replyError("ERR syntax error"))
	}})
	_, _, err := s.Reserve(context.Background(), idemstore.Key{Operation: "op", Key: "k"}, pendingWrite(token(), "", time.Minute))
	checkStorageError(t, "Reserve", err, idemevent.MethodReserve)
	if err == nil || !strings.Contains(err.Error(), "needs Redis 7.0 or newer") {
		t.Errorf("Reserve on a server before 7.0: %v, want it to say that Redis 7.0 is needed", err)
	}
}

// replyError is an error reply of Redis, as go-redis reports one.
type replyError string

func (e replyError) Error() string { return string(e) }

// RedisError makes it a redis.Error.
func (replyError) RedisError() {}

// TestRefusalsAreNotOutages: when Redis answers but refuses the client (a
// password rotated under the service, an ACL that lacks a permission, a
// database that does not exist), each single-key method of the Store,
// ReserveMany and GetMany return a *coordinator.StorageError that also
// matches coordinator.ErrMisconfigured,
// and the coordinator, in mode run, runs no action for it: a store that
// answers is not down.
func TestRefusalsAreNotOutages(t *testing.T) {
	in := redistest.Start(t)
	if in.Kind() != redistest.KindRedisServer {
		t.Skip("needs redis-server: miniredis does not answer like Redis to AUTH, ACL and SELECT")
	}
	admin := in.Client(t)
	if err := admin.Do(t.Context(), "ACL", "SETUSER", "nothing", "on", ">nothing-pw", "~*", "&*", "-@all").Err(); err != nil {
		t.Fatal(err)
	}
	clients := map[string]func(*redis.Options){
		"permission":  func(o *redis.Options) { o.Username, o.Password = "nothing", "nothing-pw" },
		"credentials": func(o *redis.Options) { o.Username, o.Password = "nothing", "a-wrong-pw" },
		"database":    func(o *redis.Options) { o.DB = 100000 },
	}
	for name, set := range clients {
		t.Run(name, func(t *testing.T) {
			opts := noRetries(in.Options())
			set(opts)
			client := redis.NewClient(opts)
			t.Cleanup(func() { _ = client.Close() })
			s := redisrepo.New(client)
			key := idemstore.Key{Operation: "op", Key: "refused-" + name}
			for _, c := range calls(s, key) {
				err := c.call(t.Context())
				var se *coordinator.StorageError
				if !errors.As(err, &se) || se.Method != c.method || !errors.Is(err, coordinator.ErrMisconfigured) {
					t.Fatalf("%s: %v (%T), want a *coordinator.StorageError for %s that matches ErrMisconfigured", c.method, err, err, c.method)
				}
				if !strings.Contains(err.Error(), "redis refused the client: "+name) {
					t.Fatalf("%s: %v, want it to say the refusal (%s)", c.method, err, name)
				}
			}
			two := []idemstore.Key{key, {Operation: key.Operation, Key: key.Key + "-2"}}
			_, _, err := s.ReserveMany(t.Context(), two, []idemstore.Write{pendingWrite(token(), "", time.Minute), pendingWrite(token(), "", time.Minute)}, false)
			if !errors.Is(err, coordinator.ErrMisconfigured) {
				t.Fatalf("ReserveMany: %v, want an error that matches ErrMisconfigured", err)
			}
			// A pipeline whose connection Redis refused as it was set up
			// (go-redis gives the refusal to none of its commands) is an
			// error too, never records read as absent.
			if recs, err := s.GetMany(t.Context(), two); !errors.Is(err, coordinator.ErrMisconfigured) {
				t.Fatalf("GetMany: %v, %v; want an error that matches ErrMisconfigured", recs, err)
			}
			if infos, err := s.Inspect(t.Context(), two...); err == nil {
				t.Fatalf("Inspect: %+v, want Redis's refusal", infos)
			}
			co, err := coordinator.New(s, coordinator.WithOnStorageError(coordinator.OnStorageErrorRun))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = co.Close() })
			runs := 0
			_, err = coordinator.Do(t.Context(), co, coordinator.Call{Operation: key.Operation, Key: key.Key}, func(context.Context) (string, error) {
				runs++
				return "charged", nil
			})
			if !errors.Is(err, coordinator.ErrMisconfigured) || runs != 0 {
				t.Fatalf("Do in mode run = %v after %d runs, want an error matching ErrMisconfigured and no run", err, runs)
			}
		})
	}
}

// TestBulkRefusalBeatsAnOutage: in a ReserveMany whose entries meet an
// outage (a node that timed out, first in the pipeline) and a refusal (an
// ACL that denies one key: on a cluster, ACLs are per node), the call's
// error, which every entry of unknown outcome takes, is the refusal, so
// that DoBatch in mode run runs neither of them unprotected; the entry
// Redis accepted runs under its reservation.
func TestBulkRefusalBeatsAnOutage(t *testing.T) {
	in := redistest.Start(t)
	if in.Kind() != redistest.KindRedisServer {
		t.Skip("needs redis-server: miniredis does not answer like Redis to ACL")
	}
	admin := in.Client(t)
	if err := admin.Do(t.Context(), "ACL", "SETUSER", "partial", "on", ">partial-pw", "~acl:op:ok-*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	opts := noRetries(in.Options())
	opts.Username, opts.Password = "partial", "partial-pw"
	client := redis.NewClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	s := redisrepo.New(client, redisrepo.WithKeyPrefix("acl:"))
	// Entry 0 is allowed but its command fails as a timed-out node's
	// would; entry 1 is denied; entry 2 is allowed and free.
	keys := []idemstore.Key{{Operation: "op", Key: "ok-0"}, {Operation: "op", Key: "no-1"}, {Operation: "op", Key: "ok-2"}}
	client.AddHook(failKey{name: s.Key(keys[0])})
	ws := []idemstore.Write{pendingWrite(token(), "", time.Minute), pendingWrite(token(), "", time.Minute), pendingWrite(token(), "", time.Minute)}
	_, written, err := s.ReserveMany(t.Context(), keys, ws, false)
	if !errors.Is(err, coordinator.ErrMisconfigured) || !written[2] {
		t.Fatalf("ReserveMany: written %v, %v; want the refusal (ErrMisconfigured) and entry 2 written", written, err)
	}

	more := []idemstore.Key{{Operation: "op", Key: "ok-batch-0"}, {Operation: "op", Key: "no-batch-1"}, {Operation: "op", Key: "ok-batch-2"}}
	client.AddHook(failKey{name: s.Key(more[0])})
	b := batchInRunMode(t, s, more)
	for i := range 2 {
		if b.runs[i].Load() != 0 || !errors.Is(b.errs[i], coordinator.ErrMisconfigured) {
			t.Errorf("call %d: %d runs, %v; want no run and the refusal", i, b.runs[i].Load(), b.errs[i])
		}
	}
	if b.runs[2].Load() != 1 || !b.protected[2].Load() || b.errs[2] != nil {
		t.Errorf("call 2: %d runs, protected %v, %v; want one run under its reservation", b.runs[2].Load(), b.protected[2].Load(), b.errs[2])
	}
}
