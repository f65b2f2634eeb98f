package idempotency_test

import (
	"fmt"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// sentinelSettings returns the default settings with Sentinel set, and url
// as the master's URL.
func sentinelSettings(url string) idempotency.Settings {
	s := idempotency.DefaultSettings()
	s.RedisURL = url
	s.RedisSentinelMaster = "mymaster"
	s.RedisSentinelAddrs = []string{"127.0.0.1:1", "127.0.0.1:2"}
	return s
}

// With Sentinel set, NewRedisClient builds a failover client for the
// master the settings name, through the listed sentinels, with the URL's
// credentials, database and TLS, and the fields it sets itself for every
// client (fail fast, context deadlines).
func TestNewRedisClientSentinel(t *testing.T) {
	s := sentinelSettings("rediss://app:secret@ignored.example:6380/3")
	s.RedisSentinelPassword = "sentinel-secret"
	s.StorageTimeout = 250 * time.Millisecond
	client, err := idempotency.NewRedisClient(s)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c, ok := client.(*redis.Client)
	if !ok {
		t.Fatalf("NewRedisClient() = %T, want a failover *redis.Client", client)
	}
	o := c.Options()
	if o.Addr != "FailoverClient" {
		t.Errorf("Addr = %q: not a failover client", o.Addr)
	}
	if o.Username != "app" || o.Password != "secret" || o.DB != 3 {
		t.Errorf("user %q password %q db %d; want the URL's app, secret, 3", o.Username, o.Password, o.DB)
	}
	if o.TLSConfig == nil || o.TLSConfig.ServerName != "" {
		t.Errorf("TLSConfig = %+v; want TLS (rediss://), verified under each server's own name", o.TLSConfig)
	}
	if !o.ContextTimeoutEnabled || o.DialerRetries != 1 || o.DialTimeout != 5*time.Second {
		t.Errorf("ContextTimeoutEnabled %v, DialerRetries %d, DialTimeout %v; want true, 1, 5s (the lease, at most 5s)",
			o.ContextTimeoutEnabled, o.DialerRetries, o.DialTimeout)
	}
	if strings.Contains(s.String(), "sentinel-secret") || !strings.Contains(s.String(), "RedisSentinelPassword:xxxxx") {
		t.Errorf("String() = %s; want the sentinel password masked", s)
	}
}

// Every query option that redis.ParseURL accepts reaches the failover
// client (the master's connections), or is refused naming it, as for a
// cluster (TestNewRedisClientClusterCarriesEveryQueryOption).
func TestNewRedisClientSentinelCarriesEveryQueryOption(t *testing.T) {
	checkQueryOptionsCarried(t, "failover", sentinelSettings,
		func(c redis.UniversalClient) reflect.Value { return reflect.ValueOf(*c.(*redis.Client).Options()) },
		"IDEMPOTENCY_REDIS_URL: query option %s has no effect on a failover client (IDEMPOTENCY_REDIS_SENTINEL_MASTER is set)")
}

// NewRedisClient refuses incomplete Sentinel settings as Validate does,
// naming the variable, rather than a client that fails every call.
func TestNewRedisClientSentinelRefusesIncompleteSettings(t *testing.T) {
	s := sentinelSettings("redis://localhost:6379/0")
	s.RedisSentinelAddrs = nil
	_, err := idempotency.NewRedisClient(s)
	want := "IDEMPOTENCY_REDIS_SENTINEL_ADDRS: is empty but IDEMPOTENCY_REDIS_SENTINEL_MASTER is set"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("NewRedisClient() error = %v; want %q", err, want)
	}
}

// The module, configured by the environment alone, reaches the master
// through a real sentinel; after SENTINEL FAILOVER a completed key still
// replays without a run, and new keys run on the promoted replica. go-redis's
// own lines (the sentinel's "new master") reach the app's logger, named
// go-redis, and not standard error. The failover under a storm of calls,
// checked call by call, is the reliability suite's (TestSentinel there).
func TestModuleOnSentinel(t *testing.T) {
	clearEnv(t)
	sentinel := redistest.StartSentinel(t)
	prefix := redistest.Prefix(t)
	t.Setenv("IDEMPOTENCY_REDIS_SENTINEL_MASTER", redistest.SentinelMaster)
	t.Setenv("IDEMPOTENCY_REDIS_SENTINEL_ADDRS", strings.Join(sentinel.Addrs(), ","))
	t.Setenv("IDEMPOTENCY_KEY_PREFIX", prefix)
	t.Setenv("IDEMPOTENCY_ON_STORAGE_ERROR", "raise")
	core, logs := observer.New(zapcore.InfoLevel)
	var c *coordinator.Coordinator
	app := fxtest.New(t, idempotency.Module,
		fx.Supply(fx.Annotate(prometheus.NewRegistry(), fx.As(new(prometheus.Registerer)))),
		fx.Supply(zap.New(core)), fx.Populate(&c))
	app.RequireStart()
	defer app.RequireStop()

	var runs atomic.Int64
	first := coordinator.Call{Operation: "payment.charge", Key: "before-failover"}
	want, err := coordinator.Do(t.Context(), c, first, charge(&runs))
	if err != nil {
		t.Fatal(err)
	}
	master, err := sentinel.Master(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	direct := redis.NewClient(&redis.Options{Addr: master})
	defer direct.Close()
	// On a busy machine the first call's completion can miss the storage
	// timeout and be saved in the background after Do has returned: the
	// record must be completed on the master before WAIT, or the failover
	// may lose the completion, and the key run again, as documented.
	onMaster := redisrepo.New(direct, redisrepo.WithKeyPrefix(prefix))
	eventually(t, func() error {
		rec, err := onMaster.Get(t.Context(), coordinator.Key{Operation: first.Operation, Key: first.Key})
		if err == nil && rec.State == coordinator.StateCompleted {
			return nil
		}
		return fmt.Errorf("the first call's record is not completed on the master: state %v, %v; logged: %v", rec.State, err, logs.FilterLoggerName("idempotency").All())
	})
	// The record is on the replica before the failover: a failover may lose
	// what had not reached it (docs/architecture.md).
	if n, err := direct.Wait(t.Context(), 1, 5000).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1: %d replicas, %v", n, err)
	}
	failover, err := sentinel.Failover(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	promoted := failover.Master
	// The client learns of the switch from the sentinel's +switch-master;
	// until then a call may meet the former master, now a read-only
	// replica, and fail (raise): retried here until it answers.
	var got string
	eventually(t, func() error {
		var err error
		if got, err = coordinator.Do(t.Context(), c, first, charge(&runs)); err != nil {
			return fmt.Errorf("no call succeeds after the failover to %s: %w", promoted, err)
		}
		return nil
	})
	if got != want || runs.Load() != 1 {
		t.Fatalf("after the failover: %q, %d runs; want the replay of %q, 1 run; logged: %v", got, runs.Load(), want, logs.FilterLoggerName("idempotency").All())
	}
	if _, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: "payment.charge", Key: "after-failover"}, charge(&runs)); err != nil {
		t.Fatal(err)
	}
	onPromoted := redis.NewClient(&redis.Options{Addr: promoted})
	defer onPromoted.Close()
	if n, err := onPromoted.Exists(t.Context(), prefix+"payment.charge:after-failover", prefix+"payment.charge:before-failover").Result(); err != nil || n != 2 {
		t.Fatalf("records on the promoted master: %d, %v; want both", n, err)
	}
	switched := logs.FilterLoggerName("go-redis").FilterMessageSnippet("new master").FilterMessageSnippet(promoted)
	if switched.Len() == 0 {
		t.Errorf("no go-redis line about the new master %s on the app's logger; go-redis lines: %v", promoted, logs.FilterLoggerName("go-redis").All())
	}
	for _, e := range switched.All() {
		if e.Level != zapcore.InfoLevel {
			t.Errorf("%q logged at %v, want info", e.Message, e.Level)
		}
	}
}

// go-redis's lines are logged at Warn when they report a failure: lines as
// go-redis v9.23 writes them.
func TestRedisLogLevels(t *testing.T) {
	for line, failure := range map[string]bool{
		`sentinel: new master="mymaster" addr="127.0.0.1:6380"`:                                                     false,
		`sentinel: selected addr=127.0.0.1:26379 masterAddr=127.0.0.1:6379`:                                         false,
		`sentinel: GetMasterAddrByName master="mymaster" failed: dial tcp 127.0.0.1:1: connect: connection refused`: true,
		`redis: connection pool: failed to dial after 5 attempts: dial tcp: i/o timeout`:                            true,
		`redis: discarding bad PubSub connection: read: connection reset by peer`:                                   true,
		`sentinel: Sentinels addrs=["127.0.0.1:26379"]`:                                                             false,
	} {
		if got := idempotency.FailureLine(line); got != failure {
			t.Errorf("FailureLine(%q) = %v, want %v", line, got, failure)
		}
	}
}

// SetRedisLogger refuses an unknown mode, and once detached, lines no longer
// reach the logger.
func TestSetRedisLogger(t *testing.T) {
	if _, err := idempotency.SetRedisLogger("syslog", zap.NewNop()); err == nil || err.Error() != `unknown go-redis log mode "syslog": accepted values are zap, off, keep` {
		t.Fatalf("SetRedisLogger(syslog) error = %v", err)
	}
	core, logs := observer.New(zapcore.InfoLevel)
	detach, err := idempotency.SetRedisLogger(idempotency.RedisLogsZap, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	// A real go-redis line: a failover client whose sentinel is not there.
	client := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: []string{"127.0.0.1:1"}, MaxRetries: -1, DialerRetries: 1})
	_ = client.Ping(t.Context()).Err()
	_ = client.Close()
	lines := logs.FilterLoggerName("go-redis").All()
	if len(lines) == 0 {
		t.Fatal("no go-redis line on the logger")
	}
	t.Logf("go-redis said: %q at %v", lines[0].Message, lines[0].Level)
	if lines[0].Level != zapcore.WarnLevel {
		t.Errorf("%q at %v; want warn", lines[0].Message, lines[0].Level)
	}
	detach()
	detach()
	before := logs.Len()
	client = redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: []string{"127.0.0.1:1"}, MaxRetries: -1, DialerRetries: 1})
	_ = client.Ping(t.Context()).Err()
	_ = client.Close()
	if logs.Len() != before {
		t.Errorf("detached, yet %d more lines reached the logger", logs.Len()-before)
	}
	if _, err := idempotency.SetRedisLogger(idempotency.RedisLogsOff, nil); err != nil {
		t.Fatal(err)
	}
}

// RedisAddr names where the settings point without any secret; Redacted
// masks both passwords and changes nothing else.
func TestSettingsRedisAddrAndRedacted(t *testing.T) {
	s := idempotency.DefaultSettings()
	s.RedisURL = "rediss://app:hunter2@cache.example:6380/1"
	if got := s.RedisAddr(); got != "cache.example:6380" {
		t.Errorf("RedisAddr() = %q", got)
	}
	s.RedisURL = "redis://app:hunter2@[::1"
	if got := s.RedisAddr(); got != "(invalid URL)" {
		t.Errorf("RedisAddr() of an invalid URL = %q", got)
	}
	c := idempotency.DefaultSettings()
	c.RedisClusterAddrs = []string{"node-a:7000", "node-b:7001"}
	if got := c.RedisAddr(); got != "cluster node-a:7000,node-b:7001" {
		t.Errorf("cluster RedisAddr() = %q", got)
	}
	sn := sentinelSettings("redis://:hunter2@ignored/0")
	sn.RedisSentinelPassword = "s3cret"
	if got := sn.RedisAddr(); got != "sentinel master mymaster via 127.0.0.1:1,127.0.0.1:2" {
		t.Errorf("sentinel RedisAddr() = %q", got)
	}
	r := sn.Redacted()
	if r.RedisURL != "redis://:xxxxx@ignored/0" || r.RedisSentinelPassword != "xxxxx" {
		t.Errorf("Redacted() URL %q, sentinel password %q", r.RedisURL, r.RedisSentinelPassword)
	}
	r.RedisURL, r.RedisSentinelPassword = sn.RedisURL, sn.RedisSentinelPassword
	if !reflect.DeepEqual(r, sn) {
		t.Errorf("Redacted() changed more than the secrets:\n%+v\n%+v", r, sn)
	}
}
