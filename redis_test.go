package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	idemfxtest "github.com/idemkit/idempotency/fxtest"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/internal/faultproxy"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// backend supplies b under BackendName.
func backend(b *idempotency.Backend) fx.Option {
	return fx.Supply(fx.Annotate(b, fx.ResultTags(`name:"`+idempotency.BackendName+`"`)))
}

// With a Backend, the coordinator uses its store, Module builds no Redis
// client (an unreachable Redis is never dialled, so nothing is logged about
// it), and Start and Stop run with the app, Start with the module's logger.
func TestModuleUsesTheBackend(t *testing.T) {
	clearEnv(t)
	t.Setenv("IDEMPOTENCY_REDIS_URL", "redis://127.0.0.1:1/0")
	_, regOpt := registry()
	mem := memstore.New()
	var started, stopped atomic.Int32
	var gotLogger *zap.Logger
	b := &idempotency.Backend{
		Store: mem,
		Start: func(_ context.Context, l *zap.Logger) error { started.Add(1); gotLogger = l; return nil },
		Stop:  func(context.Context) error { stopped.Add(1); return nil },
	}
	logger := zap.NewNop()
	var c *coordinator.Coordinator
	app := fxtest.New(t, idempotency.Module, backend(b), regOpt, fx.Supply(logger), fx.Populate(&c))
	app.RequireStart()
	var runs atomic.Int64
	for range 2 {
		if _, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: "op", Key: "k"}, charge(&runs)); err != nil {
			t.Fatal(err)
		}
	}
	if runs.Load() != 1 || mem.Len() != 1 {
		t.Errorf("runs=%d records=%d, want 1 and 1", runs.Load(), mem.Len())
	}
	app.RequireStop()
	if started.Load() != 1 || stopped.Load() != 1 || gotLogger != logger {
		t.Errorf("Start ran %d times, Stop %d, logger %p; want once, once, the app's %p", started.Load(), stopped.Load(), gotLogger, logger)
	}
}

// A Backend's Start error stops start-up; asking for the Redis store of an
// app whose store is a Backend is an error that says why.
func TestModuleBackendErrors(t *testing.T) {
	clearEnv(t)
	_, regOpt := registry()
	refused := errors.New("IDEMPOTENCY_POSTGRES_URL: the database refused the password")
	app := fx.New(idempotency.Module, fx.NopLogger, regOpt, fx.Supply(zap.NewNop()),
		backend(&idempotency.Backend{Store: memstore.New(), Start: func(context.Context, *zap.Logger) error { return refused }}),
		fx.Invoke(func(*coordinator.Coordinator) {}))
	if err := app.Start(t.Context()); !errors.Is(err, refused) {
		t.Errorf("start with a failing backend = %v, want its error", err)
	}

	app = fx.New(idempotency.Module, fx.NopLogger, regOpt, backend(&idempotency.Backend{Store: memstore.New()}),
		fx.Invoke(func(*redisrepo.Store) {}))
	if err := app.Err(); err == nil || !strings.Contains(err.Error(), "not Redis: there is no *redisrepo.Store") {
		t.Errorf("*redisrepo.Store with a backend: %v", err)
	}

	app = fx.New(idempotency.Module, fx.NopLogger, regOpt, backend(&idempotency.Backend{}),
		fx.Invoke(func(*coordinator.Coordinator) {}))
	if err := app.Err(); err == nil || !strings.Contains(err.Error(), "has no Store") {
		t.Errorf("a backend without a store: %v", err)
	}
}

// fencelessStore is a store that hands out no fences, as idempg's does not.
type fencelessStore struct{ idemstore.Store }

// IDEMPOTENCY_FENCED_OPERATIONS with a store that hands out no fences (a
// Backend such as idempg's) stops start-up with a *SettingsError naming the
// variable and what to set, not with the coordinator's option name.
func TestModuleFencedOperationsNeedAFencer(t *testing.T) {
	clearEnv(t)
	t.Setenv("IDEMPOTENCY_FENCED_OPERATIONS", "payment.charge")
	_, regOpt := registry()
	app := fx.New(idempotency.Module, fx.NopLogger, regOpt, fx.Supply(zap.NewNop()),
		backend(&idempotency.Backend{Store: fencelessStore{memstore.New()}}),
		fx.Invoke(func(*coordinator.Coordinator) {}))
	err := app.Err()
	var se *idempotency.SettingsError
	if !errors.As(err, &se) || len(se.Errs) != 1 {
		t.Fatalf("start-up with fences over a store without = %v, want a *SettingsError with one refusal", err)
	}
	const want = "IDEMPOTENCY_FENCED_OPERATIONS: the store (idempotency_test.fencelessStore) hands out no fences: " +
		"it does not implement coordinator.Fencer; leave IDEMPOTENCY_FENCED_OPERATIONS empty with this store (the Redis store hands out fences)"
	if got := se.Errs[0].Error(); got != want {
		t.Errorf("refusal = %q\nwant %q", got, want)
	}

	// Without fenced operations the same store is fine.
	clearEnv(t)
	_, regOpt = registry()
	app = fx.New(idempotency.Module, fx.NopLogger, regOpt, fx.Supply(zap.NewNop()),
		backend(&idempotency.Backend{Store: fencelessStore{memstore.New()}}),
		fx.Invoke(func(*coordinator.Coordinator) {}))
	if err := app.Err(); err != nil {
		t.Errorf("start-up over a store without fences, none asked for = %v", err)
	}
}

// A variable that a module of its own declares (as idempg declares its
// IDEMPOTENCY_POSTGRES_*) is accepted by LoadSettings only once declared;
// set while the app's store is Redis, it fails start-up, naming the
// variable and the module to add, without its value.
func TestDeclaredVariables(t *testing.T) {
	clearEnv(t)
	const name = "IDEMPOTENCY_TESTSTORE_URL_OF_DECLARED"
	t.Setenv(name, "store://app:s3cret@db")
	if _, err := idempotency.LoadSettings(); err == nil || !strings.Contains(err.Error(), name+": unknown variable: no package of this program reads it") {
		t.Fatalf("LoadSettings before the declaration: %v, want %s unknown", err, name)
	}
	idempotency.DeclareVariables("teststore.Module", name)
	if _, err := idempotency.LoadSettings(); err != nil {
		t.Fatalf("LoadSettings after the declaration: %v", err)
	}
	_, regOpt := registry()
	app := fx.New(idempotency.Module, fx.NopLogger, regOpt, fx.Invoke(func(*coordinator.Coordinator) {}))
	err := app.Err()
	if err == nil || !strings.Contains(err.Error(), name+" is set, but the app has no teststore.Module, which reads it: add it to the app") {
		t.Fatalf("start-up error = %v", err)
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("the error shows the value: %v", err)
	}
	// Settings that do not come from the environment are not judged by it.
	app = fx.New(idempotency.Module, fx.NopLogger, regOpt, idemfxtest.IgnoreEnvironment(), idemfxtest.MemoryStore(),
		fx.Invoke(func(*coordinator.Coordinator) {}))
	if err := app.Err(); err != nil {
		t.Errorf("with fxtest.IgnoreEnvironment: %v", err)
	}
	defer func() {
		if recover() == nil {
			t.Error("DeclareVariables of a name without the prefix did not panic")
		}
	}()
	idempotency.DeclareVariables("teststore.Module", "TESTSTORE_URL")
}

// A Redis whose maxmemory-policy can evict records fails start-up, naming
// the setting and the variable that accepts it; noeviction starts; with
// that variable set the error is a warning.
func TestModuleStartUpRefusesAnEvictingRedis(t *testing.T) {
	for _, tc := range []struct {
		policy string
		allow  bool
		want   string // in the error; "" means start-up succeeds
		warn   string // in a warning, when set
	}{
		{"noeviction", false, "", ""},
		{"allkeys-lru", false, "maxmemory-policy allkeys-lru", ""},
		{"allkeys-random", false, "maxmemory-policy allkeys-random", ""},
		{"volatile-ttl", false, "maxmemory-policy volatile-ttl", ""},
		{"volatile-lfu", false, "maxmemory-policy volatile-lfu", ""},
		{"allkeys-lru", true, "", "can evict records"},
	} {
		t.Run(tc.policy+"/allow="+strconv.FormatBool(tc.allow), func(t *testing.T) {
			addr := "127.0.0.1:" + strconv.Itoa(redisProc(t, "--maxmemory-policy", tc.policy))
			logs, err := startModule(t, map[string]string{
				"IDEMPOTENCY_REDIS_URL":            "redis://" + addr + "/0",
				"IDEMPOTENCY_REDIS_ALLOW_EVICTION": strconv.FormatBool(tc.allow),
			})
			if tc.want == "" {
				if err != nil {
					t.Fatalf("start-up failed: %v", err)
				}
			} else {
				if err == nil {
					t.Fatalf("start-up succeeded, want %q", tc.want)
				}
				t.Log(err)
				for _, part := range []string{"IDEMPOTENCY_REDIS_ALLOW_EVICTION: redis at " + addr, tc.want, "noeviction", "IDEMPOTENCY_REDIS_ALLOW_EVICTION=true"} {
					if !strings.Contains(err.Error(), part) {
						t.Fatalf("err = %v, want %q in it", err, part)
					}
				}
			}
			warned := logs.FilterMessageSnippet("maxmemory-policy").Len() > 0
			if tc.warn != "" && logs.FilterMessageSnippet(tc.warn).Len() != 1 {
				t.Errorf("warnings %v, want one that says %q", logs.All(), tc.warn)
			}
			if tc.warn == "" && tc.want == "" && warned {
				t.Errorf("a noeviction server warned: %v", logs.All())
			}
		})
	}
}

// A user that may not run CONFIG (as managed Redis often has it) starts,
// with a warning that gives the advice.
func TestModuleStartUpWarnsWhenConfigIsRefused(t *testing.T) {
	const secret = "evict-s3cret"
	addr := "127.0.0.1:" + strconv.Itoa(redisProc(t, "--requirepass", secret, "--maxmemory-policy", "allkeys-lru"))
	admin := redis.NewClient(&redis.Options{Addr: addr, Password: secret})
	t.Cleanup(func() { _ = admin.Close() })
	if err := admin.Do(t.Context(), "ACL", "SETUSER", "app", "on", ">"+secret+"-app", "~*", "&*", "+@all", "-config").Err(); err != nil {
		t.Fatal(err)
	}
	logs, err := startModule(t, map[string]string{"IDEMPOTENCY_REDIS_URL": "redis://app:" + secret + "-app@" + addr + "/0"})
	if err != nil {
		t.Fatalf("start-up failed: %v", err)
	}
	if n := logs.FilterMessageSnippet("could not read the server's maxmemory-policy").Len(); n != 1 {
		t.Errorf("warnings %v, want one about maxmemory-policy", logs.All())
	}
}

// On a cluster every master is read: one evicting master fails start-up,
// naming it.
func TestModuleStartUpReadsEveryClusterMaster(t *testing.T) {
	c := redistest.NewCluster(t, 3)
	nodes := c.Nodes()
	evicting := nodes[len(nodes)-1].Addr()
	node := redis.NewClient(&redis.Options{Addr: evicting})
	t.Cleanup(func() { _ = node.Close() })
	if err := node.ConfigSet(t.Context(), "maxmemory-policy", "volatile-lru").Err(); err != nil {
		t.Fatal(err)
	}
	_, err := startModule(t, map[string]string{"IDEMPOTENCY_REDIS_CLUSTER_ADDRS": strings.Join(c.Addrs(), ",")})
	if err == nil || !strings.Contains(err.Error(), "redis at "+evicting+" has maxmemory-policy volatile-lru") {
		t.Fatalf("start-up on a cluster with one volatile-lru master: %v, want an error naming %s", err, evicting)
	}
}

// With replica acknowledgement on, a server with fewer connected replicas
// than it needs starts, with a warning; WAITAOF on a server without it, or
// with appendonly no, fails start-up naming IDEMPOTENCY_REDIS_REPLICA_ACK_FSYNC.
func TestModuleStartUpChecksReplicaAcks(t *testing.T) {
	addr := "127.0.0.1:" + strconv.Itoa(redisProc(t))
	logs, err := startModule(t, map[string]string{"IDEMPOTENCY_REDIS_URL": "redis://" + addr + "/0", "IDEMPOTENCY_REDIS_REPLICA_ACKS": "1"})
	if err != nil {
		t.Fatalf("start-up with 1 acknowledgement and no replica: %v", err)
	}
	if n := logs.FilterMessageSnippet("fewer replicas are connected").Len(); n != 1 {
		t.Errorf("warnings %v, want one about the missing replica", logs.All())
	}
	_, err = startModule(t, map[string]string{"IDEMPOTENCY_REDIS_URL": "redis://" + addr + "/0", "IDEMPOTENCY_REDIS_REPLICA_ACK_FSYNC": "true"})
	if err == nil || !strings.HasPrefix(err.Error(), "IDEMPOTENCY_REDIS_REPLICA_ACK_FSYNC: redis at "+addr) ||
		!(strings.Contains(err.Error(), "no WAITAOF") || strings.Contains(err.Error(), "appendonly no")) {
		t.Fatalf("start-up with WAITAOF on a server without it or without appendonly: %v", err)
	}
}

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
		rec, err := onMaster.Get(t.Context(), idemstore.Key{Operation: first.Operation, Key: first.Key})
		if err == nil && rec.State == idemstore.StateCompleted {
			return nil
		}
		return fmt.Errorf("the first call's record is not completed on the master: state %v, %v; logged: %v", rec.State, err, logs.FilterLoggerName("idempotency").All())
	})
	// The record is on the replica before the failover: a failover may lose
	// what had not reached it (docs/architecture.md). WAIT waits for the
	// writes of its own connection only, and direct has written nothing:
	// so it writes a barrier first, which the replica receives after the
	// completion (one replication stream, in order), and waits for that.
	if err := direct.Set(t.Context(), prefix+"barrier", 1, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := direct.Wait(t.Context(), 1, 5000).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 after the barrier: %d replicas, %v", n, err)
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

// The storage timeout bounds a call on a hung Redis through the client the
// module builds: go-redis ignores context deadlines on sockets unless
// ContextTimeoutEnabled is set (NewRedisClient sets it), and would otherwise
// hold every call for its own ReadTimeout (5s). The test freezes a
// redis-server of its own with SIGSTOP. (Skipped without redis-server.)
func TestHungRedisIsBoundedByTheStorageTimeout(t *testing.T) {
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
	defer func() {
		_ = srv.Process.Signal(syscall.SIGCONT)
		_ = srv.Process.Kill()
		_ = srv.Wait()
	}()

	s := idempotency.DefaultSettings()
	s.RedisURL = "redis://127.0.0.1:" + strconv.Itoa(port) + "/0"
	s.StorageTimeout = 100 * time.Millisecond
	s.OnStorageError = coordinator.OnStorageErrorRaise
	client, err := idempotency.NewRedisClient(s)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	for deadline := time.Now().Add(5 * time.Second); client.Ping(t.Context()).Err() != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("redis-server does not answer")
		}
	}
	c, err := idempotency.NewCoordinator(s, idempotency.NewStore(s, client), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: "op", Key: "warm"}, func(context.Context) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}

	_ = srv.Process.Signal(syscall.SIGSTOP) // Redis hangs (a long script, a stall, a blackholed link)
	start := time.Now()
	_, err = coordinator.Do(t.Context(), c, coordinator.Call{Operation: "op", Key: "hung-redis"}, func(context.Context) (int, error) { return 1, nil })
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Do took %v on a hung Redis with IDEMPOTENCY_STORAGE_TIMEOUT=100ms (err %v)", d, err)
	}
}

const (
	msgBreakerOpen   = "idempotency: redis circuit breaker open: store calls fail at once, as storage errors, until a probe finds redis back"
	msgBreakerClosed = "idempotency: redis circuit breaker closed: redis is back"
)

// breakerApp starts Module on url with env, logging from level Debug, and
// returns its coordinator and logs; it stops when the test ends.
func breakerApp(tb testing.TB, url string, env map[string]string) (*coordinator.Coordinator, *observer.ObservedLogs) {
	tb.Helper()
	if t, ok := tb.(*testing.T); ok {
		clearEnv(t)
	}
	tb.Setenv("IDEMPOTENCY_REDIS_URL", url)
	for k, v := range env {
		tb.Setenv(k, v)
	}
	_, regOpt := registry()
	core, logs := observer.New(zapcore.DebugLevel)
	var c *coordinator.Coordinator
	app := fx.New(fx.NopLogger, idempotency.Module, regOpt, fx.Supply(zap.New(core)), fx.Populate(&c))
	if err := app.Start(context.Background()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = app.Stop(context.Background()) })
	return c, logs
}

// doCost runs n calls of new keys through c and returns the median cost of
// a call.
func doCost(tb testing.TB, c *coordinator.Coordinator, prefix string, n int) time.Duration {
	tb.Helper()
	ok := func(context.Context) (int, error) { return 1, nil }
	costs := make([]time.Duration, n)
	for i := range n {
		start := time.Now()
		if _, err := coordinator.Do(context.Background(), c, coordinator.Call{Operation: "op", Key: prefix + strconv.Itoa(i)}, ok); err != nil {
			tb.Fatal(err)
		}
		costs[i] = time.Since(start)
	}
	slices.Sort(costs)
	return costs[n/2]
}

// openBreaker makes calls until the breaker has opened.
func openBreaker(t *testing.T, c *coordinator.Coordinator, logs *observer.ObservedLogs) {
	t.Helper()
	ok := func(context.Context) (int, error) { return 1, nil }
	for i := 0; logs.FilterMessage(msgBreakerOpen).Len() == 0; i++ {
		if i == 100 {
			t.Fatalf("the breaker did not open after 100 calls; logged %v", logs.All())
		}
		if _, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: "op", Key: "opening-" + strconv.Itoa(i)}, ok); err != nil {
			t.Fatal(err)
		}
	}
}

// Against a dead Redis the breaker opens once, calls then fail at once (in
// run mode: the action runs unprotected), and go-redis stops logging dials.
func TestBreakerAgainstADeadRedis(t *testing.T) {
	c, logs := breakerApp(t, "redis://127.0.0.1:1/0", nil)
	before := doCost(t, c, "before-", 3)
	openBreaker(t, c, logs)
	goRedisLines := logs.FilterLoggerName("go-redis").Len()
	after := doCost(t, c, "after-", 200)
	t.Logf("a run-mode Do against 127.0.0.1:1: p50 %v before the breaker opened, %v once open", before, after)
	if n := logs.FilterMessage(msgBreakerOpen).Len(); n != 1 {
		t.Fatalf("%d lines say the breaker opened, want 1", n)
	}
	// The cool-down (1s) is longer than the calls took: no probe yet, so no
	// dial and no go-redis line.
	if n := logs.FilterLoggerName("go-redis").Len() - goRedisLines; n != 0 {
		t.Fatalf("go-redis logged %d lines while the breaker was open", n)
	}
}

// Raise mode: a call the breaker refuses is a storage error, which says the
// breaker is open.
func TestBreakerRefusalIsAStorageError(t *testing.T) {
	c, logs := breakerApp(t, "redis://127.0.0.1:1/0", map[string]string{"IDEMPOTENCY_ON_STORAGE_ERROR": "raise"})
	ok := func(context.Context) (int, error) { return 1, nil }
	for i := 0; logs.FilterMessage(msgBreakerOpen).Len() == 0; i++ {
		if i == 100 {
			t.Fatal("the breaker did not open")
		}
		_, _ = coordinator.Do(t.Context(), c, coordinator.Call{Operation: "op", Key: "k" + strconv.Itoa(i)}, ok)
	}
	_, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: "op", Key: "refused"}, ok)
	if !errors.Is(err, coordinator.ErrStorage) || !errors.Is(err, idempotency.ErrBreakerOpen) {
		t.Fatalf("err = %v, want a storage error wrapping ErrBreakerOpen", err)
	}
}

// Against a frozen Redis (SIGSTOP) the breaker opens, and once the server
// is back (SIGCONT) the first call after the cool-down probes it and closes
// the breaker.
func TestBreakerAgainstAFrozenRedis(t *testing.T) {
	url, freeze, thaw := freezableRedis(t)
	const cooldown = 200 * time.Millisecond
	c, logs := breakerApp(t, url, map[string]string{
		"IDEMPOTENCY_STORAGE_TIMEOUT":  "100ms",
		"IDEMPOTENCY_BREAKER_COOLDOWN": cooldown.String(),
	})
	before := doCost(t, c, "warm-", 3)
	freeze()
	frozen := doCost(t, c, "frozen-", 3)
	openBreaker(t, c, logs)
	after := doCost(t, c, "after-", 200)
	t.Logf("a run-mode Do against a SIGSTOPped redis-server (STORAGE_TIMEOUT=100ms): p50 %v while it ran, %v frozen before the breaker opened, %v once open", before, frozen, after)
	thaw()
	// Recovery: within a cool-down, plus the probe's round trip (a probe
	// sent while frozen is answered once the server runs again).
	ok := func(context.Context) (int, error) { return 1, nil }
	thawed := time.Now()
	for i := 0; logs.FilterMessage(msgBreakerClosed).Len() == 0; i++ {
		if time.Since(thawed) > 10*cooldown {
			t.Fatalf("the breaker did not close within %v of SIGCONT; logged %v", 10*cooldown, logs.All())
		}
		if _, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: "op", Key: "thawed-" + strconv.Itoa(i)}, ok); err != nil {
			t.Fatal(err)
		}
		time.Sleep(cooldown / 20)
	}
	t.Logf("the breaker closed %v after SIGCONT (cool-down %v)", time.Since(thawed), cooldown)
	if n := logs.FilterMessage(msgBreakerOpen).Len(); n != 1 {
		t.Fatalf("%d lines say the breaker opened, want 1", n)
	}
}

// BenchmarkDoAgainstADeadRedis measures a run-mode Do against a dead Redis
// (127.0.0.1:1) and a SIGSTOPped one, with and without the breaker, as
// docs/operations.md reports it: ns/op is the mean, p50-ns the median. The
// refused port uses the default storage timeout (1s), the stopped server
// 100ms.
func BenchmarkDoAgainstADeadRedis(b *testing.B) {
	for _, server := range []string{"refused", "stopped"} {
		for _, failures := range []string{"0", "5"} {
			b.Run(server+"/BREAKER_FAILURES="+failures, func(b *testing.B) {
				url, freeze := "redis://127.0.0.1:1/0", func() {}
				env := map[string]string{"IDEMPOTENCY_BREAKER_FAILURES": failures}
				if server == "stopped" {
					url, freeze, _ = freezableRedis(b)
					// Each call waits its whole storage timeout: shortened
					// from 1s to keep the run short.
					env["IDEMPOTENCY_STORAGE_TIMEOUT"] = "100ms"
				}
				c, _ := breakerApp(b, url, env)
				doCost(b, c, "warm-", 1)
				freeze()
				doCost(b, c, "opening-", 10) // opens the breaker, if any
				b.ResetTimer()
				b.ReportMetric(float64(doCost(b, c, "bench-", b.N)), "p50-ns")
			})
		}
	}
}

// The cool-down is at most a tenth of the lease.
func TestBreakerCooldownIsShortRelativeToTheLease(t *testing.T) {
	s := idempotency.DefaultSettings()
	if got := s.BreakerCooldownUsed(); got != time.Second {
		t.Fatalf("default cool-down %v, want 1s", got)
	}
	s.Lease = 2 * time.Second
	if got := s.BreakerCooldownUsed(); got != 200*time.Millisecond {
		t.Fatalf("cool-down with a 2s lease %v, want 200ms", got)
	}
}

// With BREAKER_FAILURES=0 there is no breaker: every call pays its storage
// round, and nothing says the breaker opened.
func TestBreakerOff(t *testing.T) {
	c, logs := breakerApp(t, "redis://127.0.0.1:1/0", map[string]string{"IDEMPOTENCY_BREAKER_FAILURES": "0"})
	doCost(t, c, "off-", 10)
	if n := logs.FilterMessage(msgBreakerOpen).Len(); n != 0 {
		t.Fatalf("%d lines say the breaker opened with BREAKER_FAILURES=0", n)
	}
	if errs := logs.FilterMessageSnippet("circuit open").Len(); errs != 0 {
		t.Fatalf("%d lines mention an open circuit", errs)
	}
}

// With auto-pipelining the breaker refuses the pipeliner's batches: calls
// fail fast too.
func TestBreakerWithAutoPipeline(t *testing.T) {
	c, logs := breakerApp(t, "redis://127.0.0.1:1/0", map[string]string{"IDEMPOTENCY_REDIS_AUTO_PIPELINE": "true"})
	openBreaker(t, c, logs)
	t.Logf("a run-mode Do against 127.0.0.1:1 with auto-pipelining, breaker open: p50 %v", doCost(t, c, "after-", 50))
	if n := logs.FilterMessage(msgBreakerOpen).Len(); n != 1 {
		t.Fatalf("%d lines say the breaker opened, want 1", n)
	}
}

// While the breaker is open, its probes' failed dials are go-redis lines
// that repeat the one before, logged at Debug: the breaker's one Warn line
// said that Redis is down.
func TestBreakerProbesDoNotWarn(t *testing.T) {
	const cooldown = 20 * time.Millisecond
	// A pool large enough that go-redis keeps dialing (after PoolSize failed
	// dials in a row it stops, until its background dial succeeds).
	c, logs := breakerApp(t, "redis://127.0.0.1:1/0?pool_size=1000", map[string]string{"IDEMPOTENCY_BREAKER_COOLDOWN": cooldown.String()})
	openBreaker(t, c, logs)
	warned := logs.FilterLoggerName("go-redis").FilterLevelExact(zapcore.WarnLevel).Len()
	probes := func() int {
		return logs.FilterMessage("idempotency: redis circuit breaker half-open: probing redis").Len()
	}
	for i := 0; probes() < 3; i++ {
		if i == 1000 {
			t.Fatalf("%d probes in 1000 calls", probes())
		}
		doCost(t, c, "probing-"+strconv.Itoa(i)+"-", 1)
		time.Sleep(cooldown / 4)
	}
	if n := logs.FilterLoggerName("go-redis").FilterLevelExact(zapcore.WarnLevel).Len() - warned; n != 0 {
		t.Fatalf("go-redis logged %d warnings during %d probes", n, probes())
	}
	if logs.FilterLoggerName("go-redis").FilterLevelExact(zapcore.DebugLevel).Len() == 0 {
		t.Fatal("no go-redis line at Debug for the probes' dials")
	}
	if n := logs.FilterMessage(msgBreakerOpen).Len(); n != 1 {
		t.Fatalf("%d lines say the breaker opened, want 1", n)
	}
}

// The breaker never refuses a call that no caller waits for: a completion
// is lost, and then Redis answers slower than the storage timeout, so the
// callers' calls keep the breaker open (every probe times out); the result
// is still stored by the background rounds, which the breaker lets through
// and which may take what is left of the reservation.
func TestBreakerLetsBackgroundSavesThrough(t *testing.T) {
	in := redistest.Start(t)
	if in.Kind() != redistest.KindRedisServer {
		t.Skip("needs redis-server behind the latency proxy")
	}
	proxy, err := faultproxy.Start(in.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	c, logs := breakerApp(t, "redis://"+proxy.Addr()+"/0", map[string]string{
		"IDEMPOTENCY_ON_STORAGE_ERROR":    "raise",
		"IDEMPOTENCY_STORAGE_TIMEOUT":     "100ms",
		"IDEMPOTENCY_LEASE":               "2s",
		"IDEMPOTENCY_BREAKER_FAILURES":    "1",
		"IDEMPOTENCY_BREAKER_COOLDOWN":    "100ms",
		"IDEMPOTENCY_KEY_PREFIX":          redistest.Prefix(t),
		"IDEMPOTENCY_REDIS_AUTO_PIPELINE": "false",
	})
	key := coordinator.Call{Operation: "op", Key: "slow-save"}
	var runs atomic.Int64
	action := func(context.Context) (int, error) {
		if runs.Add(1) == 1 {
			proxy.Cut(true) // the first completion is lost, and opens the breaker
		}
		return 1, nil
	}
	if _, err := coordinator.Do(t.Context(), c, key, action); err != nil {
		t.Fatal(err)
	}
	// From now on every call goes through, slower than the storage timeout.
	proxy.SetLatency(150 * time.Millisecond)
	proxy.Cut(false)
	// Callers keep the breaker open until the reservation has expired: each
	// probe times out, and the calls in between are refused.
	var wg sync.WaitGroup
	stop := time.Now().Add(2500 * time.Millisecond)
	for g := range 4 {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				_, _ = coordinator.Do(t.Context(), c, coordinator.Call{Operation: "op", Key: fmt.Sprintf("h%d-%d", g, i)}, action)
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	if logs.FilterMessage(msgBreakerOpen).Len() == 0 {
		t.Fatal("the breaker never opened")
	}
	proxy.SetLatency(0)
	before := runs.Load()
	for i := 0; ; i++ {
		_, err := coordinator.Do(t.Context(), c, key, action)
		if errors.Is(err, coordinator.ErrInProgress) || errors.Is(err, coordinator.ErrStorage) {
			if i == 100 {
				t.Fatalf("the key is still %v", err)
			}
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		break
	}
	if n := runs.Load() - before; n != 0 {
		t.Fatalf("the action ran again (%d): the result was not stored", n)
	}
}

// On a cluster, a node that refuses connections opens its breaker only
// while the slot map still routes to it (finding 8): a master resharded
// away, removed and shut down, which a stale slot map still names, does
// not; a master killed with its slots does.
func TestBreakerIgnoresARemovedNode(t *testing.T) {
	cl := redistest.NewCluster(t, 3)
	s := idempotency.DefaultSettings()
	s.RedisClusterAddrs = cl.Addrs()
	s.BreakerFailures = 1 // one counted refusal opens it
	client, err := idempotency.NewRedisClient(s)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	core, logs := observer.New(zapcore.WarnLevel)
	if err := idempotency.AddBreaker(client, s, zap.New(core)); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	cc := client.(*redis.ClusterClient)
	// keyOn returns a key that node serves, written through the client so
	// that its slot map and node are warm.
	keyOn := func(node *redistest.ClusterNode) string {
		t.Helper()
		for i := 0; ; i++ {
			key := "k" + strconv.Itoa(i)
			slot, err := cc.ClusterKeySlot(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			if cl.SlotOwner(t, int(slot)) == node {
				if err := client.Set(ctx, key, key, 0).Err(); err != nil {
					t.Fatal(err)
				}
				return key
			}
		}
	}
	nodes := cl.Nodes()
	removed, killed, kept := nodes[0], nodes[1], nodes[2]
	moved := keyOn(removed)
	cl.Remove(t, removed, kept)
	cl.Kill(removed)
	// The slot map is stale (no call since the removal): the GET goes to
	// the removed node, is refused, and is sent again to the new owner.
	if v, err := client.Get(ctx, moved).Result(); err != nil || v != moved {
		t.Fatalf("GET of a key whose master was removed: %q, %v", v, err)
	}
	if n := logs.FilterMessage(msgBreakerOpen).Len(); n != 0 {
		t.Fatalf("a removed node's refused connection opened a breaker: %v", logs.All())
	}

	lost := keyOn(killed)
	cl.Kill(killed) // its slots with it: an outage of a third of the keys
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := client.Get(cctx, lost).Err(); err == nil {
		t.Fatal("GET of a key whose master was killed with its slots: no error")
	}
	if n := logs.FilterMessage(msgBreakerOpen).Len(); n != 1 {
		t.Fatalf("a killed master that still owns its slots: %d breakers opened, want 1: %v", n, logs.All())
	}
}

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
			var store idemstore.Store
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
			var ks []idemstore.Key
			for _, k := range keys {
				ks = append(ks, idemstore.Key{Operation: "payment.charge", Key: k})
			}
			infos, err := admin.Inspect(t.Context(), ks...)
			if err != nil || len(infos) != len(keys) {
				t.Fatalf("Inspect() = %+v, %v; want %d records", infos, err, len(keys))
			}
			for _, info := range infos {
				if info.State != idemstore.StateCompleted {
					t.Errorf("Inspect(): %+v; want completed", info)
				}
			}
			app.RequireStop()

			// The store went through the client that stop closed.
			_, err = store.Get(t.Context(), idemstore.Key{Operation: "payment.charge", Key: "first"})
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

// wrappedClient is an app's own type around a *redis.Client: it can do what
// the client does, but it is no *redis.Client.
type wrappedClient struct{ *redis.Client }

// An app's client that cannot acknowledge writes (a Ring, a type of the
// app's own around a client) stops start-up with replica acknowledgement
// on, naming the variable, as one that cannot auto-pipeline does: otherwise
// every acknowledged reservation would be a storage error, and with
// IDEMPOTENCY_ON_STORAGE_ERROR=run every action would run unprotected.
func TestModuleWithReplicaAcksRefusesARing(t *testing.T) {
	for _, fsync := range []bool{false, true} {
		t.Run(fmt.Sprintf("fsync=%v", fsync), func(t *testing.T) {
			clearEnv(t)
			if fsync {
				t.Setenv("IDEMPOTENCY_REDIS_REPLICA_ACK_FSYNC", "true")
			} else {
				t.Setenv("IDEMPOTENCY_REDIS_REPLICA_ACKS", "1")
			}
			ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
			defer ring.Close()
			wrapped := &wrappedClient{redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})}
			defer wrapped.Close()
			for _, tt := range []struct {
				name, want string
				opts       fx.Option
			}{
				{"ring", "IDEMPOTENCY_REDIS_REPLICA_ACKS: a *redis.Ring cannot acknowledge writes",
					fx.Options(fx.Supply(ring), idempotency.UseRedisClient[*redis.Ring]())},
				{"wrapper", "IDEMPOTENCY_REDIS_REPLICA_ACKS: a *idempotency_test.wrappedClient cannot acknowledge writes",
					fx.Options(fx.Supply(wrapped), idempotency.UseRedisClient[*wrappedClient]())},
			} {
				_, regOpt := registry()
				var c *coordinator.Coordinator
				app := fx.New(fx.NopLogger, tt.opts, idempotency.Module, regOpt, fx.Supply(zap.NewNop()), fx.Populate(&c))
				if err := app.Err(); err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Errorf("%s: err = %v\nwant it to contain %q", tt.name, err, tt.want)
				}
			}
		})
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
