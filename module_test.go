package idempotency_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/coordinator/memstore"
	idemfxtest "github.com/idemkit/idempotency/fxtest"
	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(redistest.Main(m),
		// After PoolSize failed dials (tests against a dead Redis), go-redis
		// probes the server from a goroutine that sleeps a second and then
		// exits, even after Close: go-redis's, not ours, and bounded.
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

// registry returns a fresh Prometheus registry, provided to the graph as the
// prometheus.Registerer interface (the type Module looks for).
func registry() (*prometheus.Registry, fx.Option) {
	reg := prometheus.NewRegistry()
	return reg, fx.Supply(fx.Annotate(reg, fx.As(new(prometheus.Registerer))))
}

func charge(runs *atomic.Int64) func(context.Context) (string, error) {
	return func(context.Context) (string, error) {
		n := runs.Add(1)
		return "ch_" + string(rune('0'+n)), nil
	}
}

func TestModuleCoordinatesThroughRedis(t *testing.T) {
	clearEnv(t)
	opts := redistest.ServerOptions(t)
	prefix := redistest.Prefix(t)
	t.Setenv("IDEMPOTENCY_REDIS_URL", "redis://"+opts.Addr+"/0")
	t.Setenv("IDEMPOTENCY_KEY_PREFIX", prefix)
	_, regOpt := registry()
	var c *coordinator.Coordinator
	var s idempotency.Settings
	app := fxtest.New(t, idempotency.Module, regOpt, fx.Populate(&c, &s))
	app.RequireStart()
	defer app.RequireStop()

	if s.KeyPrefix != prefix {
		t.Fatalf("settings not from the environment: prefix %q", s.KeyPrefix)
	}
	var runs atomic.Int64
	call := coordinator.Call{Operation: "payment.charge", Key: "fx-1"}
	a, err := coordinator.Do(t.Context(), c, call, charge(&runs))
	if err != nil {
		t.Fatal(err)
	}
	b, err := coordinator.Do(t.Context(), c, call, charge(&runs))
	if err != nil || a != b || runs.Load() != 1 {
		t.Fatalf("a=%q b=%q err=%v runs=%d", a, b, err, runs.Load())
	}
	client := redistest.Server(t)
	if n, err := client.Exists(t.Context(), prefix+"payment.charge:fx-1").Result(); err != nil || n != 1 {
		t.Fatalf("the record is not in Redis under the prefix: %d, %v", n, err)
	}
}

func TestModuleWithMemoryStoreNeedsNoRedis(t *testing.T) {
	clearEnv(t)
	t.Setenv("IDEMPOTENCY_REDIS_URL", "redis://127.0.0.1:1/0") // never dialled
	_, regOpt := registry()
	var c *coordinator.Coordinator
	var mem *memstore.Store
	app := fxtest.New(t, idempotency.Module, idemfxtest.MemoryStore(), regOpt, fx.Populate(&c, &mem))
	app.RequireStart()
	defer app.RequireStop()
	var runs atomic.Int64
	for range 2 {
		if _, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: "op", Key: "k"}, charge(&runs)); err != nil {
			t.Fatal(err)
		}
	}
	if runs.Load() != 1 || mem.Len() != 1 {
		t.Fatalf("runs=%d records=%d", runs.Load(), mem.Len())
	}
}

// The original pull request's scenario, end to end through fx: Redis is
// unreachable and one key is used twice.
func TestModuleStoreDown(t *testing.T) {
	for _, mode := range []string{"", "raise"} {
		t.Run("ON_STORAGE_ERROR="+mode, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("IDEMPOTENCY_REDIS_URL", "redis://127.0.0.1:1/0") // the client as the module builds it
			t.Setenv("IDEMPOTENCY_ON_STORAGE_ERROR", mode)
			reg, regOpt := registry()
			core, logs := observer.New(zap.WarnLevel)
			var c *coordinator.Coordinator
			app := fxtest.New(t, idempotency.Module, regOpt, fx.Supply(zap.New(core)), fx.Populate(&c))
			app.RequireStart() // an unreachable Redis does not stop the app
			defer app.RequireStop()

			warned := logs.FilterMessageSnippet("redis is unreachable").All()
			if len(warned) != 1 || warned[0].ContextMap()["redis_addr"] != "127.0.0.1:1" {
				t.Fatalf("start-up warning naming the address: %+v", warned)
			}
			var runs atomic.Int64
			for range 2 {
				start := time.Now()
				_, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: "payment.charge", Key: "down"}, charge(&runs))
				if mode == "raise" {
					if !errors.Is(err, coordinator.ErrStorage) {
						t.Fatalf("err = %v, want ErrStorage", err)
					}
				} else if err != nil {
					t.Fatal(err)
				}
				if d := time.Since(start); d > 500*time.Millisecond { // go-redis retries thrice, quickly
					t.Fatalf("a call took %v with Redis down", d)
				}
			}
			want := map[string]int64{"": 2, "raise": 0}[mode]
			if runs.Load() != want {
				t.Fatalf("the action ran %d times, want %d", runs.Load(), want)
			}
			errs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			if got := counterValue(errs, "idempotency_errors_total", map[string]string{"operation": "payment.charge", "error_type": "storage_reserve_error"}); got != 2 {
				t.Fatalf("storage_reserve_error counter = %v, want 2", got)
			}
		})
	}
}

func TestModuleRefusesInvalidSettings(t *testing.T) {
	for name, env := range map[string][2]string{
		"IDEMPOTENCY_ON_STORAGE_ERROR": {"IDEMPOTENCY_ON_STORAGE_ERROR", "ignore"},
		"IDEMPOTENCY_IN_FLIGHT":        {"IDEMPOTENCY_IN_FLIGHT", "block"},
		"IDEMPOTENCY_LEASE":            {"IDEMPOTENCY_LEASE", "0s"},
		"IDEMPOTENCY_REDIS_URL":        {"IDEMPOTENCY_REDIS_URL", "http://localhost"},
	} {
		t.Run(name, func(t *testing.T) {
			clearEnv(t)
			t.Setenv(env[0], env[1])
			var c *coordinator.Coordinator
			app := fx.New(idempotency.Module, fx.NopLogger, fx.Populate(&c))
			err := app.Err()
			if err == nil || !strings.Contains(err.Error(), name) {
				t.Fatalf("err = %v, want it to name %s", err, name)
			}
		})
	}
}

func TestModuleUsesTheAppsRedisClient(t *testing.T) {
	clearEnv(t)
	t.Setenv("IDEMPOTENCY_REDIS_URL", "redis://127.0.0.1:1/0") // ignored: the app's client wins
	prefix := redistest.Prefix(t)
	t.Setenv("IDEMPOTENCY_KEY_PREFIX", prefix)
	client := redistest.Server(t)
	_, regOpt := registry()
	var c *coordinator.Coordinator
	app := fxtest.New(t,
		fx.Supply(client),
		idempotency.Module,
		idempotency.UseRedisClient[*redis.Client](),
		regOpt, fx.Populate(&c))
	app.RequireStart()
	var runs atomic.Int64
	if _, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: "op", Key: "app-client"}, charge(&runs)); err != nil {
		t.Fatal(err)
	}
	app.RequireStop()
	// The module does not close a client it does not own.
	if err := client.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("the app's client was closed: %v", err)
	}
	if n, _ := client.Exists(t.Context(), prefix+"op:app-client").Result(); n != 1 {
		t.Fatal("the record is not in the app's Redis")
	}
}

func TestModuleClosesTheClientItBuilt(t *testing.T) {
	clearEnv(t)
	t.Setenv("IDEMPOTENCY_REDIS_URL", "redis://"+redistest.ServerOptions(t).Addr+"/0")
	t.Setenv("IDEMPOTENCY_KEY_PREFIX", redistest.Prefix(t))
	_, regOpt := registry()
	var store coordinator.Store
	app := fxtest.New(t, idempotency.Module, regOpt, fx.Populate(&store))
	app.RequireStart()
	app.RequireStop()
	_, err := store.Get(t.Context(), coordinator.Key{Operation: "op", Key: "k"})
	if !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("after stop: %v, want redis: client is closed", err)
	}
}

func TestFxtestHelpers(t *testing.T) {
	clearEnv(t)
	t.Setenv("IDEMPOTENCY_IN_FLIGHT", "block") // ignored under DefaultSettings
	_, regOpt := registry()
	var c *coordinator.Coordinator
	var fs *faultstore.Store
	var s idempotency.Settings
	app := fxtest.New(t, idempotency.Module,
		idemfxtest.IgnoreEnvironment(),
		idemfxtest.FailingStore(),
		idempotency.OverrideSettings(func(s *idempotency.Settings) { s.OnStorageError = coordinator.OnStorageErrorRaise }),
		regOpt, fx.Populate(&c, &fs, &s))
	app.RequireStart()
	defer app.RequireStop()
	if s.OnStorageError != coordinator.OnStorageErrorRaise || s.InFlight != coordinator.InFlightWait {
		t.Fatalf("modes: %v, %v", s.OnStorageError, s.InFlight)
	}
	fs.Fail(coordinator.MethodReserve, nil)
	var runs atomic.Int64
	_, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: "op", Key: "k"}, charge(&runs))
	if !errors.Is(err, coordinator.ErrStorage) || runs.Load() != 0 {
		t.Fatalf("err=%v runs=%d", err, runs.Load())
	}
}

func TestFxtestSettingsAreValidated(t *testing.T) {
	clearEnv(t)
	_, regOpt := registry()
	var c *coordinator.Coordinator
	app := fx.New(idempotency.Module, fx.NopLogger, idemfxtest.MemoryStore(),
		idempotency.OverrideSettings(func(s *idempotency.Settings) { s.Lease = 0 }), regOpt, fx.Populate(&c))
	if err := app.Err(); err == nil || !strings.Contains(err.Error(), "IDEMPOTENCY_LEASE") {
		t.Fatalf("err = %v", err)
	}
}

// Two apps in one process on the default registerer: no duplicate
// registration error, and both count into the same series.
func TestTwoAppsInOneProcess(t *testing.T) {
	clearEnv(t)
	misses := func() float64 {
		mfs, err := prometheus.DefaultGatherer.Gather()
		if err != nil {
			t.Fatal(err)
		}
		return max(counterValue(mfs, "idempotency_requests_total", map[string]string{"operation": "two.apps", "outcome": "miss"}), 0)
	}
	before := misses() // the default registry lives as long as the process (-count=N)
	for i := range 2 {
		var c *coordinator.Coordinator
		app := fxtest.New(t, idempotency.Module, idemfxtest.MemoryStore(), fx.Populate(&c))
		app.RequireStart()
		if _, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: "two.apps", Key: "k"}, func(context.Context) (int, error) { return i, nil }); err != nil {
			t.Fatal(err)
		}
		app.RequireStop()
	}
	if got := misses() - before; got != 2 {
		t.Fatalf("misses across two apps = %v, want 2", got)
	}
}

func TestEveryDocumentedMetricIsScraped(t *testing.T) {
	clearEnv(t)
	t.Setenv("IDEMPOTENCY_OPERATION_TTLS", "payment.charge:24h")
	t.Setenv("IDEMPOTENCY_REDIS_URL", "redis://"+redistest.ServerOptions(t).Addr+"/0") // the consumer's
	reg, regOpt := registry()
	consumer := idempotency.ConsumeStream(idempotency.StreamConsumer{
		Stream: redistest.Prefix(t) + "orders", Group: "billing", Operation: "billing.credit",
		Handler: func(context.Context, idemconsume.Message) error { return nil },
	})
	app := fxtest.New(t, idempotency.Module, idemfxtest.MemoryStore(), regOpt, fx.Supply(zap.NewNop()), consumer,
		fx.Invoke(func(*coordinator.Coordinator) {}))
	app.RequireStart()
	defer app.RequireStop()
	for _, name := range documentedMetrics(t) {
		if n, err := testutil.GatherAndCount(reg, name); err != nil || n == 0 {
			t.Errorf("%s: %d series, %v; want pre-initialised series", name, n, err)
		}
	}
}

func TestOverrideSettingsFromTheGraph(t *testing.T) {
	clearEnv(t)
	_, regOpt := registry()
	type lease struct{ d time.Duration }
	var c *coordinator.Coordinator
	var s idempotency.Settings
	app := fxtest.New(t, idempotency.Module, idemfxtest.MemoryStore(), regOpt,
		fx.Supply(lease{2 * time.Second}),
		idempotency.OverrideSettingsWith(func(l lease, s *idempotency.Settings) { s.Lease = l.d }),
		idempotency.OverrideSettings(func(s *idempotency.Settings) { s.InFlight = coordinator.InFlightRun }),
		fx.Populate(&c, &s))
	defer app.RequireStart().RequireStop()
	if s.Lease != 2*time.Second || s.InFlight != coordinator.InFlightRun || c == nil {
		t.Fatalf("lease %v, in-flight %v", s.Lease, s.InFlight)
	}
}

// The module's *redisrepo.Store, for operator tools, is the store the
// coordinator writes to: what Do stored, Inspect shows, and what Forget
// removes, the coordinator no longer replays.
func TestModuleProvidesTheRedisStoreForOperatorTools(t *testing.T) {
	clearEnv(t)
	prefix := redistest.Prefix(t)
	t.Setenv("IDEMPOTENCY_REDIS_URL", "redis://"+redistest.ServerOptions(t).Addr+"/0")
	t.Setenv("IDEMPOTENCY_KEY_PREFIX", prefix)
	_, regOpt := registry()
	var c *coordinator.Coordinator
	var admin *redisrepo.Store
	var store coordinator.Store
	app := fxtest.New(t, idempotency.Module, regOpt, fx.Populate(&c, &admin, &store))
	app.RequireStart()
	defer app.RequireStop()
	if store != coordinator.Store(admin) {
		t.Fatalf("coordinator.Store is %T %p, *redisrepo.Store is %p; want one store", store, store, admin)
	}

	var runs atomic.Int64
	call := coordinator.Call{Operation: "payment.charge", Key: "admin-1"}
	key := coordinator.Key{Operation: call.Operation, Key: call.Key}
	if _, err := coordinator.Do(t.Context(), c, call, charge(&runs)); err != nil {
		t.Fatal(err)
	}
	infos, err := admin.Inspect(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 1 || infos[0].State != coordinator.StateCompleted || infos[0].RedisKey != prefix+"payment.charge:admin-1" {
		t.Fatalf("Inspect() = %+v; want the completed record under the settings' prefix", infos)
	}
	if n, err := admin.Forget(t.Context(), key); err != nil || n != 1 {
		t.Fatalf("Forget() = %d, %v; want 1", n, err)
	}
	if _, err := coordinator.Do(t.Context(), c, call, charge(&runs)); err != nil || runs.Load() != 2 {
		t.Fatalf("after Forget: err=%v runs=%d; want the action to run again", err, runs.Load())
	}
}

// With the app's own client, the *redisrepo.Store is built over it.
func TestModuleProvidesTheRedisStoreOverTheAppsClient(t *testing.T) {
	clearEnv(t)
	t.Setenv("IDEMPOTENCY_REDIS_URL", "redis://127.0.0.1:1/0") // ignored: the app's client wins
	prefix := redistest.Prefix(t)
	t.Setenv("IDEMPOTENCY_KEY_PREFIX", prefix)
	client := redistest.Server(t)
	_, regOpt := registry()
	var admin *redisrepo.Store
	app := fxtest.New(t, fx.Supply(client), idempotency.Module, idempotency.UseRedisClient[*redis.Client](), regOpt, fx.Populate(&admin))
	defer app.RequireStart().RequireStop()
	if err := client.Set(t.Context(), prefix+"op:junk", "not a record", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	infos, err := admin.Inspect(t.Context(), coordinator.Key{Operation: "op", Key: "junk"}, coordinator.Key{Operation: "op", Key: "none"})
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 || infos[0].State != coordinator.StateUnreadable || infos[1].State != coordinator.StateAbsent {
		t.Fatalf("Inspect() = %+v; want the junk key unreadable and the other absent", infos)
	}
}

// Overrides taken from the graph are validated like any other, and their
// errors name the variables.
func TestOverrideSettingsWithIsValidated(t *testing.T) {
	clearEnv(t)
	_, regOpt := registry()
	type timings struct{ lease, renew time.Duration }
	var c *coordinator.Coordinator
	app := fx.New(fx.NopLogger, idempotency.Module, idemfxtest.MemoryStore(), regOpt,
		fx.Supply(timings{1500 * time.Microsecond, 1200 * time.Microsecond}),
		idempotency.OverrideSettingsWith(func(d timings, s *idempotency.Settings) { s.Lease, s.RenewInterval = d.lease, d.renew }),
		fx.Populate(&c))
	err := app.Err()
	const want = "IDEMPOTENCY_RENEW_INTERVAL: must be shorter than IDEMPOTENCY_LEASE (1ms, rounded down from 1.5ms), got 1.2ms"
	if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "WithRenewInterval") {
		t.Fatalf("err = %v\nwant it to contain %q", err, want)
	}

	// The value comes from the graph: without it the app does not build.
	app = fx.New(fx.NopLogger, idempotency.Module, idemfxtest.MemoryStore(), regOpt,
		idempotency.OverrideSettingsWith(func(timings, *idempotency.Settings) {}),
		fx.Populate(&c))
	if err := app.Err(); err == nil || !strings.Contains(err.Error(), "timings") {
		t.Fatalf("err = %v; want a missing timings value", err)
	}
}

// docs/configuration.md: with UseRedisClient, IDEMPOTENCY_REDIS_URL is
// ignored. An app whose deployment leaves it empty (a Helm value: "") cannot
// start: LoadSettings validates it before the module knows it has a client.
func TestModuleWithTheAppsClientIgnoresAnEmptyRedisURL(t *testing.T) {
	clearEnv(t)
	t.Setenv("IDEMPOTENCY_REDIS_URL", "")
	client := redistest.Server(t)
	_, regOpt := registry()
	var c *coordinator.Coordinator
	app := fx.New(fx.NopLogger, fx.Supply(client), idempotency.Module, idempotency.UseRedisClient[*redis.Client](), regOpt, fx.Populate(&c))
	if err := app.Err(); err != nil {
		t.Fatalf("the app's own client is used, yet start-up fails on the ignored variable: %v", err)
	}
}

func TestModuleOnARedisCluster(t *testing.T) {
	clearEnv(t)
	addrs := redistest.ClusterAddrs(t) // skips without redis-server, fails with IDEMPOTENCY_TEST_REQUIRE_REDIS=1
	prefix := redistest.Prefix(t)
	t.Setenv("IDEMPOTENCY_REDIS_CLUSTER_ADDRS", strings.Join(addrs, ","))
	t.Setenv("IDEMPOTENCY_KEY_PREFIX", prefix)
	_, regOpt := registry()
	var c *coordinator.Coordinator
	app := fxtest.New(t, idempotency.Module, regOpt, fx.Populate(&c))
	app.RequireStart()
	defer app.RequireStop()
	var runs atomic.Int64
	for i := range 20 { // keys spread over the masters
		call := coordinator.Call{Operation: "payment.charge", Key: "cluster-" + strconv.Itoa(i)}
		for range 2 {
			if _, err := coordinator.Do(t.Context(), c, call, charge(&runs)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if runs.Load() != 20 {
		t.Fatalf("runs = %d, want one per key", runs.Load())
	}
	cluster := redistest.Cluster(t)
	if n, err := cluster.Exists(t.Context(), prefix+"payment.charge:cluster-7").Result(); err != nil || n != 1 {
		t.Fatalf("record not on the cluster: %d, %v", n, err)
	}
}

// The kill switch off is worth a warning at start-up, once, on the app's
// logger.
func TestModuleWarnsThatProtectionIsOff(t *testing.T) {
	for _, enabled := range []string{"false", "true"} {
		t.Run("ENABLED="+enabled, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("IDEMPOTENCY_ENABLED", enabled)
			_, regOpt := registry()
			core, logs := observer.New(zap.InfoLevel)
			app := fxtest.New(t, idempotency.Module, idemfxtest.MemoryStore(), regOpt, fx.Supply(zap.New(core)),
				fx.Invoke(func(*coordinator.Coordinator) {})) // a coordinator is built
			app.RequireStart()
			app.RequireStop()
			const msg = "idempotency: protection is off (IDEMPOTENCY_ENABLED=false): every call runs its action unprotected"
			got := logs.FilterMessage(msg).All()
			want := map[string]int{"false": 1, "true": 0}[enabled]
			if len(got) != want || want == 1 && got[0].Level != zap.WarnLevel {
				t.Fatalf("%d lines %q (%+v); want %d at Warn", len(got), msg, got, want)
			}
		})
	}
}

// Without a *zap.Logger in the graph the module's warnings and errors, its
// observer's included, go to standard error as JSON lines; zap.NewNop()
// silences them. The README promises that an unreachable Redis is logged.
func TestModuleWithoutALoggerWritesToStderr(t *testing.T) {
	lines := runStderrScenario(t, "module-no-logger")
	msgs := map[string]map[string]any{} // the first line of each message
	for _, l := range lines {
		msg, _ := l["msg"].(string)
		if msgs[msg] == nil {
			msgs[msg] = l
		}
		if l["level"] != "warn" && l["level"] != "error" {
			t.Errorf("a line below Warn: %v", l)
		}
	}
	if l := msgs["idempotency: redis is unreachable at start-up; calls follow IDEMPOTENCY_ON_STORAGE_ERROR until it is back"]; l == nil || l["redis_addr"] != "127.0.0.1:1" {
		t.Errorf("no start-up warning naming the address in %v", lines)
	}
	if l := msgs["storage call failed"]; l == nil || l["logger"] != "idempotency" || l["error_type"] != "storage_reserve_error" {
		t.Errorf("no observer error line in %v", lines)
	}
	if msgs["running action unprotected: store failed"] == nil {
		t.Errorf("no observer warning in %v", lines)
	}

	lines = runStderrScenario(t, "module-kill-switch")
	if len(lines) != 1 || lines[0]["msg"] != "idempotency: protection is off (IDEMPOTENCY_ENABLED=false): every call runs its action unprotected" {
		t.Errorf("kill switch off: stderr lines %v; want the one warning", lines)
	}

	if lines := runStderrScenario(t, "module-nop-logger"); len(lines) != 0 {
		t.Errorf("with fx.Supply(zap.NewNop()): stderr lines %v; want none", lines)
	}
}

// stderrScenarioEnv names the scenario that TestStderrScenarioChild runs.
const stderrScenarioEnv = "IDEMPOTENCY_TEST_STDERR_SCENARIO"

// runStderrScenario runs TestStderrScenarioChild's scenario name in a child
// process of the test binary and returns the JSON lines it wrote to standard
// error (go-redis's own log lines, which are not JSON, are left out).
func runStderrScenario(t *testing.T, name string) []map[string]any {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestStderrScenarioChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), stderrScenarioEnv+"="+name)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil || !bytes.Contains(stdout, []byte("--- PASS: TestStderrScenarioChild")) {
		t.Fatalf("scenario %s: %v\nstdout:\n%s\nstderr:\n%s", name, err, stdout, stderr.Bytes())
	}
	var lines []map[string]any
	for line := range strings.Lines(stderr.String()) {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var l map[string]any
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("scenario %s: stderr line %q: %v", name, line, err)
		}
		lines = append(lines, l)
	}
	return lines
}

// TestStderrScenarioChild is the child process of runStderrScenario; it only
// runs when stderrScenarioEnv names a scenario.
func TestStderrScenarioChild(t *testing.T) {
	scenario := os.Getenv(stderrScenarioEnv)
	if scenario == "" {
		t.Skip("runs as a child process of runStderrScenario")
	}
	clearEnv(t)
	t.Setenv("IDEMPOTENCY_METRICS_ENABLED", "false")
	call := coordinator.Call{Operation: "payment.charge", Key: "k"}
	action := func(context.Context) (int, error) { return 1, nil }
	switch scenario {
	case "module-no-logger", "module-nop-logger":
		t.Setenv("IDEMPOTENCY_REDIS_URL", "redis://127.0.0.1:1/0")
		opts := []fx.Option{idempotency.Module}
		if scenario == "module-nop-logger" {
			opts = append(opts, fx.Supply(zap.NewNop()))
		}
		var c *coordinator.Coordinator
		app := fxtest.New(t, append(opts, fx.Populate(&c))...)
		app.RequireStart()
		if _, err := coordinator.Do(t.Context(), c, call, action); err != nil {
			t.Fatal(err)
		}
		app.RequireStop()
	case "module-kill-switch":
		t.Setenv("IDEMPOTENCY_ENABLED", "false")
		fxtest.New(t, idempotency.Module, idemfxtest.MemoryStore(), fx.Invoke(func(*coordinator.Coordinator) {})).RequireStart().RequireStop()
	case "observer-nil-logger", "observer-nop-logger":
		var logger *zap.Logger
		if scenario == "observer-nop-logger" {
			logger = zap.NewNop()
		}
		obs, err := idempotency.NewObserver(idempotency.DefaultSettings(), logger, nil)
		if err != nil {
			t.Fatal(err)
		}
		key := coordinator.Key{Operation: "payment.charge", Key: "k"}
		obs.Observe(t.Context(), coordinator.Event{Kind: coordinator.EventHit, Key: key}) // Debug
		obs.Observe(t.Context(), coordinator.Event{Kind: coordinator.EventError, Key: key, ErrorType: coordinator.ErrorStorageReserve,
			Method: coordinator.MethodReserve, Err: errors.New("connection refused")})
	default:
		t.Fatalf("unknown scenario %q", scenario)
	}
}

// TestModuleLoadsScriptsAtStart: the module loads the store's scripts into a
// server that has none cached, so that their first use is one round trip.
func TestModuleLoadsScriptsAtStart(t *testing.T) {
	clearEnv(t)
	in := redistest.Start(t) // a server of our own: its script cache starts empty
	if in.Kind() != redistest.KindRedisServer {
		t.Skip("counts the scripts in INFO memory: a real redis-server only")
	}
	c := in.Client(t)
	cached := func() string {
		t.Helper()
		info, err := c.Info(t.Context(), "memory").Result()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(info, "\r\n") {
			if n, ok := strings.CutPrefix(line, "number_of_cached_scripts:"); ok {
				return n
			}
		}
		t.Fatal("INFO memory has no number_of_cached_scripts")
		return ""
	}
	if n := cached(); n != "0" {
		t.Fatalf("a new server has %s scripts cached", n)
	}
	t.Setenv("IDEMPOTENCY_REDIS_URL", "redis://"+in.Addr()+"/0")
	_, regOpt := registry()
	app := fxtest.New(t, idempotency.Module, regOpt, fx.Invoke(func(*coordinator.Coordinator) {}))
	app.RequireStart()
	defer app.RequireStop()
	if n := cached(); n != "14" {
		t.Errorf("after start-up %s scripts are cached, want 14 (complete, renew, release, watch, abandon; legacy, reserve, fence, inspect, forget, unwrite, and the format 1 writer's abandon1, reserve1 and owner1)", n)
	}
}

// The table for users of the Python idempotency-kit (docs/observability.md)
// names only Python's two metrics and ours, and every one of ours, so that
// a metric added later is mapped too; and it maps every Python status of
// the coordinator's error types.
func TestPythonMetricsMapping(t *testing.T) {
	doc, err := os.ReadFile("docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), pythonSection)
	if !ok {
		t.Fatalf("docs/observability.md has no section %q", strings.TrimSpace(pythonSection))
	}
	section, _, _ = strings.Cut(section, "\n## ")
	python := map[string]bool{
		"idempotency_operations_total": true, "idempotency_operation_duration_seconds": true,
		"idempotency_operation_duration_seconds_bucket": true,
	}
	named := map[string]bool{}
	for _, m := range regexp.MustCompile(`(idempotency_[a-z_]+)(:?)`).FindAllStringSubmatch(section, -1) {
		if m[2] == ":" {
			continue // a recorded series: level:metric:operations
		}
		named[strings.TrimSuffix(strings.TrimSuffix(m[1], "_count"), "_bucket")] = true
	}
	documented := documentedMetrics(t)
	for name := range named {
		if !python[name] && !python[name+"_bucket"] && !slices.Contains(documented, name) {
			t.Errorf("the Python table names %s, neither Python's nor ours", name)
		}
	}
	for _, name := range documented {
		if !named[name] {
			t.Errorf("the Python table does not map our %s", name)
		}
	}
	for _, et := range []string{"storage_get_error", "storage_reserve_error", "storage_save_error", "storage_release_error", "record_validation_error", "key_reuse"} {
		if !strings.Contains(section, et) {
			t.Errorf("the Python table does not map the error type %s", et)
		}
	}
	for _, status := range []string{`status="hit"`, `status="miss"`, `status="collision"`} {
		if !strings.Contains(section, status) {
			t.Errorf("the Python table does not map %s", status)
		}
	}
}
