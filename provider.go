package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/autopipe"
	"github.com/idemkit/idempotency/internal/redisurl"
	"github.com/idemkit/idempotency/internal/sentinelcheck"
	"github.com/idemkit/idempotency/observability"
	"github.com/idemkit/idempotency/redisrepo"
)

// The constructors in this file are what Module wires. They are exported so
// that the library works without fx too:
//
//	s, err := idempotency.LoadSettings()
//	client, err := idempotency.NewRedisClient(s)
//	err = idempotency.AddBreaker(client, s, logger)
//	obs, err := idempotency.NewObserver(s, logger, prometheus.DefaultRegisterer)
//	sc, err := idempotency.NewStoreClient(s, client)
//	c, err := idempotency.NewCoordinator(s, idempotency.NewStore(s, sc), obs)

// NewRedisClient returns the Redis client the settings describe, without
// connecting: a *redis.ClusterClient over RedisClusterAddrs when that is set,
// a failover *redis.Client (redis.NewFailoverClient) for the master that
// RedisSentinelMaster names when that is set, else a *redis.Client for
// RedisURL. In cluster mode the user name, password, TLS (rediss://) and
// every query option of RedisURL apply to every node, its host is ignored,
// and its database must be 0 (a cluster has no other). With Sentinel they
// apply to the master the sentinels name, the database too, and the host is
// ignored; the client follows the sentinels' failovers, and never keeps a
// connection to a master they replaced while it was dialled (each new
// connection asks a sentinel once more). A cluster client
// rides through a resharding: a command that meets MOVED, ASK, TRYAGAIN or
// CLUSTERDOWN past go-redis's own redirections, or a refused connection,
// is sent again until its context's deadline (redisrepo.AddClusterRetry).
// The client fails fast when Redis is down (one dial attempt per connection)
// and honours context deadlines (ContextTimeoutEnabled), so the storage
// timeout bounds every call; its dial timeout is the lease within
// [IDEMPOTENCY_STORAGE_TIMEOUT, 5s], for the background saves (dialTimeout).
// With RedisAutoPipeline set, its read and write timeouts are at most the
// storage timeout too (a longer read_timeout or write_timeout, or one that
// disables them, is lowered to it), since the batches of an AutoPipeliner do
// not run on the callers' contexts. The caller owns the client and closes it;
// closing it also closes its AutoPipeliner.
//
// It returns an error naming IDEMPOTENCY_REDIS_URL, and no client, when the
// URL is invalid, or, in cluster mode, sets a database other than 0 or a
// query option that a cluster client would ignore (a failover client's
// likewise), and an error naming the REDIS_SENTINEL_* variable that is
// missing or conflicting. The error never shows the user name or password,
// nor any part of them.
func NewRedisClient(s Settings) (redis.UniversalClient, error) {
	top := s.topology()
	// The same check as Settings.Validate.
	opts, err := redisurl.Parse(s.RedisURL, top)
	if err != nil {
		return nil, fmt.Errorf("%s_REDIS_URL: %w", EnvPrefix, err)
	}
	// Fail fast when Redis is down: every call is bounded by the storage
	// timeout anyway, and go-redis's default of five dial attempts 100ms apart
	// would spend most of that budget before the call can follow
	// IDEMPOTENCY_ON_STORAGE_ERROR.
	opts.DialerRetries = 1
	// Without this go-redis bounds socket reads and writes by its own
	// ReadTimeout (5s) and ignores the context's deadline, so
	// IDEMPOTENCY_STORAGE_TIMEOUT would not bound a call on a hung Redis.
	opts.ContextTimeoutEnabled = true
	if d := dialTimeout(s); opts.DialTimeout == 0 || opts.DialTimeout > d {
		opts.DialTimeout = d
	}
	if s.RedisAutoPipeline && s.StorageTimeout > 0 {
		// An AutoPipeliner runs its batches on a context of its own, so only
		// these timeouts bound a batch on a hung Redis. pipelinedClient
		// frees the callers at their deadline anyway; these free the
		// pipeline, which a hung batch holds for every later one, and bound
		// Close, which waits for the batch in flight (30s with go-redis's
		// default 5s, measured). No store call may take longer than the
		// storage timeout, so a longer one, none (0) or a disabled one (-1)
		// is lowered to it.
		if opts.ReadTimeout <= 0 || opts.ReadTimeout > s.StorageTimeout {
			opts.ReadTimeout = s.StorageTimeout
		}
		if opts.WriteTimeout <= 0 || opts.WriteTimeout > s.StorageTimeout {
			opts.WriteTimeout = s.StorageTimeout
		}
	}
	switch top {
	case redisurl.Cluster:
		c := redis.NewClusterClient(clusterOptions(opts, s.RedisClusterAddrs))
		// A resharding is not an outage: go-redis follows MOVED and ASK a
		// few times only, which a slot in flight outlasts (issue 34).
		// First, so that a circuit breaker added later sees one result
		// per call.
		redisrepo.AddClusterRetry(c)
		return c, nil
	case redisurl.Sentinel:
		if errs := s.sentinelErrors(); len(errs) > 0 {
			// The sentinel variables' own checks (Validate's): go-redis
			// would take an empty list of sentinels, and fail every call.
			return nil, invalidSettings(errs)
		}
		return sentinelcheck.New(failoverOptions(opts, s)), nil
	}
	return redis.NewClient(opts), nil
}

// universalOptions returns go-redis's options for a cluster or a failover
// client that carry every field of o that redis.ParseURL sets, but the
// server's address (redisurl.Parse refuses a query option these clients
// would drop, and a database other than 0 for a cluster). redisurl's appliesToCluster
// lists the query options whose fields these are.
func universalOptions(o *redis.Options) *redis.UniversalOptions {
	tlsConfig := o.TLSConfig
	if tlsConfig != nil {
		// redis.ParseURL names the URL's host as the TLS server; a cluster's
		// nodes and the master the sentinels name are each verified under
		// their own name instead. skip_verify (InsecureSkipVerify) is kept.
		tlsConfig = tlsConfig.Clone()
		tlsConfig.ServerName = ""
	}
	return &redis.UniversalOptions{
		Username:  o.Username,
		Password:  o.Password,
		DB:        o.DB,
		TLSConfig: tlsConfig,

		Protocol:   o.Protocol,
		ClientName: o.ClientName,

		MaxRetries:      o.MaxRetries,
		MinRetryBackoff: o.MinRetryBackoff,
		MaxRetryBackoff: o.MaxRetryBackoff,

		DialTimeout:           o.DialTimeout,
		DialerRetries:         o.DialerRetries,
		ReadTimeout:           o.ReadTimeout,
		WriteTimeout:          o.WriteTimeout,
		ContextTimeoutEnabled: o.ContextTimeoutEnabled,

		PoolFIFO:              o.PoolFIFO,
		PoolSize:              o.PoolSize,
		PoolTimeout:           o.PoolTimeout,
		MaxConcurrentDials:    o.MaxConcurrentDials,
		MinIdleConns:          o.MinIdleConns,
		MaxIdleConns:          o.MaxIdleConns,
		MaxActiveConns:        o.MaxActiveConns,
		ConnMaxIdleTime:       o.ConnMaxIdleTime,
		ConnMaxLifetime:       o.ConnMaxLifetime,
		ConnMaxLifetimeJitter: o.ConnMaxLifetimeJitter,

		PipelinePoolSize:        o.PipelinePoolSize,
		PipelineReadBufferSize:  o.PipelineReadBufferSize,
		PipelineWriteBufferSize: o.PipelineWriteBufferSize,
	}
}

// clusterOptions returns the options of a cluster client over addrs that
// carry o's fields (universalOptions).
func clusterOptions(o *redis.Options, addrs []string) *redis.ClusterOptions {
	u := universalOptions(o)
	u.Addrs = addrs
	c := u.Cluster()
	// go-redis reloads the slot map on MOVED and ASK replies, but not on
	// connection errors: after a master dies and its replica is promoted,
	// calls on its slots would keep failing until the next periodic
	// reload, 60s by default (measured by the reliability suite). A
	// reload is one CLUSTER SLOTS, in the background, at most once per
	// interval while calls are made.
	c.ClusterStateReloadInterval = clusterStateReloadInterval
	return c
}

// failoverOptions returns the options of a failover client for the master
// that s.RedisSentinelMaster names, through the sentinels of
// s.RedisSentinelAddrs, that carry o's fields (universalOptions).
func failoverOptions(o *redis.Options, s Settings) *redis.FailoverOptions {
	u := universalOptions(o)
	u.Addrs = s.RedisSentinelAddrs
	u.MasterName = s.RedisSentinelMaster
	u.SentinelPassword = s.RedisSentinelPassword
	return u.Failover()
}

// clusterStateReloadInterval bounds how long a cluster client built by
// NewRedisClient routes to a topology that changed without a redirect (a
// failover after a master died).
const clusterStateReloadInterval = time.Second

// NewStore returns the Redis store over client, with the settings' key
// prefix, record format (format 1 when RecordFormat is 1, else format 2;
// Validate refuses any other value), replica acknowledgement and coalescing
// lanes (RedisCoalesceLanes, which applies over a *redis.Client or a
// *redis.ClusterClient, not over the AutoPipeliner of NewStoreClient). It sends the store's commands to client
// as it is: for RedisAutoPipeline, pass it what NewStoreClient returns.
func NewStore(s Settings, client redisrepo.Client) *redisrepo.Store {
	format := redisrepo.Format2
	if s.RecordFormat == int(redisrepo.Format1) {
		format = redisrepo.Format1
	}
	return redisrepo.New(client, redisrepo.WithKeyPrefix(s.KeyPrefix), redisrepo.WithRecordFormat(format),
		redisrepo.WithReplicaAcks(redisrepo.ReplicaAcks{Replicas: s.RedisReplicaAcks, Fsync: s.RedisReplicaAckFsync, Operations: s.RedisReplicaAckOperations}),
		redisrepo.WithCoalescing(s.RedisCoalesceLanes))
}

// NewStoreClient returns what the store should send its commands to: client
// itself, or, when s.RedisAutoPipeline is set, client's deferred
// AutoPipeliner (client.AsyncAutoPipeline(), which go-redis caches and
// shares, built with client's AutoPipelineOptions or go-redis's defaults for
// it), which batches the commands of concurrent callers into pipelines.
// Module calls it, for the client it builds and for the app's own
// (UseRedisClient).
//
// go-redis runs an auto-pipelined command on a context of its own, so the
// returned client waits for each command only until the caller's context is
// done and then returns the context's error: IDEMPOTENCY_STORAGE_TIMEOUT
// bounds every store call, as it does without auto-pipelining. A command
// left behind still runs in its batch. (The deferred face is the one whose
// waits can end with a context, AutoFuture.WaitContext, without a goroutine
// per call; the store waits for every command it submits before it sends
// the next.) Pub/Sub and pipelines (the store's
// wake-ups, Inspect and Forget) go to client directly; a command the store
// gives to Process that is neither a *redis.Cmd nor a *redis.RawCmd does
// too, unbatched.
//
// The AutoPipeliner belongs to client: closing client closes it. Do not
// close it while the store is in use: that stops it for every user of
// client. It returns an error naming IDEMPOTENCY_REDIS_AUTO_PIPELINE when
// client cannot auto-pipeline (a *redis.Ring, a closed client, invalid
// AutoPipelineOptions), and one naming IDEMPOTENCY_REDIS_REPLICA_ACKS when
// writes are to be acknowledged and client cannot acknowledge them
// (redisrepo.CanAcknowledge: a *redis.Ring, a type that wraps a client).
func NewStoreClient(s Settings, client redis.UniversalClient) (redisrepo.Client, error) {
	if err := cannotAcknowledge(s, client); err != nil {
		return nil, err
	}
	if !s.RedisAutoPipeline {
		return client, nil
	}
	ap, err := client.AsyncAutoPipeline()
	if err != nil {
		return nil, fmt.Errorf("%s_REDIS_AUTO_PIPELINE: the Redis client (%T) cannot auto-pipeline: %w", EnvPrefix, client, err)
	}
	return autopipe.Wrap(ap, client), nil
}

// NewObserver returns the observer the settings describe: zap log lines on
// logger, and, when MetricsEnabled, Prometheus metrics registered on reg
// (nil: prometheus.DefaultRegisterer) under MetricsNamespace, with the
// operations of OperationTTLS pre-initialised. Building it twice on one
// registerer is not an error; the second counts into the first's metrics.
//
// A nil logger means what no logger in the graph means to Module: warnings
// and errors are written to standard error as JSON lines, as
// zap.NewProduction writes them but from level Warn up and without stack
// traces, so that a failing store is never silent. Pass zap.NewNop() for no
// log lines at all.
//
// It returns an error when the settings' namespace, key logging mode or
// operation names are invalid (each a *coordinator.OptionError; Validate
// names their variables), or when a metric cannot be registered.
func NewObserver(s Settings, logger *zap.Logger, reg prometheus.Registerer) (*observability.Observer, error) {
	if logger == nil {
		var err error
		if logger, err = newStderrLogger(); err != nil {
			return nil, err
		}
	}
	opts := append(s.observerOptions(), observability.WithLogger(logger))
	if s.MetricsEnabled {
		if reg == nil {
			reg = prometheus.DefaultRegisterer
		}
		opts = append(opts, observability.WithRegisterer(reg))
	}
	return observability.New(opts...)
}

// newStderrLogger returns the logger that Module and NewObserver use when
// they are given none: zap.NewProduction's JSON lines on standard error, at
// level Warn and above, sampled as zap.NewProduction samples, without stack
// traces (each line of the library comes from one of a few call sites). It
// needs no Close, and no Sync: writes to standard error are not buffered (and
// Sync on it fails with EINVAL on Linux when it is a terminal or a pipe).
func newStderrLogger() (*zap.Logger, error) {
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(zap.WarnLevel)
	cfg.DisableStacktrace = true
	return cfg.Build()
}

// NewCoordinator returns the coordinator the settings describe, over store,
// reporting to obs (nil: nothing). It returns an error when the settings are
// invalid, or invalid for store (IDEMPOTENCY_FENCED_OPERATIONS with a store
// that hands out no fences): a *SettingsError naming the variable.
func NewCoordinator(s Settings, store idemstore.Store, obs idemevent.Observer) (*coordinator.Coordinator, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	c, err := coordinator.New(store, append(s.CoordinatorOptions(), coordinator.WithObserver(obs))...)
	if err != nil {
		return nil, storeRefusal(err)
	}
	return c, nil
}

// storeRefusal returns err, an error of coordinator.New over settings that
// Validate accepted, as a *SettingsError naming the variable behind the
// option it refuses for the store; an error of no option is returned as it
// is.
func storeRefusal(err error) error {
	var oe *coordinator.OptionError
	if !errors.As(err, &oe) {
		return err
	}
	v, ok := optionVariables[oe.Option]
	if !ok {
		return err
	}
	reason := optionReason(oe).Error()
	if oe.Option == "WithFencedOperations" {
		reason += fmt.Sprintf("; leave %s_%s empty with this store (the Redis store hands out fences)", EnvPrefix, v)
	}
	return invalidSettings([]error{fmt.Errorf("%s_%s: %s", EnvPrefix, v, reason)})
}

// pingTimeout bounds the start-up ping of a Redis client the module built.
const pingTimeout = 3 * time.Second

// ping checks client at start-up. An unreachable Redis is not fatal: calls
// follow IDEMPOTENCY_ON_STORAGE_ERROR until it is back, so it is only logged.
// A misconfiguration is: a Redis that refuses the credentials, a permission
// or the database, a TLS mismatch, or a server that is not Redis stops
// start-up with an error naming the variable (misconfiguration).
func ping(ctx context.Context, client redis.UniversalClient, store *redisrepo.Store, s Settings, logger *zap.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		if merr := RedisMisconfiguration(ctx, err, s); merr != nil {
			return merr
		}
		logger.Warn("idempotency: redis is unreachable at start-up; calls follow IDEMPOTENCY_ON_STORAGE_ERROR until it is back",
			zap.String("redis_addr", s.RedisAddr()),
			zap.Stringer("on_storage_error", s.OnStorageError),
			zap.Error(fmt.Errorf("ping redis: %w", err)))
		return nil
	}
	logger.Info("idempotency: redis is reachable", zap.String("redis_addr", s.RedisAddr()))
	if info, err := client.Info(ctx, "server").Result(); err == nil {
		if version, old := oldRedis(info); old {
			logger.Warn("idempotency: the store needs Redis 7.0 or newer (SET with NX and GET); every call to this server will fail with a storage error",
				zap.String("redis_addr", s.RedisAddr()), zap.String("redis_version", version))
		}
	}
	if err := checkEviction(ctx, client, s, logger); err != nil {
		return err
	}
	if err := checkReplicaAcks(ctx, client, s, logger); err != nil {
		return err
	}
	// The scripts of the rare paths (heals, format 1 records, the operator
	// tools), so that their first call is one round trip; the common paths
	// need no script cache.
	if err := store.LoadScripts(ctx); err != nil {
		if merr := RedisMisconfiguration(ctx, err, s); merr != nil {
			return merr
		}
		logger.Warn("idempotency: could not load the store's scripts at start-up; each loads at its first use",
			zap.String("redis_addr", s.RedisAddr()), zap.Error(err))
	}
	return nil
}

// allowEvictionVar is the variable that accepts a Redis that can evict
// records.
const allowEvictionVar = EnvPrefix + "_REDIS_ALLOW_EVICTION"

// evicting reports whether a maxmemory-policy can evict the store's keys:
// every allkeys-* policy, and every volatile-* one, since every record has
// a TTL. noeviction cannot.
func evicting(policy string) bool {
	return strings.HasPrefix(policy, "allkeys-") || strings.HasPrefix(policy, "volatile-")
}

// checkEviction reads maxmemory-policy from the server (every master of a
// cluster). A policy that can evict records stops start-up with an error
// naming the setting and IDEMPOTENCY_REDIS_ALLOW_EVICTION, or, with that
// set, logs a warning. A server that refuses CONFIG GET (managed Redis often
// renames or forbids it, and an ACL may deny it) or does not answer gets a
// warning with the advice: the check is the operator's then.
func checkEviction(ctx context.Context, client redis.UniversalClient, s Settings, logger *zap.Logger) error {
	type reading struct {
		addr, policy string
		err          error
	}
	var (
		mu       sync.Mutex
		readings []reading
	)
	read := func(ctx context.Context, c *redis.Client) error {
		r := reading{addr: c.Options().Addr}
		if _, cluster := client.(*redis.ClusterClient); !cluster {
			r.addr = s.RedisAddr() // a Sentinel's client names no address of its own
		}
		var res map[string]string
		res, r.err = c.ConfigGet(ctx, "maxmemory-policy").Result()
		if r.err == nil {
			r.policy = res["maxmemory-policy"]
		}
		mu.Lock()
		readings = append(readings, r)
		mu.Unlock()
		return nil
	}
	switch c := client.(type) {
	case *redis.ClusterClient:
		if err := c.ForEachMaster(ctx, read); err != nil {
			readings = append(readings, reading{addr: s.RedisAddr(), err: err})
		}
	case *redis.Client:
		_ = read(ctx, c)
	default:
		return nil
	}
	for _, r := range readings {
		switch {
		case r.err != nil:
			logger.Warn("idempotency: could not read the server's maxmemory-policy (CONFIG GET refused or failed); make sure it is noeviction: "+
				"a policy that evicts keys drops records, and a dropped record lets its key run again (docs/operations.md, \"Eviction\")",
				zap.String("redis_addr", r.addr), zap.Error(r.err))
		case !evicting(r.policy):
		case s.RedisAllowEviction:
			logger.Warn("idempotency: the server's maxmemory-policy can evict records, which "+allowEvictionVar+" accepts: an evicted record lets its key run again",
				zap.String("redis_addr", r.addr), zap.String("maxmemory_policy", r.policy))
		default:
			return fmt.Errorf("%s: redis at %s has maxmemory-policy %s, which evicts keys under memory pressure, records included: an evicted record lets its key run again. "+
				"Set the server's maxmemory-policy to noeviction (CONFIG SET maxmemory-policy noeviction, and in its configuration), "+
				"or set %s=true to accept the risk (docs/operations.md, \"Eviction\")",
				allowEvictionVar, r.addr, r.policy, allowEvictionVar)
		}
	}
	return nil
}

// replicaAcksVar is the variable of replica acknowledgement.
const replicaAcksVar = EnvPrefix + "_REDIS_REPLICA_ACKS"

// cannotAcknowledge returns an error naming IDEMPOTENCY_REDIS_REPLICA_ACKS
// when s has writes acknowledged and client cannot acknowledge them: every
// acknowledged write would be a storage error.
func cannotAcknowledge(s Settings, client redis.UniversalClient) error {
	if s.RedisReplicaAcks == 0 && !s.RedisReplicaAckFsync || redisrepo.CanAcknowledge(client) {
		return nil
	}
	return fmt.Errorf("%s: a %T cannot acknowledge writes (the touch of each write and its WAIT must share one connection): hand the module a *redis.Client or a *redis.ClusterClient, or set %s to 0 and %s_REDIS_REPLICA_ACK_FSYNC to false",
		replicaAcksVar, client, replicaAcksVar, EnvPrefix)
}

// checkReplicaAcks checks, when writes are to be acknowledged
// (IDEMPOTENCY_REDIS_REPLICA_ACKS, _FSYNC), what the server must have: a
// client that can hold a connection for the WAIT, and, for WAITAOF, the
// command and appendonly yes on every master; each missing is an error
// naming the variable. Fewer connected replicas than the acknowledgements
// need (none at all, or one that is down) is a warning: every acknowledged
// reservation is a storage error until they are back. A server that does
// not answer is left to the calls.
func checkReplicaAcks(ctx context.Context, client redis.UniversalClient, s Settings, logger *zap.Logger) error {
	if s.RedisReplicaAcks == 0 && !s.RedisReplicaAckFsync {
		return nil
	}
	if err := cannotAcknowledge(s, client); err != nil {
		return err // NewStoreClient refused it already
	}
	fsyncVar := EnvPrefix + "_REDIS_REPLICA_ACK_FSYNC"
	check := func(ctx context.Context, c *redis.Client, addr string) error {
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return nil
		}
		fields := infoFields(info)
		if n, err := strconv.Atoi(fields["connected_slaves"]); err == nil && n < s.RedisReplicaAcks {
			logger.Warn("idempotency: fewer replicas are connected than must acknowledge each write: every acknowledged reservation fails (a storage error, after the storage timeout) until they are back",
				zap.String("redis_addr", addr), zap.Int("connected_replicas", n), zap.Int("replica_acks", s.RedisReplicaAcks))
		}
		if !s.RedisReplicaAckFsync {
			return nil
		}
		if v, err := c.Do(ctx, "command", "info", "waitaof").Slice(); err == nil && (len(v) == 0 || v[0] == nil) {
			return fmt.Errorf("%s: redis at %s has no WAITAOF (Redis 7.2 or later, or Valkey 8, has it)", fsyncVar, addr)
		}
		cfg, err := c.ConfigGet(ctx, "appendonly").Result()
		switch {
		case err != nil:
			logger.Warn("idempotency: could not read the server's appendonly setting (CONFIG GET refused or failed); WAITAOF needs appendonly yes, or every acknowledged write fails",
				zap.String("redis_addr", addr), zap.Error(err))
		case cfg["appendonly"] != "yes":
			return fmt.Errorf("%s: redis at %s runs with appendonly %s, and WAITAOF waits for the append-only file: set appendonly yes on the server, or leave %s unset", fsyncVar, addr, cfg["appendonly"], fsyncVar)
		}
		return nil
	}
	if c, ok := client.(*redis.ClusterClient); ok {
		return c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			return check(ctx, n, n.Options().Addr)
		})
	}
	return check(ctx, client.(*redis.Client), s.RedisAddr())
}

// infoFields returns the fields of a reply of INFO, name to value.
func infoFields(info string) map[string]string {
	fields := map[string]string{}
	for line := range strings.SplitSeq(info, "\n") {
		if name, value, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && !strings.HasPrefix(name, "#") {
			fields[name] = value
		}
	}
	return fields
}

// oldRedis reads redis_version from the reply of INFO server and reports
// whether it is older than 7.0, which the store needs. A reply without a
// version it can read is not called old.
func oldRedis(info string) (version string, old bool) {
	for line := range strings.SplitSeq(info, "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:")
		if !ok {
			continue
		}
		major, _, _ := strings.Cut(v, ".")
		n, err := strconv.Atoi(major)
		return v, err == nil && n < 7
	}
	return "", false
}

// maxDialTimeout is go-redis's own default dial timeout: a connection that
// takes longer than this is not coming.
const maxDialTimeout = 5 * time.Second

// dialTimeout is the dial timeout of the clients NewRedisClient builds: the
// lease, within [StorageTimeout, 5s]. go-redis dials in the background and a
// caller waits for a dial only until its own context ends, so a dial timeout
// longer than the storage timeout holds no call longer; what it buys is a
// connection for the background save rounds and renewals, which may use
// what is left of a reservation, on a Redis too starved to accept within
// the storage timeout. A dial cut short at the storage timeout there (go-redis
// counts it, and after PoolSize of them fails every new connection at once
// until a probe a second later) gave up saves a lease could have kept.
func dialTimeout(s Settings) time.Duration {
	return max(s.StorageTimeout, min(s.Lease, maxDialTimeout))
}
