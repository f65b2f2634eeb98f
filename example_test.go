package idempotency_test

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
	"go.uber.org/fx"
	"go.uber.org/zap"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/fxtest"
	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/idemconsume/redisstream"
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
