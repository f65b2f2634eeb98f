package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// The store takes an AutoPipeliner as it is. The second check holds whether
// or not redisrepo.Client requires Process.
var (
	_ redisrepo.Client = (*redis.AutoPipeliner)(nil)
	_ interface {
		redis.Scripter
		Process(ctx context.Context, cmd redis.Cmder) error
	} = (*redis.AutoPipeliner)(nil)
)

// goredisProbe is go-redis's, not ours: see TestMain.
var goredisProbe = goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial")

// verifyNoLeaks is goleak.VerifyNone with the patience of a loaded machine:
// a goroutine that ends a few seconds after a client closed (a dial or a
// batch on a hung Redis finishing its timeout) is not a leak, and goleak's
// own retries wait less than half a second in all.
func verifyNoLeaks(t *testing.T, opts ...goleak.Option) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if goleak.Find(opts...) == nil {
			return
		}
	}
	goleak.VerifyNone(t, opts...)
}

// batchHook counts the store commands that a client sends in pipelines: an
// AutoPipeliner sends its batches through the client's pipeline hooks. The
// commands that go-redis pipelines when it opens a connection (CLIENT
// SETINFO, HELLO, ...) are not counted.
type batchHook struct {
	batches, cmds, largest atomic.Int64
}

func (h *batchHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *batchHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *batchHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var n int64
		for _, cmd := range cmds {
			switch cmd.Name() {
			case "client", "hello", "auth", "select", "readonly":
			default:
				n++
			}
		}
		if n > 0 {
			h.batches.Add(1)
			h.cmds.Add(n)
			for l := h.largest.Load(); n > l && !h.largest.CompareAndSwap(l, n); l = h.largest.Load() {
			}
		}
		return next(ctx, cmds)
	}
}

// storm has callers goroutines call Do on every one of keys, each starting
// at a key of its own, and checks that each key's action ran exactly once and
// that every caller got that run's result.
func storm(t *testing.T, c *coordinator.Coordinator, op string, callers int, keys []string) {
	t.Helper()
	effects := make(map[string]*atomic.Int64, len(keys))
	for _, k := range keys {
		effects[k] = new(atomic.Int64)
	}
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			for j := range keys {
				k := keys[(i+j)%len(keys)]
				got, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: op, Key: k}, func(context.Context) (string, error) {
					n := effects[k].Add(1)
					time.Sleep(5 * time.Millisecond) // the others find it pending
					return k + "#" + strconv.FormatInt(n, 10), nil
				})
				if err != nil || got != k+"#1" {
					t.Errorf("caller %d, key %s: %q, %v; want %q", i, k, got, err, k+"#1")
				}
			}
		})
	}
	wg.Wait()
	for _, k := range keys {
		if n := effects[k].Load(); n != 1 {
			t.Errorf("key %s: the action ran %d times, want once", k, n)
		}
	}
}

// firstRunAndReplay checks one first run and its replay.
func firstRunAndReplay(t *testing.T, c *coordinator.Coordinator, key string) {
	t.Helper()
	var runs atomic.Int64
	call := coordinator.Call{Operation: "payment.charge", Key: key}
	first, err := coordinator.DoResult(t.Context(), c, call, charge(&runs))
	if err != nil || first.Replayed {
		t.Fatalf("first run: %+v, %v; want a run", first, err)
	}
	again, err := coordinator.DoResult(t.Context(), c, call, charge(&runs))
	if err != nil || !again.Replayed || again.Value != first.Value || runs.Load() != 1 {
		t.Fatalf("second call: %+v, %v, %d runs; want the replay of %q", again, err, runs.Load(), first.Value)
	}
}

// stormKeys are the keys of the storms: on a cluster, in slots of every
// master.
func stormKeys(prefix string) []string {
	return []string{prefix + "a", prefix + "b", prefix + "c", prefix + "d"}
}

// The module with IDEMPOTENCY_REDIS_AUTO_PIPELINE on, on real Redis: a first
// run and its replay, 64 concurrent callers on four keys, and a stop that
// closes the AutoPipeliner with the client and leaves no goroutine behind.
func TestModuleWithAutoPipeline(t *testing.T) {
	for _, topology := range []string{"standalone", "cluster"} {
		t.Run(topology, func(t *testing.T) {
			clearEnv(t)
			if topology == "cluster" {
				addrs := redistest.ClusterAddrs(t) // skips without redis-server, fails with IDEMPOTENCY_TEST_REQUIRE_REDIS=1
				t.Setenv("IDEMPOTENCY_REDIS_CLUSTER_ADDRS", strings.Join(addrs, ","))
			} else {
				t.Setenv("IDEMPOTENCY_REDIS_URL", "redis://"+redistest.ServerOptions(t).Addr+"/0")
			}
			t.Setenv("IDEMPOTENCY_KEY_PREFIX", redistest.Prefix(t))
			t.Setenv("IDEMPOTENCY_REDIS_AUTO_PIPELINE", "true")
			defer verifyNoLeaks(t, goleak.IgnoreCurrent(), goredisProbe) // the shared servers run on

			_, regOpt := registry()
			var c *coordinator.Coordinator
			var store coordinator.Store
			var admin *redisrepo.Store
			var s idempotency.Settings
			app := fxtest.New(t, idempotency.Module, regOpt, fx.Supply(zap.NewNop()), fx.Populate(&c, &store, &admin, &s))
			app.RequireStart()
			if !s.RedisAutoPipeline {
				t.Fatal("Settings.RedisAutoPipeline is false with IDEMPOTENCY_REDIS_AUTO_PIPELINE=true")
			}
			firstRunAndReplay(t, c, "first")
			keys := stormKeys("storm-")
			storm(t, c, "payment.charge", 64, keys)

			// The operator tools, several keys at once (one pipeline).
			var ks []coordinator.Key
			for _, k := range keys {
				ks = append(ks, coordinator.Key{Operation: "payment.charge", Key: k})
			}
			infos, err := admin.Inspect(t.Context(), ks...)
			if err != nil || len(infos) != len(keys) {
				t.Fatalf("Inspect() = %+v, %v; want %d records", infos, err, len(keys))
			}
			for _, info := range infos {
				if info.State != coordinator.StateCompleted {
					t.Errorf("Inspect(): %+v; want completed", info)
				}
			}
			app.RequireStop()

			// The store went through the client that stop closed.
			_, err = store.Get(t.Context(), coordinator.Key{Operation: "payment.charge", Key: "first"})
			if !errors.Is(err, redis.ErrClosed) {
				t.Fatalf("after stop: %v, want redis: client is closed", err)
			}
		})
	}
}

// What NewStoreClient returns batches concurrent calls (the client's pipeline
// hook sees batches of more than one command) on the client NewRedisClient
// builds, and so does the store's coalescing, the default; with both off,
// nothing goes in pipelines.
func TestNewStoreClientBatches(t *testing.T) {
	for _, topology := range []string{"standalone", "cluster"} {
		for _, mode := range []string{"auto_pipeline", "coalesce", "off"} {
			t.Run(topology+"/"+mode, func(t *testing.T) {
				s := idempotency.DefaultSettings()
				if topology == "cluster" {
					s.RedisClusterAddrs = redistest.ClusterAddrs(t)
				} else {
					s.RedisURL = "redis://" + redistest.ServerOptions(t).Addr + "/0"
				}
				s.KeyPrefix = redistest.Prefix(t)
				s.RedisAutoPipeline = mode == "auto_pipeline"
				if mode == "off" {
					s.RedisCoalesceLanes = 0
				}
				defer verifyNoLeaks(t, goleak.IgnoreCurrent(), goredisProbe)

				client, err := idempotency.NewRedisClient(s)
				if err != nil {
					t.Fatal(err)
				}
				hook := &batchHook{}
				client.AddHook(hook)
				sc, err := idempotency.NewStoreClient(s, client)
				if err != nil {
					t.Fatal(err)
				}
				if !s.RedisAutoPipeline && sc != redisrepo.Client(client) {
					t.Fatalf("auto-pipelining off: NewStoreClient returned %T, want the client itself", sc)
				}
				c, err := idempotency.NewCoordinator(s, idempotency.NewStore(s, sc), nil)
				if err != nil {
					t.Fatal(err)
				}
				firstRunAndReplay(t, c, "first")
				storm(t, c, "op", 64, stormKeys("storm-"))
				if err := c.Close(); err != nil {
					t.Fatal(err)
				}
				if err := client.Close(); err != nil {
					t.Fatal(err)
				}
				largest := hook.largest.Load()
				t.Logf("%d commands in %d pipelines, the largest of %d", hook.cmds.Load(), hook.batches.Load(), largest)
				if mode != "off" && largest < 2 {
					t.Errorf("%s: the largest pipeline had %d commands; want concurrent calls batched", mode, largest)
				}
				if mode == "off" && largest != 0 {
					t.Errorf("auto-pipelining and coalescing off: %d commands went in pipelines; want none", hook.cmds.Load())
				}
			})
		}
	}
}

// With the app's own client (UseRedisClient) the setting applies too: the
// store goes through that client's AutoPipeliner, which the module does not
// close on stop; it closes with the client.
func TestModuleWithAutoPipelineOverTheAppsClient(t *testing.T) {
	clearEnv(t)
	t.Setenv("IDEMPOTENCY_REDIS_URL", "redis://127.0.0.1:1/0") // ignored: the app's client wins
	t.Setenv("IDEMPOTENCY_KEY_PREFIX", redistest.Prefix(t))
	t.Setenv("IDEMPOTENCY_REDIS_AUTO_PIPELINE", "true")
	opts := redistest.ServerOptions(t)
	defer verifyNoLeaks(t, goleak.IgnoreCurrent(), goredisProbe)

	opts.ContextTimeoutEnabled = true
	client := redis.NewClient(opts)
	hook := &batchHook{}
	client.AddHook(hook)
	_, regOpt := registry()
	var c *coordinator.Coordinator
	app := fxtest.New(t, fx.Supply(client), idempotency.Module, idempotency.UseRedisClient[*redis.Client](),
		regOpt, fx.Supply(zap.NewNop()), fx.Populate(&c))
	app.RequireStart()
	firstRunAndReplay(t, c, "first")
	storm(t, c, "op", 64, stormKeys("storm-"))
	app.RequireStop()
	if hook.largest.Load() < 2 {
		t.Errorf("the largest pipeline on the app's client had %d commands; want concurrent calls batched", hook.largest.Load())
	}

	// Still open after stop: the client, and its AutoPipeliner (go-redis
	// caches one per client, so this is the store's).
	ap, err := client.AutoPipeline()
	if err != nil {
		t.Fatalf("the app's client after stop: %v", err)
	}
	if ap.IsClosed() {
		t.Fatal("the module closed the app's AutoPipeliner on stop")
	}
	if err := ap.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("the app's AutoPipeliner after stop: %v", err)
	}
	if err := client.Close(); err != nil {
		t.Fatal(err)
	}
	if !ap.IsClosed() {
		t.Fatal("closing the client left its AutoPipeliner open")
	}
}

// A client that cannot auto-pipeline stops start-up, naming the variable.
func TestModuleWithAutoPipelineRefusesARing(t *testing.T) {
	clearEnv(t)
	t.Setenv("IDEMPOTENCY_REDIS_AUTO_PIPELINE", "true")
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	_, regOpt := registry()
	var c *coordinator.Coordinator
	app := fx.New(fx.NopLogger, fx.Supply(ring), idempotency.Module, idempotency.UseRedisClient[*redis.Ring](), regOpt, fx.Populate(&c))
	err := app.Err()
	const want = "IDEMPOTENCY_REDIS_AUTO_PIPELINE: the Redis client (*redis.Ring) cannot auto-pipeline: "
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v\nwant it to contain %q", err, want)
	}
}

// With auto-pipelining the client's read and write timeouts are at most the
// storage timeout; without it they are left as they are.
func TestNewRedisClientTimeoutsWithAutoPipeline(t *testing.T) {
	const storage = 250 * time.Millisecond
	tests := []struct {
		name, query string
		on          bool
		read, write time.Duration
	}{
		{name: "off: go-redis's defaults", read: 5 * time.Second, write: 5 * time.Second},
		{name: "off: the URL's", query: "?read_timeout=10s&write_timeout=-1", read: 10 * time.Second, write: 0},
		{name: "on: unset", on: true, read: storage, write: storage},
		{name: "on: longer", query: "?read_timeout=10s&write_timeout=3s", on: true, read: storage, write: storage},
		{name: "on: disabled", query: "?read_timeout=-1&write_timeout=0", on: true, read: storage, write: storage},
		{name: "on: shorter is kept", query: "?read_timeout=100ms", on: true, read: 100 * time.Millisecond, write: storage},
	}
	for _, tt := range tests {
		for _, topology := range []string{"standalone", "cluster"} {
			t.Run(tt.name+"/"+topology, func(t *testing.T) {
				s := idempotency.DefaultSettings()
				s.RedisURL = "redis://127.0.0.1:1/0" + tt.query
				s.StorageTimeout = storage
				s.RedisAutoPipeline = tt.on
				if topology == "cluster" {
					s.RedisClusterAddrs = []string{"127.0.0.1:1"}
				}
				client, err := idempotency.NewRedisClient(s)
				if err != nil {
					t.Fatal(err)
				}
				defer client.Close()
				var read, write time.Duration
				switch c := client.(type) {
				case *redis.Client:
					read, write = c.Options().ReadTimeout, c.Options().WriteTimeout
				case *redis.ClusterClient:
					read, write = c.Options().ReadTimeout, c.Options().WriteTimeout
				}
				if read != tt.read || write != tt.write {
					t.Errorf("read and write timeouts %v, %v; want %v, %v", read, write, tt.read, tt.write)
				}
			})
		}
	}
}

// freezableRedis starts a redis-server of the test's own, which freeze stops
// (SIGSTOP: a stall, a blackholed link) and thaw resumes. It skips without
// redis-server.
func freezableRedis(t testing.TB) (url string, freeze, thaw func()) {
	t.Helper()
	bin := redistest.ServerBinary(t).Path // a hung server needs a real one (miniredis cannot be frozen)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	srv := exec.Command(bin, "--port", strconv.Itoa(port), "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	thaw = func() { _ = srv.Process.Signal(syscall.SIGCONT) }
	t.Cleanup(func() {
		thaw()
		_ = srv.Process.Kill()
		_ = srv.Wait()
	})
	url = "redis://127.0.0.1:" + strconv.Itoa(port) + "/0"
	opts, _ := redis.ParseURL(url)
	probe := redis.NewClient(opts)
	defer probe.Close()
	for deadline := time.Now().Add(5 * time.Second); probe.Ping(t.Context()).Err() != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("redis-server does not answer")
		}
	}
	return url, func() { _ = srv.Process.Signal(syscall.SIGSTOP) }, thaw
}

// go-redis runs an auto-pipelined command on a context of its own: against a
// frozen Redis a call would wait out go-redis's read timeouts and retries (35s
// measured with its defaults). The storage timeout still bounds every call,
// the caller's command is not written once Process has returned, and closing
// the client, which waits for the batch in flight, takes a few storage
// timeouts, not go-redis's 30s backstop.
func TestHungRedisWithAutoPipeline(t *testing.T) {
	url, freeze, thaw := freezableRedis(t)
	s := idempotency.DefaultSettings()
	s.RedisURL = url
	s.StorageTimeout = 100 * time.Millisecond
	s.OnStorageError = coordinator.OnStorageErrorRaise
	s.RedisAutoPipeline = true
	defer verifyNoLeaks(t, goleak.IgnoreCurrent(), goredisProbe)

	client, err := idempotency.NewRedisClient(s)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := idempotency.NewStoreClient(s, client)
	if err != nil {
		t.Fatal(err)
	}
	c, err := idempotency.NewCoordinator(s, idempotency.NewStore(s, sc), nil)
	if err != nil {
		t.Fatal(err)
	}
	ok := func(context.Context) (int, error) { return 1, nil }
	if _, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: "op", Key: "warm"}, ok); err != nil {
		t.Fatal(err)
	}

	freeze()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			start := time.Now()
			_, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: "op", Key: "hung-" + strconv.Itoa(i)}, ok)
			if d := time.Since(start); d > time.Second || !errors.Is(err, coordinator.ErrStorage) {
				t.Errorf("Do took %v on a hung Redis with IDEMPOTENCY_STORAGE_TIMEOUT=100ms: %v; want ErrStorage at once", d, err)
			}
		})
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	cmd, raw := redis.NewCmd(ctx, "get", "hung"), redis.NewRawCmd(ctx, "get", "hung")
	for _, cmd := range []redis.Cmder{cmd, raw} {
		start := time.Now()
		err = sc.Process(ctx, cmd)
		if d := time.Since(start); d > time.Second || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(cmd.Err(), context.DeadlineExceeded) {
			t.Errorf("Process(%T): %v after %v, command error %v; want the deadline at once", cmd, err, d, cmd.Err())
		}
	}
	wg.Wait()
	// The calls left their commands behind without a goroutine of ours to
	// wait for each: only go-redis's own wait for the hung batch.
	buf := make([]byte, 1<<20)
	if stacks := string(buf[:runtime.Stack(buf, true)]); strings.Contains(stacks, "created by github.com/idemkit/idempotency.(*pipelinedClient)") {
		t.Errorf("goroutines that pipelinedClient started outlive the calls that timed out:\n%s", stacks)
	}

	start := time.Now()
	if err := c.Close(); err != nil {
		t.Error(err)
	}
	_ = client.Close()
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("closing took %v on a hung Redis", d)
	}
	t.Logf("closed in %v on a hung Redis", time.Since(start))
	thaw()
	// The command left behind has run its course; the caller's is as
	// Process left it (the race detector sees any write to it).
	if !errors.Is(cmd.Err(), context.DeadlineExceeded) || cmd.Val() != nil || !errors.Is(raw.Err(), context.DeadlineExceeded) || raw.Val() != nil {
		t.Errorf("the caller's commands changed after Process returned: %v, %v; %v, %q", cmd.Val(), cmd.Err(), raw.Err(), raw.Val())
	}
}

// On a hung Redis, closing the client waits for the batches queued in its
// AutoPipeliner, each for its read timeout on every attempt (14.6s measured
// with the default storage timeout of 1s). fx's stop timeout still bounds the
// app's stop, and the client finishes closing in the background without
// leaving a goroutine behind.
func TestModuleWithAutoPipelineStopsInTimeOnAHungRedis(t *testing.T) {
	url, freeze, thaw := freezableRedis(t)
	clearEnv(t)
	t.Setenv("IDEMPOTENCY_REDIS_URL", url)
	t.Setenv("IDEMPOTENCY_REDIS_AUTO_PIPELINE", "true")
	t.Setenv("IDEMPOTENCY_ON_STORAGE_ERROR", "raise")
	t.Setenv("IDEMPOTENCY_STORAGE_TIMEOUT", "100ms") // the coordinator's stop waits for its background releases
	// Without the breaker, which would refuse most calls before they reach
	// the hung pipeline: the worst case.
	t.Setenv("IDEMPOTENCY_BREAKER_FAILURES", "0")
	defer verifyNoLeaks(t, goleak.IgnoreCurrent(), goredisProbe)

	_, regOpt := registry()
	var c *coordinator.Coordinator
	app := fx.New(fx.NopLogger, idempotency.Module, regOpt, fx.Supply(zap.NewNop()), fx.Populate(&c))
	if err := app.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	ok := func(context.Context) (int, error) { return 1, nil }
	if _, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: "op", Key: "warm"}, ok); err != nil {
		t.Fatal(err)
	}
	freeze()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			_, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: "op", Key: "hung-" + strconv.Itoa(i)}, ok)
			if !errors.Is(err, coordinator.ErrStorage) {
				t.Errorf("Do on a hung Redis: %v, want ErrStorage", err)
			}
		})
	}
	wg.Wait()

	// Closing the client alone takes about 2s here (TestHungRedisWithAutoPipeline).
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	start := time.Now()
	err := app.Stop(ctx)
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Errorf("stop took %v with a stop timeout of 1s", d)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("stop: %v, want fx's stop timeout", err)
	}
	thaw() // the client closes in the background; goleak waits for it
}

// The store's optional methods (Pub/Sub for its wake-ups, pipelines for
// Inspect and Forget) are there with auto-pipelining, and Process gives the
// reply of every kind of command: through the AutoPipeliner for a *redis.Cmd
// and a *redis.RawCmd, on the client for the others.
func TestNewStoreClientKeepsTheOptionalMethods(t *testing.T) {
	s := idempotency.DefaultSettings()
	s.RedisURL = "redis://" + redistest.ServerOptions(t).Addr + "/0"
	s.RedisAutoPipeline = true
	client, err := idempotency.NewRedisClient(s)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	sc, err := idempotency.NewStoreClient(s, client)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := sc.(interface {
		Subscribe(ctx context.Context, channels ...string) *redis.PubSub
	}); !ok {
		t.Errorf("%T has no Subscribe: the store would poll instead of waking its waiters", sc)
	}
	if _, ok := sc.(interface{ Pipeline() redis.Pipeliner }); !ok {
		t.Errorf("%T has no Pipeline: Inspect and Forget would make a round trip per key", sc)
	}

	key := redistest.Prefix(t) + "k"
	if err := client.Set(t.Context(), key, "v", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	str := redis.NewStringCmd(t.Context(), "get", key)
	if err := sc.Process(t.Context(), str); err != nil || str.Val() != "v" {
		t.Fatalf("Process(*redis.StringCmd) = %v, %q; want v", err, str.Val())
	}
	cmd := redis.NewCmd(t.Context(), "get", key)
	if err := sc.Process(t.Context(), cmd); err != nil || cmd.Val() != "v" {
		t.Fatalf("Process(*redis.Cmd) = %v, %v; want v", err, cmd.Val())
	}
	raw := redis.NewRawCmd(t.Context(), "get", key)
	if err := sc.Process(t.Context(), raw); err != nil || string(raw.Val()) != "$1\r\nv\r\n" {
		t.Fatalf("Process(*redis.RawCmd) = %v, %q; want the bulk string v", err, raw.Val())
	}
	missing := redis.NewCmd(t.Context(), "get", key+"-missing")
	if err := sc.Process(t.Context(), missing); err != redis.Nil || missing.Err() != redis.Nil {
		t.Fatalf("Process of a missing key = %v (command %v); want redis.Nil", err, missing.Err())
	}
}

// BenchmarkAutoPipelineReplay: replays (one store round trip each) through
// coordinator.Do, from 1 and from 64 goroutines, with auto-pipelining off and
// on. ns/op is a call's latency with one caller, and the inverse of the
// throughput with 64. Compare with
//
//	go test -run '^$' -bench BenchmarkAutoPipelineReplay -count 6 . | tee ap.out
//	go run golang.org/x/perf/cmd/benchstat@latest -col /auto_pipeline ap.out
func BenchmarkAutoPipelineReplay(b *testing.B) {
	for _, callers := range []int{1, 64} {
		for _, on := range []bool{false, true} {
			b.Run(fmt.Sprintf("callers=%d/auto_pipeline=%v", callers, on), func(b *testing.B) {
				s := idempotency.DefaultSettings()
				s.RedisURL = "redis://" + redistest.ServerOptions(b).Addr + "/0"
				s.KeyPrefix = redistest.Prefix(b)
				s.RedisAutoPipeline = on
				s.MetricsEnabled = false
				client, err := idempotency.NewRedisClient(s)
				if err != nil {
					b.Fatal(err)
				}
				defer client.Close()
				sc, err := idempotency.NewStoreClient(s, client)
				if err != nil {
					b.Fatal(err)
				}
				c, err := idempotency.NewCoordinator(s, idempotency.NewStore(s, sc), nil)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				const keys = 64
				action := func(context.Context) (string, error) { return `{"id":"ch_1","amount":1000}`, nil }
				for k := range keys {
					if _, err := coordinator.Do(b.Context(), c, coordinator.Call{Operation: "bench", Key: strconv.Itoa(k)}, action); err != nil {
						b.Fatal(err)
					}
				}
				var next atomic.Int64
				replay := func() {
					k := next.Add(1) % keys
					if _, err := coordinator.Do(b.Context(), c, coordinator.Call{Operation: "bench", Key: strconv.FormatInt(k, 10)}, action); err != nil {
						b.Error(err)
					}
				}
				b.ReportAllocs()
				b.ResetTimer()
				if callers == 1 {
					for b.Loop() {
						replay()
					}
					return
				}
				// RunParallel runs parallelism × GOMAXPROCS goroutines.
				b.SetParallelism(max(1, callers/runtime.GOMAXPROCS(0)))
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						replay()
					}
				})
			})
		}
	}
}

// Over a cluster, the auto-pipelined store client can reload the slot map
// (ReloadState), which is how the store knows that it talks to a cluster and
// rides through a resharding: a removed node's refused dials, and the
// circuit breaker they open, are sent again once the map is reloaded
// (docs/reliability.md, finding 8; TestReshardUnderTraffic in the full
// suite). Over a single server it cannot, so a server that is down fails at
// once, as without auto-pipelining.
func TestNewStoreClientRidesThroughAReshard(t *testing.T) {
	type reloader interface{ ReloadState(context.Context) }
	s := idempotency.DefaultSettings()
	s.RedisAutoPipeline = true
	cluster := redistest.Cluster(t)
	sc, err := idempotency.NewStoreClient(s, cluster)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := sc.(reloader); !ok {
		t.Errorf("the auto-pipelined client of a cluster (%T) cannot reload the slot map: the store would not ride through a resharding", sc)
	}
	single := redis.NewClient(redistest.ServerOptions(t))
	defer single.Close()
	sc, err = idempotency.NewStoreClient(s, single)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := sc.(reloader); ok {
		t.Errorf("the auto-pipelined client of one server (%T) claims a slot map: a server that is down would be retried as a resharding", sc)
	}
}
