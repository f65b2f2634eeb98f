package idempotency

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/observability"
	"github.com/idemkit/idempotency/redisrepo"
)

// The constructors in this file are what Module wires. They are exported so
// that the library works without fx too:
//
//	s, err := idempotency.LoadSettings()
//	client, err := idempotency.NewRedisClient(s)
//	obs, err := idempotency.NewObserver(s, logger, prometheus.DefaultRegisterer)
//	c, err := idempotency.NewCoordinator(s, idempotency.NewStore(s, client), obs)

// NewRedisClient returns the Redis client the settings describe, without
// connecting: a *redis.ClusterClient over RedisClusterAddrs when that is set,
// else a *redis.Client for RedisURL. In cluster mode the user name, password,
// TLS (rediss://) and every query option of RedisURL apply to every node, its
// host is ignored, and its database must be 0 (a cluster has no other). The
// client fails fast when Redis is down (one dial attempt per connection, a
// dial timeout of at most IDEMPOTENCY_STORAGE_TIMEOUT) and honours context
// deadlines (ContextTimeoutEnabled), so the storage timeout bounds every call.
// The caller owns the client and closes it.
//
// It returns an error naming IDEMPOTENCY_REDIS_URL, and no client, when the
// URL is invalid, or, in cluster mode, sets a database other than 0 or a
// query option that a cluster client would ignore. The error never shows the
// user name or password, nor any part of them.
func NewRedisClient(s Settings) (redis.UniversalClient, error) {
	cluster := len(s.RedisClusterAddrs) > 0
	// The same check as Settings.Validate.
	opts, err := parseRedisURL(s.RedisURL, cluster)
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
	if opts.DialTimeout == 0 || opts.DialTimeout > s.StorageTimeout && s.StorageTimeout > 0 {
		opts.DialTimeout = s.StorageTimeout
	}
	if !cluster {
		return redis.NewClient(opts), nil
	}
	return redis.NewClusterClient(clusterOptions(opts, s.RedisClusterAddrs)), nil
}

// clusterOptions returns the options of a cluster client over addrs that
// carry every field of o that redis.ParseURL sets, but the node's address
// and database (parseRedisURL refuses a database other than 0 in cluster
// mode). appliesToCluster lists the query options whose fields these are.
func clusterOptions(o *redis.Options, addrs []string) *redis.ClusterOptions {
	tlsConfig := o.TLSConfig
	if tlsConfig != nil {
		// redis.ParseURL names the URL's host as the TLS server; on a cluster
		// each node is verified under its own name instead. skip_verify
		// (InsecureSkipVerify) is kept.
		tlsConfig = tlsConfig.Clone()
		tlsConfig.ServerName = ""
	}
	return &redis.ClusterOptions{
		Addrs:     addrs,
		Username:  o.Username,
		Password:  o.Password,
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

		// go-redis reloads the slot map on MOVED and ASK replies, but not on
		// connection errors: after a master dies and its replica is promoted,
		// calls on its slots would keep failing until the next periodic
		// reload, 60s by default (measured by the reliability suite). A
		// reload is one CLUSTER SLOTS, in the background, at most once per
		// interval while calls are made.
		ClusterStateReloadInterval: clusterStateReloadInterval,
	}
}

// clusterStateReloadInterval bounds how long a cluster client built by
// NewRedisClient routes to a topology that changed without a redirect (a
// failover after a master died).
const clusterStateReloadInterval = time.Second

// redisAddr describes where client points, for log lines: the address of a
// single server or the seed nodes of a cluster. It never includes a password.
func redisAddr(client redis.UniversalClient) string {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().Addr
	case *redis.ClusterClient:
		return strings.Join(c.Options().Addrs, ",")
	default:
		return fmt.Sprintf("%T", client)
	}
}

// NewStore returns the Redis store over client, with the settings' key
// prefix.
func NewStore(s Settings, client redisrepo.Client) *redisrepo.Store {
	return redisrepo.New(client, redisrepo.WithKeyPrefix(s.KeyPrefix))
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
// invalid.
func NewCoordinator(s Settings, store coordinator.Store, obs coordinator.Observer) (*coordinator.Coordinator, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return coordinator.New(store, append(s.CoordinatorOptions(), coordinator.WithObserver(obs))...)
}

// pingTimeout bounds the start-up ping of a Redis client the module built.
const pingTimeout = 3 * time.Second

// ping checks client at start-up. An unreachable Redis is not fatal: calls
// follow IDEMPOTENCY_ON_STORAGE_ERROR until it is back, so it is only logged.
func ping(ctx context.Context, client redis.UniversalClient, s Settings, logger *zap.Logger) {
	ctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		logger.Warn("idempotency: redis is unreachable at start-up; calls follow IDEMPOTENCY_ON_STORAGE_ERROR until it is back",
			zap.String("redis_addr", redisAddr(client)),
			zap.Stringer("on_storage_error", s.OnStorageError),
			zap.Error(fmt.Errorf("ping redis: %w", err)))
		return
	}
	logger.Info("idempotency: redis is reachable", zap.String("redis_addr", redisAddr(client)))
}
