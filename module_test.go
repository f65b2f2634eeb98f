package idempotency_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
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
	"github.com/idemkit/idempotency/idemconsume/redisstream"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/internal/telemetry"
	"github.com/idemkit/idempotency/observability"
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
	var store idemstore.Store
	app := fxtest.New(t, idempotency.Module, regOpt, fx.Populate(&store))
	app.RequireStart()
	app.RequireStop()
	_, err := store.Get(t.Context(), idemstore.Key{Operation: "op", Key: "k"})
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
	fs.Fail(idemevent.MethodReserve, nil)
	var runs atomic.Int64
	_, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: "op", Key: "k"}, charge(&runs))
	if !errors.Is(err, coordinator.ErrStorage) || runs.Load() != 0 {
		t.Fatalf("err=%v runs=%d", err, runs.Load())
	}
}

// A stop whose coordinator still retries a save leaves the hooks after it
// their turn: the coordinator stops waiting before fx's stop timeout, so an
// app's hook registered before the module (a tracer's flush) still runs.
func TestStopLeavesTheLaterHooksTheirTurn(t *testing.T) {
	clearEnv(t)
	_, regOpt := registry()
	var c *coordinator.Coordinator
	var fs *faultstore.Store
	var flushed atomic.Bool
	app := fx.New(fx.NopLogger,
		fx.Invoke(func(lc fx.Lifecycle) {
			lc.Append(fx.Hook{OnStop: func(context.Context) error { flushed.Store(true); return nil }})
		}),
		idempotency.Module, idemfxtest.IgnoreEnvironment(), idemfxtest.FailingStore(), regOpt, fx.Populate(&c, &fs))
	if err := app.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	fs.Fail(idemevent.MethodComplete, nil) // the save is retried in the background
	fs.Fail(idemevent.MethodRenew, nil)
	var runs atomic.Int64
	if _, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: "op", Key: "k"}, charge(&runs)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := app.Stop(ctx)
	if err == nil || !strings.Contains(err.Error(), "background tasks") {
		t.Errorf("stop: %v, want the coordinator's background tasks reported", err)
	}
	if !flushed.Load() {
		t.Error("the app's hook before the module did not run on stop")
	}
	fs.Reset()
	if err := c.Close(); err != nil { // the save ends once the store answers
		t.Fatal(err)
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
	var store idemstore.Store
	app := fxtest.New(t, idempotency.Module, regOpt, fx.Populate(&c, &admin, &store))
	app.RequireStart()
	defer app.RequireStop()
	if store != idemstore.Store(admin) {
		t.Fatalf("idemstore.Store is %T %p, *redisrepo.Store is %p; want one store", store, store, admin)
	}

	var runs atomic.Int64
	call := coordinator.Call{Operation: "payment.charge", Key: "admin-1"}
	key := idemstore.Key{Operation: call.Operation, Key: call.Key}
	if _, err := coordinator.Do(t.Context(), c, call, charge(&runs)); err != nil {
		t.Fatal(err)
	}
	infos, err := admin.Inspect(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 1 || infos[0].State != idemstore.StateCompleted || infos[0].RedisKey != prefix+"payment.charge:admin-1" {
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
	infos, err := admin.Inspect(t.Context(), idemstore.Key{Operation: "op", Key: "junk"}, idemstore.Key{Operation: "op", Key: "none"})
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 || infos[0].State != idemstore.StateUnreadable || infos[1].State != idemstore.StateAbsent {
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
		key := idemstore.Key{Operation: "payment.charge", Key: "k"}
		obs.Observe(t.Context(), idemevent.Event{Kind: idemevent.Hit, Key: key}) // Debug
		obs.Observe(t.Context(), idemevent.Event{Kind: idemevent.Error, Key: key, ErrorType: idemevent.ErrorStorageReserve,
			Method: idemevent.MethodReserve, Err: errors.New("connection refused")})
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

func TestNewRedisClientTLS(t *testing.T) {
	s := idempotency.DefaultSettings()
	s.RedisURL = "rediss://app:secret@redis.example:6380/0"
	c, err := idempotency.NewRedisClient(s)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.(*redis.Client).Options().TLSConfig.ServerName; got != "redis.example" {
		t.Fatalf("standalone TLS server name = %q, want the URL's host", got)
	}

	s.RedisClusterAddrs = []string{"node-a:6379", "node-b:6379"}
	cc, err := idempotency.NewRedisClient(s)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	opts := cc.(*redis.ClusterClient).Options()
	if opts.TLSConfig == nil || opts.TLSConfig.ServerName != "" || opts.Password != "secret" {
		t.Fatalf("cluster: TLS %+v, password %q; want TLS verifying each node by its own name and the URL's password", opts.TLSConfig, opts.Password)
	}
}

func TestNewRedisClientKeepsThePasswordOutOfErrors(t *testing.T) {
	s := idempotency.DefaultSettings()
	s.RedisURL = "redis://app:s3cret@cache:6379/zero"
	_, err := idempotency.NewRedisClient(s)
	if err == nil || !strings.Contains(err.Error(), "IDEMPOTENCY_REDIS_URL") || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("err = %v; want one naming the variable, without the password", err)
	}
}

// goRedisQueryOptions returns the query options that redis.ParseURL reads, as
// setupConnParams in the go-redis source this module builds with reads them,
// each with the kind of value it takes (int, string, duration or bool).
func goRedisQueryOptions(t *testing.T) map[string]string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/redis/go-redis/v9").Output()
	if err != nil {
		t.Fatalf("locating go-redis: %v", err)
	}
	src, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "options.go"))
	if err != nil {
		t.Fatal(err)
	}
	body, ok := strings.CutPrefix(string(src[bytes.Index(src, []byte("\nfunc setupConnParams(")):]), "\n")
	if !ok {
		t.Fatal("no setupConnParams in go-redis's options.go")
	}
	body = body[:strings.Index(body, "\n}\n")]
	kinds := map[string]string{}
	for _, m := range regexp.MustCompile(`q\.(int|string|duration|bool|has|strings)\("([a-z_]+)"\)`).FindAllStringSubmatch(body, -1) {
		if m[1] != "has" || kinds[m[2]] == "" {
			kinds[m[2]] = m[1]
		}
	}
	if len(kinds) < 20 {
		t.Fatalf("found only %d query options in setupConnParams: %v", len(kinds), kinds)
	}
	return kinds
}

// Every query option that redis.ParseURL accepts either reaches the cluster
// client (its ClusterOptions carry every field the option sets on a
// single-server client) or is refused in cluster mode, naming it. The options
// are read from the go-redis source, so an option a later go-redis adds is
// covered without a change here.
func TestNewRedisClientClusterCarriesEveryQueryOption(t *testing.T) {
	checkQueryOptionsCarried(t, "cluster",
		func(raw string) idempotency.Settings {
			s := idempotency.DefaultSettings()
			s.RedisURL = raw
			s.RedisClusterAddrs = []string{"127.0.0.1:2"}
			return s
		},
		func(c redis.UniversalClient) reflect.Value {
			return reflect.ValueOf(*c.(*redis.ClusterClient).Options())
		},
		"IDEMPOTENCY_REDIS_URL: query option %s has no effect on a cluster client (IDEMPOTENCY_REDIS_CLUSTER_ADDRS is set)")
}

// checkQueryOptionsCarried checks, for every query option that redis.ParseURL
// reads, that the client NewRedisClient builds for settings(url with the
// option) carries every field the option sets on a single-server client
// (options returns the client's options struct), or that NewRedisClient and
// Validate both refuse it with refusal (a format naming the option).
func checkQueryOptionsCarried(t *testing.T, kind string, settings func(raw string) idempotency.Settings,
	options func(redis.UniversalClient) reflect.Value, refusal string) {
	t.Helper()
	const base = "redis://app:secret@127.0.0.1:1/0"
	baseOpts, err := redis.ParseURL(base)
	if err != nil {
		t.Fatal(err)
	}
	for name, valueKind := range goRedisQueryOptions(t) {
		t.Run(name, func(t *testing.T) {
			value := map[string]string{"int": "7", "string": "name7", "duration": "700ms", "bool": "true"}[valueKind]
			if value == "" {
				t.Fatalf("no test value for a %s option", valueKind)
			}
			raw, ref := base+"?"+name+"="+value, baseOpts
			switch name {
			case "db":
				if kind == "cluster" {
					t.Skip("a cluster has database 0 only: TestNewRedisClientClusterRefusesADatabase")
				}
				raw = base + "?db=7"
			case "skip_verify": // TLS only
				raw = strings.Replace(raw, "redis://", "rediss://", 1)
				if ref, err = redis.ParseURL(strings.Replace(base, "redis://", "rediss://", 1)); err != nil {
					t.Fatal(err)
				}
			case "conn_max_lifetime_jitter": // at most the lifetime
				raw += "&conn_max_lifetime=1h"
			}
			single, err := redis.ParseURL(raw)
			if err != nil {
				t.Fatalf("redis.ParseURL(%s): %v", raw, err)
			}
			s := settings(raw)
			client, err := idempotency.NewRedisClient(s)
			if err != nil {
				want := fmt.Sprintf(refusal, name)
				if err.Error() != want {
					t.Fatalf("NewRedisClient() error = %q; want it applied, or refused with %q", err, want)
				}
				if verr := s.Validate(); verr == nil || !strings.Contains(verr.Error(), want) {
					t.Fatalf("Validate() = %v; want it to refuse the option as NewRedisClient does", verr)
				}
				return
			}
			defer client.Close()
			got := options(client)
			refV, singleV := reflect.ValueOf(*ref), reflect.ValueOf(*single)
			set := 0
			for i := range singleV.NumField() {
				field := singleV.Type().Field(i)
				if !field.IsExported() || reflect.DeepEqual(refV.Field(i).Interface(), singleV.Field(i).Interface()) {
					continue
				}
				set++
				want := singleV.Field(i).Interface()
				if field.Name == "TLSConfig" {
					if g := got.FieldByName("TLSConfig").Interface().(*tls.Config); g == nil || g.InsecureSkipVerify != single.TLSConfig.InsecureSkipVerify {
						t.Errorf("%s TLSConfig = %+v; want InsecureSkipVerify %v", kind, g, single.TLSConfig.InsecureSkipVerify)
					}
					continue
				}
				g := got.FieldByName(field.Name)
				if !g.IsValid() {
					t.Errorf("%s sets Options.%s, which the %s client's options lack, yet NewRedisClient accepted it", name, field.Name, kind)
					continue
				}
				if !reflect.DeepEqual(g.Interface(), want) {
					t.Errorf("%s=%s: %s client's %s = %v, want %v", name, value, kind, field.Name, g.Interface(), want)
				}
			}
			if set == 0 {
				t.Fatalf("%s=%s sets no field of redis.Options; pick another test value", name, value)
			}
		})
	}
}

// The fields NewRedisClient sets itself reach the cluster client too.
func TestNewRedisClientClusterFailsFast(t *testing.T) {
	s := idempotency.DefaultSettings()
	s.StorageTimeout = 250 * time.Millisecond
	s.RedisClusterAddrs = []string{"127.0.0.1:2"}
	client, err := idempotency.NewRedisClient(s)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	o := client.(*redis.ClusterClient).Options()
	if !o.ContextTimeoutEnabled || o.DialerRetries != 1 || o.DialTimeout != 5*time.Second {
		t.Fatalf("cluster options: ContextTimeoutEnabled %v, DialerRetries %d, DialTimeout %v; want true, 1, 5s (the lease, at most 5s)",
			o.ContextTimeoutEnabled, o.DialerRetries, o.DialTimeout)
	}
}

// A cluster has database 0 only: a URL that selects another is refused in
// cluster mode, by Validate (so at start-up) and NewRedisClient, rather than
// ignored.
func TestNewRedisClientClusterRefusesADatabase(t *testing.T) {
	for _, tt := range []struct {
		url     string
		wantErr string // "" accepted
	}{
		{url: "redis://cache:6379/0"},
		{url: "redis://cache:6379"},
		{url: "redis://cache:6379/?db=0"},
		{url: "redis://cache:6379/3", wantErr: "IDEMPOTENCY_REDIS_URL: database 3 has no effect on a cluster client, which has database 0 only (IDEMPOTENCY_REDIS_CLUSTER_ADDRS is set)"},
		{url: "redis://cache:6379/0?db=2", wantErr: "IDEMPOTENCY_REDIS_URL: database 2 has no effect on a cluster client, which has database 0 only (IDEMPOTENCY_REDIS_CLUSTER_ADDRS is set)"},
	} {
		s := idempotency.DefaultSettings()
		s.RedisURL = tt.url
		s.RedisClusterAddrs = []string{"node-a:7000"}
		client, err := idempotency.NewRedisClient(s)
		verr := s.Validate()
		if tt.wantErr == "" {
			if err != nil || verr != nil {
				t.Errorf("%s: NewRedisClient() error = %v, Validate() = %v; want neither", tt.url, err, verr)
			}
			if client != nil {
				client.Close()
			}
			continue
		}
		if err == nil || err.Error() != tt.wantErr {
			t.Errorf("%s: NewRedisClient() error = %v; want %q", tt.url, err, tt.wantErr)
		}
		if verr == nil || !strings.Contains(verr.Error(), "\n"+tt.wantErr) {
			t.Errorf("%s: Validate() = %v; want a line %q", tt.url, verr, tt.wantErr)
		}
		// A single server has databases: the same URL is fine there.
		s.RedisClusterAddrs = nil
		if err := s.Validate(); err != nil {
			t.Errorf("%s without a cluster: Validate() = %v", tt.url, err)
		}
	}
}

// No error and no printed Settings show any part of the user name or
// password, even of a URL so malformed that the parser cannot tell where they
// end; the errors still say what to fix. FuzzRedisURLErrorsHideThePassword
// tries many more.
func TestRedisURLErrorsHideTheUserInformation(t *testing.T) {
	for _, tt := range []struct {
		url, secret string
		wantErr     string // a part of the message
	}{
		// url.Parse: invalid URL escape "%zz"
		{url: "redis://user:p%zzss@host:6379/0", secret: "%zz", wantErr: "a '%' in the user name or password is not followed by two hex digits"},
		{url: "redis://u%zzq:pw@host:6379/0", secret: "%zz", wantErr: "a '%' in the user name or password is not followed by two hex digits"},
		{url: "redis://user:zqwvx%4@host:6379/0", secret: "%4", wantErr: "not followed by two hex digits"},
		// a '/' ends the host early: invalid port ":zq" after host
		{url: "redis://user:zq/wvx@host:6379/0", secret: "zq", wantErr: "cannot be told apart"},
		// ... or makes the rest a path: invalid database number "wvx@host:6379"
		{url: "redis://user:1234/wvx@host:6379", secret: "wvx", wantErr: "cannot be told apart"},
		// '?' and '#' likewise
		{url: "redis://user:1234?wvx@host:6379/0", secret: "wvx", wantErr: "percent-encoded (%2F, %3F, %23)"},
		{url: "redis://user:zq#wvx@host:6379/0", secret: "zq", wantErr: "cannot be told apart"},
		// no "//": all of it is opaque
		{url: "redis:user:zqwvx@host:6379/0", secret: "zqwvx", wantErr: "cannot be told apart"},
		// a message of go-redis that happens to share bytes with the password
		{url: "redis://user:database@host:6379/x", secret: "database", wantErr: "the reason is not shown"},
		// an invalid host is still named: it is not the user information
		{url: "redis://user:zqwvx@ho%zzst:6379/0", secret: "zqwvx", wantErr: `invalid URL escape "%zz"`},
	} {
		s := idempotency.DefaultSettings()
		s.RedisURL = tt.url
		verr := s.Validate()
		_, err := idempotency.NewRedisClient(s)
		if verr == nil || err == nil {
			t.Errorf("%s: Validate() = %v, NewRedisClient() error = %v; want errors", tt.url, verr, err)
			continue
		}
		for _, e := range []error{verr, err} {
			if strings.Contains(e.Error(), tt.secret) || !strings.Contains(e.Error(), "IDEMPOTENCY_REDIS_URL: ") || !strings.Contains(e.Error(), tt.wantErr) {
				t.Errorf("%s: error = %q; want one naming the variable and saying %q, without %q", tt.url, e, tt.wantErr, tt.secret)
			}
		}
		if got := s.String(); strings.Contains(got, tt.secret) {
			t.Errorf("%s: String() = %s", tt.url, got)
		}
	}
}

// A nil logger to NewObserver means what no logger in the graph means to
// Module: warnings and errors go to standard error (see stderrScenarios).
func TestNewObserverWithoutALoggerWritesToStderr(t *testing.T) {
	lines := runStderrScenario(t, "observer-nil-logger")
	if len(lines) != 1 || lines[0]["msg"] != "storage call failed" || lines[0]["level"] != "error" ||
		lines[0]["logger"] != "idempotency" || lines[0]["error_type"] != "storage_reserve_error" {
		t.Fatalf("stderr lines %v; want the storage error, and not the Debug line", lines)
	}
	if lines := runStderrScenario(t, "observer-nop-logger"); len(lines) != 0 {
		t.Fatalf("with zap.NewNop(), stderr lines %v; want none", lines)
	}
}

// redis:host:port has no "//": url.Parse reads it as opaque, and go-redis
// would connect to localhost:6379 instead.
func TestRedisURLWithoutSlashesIsRefused(t *testing.T) {
	s := idempotency.DefaultSettings()
	s.RedisURL = "redis:cache:6380"
	const want = "IDEMPOTENCY_REDIS_URL: want redis://host:port/db, got no // after the scheme"
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Validate() = %v; want %q", err, want)
	}
	if _, err := idempotency.NewRedisClient(s); err == nil || err.Error() != want {
		t.Errorf("NewRedisClient() error = %v; want %q", err, want)
	}
}

func TestOldRedis(t *testing.T) {
	for _, tt := range []struct {
		info, version string
		old           bool
	}{
		{"# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:0\r\n", "7.0.15", false},
		{"# Server\r\nredis_version:6.2.14\r\n", "6.2.14", true},
		{"redis_version:8.4.0", "8.4.0", false},
		{"redis_version:255.255.255", "255.255.255", false}, // miniredis
		{"# Server\r\nno version here\r\n", "", false},
		{"redis_version:x.y", "x.y", false},
	} {
		if v, old := idempotency.OldRedis(tt.info); v != tt.version || old != tt.old {
			t.Errorf("oldRedis(%q) = %q, %v; want %q, %v", tt.info, v, old, tt.version, tt.old)
		}
	}
}

// The dial timeout of the client NewRedisClient builds is the lease within
// [IDEMPOTENCY_STORAGE_TIMEOUT, 5s]; a dial_timeout in the URL is kept when it
// is shorter.
func TestNewRedisClientDialTimeout(t *testing.T) {
	for _, tt := range []struct {
		name           string
		url            string
		lease, storage time.Duration
		want           time.Duration
	}{
		{"defaults", "redis://127.0.0.1:2/0", 30 * time.Second, 250 * time.Millisecond, 5 * time.Second},
		{"a short lease", "redis://127.0.0.1:2/0", time.Second, 100 * time.Millisecond, time.Second},
		{"a lease shorter than the storage timeout", "redis://127.0.0.1:2/0", 50 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond},
		{"a shorter dial_timeout in the URL", "redis://127.0.0.1:2/0?dial_timeout=200ms", 30 * time.Second, 250 * time.Millisecond, 200 * time.Millisecond},
		{"a longer dial_timeout in the URL", "redis://127.0.0.1:2/0?dial_timeout=1m", 30 * time.Second, 250 * time.Millisecond, 5 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := idempotency.DefaultSettings()
			s.RedisURL, s.Lease, s.StorageTimeout = tt.url, tt.lease, tt.storage
			client, err := idempotency.NewRedisClient(s)
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			if got := client.(*redis.Client).Options().DialTimeout; got != tt.want {
				t.Errorf("DialTimeout = %v; want %v", got, tt.want)
			}
		})
	}
}

// The frameworks of the adapters that are modules of their own stay out of
// the core's module graph: an app that uses the core alone never downloads,
// audits or upgrades them.
func TestCoreModuleGraphHasNoAdapterFramework(t *testing.T) {
	out, err := exec.Command("go", "mod", "graph").Output()
	if err != nil {
		t.Fatalf("go mod graph: %v", err)
	}
	graph := string(out)
	for _, m := range []string{
		"github.com/gin-gonic/gin", "github.com/labstack/echo/", "connectrpc.com/connect",
		"google.golang.org/grpc", "github.com/ThreeDotsLabs/watermill",
	} {
		for line := range strings.SplitSeq(graph, "\n") {
			if strings.Contains(line, " "+m) {
				t.Errorf("the core's module graph has %s: %s", m, line)
				break
			}
		}
	}
}

// counterValue returns the value of the counter series name{labels}, or -1
// when there is none.
func counterValue(mfs []*dto.MetricFamily, name string, labels map[string]string) float64 {
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue series
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

// pythonSection starts the section of docs/observability.md that maps the
// Python library's metrics to ours.
const pythonSection = "\n## Coming from the Python idempotency-kit\n"

// documentedMetrics returns every metric name docs/observability.md names,
// but in the section on the Python library's metrics.
func documentedMetrics(t *testing.T) []string {
	t.Helper()
	doc, err := os.ReadFile("docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	// The section on the Python library's metrics names its series too,
	// which we do not export.
	text, _, _ := strings.Cut(string(doc), pythonSection)
	seen := map[string]bool{}
	for _, m := range regexp.MustCompile("`(idempotency_[a-z_]+)`").FindAllStringSubmatch(text, -1) {
		seen[m[1]] = true
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(names) < 5 {
		t.Fatalf("docs/observability.md names only %v", names)
	}
	return names
}

// streamEnv points the module at the test's Redis, under the test's own
// prefix, and returns a client of it and the prefix.
func streamEnv(t *testing.T) (*redis.Client, string) {
	t.Helper()
	clearEnv(t)
	opts := redistest.ServerOptions(t)
	prefix := redistest.Prefix(t)
	t.Setenv("IDEMPOTENCY_REDIS_URL", "redis://"+opts.Addr+"/0")
	t.Setenv("IDEMPOTENCY_KEY_PREFIX", prefix+"idem:")
	return redistest.Server(t), prefix
}

// waitFor polls cond until it holds, failing the test after 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventually(t, func() error {
		if cond() {
			return nil
		}
		return errors.New("timed out waiting for " + what)
	})
}

// eventually polls check until it returns nil, failing the test after 10s
// with check's last error, so that the message says what was seen at the end.
func eventually(t *testing.T, check func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10s: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pending returns how many entries of stream the group has not acknowledged.
func pending(t *testing.T, rdb *redis.Client, stream, group string) int64 {
	t.Helper()
	p, err := rdb.XPending(t.Context(), stream, group).Result()
	if err != nil {
		return -1
	}
	return p.Count
}

// An fx app runs a consumer with one option: it processes the stream on a
// real Redis, once per key, and stops cleanly, waiting for the message in
// hand.
func TestConsumeStreamRunsWithTheAppsLifecycle(t *testing.T) {
	rdb, prefix := streamEnv(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), goredisProbe) // the shared server runs on
	stream := prefix + "orders"
	reg, regOpt := registry()

	var mu sync.Mutex
	var credited []string
	hold := make(chan struct{}) // the last message's handler waits for it
	handling := make(chan struct{})
	credit := func(ctx context.Context, m idemconsume.Message) error {
		if m.Fields["hold"] == "yes" {
			close(handling)
			<-hold
		}
		mu.Lock()
		defer mu.Unlock()
		credited = append(credited, m.Fields["order"])
		return nil
	}
	app := fxtest.New(t, idempotency.Module, regOpt, fx.Supply(zap.NewNop()),
		idempotency.ConsumeStream(idempotency.StreamConsumer{
			Stream: stream, Group: "billing", Operation: "billing.credit", Handler: credit,
			Consumer: []redisstream.Option{redisstream.WithBlock(50 * time.Millisecond)},
		}))
	app.RequireStart()

	for _, v := range []map[string]any{
		{"idempotency-key": "o-1", "order": "1"},
		{"idempotency-key": "o-1", "order": "1"}, // the producer's copy
		{"idempotency-key": "o-2", "order": "2"},
	} {
		if err := rdb.XAdd(t.Context(), &redis.XAddArgs{Stream: stream, Values: v}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "three acknowledged deliveries", func() bool {
		mfs, _ := reg.Gather()
		n := 0.0
		for _, r := range []string{"processed", "duplicate"} {
			n += max(counterValue(mfs, "idempotency_consumer_deliveries_total", map[string]string{"operation": "billing.credit", "reason": r}), 0)
		}
		return n == 3 && pending(t, rdb, stream, "billing") == 0
	})

	// Stop waits for the message being handled, and acknowledges it.
	if err := rdb.XAdd(t.Context(), &redis.XAddArgs{Stream: stream, Values: map[string]any{"idempotency-key": "o-3", "order": "3", "hold": "yes"}}).Err(); err != nil {
		t.Fatal(err)
	}
	<-handling
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		stopped <- app.Stop(ctx)
	}()
	select {
	case err := <-stopped:
		t.Fatalf("the app stopped with a message in hand: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(hold)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(credited) != 3 || credited[2] != "3" {
		t.Errorf("credited %v, want orders 1, 2 and 3 once each", credited)
	}
	if n := pending(t, rdb, stream, "billing"); n != 0 {
		t.Errorf("%d entries left pending after a clean stop", n)
	}
}

// A group Redis refuses to create fails start-up, naming it.
func TestConsumeStreamFailsStartOnAStreamRedisRefuses(t *testing.T) {
	rdb, prefix := streamEnv(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), goredisProbe) // the shared server runs on
	stream := prefix + "not-a-stream"
	if err := rdb.Set(t.Context(), stream, "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	_, regOpt := registry()
	app := fx.New(fx.NopLogger, idempotency.Module, regOpt, fx.Supply(zap.NewNop()),
		idempotency.ConsumeStream(idempotency.StreamConsumer{
			Stream: stream, Group: "billing", Operation: "billing.credit",
			Handler: func(context.Context, idemconsume.Message) error { return nil },
		}))
	err := app.Start(t.Context())
	if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("Start() = %v, want WRONGTYPE", err)
	}
	_ = app.Stop(context.Background())
}

// failingAck is the app's Redis client, whose XACK fails.
type failingAck struct{ *redis.Client }

func (f failingAck) XAck(ctx context.Context, _, _ string, _ ...string) *redis.IntCmd {
	cmd := redis.NewIntCmd(ctx)
	cmd.SetErr(errors.New("XACK refused by the test"))
	return cmd
}

// By default, a failed XACK and a dead letter each give a log line through
// the module's logger and a metric.
func TestConsumeStreamLogsAndCountsFailuresByDefault(t *testing.T) {
	rdb, prefix := streamEnv(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), goredisProbe) // the shared server runs on
	stream := prefix + "orders"
	reg, regOpt := registry()
	core, logs := observer.New(zap.WarnLevel)
	handle := func(_ context.Context, m idemconsume.Message) error {
		if m.Fields["bad"] == "yes" {
			return idemconsume.Permanent(errors.New("amount does not parse"))
		}
		return nil
	}
	app := fxtest.New(t, idempotency.Module, regOpt, fx.Supply(zap.New(core)),
		fx.Supply(failingAck{rdb}), idempotency.UseRedisClient[failingAck](),
		idempotency.ConsumeStream(idempotency.StreamConsumer{
			Stream: stream, Group: "billing", Operation: "billing.credit", Handler: handle,
			Consumer: []redisstream.Option{redisstream.WithBlock(50 * time.Millisecond)},
		}))
	app.RequireStart()
	defer app.RequireStop()

	for _, v := range []map[string]any{{"order": "1"}, {"order": "2", "bad": "yes"}} {
		if err := rdb.XAdd(t.Context(), &redis.XAddArgs{Stream: stream, Values: v}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "an XACK error and a dead letter counted", func() bool {
		mfs, _ := reg.Gather()
		return counterValue(mfs, "idempotency_consumer_errors_total", map[string]string{"operation": "billing.credit", "command": "xack"}) >= 2 &&
			counterValue(mfs, "idempotency_consumer_dead_letters_total", map[string]string{"operation": "billing.credit", "reason": "permanent_error"}) == 1
	})
	if n := logs.FilterMessage("consumer command failed").FilterField(zap.String("command", "xack")).Len(); n < 2 {
		t.Errorf("%d log lines of a failed XACK, want one per failure (2); logs: %v", n, logs.All())
	}
	dead := logs.FilterMessage("message dead-lettered").All()
	if len(dead) != 1 {
		t.Fatalf("%d dead-letter log lines, want 1; logs: %v", len(dead), logs.All())
	}
	if f := dead[0].ContextMap(); f["reason"] != "permanent_error" || f["operation"] != "billing.credit" || f["error"] == nil || dead[0].LoggerName != "idempotency" {
		t.Errorf("dead-letter line %s %v, want its reason, operation and error", dead[0].LoggerName, f)
	}
	// The dead letter went to the dead-letter stream.
	if n, err := rdb.XLen(t.Context(), stream+redisstream.DeadLetterSuffix).Result(); err != nil || n != 1 {
		t.Errorf("dead-letter stream has %d entries (%v), want 1", n, err)
	}
}

// tracerProvider returns a TracerProvider of the SDK that records ended
// spans in the returned recorder.
func tracerProvider(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, sr
}

// tracedApp starts an app of Module on an in-memory store with opts, and
// returns its coordinator.
func tracedApp(t *testing.T, opts ...fx.Option) *coordinator.Coordinator {
	t.Helper()
	_, regOpt := registry()
	var c *coordinator.Coordinator
	app := fxtest.New(t, append([]fx.Option{
		idempotency.Module,
		idemfxtest.IgnoreEnvironment(),
		idemfxtest.MemoryStore(),
		regOpt,
		fx.Supply(zap.NewNop()),
		fx.Populate(&c),
	}, opts...)...)
	app.RequireStart()
	t.Cleanup(app.RequireStop)
	return c
}

// callTwice makes two calls of one key, each under a span of tp named
// "first" and "second".
func callTwice(t *testing.T, tp trace.TracerProvider, c *coordinator.Coordinator) {
	t.Helper()
	for _, name := range []string{"first", "second"} {
		ctx, span := tp.Tracer("test").Start(t.Context(), name)
		_, err := coordinator.Do(ctx, c, coordinator.Call{Operation: "payment.charge", Key: "order-42"},
			func(context.Context) (string, error) { return "ch_1", nil })
		span.End()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// spanAttrs returns the attributes of the ended span named name, and the
// names of its events.
func spanAttrs(t *testing.T, sr *tracetest.SpanRecorder, name string) (map[string]string, []string) {
	t.Helper()
	for _, s := range sr.Ended() {
		if s.Name() != name {
			continue
		}
		a := map[string]string{}
		for _, kv := range s.Attributes() {
			a[string(kv.Key)] = kv.Value.String()
		}
		var events []string
		for _, e := range s.Events() {
			events = append(events, e.Name)
		}
		return a, events
	}
	t.Fatalf("no span %q", name)
	return nil, nil
}

// provided supplies tp to the graph as trace.TracerProvider, and as itself.
func provided(tp *sdktrace.TracerProvider) fx.Option {
	return fx.Supply(fx.Annotate(tp, fx.As(fx.Self()), fx.As(new(trace.TracerProvider))))
}

func TestModuleTracesWithAProvider(t *testing.T) {
	t.Run("supplied", func(t *testing.T) {
		clearEnv(t)
		tp, sr := tracerProvider(t)
		testTraces(t, tp, sr, tracedApp(t, provided(tp)))
	})
	t.Run("provided as docs/tracing.md shows", func(t *testing.T) {
		clearEnv(t)
		tp, sr := tracerProvider(t)
		newTracerProvider := func() *sdktrace.TracerProvider { return tp }
		testTraces(t, tp, sr, tracedApp(t, fx.Provide(fx.Annotate(newTracerProvider, fx.As(fx.Self()), fx.As(new(trace.TracerProvider))))))
	})
}

// testTraces checks that c records two calls on their spans.
func testTraces(t *testing.T, tp trace.TracerProvider, sr *tracetest.SpanRecorder, c *coordinator.Coordinator) {
	t.Helper()
	callTwice(t, tp, c)

	for _, tt := range []struct {
		span, outcome, replayed, event string
	}{
		{"first", "miss", "false", "idempotency.miss"},
		{"second", "hit", "true", "idempotency.hit"},
	} {
		a, events := spanAttrs(t, sr, tt.span)
		if a["idempotency.outcome"] != tt.outcome || a["idempotency.replayed"] != tt.replayed ||
			a["idempotency.operation"] != "payment.charge" || a["idempotency.key_hash"] != telemetry.KeyHash("order-42") {
			t.Errorf("%s: attributes %v, want outcome %s, replayed %s and the key's hash", tt.span, a, tt.outcome, tt.replayed)
		}
		if !slices.Contains(events, tt.event) || !slices.Contains(events, "idempotency.storage_call") {
			t.Errorf("%s: events %v, want %s and storage calls", tt.span, events, tt.event)
		}
	}
	if n := len(sr.Ended()); n != 2 {
		t.Errorf("%d spans; the module makes no store spans", n)
	}
}

// An app that only sets the global provider (otel.SetTracerProvider), as
// OpenTelemetry's getting-started guides do, gets the events.
func TestModuleTracesWithTheGlobalProvider(t *testing.T) {
	clearEnv(t)
	tp, sr := tracerProvider(t)
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
	testTraces(t, otel.GetTracerProvider(), sr, tracedApp(t))
}

// The events land on the span of the call's context whatever provider
// started it, so a provider that fx does not see as trace.TracerProvider
// (docs/testing.md) loses nothing.
func TestModuleTracesSpansOfAnyProvider(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts func(*sdktrace.TracerProvider) []fx.Option
	}{
		{"no provider in the graph", func(*sdktrace.TracerProvider) []fx.Option { return nil }},
		{"provider as *sdktrace.TracerProvider only (fx matches types exactly)", func(tp *sdktrace.TracerProvider) []fx.Option {
			return []fx.Option{fx.Supply(tp)}
		}},
		{"both types in one fx.As, which provides the first only (docs/testing.md)", func(tp *sdktrace.TracerProvider) []fx.Option {
			return []fx.Option{fx.Supply(fx.Annotate(tp, fx.As(fx.Self(), new(trace.TracerProvider))))}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			tp, sr := tracerProvider(t)
			testTraces(t, tp, sr, tracedApp(t, tt.opts(tp)...))
		})
	}
}

// IDEMPOTENCY_TRACING_ENABLED=false leaves spans alone, with a provider in
// the graph or a global one.
func TestModuleDoesNotTraceWhenTracingIsOff(t *testing.T) {
	off := idempotency.OverrideSettings(func(s *idempotency.Settings) { s.TracingEnabled = false })
	for _, tt := range []struct {
		name   string
		global bool
		opts   func(*sdktrace.TracerProvider) []fx.Option
	}{
		{"provider in the graph", false, func(tp *sdktrace.TracerProvider) []fx.Option { return []fx.Option{provided(tp), off} }},
		{"global provider", true, func(*sdktrace.TracerProvider) []fx.Option { return []fx.Option{off} }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			tp, sr := tracerProvider(t)
			if tt.global {
				prev := otel.GetTracerProvider()
				otel.SetTracerProvider(tp)
				t.Cleanup(func() { otel.SetTracerProvider(prev) })
			}
			c := tracedApp(t, tt.opts(tp)...)
			callTwice(t, tp, c)
			for _, name := range []string{"first", "second"} {
				if a, events := spanAttrs(t, sr, name); len(a) != 0 || len(events) != 0 {
					t.Errorf("%s: attributes %v, events %v; want none", name, a, events)
				}
			}
		})
	}
}

// IDEMPOTENCY_LOG_KEYS=omitted keeps the key's hash off spans too.
func TestModuleTracingFollowsLogKeysOmitted(t *testing.T) {
	for _, mode := range []observability.LogKeysMode{observability.LogKeysHashed, observability.LogKeysPlain, observability.LogKeysOmitted} {
		t.Run(mode.String(), func(t *testing.T) {
			clearEnv(t)
			tp, sr := tracerProvider(t)
			c := tracedApp(t, provided(tp), idempotency.OverrideSettings(func(s *idempotency.Settings) { s.LogKeys = mode }))
			callTwice(t, tp, c)
			a, _ := spanAttrs(t, sr, "first")
			h, ok := a["idempotency.key_hash"]
			if mode == observability.LogKeysOmitted && ok || mode != observability.LogKeysOmitted && h != telemetry.KeyHash("order-42") {
				t.Errorf("LOG_KEYS %s: idempotency.key_hash = %q (set: %v)", mode, h, ok)
			}
			for _, v := range a {
				if strings.Contains(v, "order-42") {
					t.Errorf("LOG_KEYS %s: the key is on the span: %v", mode, a)
				}
			}
		})
	}
}

func TestTracingEnabledSetting(t *testing.T) {
	for _, tt := range []struct {
		value   *string
		want    bool
		wantErr string
	}{
		{nil, true, ""},
		{ptr("true"), true, ""},
		{ptr("false"), false, ""},
		{ptr("0"), false, ""},
		{ptr("maybe"), false, `IDEMPOTENCY_TRACING_ENABLED: "maybe" is not a boolean; use true or false`},
		{ptr(""), false, `IDEMPOTENCY_TRACING_ENABLED: "" is not a boolean`},
	} {
		name := "unset"
		if tt.value != nil {
			name = *tt.value
		}
		t.Run(name, func(t *testing.T) {
			clearEnv(t)
			if tt.value != nil {
				t.Setenv("IDEMPOTENCY_TRACING_ENABLED", *tt.value)
			}
			s, err := idempotency.LoadSettings()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("LoadSettings() error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.TracingEnabled != tt.want {
				t.Errorf("TracingEnabled = %v, want %v", s.TracingEnabled, tt.want)
			}
		})
	}
	if !idempotency.DefaultSettings().TracingEnabled {
		t.Error("DefaultSettings().TracingEnabled is false, want true")
	}
}

func ptr(s string) *string { return &s }

// The house stays light: the root holds at most 45 entries, so that a
// reader finds what a user calls, and no file a person wrote is over 600
// lines, so that each can be held in the head. Both count what git tracks.
func TestHouseStaysLight(t *testing.T) {
	out, err := exec.Command("git", "ls-files", "--full-name", ":/").Output()
	if err != nil {
		t.Skipf("git ls-files: %v (not a checkout)", err)
	}
	entries := map[string]bool{}
	for path := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		first, _, _ := strings.Cut(path, "/")
		entries[first] = true
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.HasSuffix(path, ".pb.go") {
			continue
		}
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(src), "\n// Code generated ") || strings.HasPrefix(string(src), "// Code generated ") {
			continue
		}
		if n := strings.Count(string(src), "\n"); n > 600 {
			t.Errorf("%s has %d lines; split it by concern below 600", path, n)
		}
	}
	if len(entries) > 45 {
		t.Errorf("the root holds %d entries, more than 45", len(entries))
	}
	if len(entries) < 20 {
		t.Fatalf("found %d root entries; is the test running at the module's root?", len(entries))
	}
}
