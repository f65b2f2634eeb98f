package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

func TestMain(m *testing.M) {
	redis.SetLogger(quiet{}) // as main does: the failed dials of the tests against a dead Redis
	goleak.VerifyTestMain(stopPostgresAfter(redistest.Main(m)),
		// After PoolSize failed dials (the tests against a dead Redis),
		// go-redis probes the server from a goroutine that sleeps a second
		// and then exits, even after Close: go-redis's, and bounded.
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

// stopPostgresAfter stops the tests' PostgreSQL, if one started, after m.
func stopPostgresAfter(m redistest.TestingM) redistest.TestingM { return postgresMain{m} }

type postgresMain struct{ m redistest.TestingM }

func (p postgresMain) Run() int {
	defer stopPostgres()
	return p.m.Run()
}

// backend is a Redis the tests run idemctl against.
type backend struct {
	client redis.UniversalClient // for the tests' own records
	env    map[string]string     // IDEMPOTENCY_* variables that point idemctl at it
	prefix string                // the test's key prefix, in env too
}

// eachBackend runs fn in a subtest on a standalone redis-server and on a
// three-master cluster, with a key prefix of the subtest's own.
func eachBackend(t *testing.T, fn func(t *testing.T, b backend)) {
	t.Helper()
	t.Run("Redis", func(t *testing.T) {
		prefix := redistest.Prefix(t)
		fn(t, backend{
			client: redistest.Server(t),
			prefix: prefix,
			env: map[string]string{
				"IDEMPOTENCY_REDIS_URL":  "redis://" + redistest.ServerOptions(t).Addr + "/0",
				"IDEMPOTENCY_KEY_PREFIX": prefix,
			},
		})
	})
	t.Run("Cluster", func(t *testing.T) {
		prefix := redistest.Prefix(t)
		fn(t, backend{
			client: redistest.Cluster(t),
			prefix: prefix,
			env: map[string]string{
				"IDEMPOTENCY_REDIS_CLUSTER_ADDRS": strings.Join(redistest.ClusterAddrs(t), ","),
				"IDEMPOTENCY_KEY_PREFIX":          prefix,
			},
		})
	})
}

// result is what one run of idemctl wrote and returned.
type result struct {
	stdout, stderr string
	code           int
}

// output returns everything the run wrote.
func (r result) output() string { return r.stdout + r.stderr }

// idemctl runs idemctl with args, in an environment of env alone (every
// other IDEMPOTENCY_* variable but IDEMPOTENCY_TEST_* unset until t ends),
// with stdin, which is a terminal when terminal is set. Tests that call it
// cannot run in parallel: the settings come from the process's environment.
func idemctl(t *testing.T, env map[string]string, stdin string, terminal bool, args ...string) result {
	t.Helper()
	setEnv(t, env)
	var stdout, stderr bytes.Buffer
	a := &app{stdin: strings.NewReader(stdin), stdout: &stdout, stderr: &stderr, terminal: terminal}
	code := a.run(t.Context(), args)
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// setEnv makes env the IDEMPOTENCY_* variables of the process until t ends.
func setEnv(t *testing.T, env map[string]string) {
	t.Helper()
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "IDEMPOTENCY_") && !strings.HasPrefix(name, "IDEMPOTENCY_TEST_") {
			t.Setenv(name, "") // restored when t ends
			_ = os.Unsetenv(name)
		}
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
}

// with returns env with the variables kv (name, value, ...) added.
func with(env map[string]string, kv ...string) map[string]string {
	out := make(map[string]string, len(env)+len(kv)/2)
	for k, v := range env {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// records writes records with a real coordinator on b's prefix, and holds
// keys pending with actions that wait until t ends (or release).
type records struct {
	t     *testing.T
	c     *coordinator.Coordinator
	store *redisrepo.Store
	wg    sync.WaitGroup
	once  sync.Once
	stop  chan struct{}
}

// newRecords returns a writer of records in format (Format2 or Format1).
func newRecords(t *testing.T, b backend, format redisrepo.RecordFormat) *records {
	t.Helper()
	store := redisrepo.New(b.client, redisrepo.WithKeyPrefix(b.prefix), redisrepo.WithRecordFormat(format))
	c, err := coordinator.New(store)
	if err != nil {
		t.Fatal(err)
	}
	r := &records{t: t, c: c, store: store, stop: make(chan struct{})}
	t.Cleanup(func() {
		r.release()
		_ = c.Close()
	})
	return r
}

// completed runs op's action for key, which returns result.
func (r *records) completed(op, key, fingerprint string, result []byte) {
	r.t.Helper()
	_, err := r.c.Execute(r.t.Context(), coordinator.Call{Operation: op, Key: key, Fingerprint: fingerprint, TTL: time.Hour},
		func(context.Context) ([]byte, error) { return result, nil })
	if err != nil {
		r.t.Fatalf("Execute(%s, %s): %v", op, key, err)
	}
}

// notReplayable writes a not-replayable record for op's key with reason, as
// the coordinator does for a result it could not keep.
func (r *records) notReplayable(op, key, reason string) {
	r.t.Helper()
	w := idemstore.Write{State: idemstore.StateNotReplayable, Token: "00000000000000aa", Result: []byte(reason), TTL: time.Hour}
	if _, ok, err := r.store.Reserve(r.t.Context(), idemstore.Key{Operation: op, Key: key}, w); err != nil || !ok {
		r.t.Fatalf("Reserve(%s, %s) = %v, %v", op, key, ok, err)
	}
}

// pending starts op's action for key and returns once it runs: the key is
// pending until release.
func (r *records) pending(op, key string) {
	r.t.Helper()
	running := make(chan struct{})
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		_, err := r.c.Execute(context.Background(), coordinator.Call{Operation: op, Key: key},
			func(context.Context) ([]byte, error) {
				close(running)
				<-r.stop
				return []byte("late"), nil
			})
		if err != nil {
			r.t.Errorf("Execute(%s, %s): %v", op, key, err)
		}
	}()
	select {
	case <-running:
	case <-time.After(10 * time.Second):
		r.t.Fatalf("the action of %s:%s did not start", op, key)
	}
}

// release ends the pending actions and waits for them.
func (r *records) release() {
	r.once.Do(func() { close(r.stop) })
	r.wg.Wait()
}

// state returns the state of op's key, read with Get.
func (r *records) state(op, key string) idemstore.State {
	r.t.Helper()
	rec, err := r.store.Get(r.t.Context(), idemstore.Key{Operation: op, Key: key})
	if err != nil {
		r.t.Fatal(err)
	}
	return rec.State
}
