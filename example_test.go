package idempotency_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"
	uberfxtest "go.uber.org/fx/fxtest"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/fxtest"
	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/idemconsume/redisstream"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/observability"
	"github.com/idemkit/idempotency/redisrepo"
)

func Example() {
	var c *coordinator.Coordinator
	app := fx.New(
		fx.NopLogger,
		idempotency.Module,
		// An app leaves these two out: its settings come from the
		// IDEMPOTENCY_* environment and its store is Redis. They keep the
		// example self-contained.
		fxtest.IgnoreEnvironment(),
		fxtest.MemoryStore(),
		fx.Populate(&c), // an app injects *coordinator.Coordinator into its handlers
	)
	ctx := context.Background()
	if err := app.Start(ctx); err != nil {
		panic(err)
	}
	defer app.Stop(ctx)

	runs := 0
	chargeCard := func(context.Context) (string, error) {
		runs++
		return fmt.Sprintf("ch_%d", runs), nil
	}
	call := coordinator.Call{Operation: "payment.charge", Key: "order-42"}
	first, _ := coordinator.Do(ctx, c, call, chargeCard)
	retry, _ := coordinator.Do(ctx, c, call, chargeCard) // a client retry: replayed
	fmt.Println(first, retry, "runs:", runs)
	// Output: ch_1 ch_1 runs: 1
}

// The app's own Redis client, instead of one built from
// IDEMPOTENCY_REDIS_URL. This example is compiled but not run: it needs a
// Redis server.
func ExampleUseRedisClient() {
	fx.New(
		fx.Provide(func(lc fx.Lifecycle) *redis.Client {
			client := redis.NewClient(&redis.Options{
				Addr: "localhost:6379",
				// Lets IDEMPOTENCY_STORAGE_TIMEOUT bound each call on the
				// socket too; see docs/configuration.md.
				ContextTimeoutEnabled: true,
			})
			lc.Append(fx.StopHook(client.Close)) // the app's client: the module neither pings nor closes it
			return client
		}),
		idempotency.Module,
		idempotency.UseRedisClient[*redis.Client](),
		fx.Invoke(func(c *coordinator.Coordinator) { /* hand c to the handlers */ }),
	).Run()
}

func ExampleOverrideSettings() {
	var s idempotency.Settings
	app := fx.New(
		fx.NopLogger,
		idempotency.Module,
		fxtest.IgnoreEnvironment(), // an app reads the environment instead
		idempotency.OverrideSettings(func(s *idempotency.Settings) {
			s.InFlight = coordinator.InFlightRaise // fail fast rather than wait for the first caller
		}),
		fx.Populate(&s),
	)
	if err := app.Err(); err != nil { // the changed settings are validated again
		panic(err)
	}
	fmt.Println(s.InFlight)
	// Output: raise
}

func ExampleOverrideSettingsWith() {
	type tenant struct{ name string } // a value the app has in its graph
	var s idempotency.Settings
	app := fx.New(
		fx.NopLogger,
		idempotency.Module,
		fxtest.IgnoreEnvironment(), // an app reads the environment instead
		fx.Supply(tenant{name: "shop"}),
		idempotency.OverrideSettingsWith(func(t tenant, s *idempotency.Settings) {
			s.KeyPrefix = t.name + ":idempotency:"
		}),
		fx.Populate(&s),
	)
	if err := app.Err(); err != nil {
		panic(err)
	}
	fmt.Println(s.KeyPrefix)
	// Output: shop:idempotency:
}

// Redis Sentinel from the settings: IDEMPOTENCY_REDIS_SENTINEL_MASTER and
// IDEMPOTENCY_REDIS_SENTINEL_ADDRS, set here in code. The URL still gives the
// master's password and database; its host is ignored. NewRedisClient does
// not connect.
func ExampleNewRedisClient_sentinel() {
	s := idempotency.DefaultSettings() // an app: idempotency.LoadSettings()
	s.RedisURL = "redis://:master-password@ignored/2"
	s.RedisSentinelMaster = "payments"
	s.RedisSentinelAddrs = []string{"sentinel-a:26379", "sentinel-b:26379", "sentinel-c:26379"}
	client, err := idempotency.NewRedisClient(s)
	if err != nil {
		panic(err)
	}
	defer client.Close()
	o := client.(*redis.Client).Options() // a failover client: it follows the sentinels
	fmt.Println(o.Addr, "db", o.DB)
	// Output: FailoverClient db 2
}

// go-redis's own log lines through a zap logger, as Module does on start
// (IDEMPOTENCY_REDIS_LOGS=zap), for an app that uses the library without
// fx. This example is compiled but not run: go-redis logs only when it has
// something to say, such as a failed dial.
func ExampleSetRedisLogger() {
	logger, _ := zap.NewProduction()
	detach, err := idempotency.SetRedisLogger(idempotency.RedisLogsZap, logger)
	if err != nil {
		panic(err)
	}
	defer detach() // before the logger is closed: lines go back to standard error
	// ... every go-redis client of the process now logs through logger,
	// named "go-redis".
}

// Settings as an operator tool shows them: no password, and where they point.
func ExampleSettings_Redacted() {
	s := idempotency.DefaultSettings() // an app: idempotency.LoadSettings()
	s.RedisURL = "rediss://app:s3cret@cache.internal:6380/2"
	fmt.Println(s.Redacted().RedisURL)
	// Output: rediss://app:xxxxx@cache.internal:6380/2
}

// Where the settings point, for a log line or an error: a server, a
// cluster's seeds, or a Sentinel master; never a password.
func ExampleSettings_RedisAddr() {
	s := idempotency.DefaultSettings()
	s.RedisURL = "redis://:s3cret@cache.internal:6380/0"
	fmt.Println(s.RedisAddr())
	s.RedisSentinelMaster, s.RedisSentinelAddrs = "payments", []string{"sentinel-a:26379", "sentinel-b:26379"}
	fmt.Println(s.RedisAddr())
	// Output:
	// cache.internal:6380
	// sentinel master payments via sentinel-a:26379,sentinel-b:26379
}

// IDEMPOTENCY_REDIS_LOGS is read with UnmarshalText, which names the
// accepted values when it refuses one.
func ExampleRedisLogsMode() {
	var m idempotency.RedisLogsMode
	fmt.Println(m) // the zero value means zap
	if err := m.UnmarshalText([]byte("off")); err == nil {
		fmt.Println(m)
	}
	fmt.Println(m.UnmarshalText([]byte("stderr")))
	// Output:
	// zap
	// off
	// unknown go-redis log mode "stderr": accepted values are zap, off, keep
}

// One option runs a Redis Streams consumer with the app's lifecycle, through
// the module's coordinator, logged and counted on the module's logger and
// registerer (docs/consumers.md).
func ExampleConsumeStream() {
	credit := func(ctx context.Context, m idemconsume.Message) error {
		return nil // credit m.Fields["account"] with m.Fields["amount"]
	}
	app := fx.New(
		idempotency.Module,
		idempotency.ConsumeStream(idempotency.StreamConsumer{
			Stream: "orders", Group: "billing", Operation: "billing.credit", Handler: credit,
			Processor: []idemconsume.Option{idemconsume.WithMaxDeliveries(5)},
			Consumer:  []redisstream.Option{redisstream.WithWorkers(4)},
		}),
	)
	_ = app // app.Run() until SIGTERM; it needs a Redis at IDEMPOTENCY_REDIS_URL
}

// Module records calls on their spans, with the app's trace.TracerProvider
// from the graph, as here, or else the global one (otel.SetTracerProvider).
// fx matches types exactly: the SDK's provider is provided as the interface
// too.
func ExampleModule_tracing() {
	sr := tracetest.NewSpanRecorder() // in an app: an exporter, e.g. OTLP, in a batch processor
	newTracerProvider := func(lc fx.Lifecycle) *sdktrace.TracerProvider {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
		lc.Append(fx.StopHook(tp.Shutdown))
		return tp
	}
	var c *coordinator.Coordinator
	var tp trace.TracerProvider
	app := fx.New(
		fx.NopLogger,
		fx.Provide(fx.Annotate(newTracerProvider, fx.As(fx.Self()), fx.As(new(trace.TracerProvider)))),
		idempotency.Module,
		fxtest.IgnoreEnvironment(), // an app reads the environment instead
		fxtest.MemoryStore(),       // and uses Redis
		fx.Supply(zap.NewNop(), fx.Annotate(prometheus.NewRegistry(), fx.As(new(prometheus.Registerer)))),
		fx.Populate(&c, &tp),
	)
	ctx := context.Background()
	if err := app.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer app.Stop(ctx)

	// In an app, otelhttp or otelgrpc starts the request's span.
	ctx, span := tp.Tracer("shop").Start(ctx, "POST /charges")
	_, err := coordinator.Do(ctx, c, coordinator.Call{Operation: "payment.charge", Key: "order-42"},
		func(context.Context) (string, error) { return "ch_1", nil })
	span.End()
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, kv := range sr.Ended()[0].Attributes() {
		fmt.Printf("%s=%s\n", kv.Key, kv.Value.String())
	}
	// Output:
	// idempotency.operation=payment.charge
	// idempotency.key_hash=3bf8b157c4238eef
	// idempotency.outcome=miss
	// idempotency.replayed=false
}

// Without fx: the tracing observer beside the metrics and logs.
func ExampleNewTracingObserver() {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	defer tp.Shutdown(context.Background())

	s := idempotency.DefaultSettings()       // or idempotency.LoadSettings()
	s.LogKeys = observability.LogKeysOmitted // no key hash in logs, nor on spans
	obs, err := idempotency.NewObserver(s, zap.NewNop(), prometheus.NewRegistry())
	if err != nil {
		fmt.Println(err)
		return
	}
	c, err := idempotency.NewCoordinator(s, memstore.New(), observability.Multi(obs, idempotency.NewTracingObserver(s, tp)))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	ctx, span := tp.Tracer("shop").Start(context.Background(), "POST /charges")
	_, err = coordinator.Do(ctx, c, coordinator.Call{Operation: "payment.charge", Key: "order-42"},
		func(context.Context) (string, error) { return "ch_1", nil })
	span.End()
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, e := range sr.Ended()[0].Events() {
		fmt.Println(e.Name)
	}
	// Output:
	// idempotency.storage_call
	// idempotency.miss
	// idempotency.storage_call
	// idempotency.stored
}

// Every command in the README's sh blocks must be one that
// tools/readme-commands.sh runs (CI runs that script), so a README command
// cannot silently stop working.
func TestReadmeCommandsAreChecked(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile("tools/readme-commands.sh")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(readme), -1)
	if len(blocks) < 2 {
		t.Fatalf("found %d sh blocks in README.md; expected the install command and the two commands", len(blocks))
	}
	checked := 0
	for _, b := range blocks {
		for _, line := range strings.Split(b[1], "\n") {
			cmd := strings.TrimSpace(strings.SplitN(line, "#", 2)[0])
			if cmd == "" {
				continue
			}
			if !strings.Contains(string(script), `echo ">>> `+cmd+`"`) {
				t.Errorf("README command %q is not run by tools/readme-commands.sh", cmd)
			}
			checked++
		}
	}
	t.Logf("%d README commands are checked", checked)
}

// Ledger is the service of the docs' snippet.
type Ledger struct{ credited chan string }

// Credit is a handler of the stream of orders.
func (l *Ledger) Credit(_ context.Context, m idemconsume.Message) error {
	l.credited <- m.Fields["order"]
	return nil
}

// The snippet of docs/consumers.md and docs/configuration.md starts as
// written: the code between the markers below is the docs' snippet, which
// TestConsumersSnippetIsTheDocumented checks word for word.
func TestConsumersSnippetStartsAsWritten(t *testing.T) {
	clearEnv(t)
	server := redistest.Start(t) // a server of its own: the snippet's stream is "orders"
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), goredisProbe)
	newRedisClient := func(lc fx.Lifecycle) *redis.Client {
		rdb := redis.NewClient(&redis.Options{Addr: server.Addr(), ContextTimeoutEnabled: true})
		lc.Append(fx.StopHook(rdb.Close))
		return rdb
	}
	ledger := &Ledger{credited: make(chan string, 1)}
	newLedger := func() *Ledger { return ledger }

	// snippet: begin
	app := fx.New(
		fx.Provide(newRedisClient, newLedger),       // your *redis.Client, your service
		idempotency.Module,                          // reads IDEMPOTENCY_* from the environment
		idempotency.UseRedisClient[*redis.Client](), // the module and the consumer use your client
		idempotency.ConsumeStreamWith(idempotency.StreamConsumer{
			Stream: "orders", Group: "billing", Operation: "billing.credit",
		}, func(l *Ledger) idemconsume.Handler { return l.Credit }),
	)
	// snippet: end

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := app.Start(ctx); err != nil {
		t.Fatal(err)
	}
	rdb := server.Client(t)
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "orders", Values: map[string]any{"idempotency-key": "o-1", "order": "1"}}).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-ledger.credited:
		if got != "1" {
			t.Errorf("credited order %q, want 1", got)
		}
	case <-ctx.Done():
		t.Fatal("the consumer processed nothing")
	}
	if err := app.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// The docs show the snippet above as it is, so that what a user copies is
// what the test starts.
func TestConsumersSnippetIsTheDocumented(t *testing.T) {
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(string(src), "\t// snippet: begin\n")
	code, _, ok := strings.Cut(rest, "\t// snippet: end\n")
	if !ok {
		t.Fatal("no snippet in example_test.go")
	}
	var lines []string
	for line := range strings.SplitSeq(strings.TrimSuffix(code, "\n"), "\n") {
		line = strings.TrimPrefix(line, "\t")
		indent := len(line) - len(strings.TrimLeft(line, "\t"))
		lines = append(lines, strings.Repeat("    ", indent)+line[indent:])
	}
	snippet := "```go\n" + strings.Join(lines, "\n") + "\n"
	for _, doc := range []string{"docs/consumers.md", "docs/configuration.md"} {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(text), snippet) {
			t.Errorf("%s does not show the snippet of TestConsumersSnippetStartsAsWritten as it is:\n%s", doc, snippet)
		}
	}
}

// The fx traps that docs/testing.md warns about, pinned as tests so the docs
// stay true.

// A plain fx.Replace of a concrete value replaces that concrete type, which
// nobody asked for: the module's idemstore.Store stays the Redis store.
func TestTrap_ReplaceWithoutAsDoesNothing(t *testing.T) {
	clearEnv(t)
	_, regOpt := registry()
	var store idemstore.Store
	app := uberfxtest.New(t, idempotency.Module, regOpt,
		fx.Replace(memstore.New()), // the trap
		fx.Populate(&store))
	defer app.RequireStart().RequireStop()
	if _, ok := store.(*redisrepo.Store); !ok {
		t.Fatalf("store is %T; the trap no longer springs, update docs/testing.md", store)
	}
}

// With fx.As, the interface is replaced.
func TestTrap_ReplaceWithAsWorks(t *testing.T) {
	clearEnv(t)
	_, regOpt := registry()
	mem := memstore.New()
	var store idemstore.Store
	app := uberfxtest.New(t, idempotency.Module, regOpt,
		fx.Replace(fx.Annotate(mem, fx.As(new(idemstore.Store)))),
		fx.Populate(&store))
	defer app.RequireStart().RequireStop()
	if store != idemstore.Store(mem) {
		t.Fatalf("store is %T", store)
	}
}

// The module keeps its observer private; a root-level fx.Decorate of it
// fails at start-up. Add observers through the idempotency.observers group
// instead.
func TestTrap_DecorateOfAPrivateTypeFails(t *testing.T) {
	clearEnv(t)
	_, regOpt := registry()
	app := fx.New(idempotency.Module, fxtest.MemoryStore(), regOpt, fx.NopLogger,
		fx.Decorate(func(o idemevent.Observer) idemevent.Observer { return o }),
		fx.Invoke(func(*coordinator.Coordinator) {}))
	if app.Err() == nil {
		t.Fatal("decorating the module's private observer worked; update docs/testing.md")
	}
}

func TestExtraObserversFromTheGroup(t *testing.T) {
	clearEnv(t)
	_, regOpt := registry()
	var seen []idemevent.Kind
	obs := idemevent.ObserverFunc(func(_ context.Context, e idemevent.Event) { seen = append(seen, e.Kind) })
	var c *coordinator.Coordinator
	app := uberfxtest.New(t, idempotency.Module, fxtest.MemoryStore(), regOpt,
		fx.Supply(fx.Annotate(obs, fx.As(new(idemevent.Observer)), fx.ResultTags(`group:"`+idempotency.ObserversGroup+`"`))),
		fx.Populate(&c))
	defer app.RequireStart().RequireStop()
	if _, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: "op", Key: "k"}, func(context.Context) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	if len(seen) == 0 || seen[0] != idemevent.StorageCall {
		t.Fatalf("the app's observer saw %v", seen)
	}
}
