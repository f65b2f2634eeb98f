package idempotency

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/redisurl"
	"github.com/idemkit/idempotency/observability"
	"github.com/idemkit/idempotency/redisrepo"
)

// EnvPrefix is the prefix of every environment variable LoadSettings reads:
// the field Lease is read from IDEMPOTENCY_LEASE. Pass it to
// envconfig.Usage to print the variables with their defaults.
const EnvPrefix = "IDEMPOTENCY"

// Settings configures the library. LoadSettings reads it from the
// environment (every field's variable is EnvPrefix, "_", and the name in its
// doc comment); DefaultSettings returns the documented defaults for code
// that builds it by hand.
//
// The zero Settings is not usable: it has Enabled false and no lease, and
// Validate refuses it. Start from DefaultSettings or LoadSettings and change
// what you need.
//
// A variable that is set to the empty string is read as the empty value of
// its field, as envconfig does: an error for a duration, a boolean or a
// number, nothing for a list, the empty string for a string. The modes are
// the exception: IDEMPOTENCY_IN_FLIGHT, IDEMPOTENCY_ON_STORAGE_ERROR and
// IDEMPOTENCY_LOG_KEYS set to "" mean their defaults.
type Settings struct {
	// Enabled (ENABLED, default true) is the kill switch: false makes every
	// call just run its action, with nothing read, written or counted.
	Enabled bool `split_words:"true" option:"WithEnabled" default:"true" desc:"kill switch: false runs every action unprotected, with nothing read, written or counted"`

	// RedisURL (REDIS_URL, default redis://localhost:6379/0) is the Redis
	// server: redis:// or rediss:// (TLS), with an optional user and
	// password, a host and a port from 1 to 65535 (default 6379), and the
	// database number as the path. Query parameters are go-redis client
	// options (redis.ParseURL), e.g. ?pool_size=20. Set but empty means the
	// default.
	RedisURL string `split_words:"true" default:"redis://localhost:6379/0" desc:"Redis server: redis:// or rediss:// (TLS) URL, with password and database number"`

	// RedisClusterAddrs (REDIS_CLUSTER_ADDRS, default empty) lists the
	// host:port seed nodes of a Redis Cluster, comma-separated. When it is
	// set, a cluster client is used instead of the single server in
	// RedisURL. LoadSettings trims spaces around entries and drops empty
	// ones.
	RedisClusterAddrs []string `split_words:"true" default:"" desc:"comma-separated host:port seed nodes of a Redis Cluster; set: a cluster client is used"`

	// RedisSentinelMaster (REDIS_SENTINEL_MASTER, default empty) is the
	// name under which Redis Sentinel monitors the master. When it is set, a
	// failover client is used instead of the single server in RedisURL: it
	// asks the sentinels of RedisSentinelAddrs for the master's address, and
	// follows a failover when they announce one. The user, password,
	// database, TLS and query options of RedisURL then apply to the master
	// (and its replicas), and its host is ignored. It cannot be combined with
	// RedisClusterAddrs.
	RedisSentinelMaster string `split_words:"true" default:"" desc:"name of the master that Redis Sentinel monitors; set: a failover client asks IDEMPOTENCY_REDIS_SENTINEL_ADDRS for it"`

	// RedisSentinelAddrs (REDIS_SENTINEL_ADDRS, default empty) lists the
	// host:port addresses of the sentinels, comma-separated; required with
	// RedisSentinelMaster, and refused without it. LoadSettings trims spaces
	// around entries and drops empty ones.
	RedisSentinelAddrs []string `split_words:"true" default:"" desc:"comma-separated host:port addresses of the sentinels (with IDEMPOTENCY_REDIS_SENTINEL_MASTER)"`

	// RedisSentinelPassword (REDIS_SENTINEL_PASSWORD, default empty) is the
	// password of the sentinels themselves (their requirepass), if they have
	// one; the master's is RedisURL's. String and the start-up logs never
	// show it.
	RedisSentinelPassword string `split_words:"true" default:"" desc:"password of the sentinels (their requirepass), if any; the master's password is in IDEMPOTENCY_REDIS_URL"`

	// RedisAutoPipeline (REDIS_AUTO_PIPELINE, default false) sends the
	// store's commands through the Redis client's go-redis AutoPipeliner,
	// which batches the commands of concurrent callers into pipelines: more
	// calls per second with many concurrent callers, more latency with few
	// (docs/configuration.md has figures). StorageTimeout still bounds every
	// store call. It applies to the app's own client too (UseRedisClient);
	// see NewStoreClient.
	RedisAutoPipeline bool `split_words:"true" default:"false" desc:"batch the store commands of concurrent callers into pipelines (go-redis AutoPipeline)"`

	// RedisCoalesceLanes (REDIS_COALESCE_LANES, default 2; 0: off) is how
	// many commands of concurrent callers the store has in flight at once
	// before it sends those that come meanwhile together, in one pipeline
	// (redisrepo.WithCoalescing): one caller's command goes at once, alone,
	// and 64 callers take about half the time each that they take without
	// it (docs/performance.md, "Coalescing"). It does not apply with
	// RedisAutoPipeline, which batches in its own way.
	RedisCoalesceLanes int `split_words:"true" default:"2" desc:"commands of concurrent callers in flight at once before the rest go together in one pipeline; 0: off"`

	// RedisReplicaAcks (REDIS_REPLICA_ACKS, default 0: off) is how many
	// replicas must acknowledge (WAIT) each reservation and each completion
	// of the operations in RedisReplicaAckOperations (every operation when
	// it is empty) before the call goes on, so that a failover to such a
	// replica loses none of them. A reservation that is not acknowledged
	// within the storage timeout is taken back and is a storage error
	// (OnStorageError decides); a completion that is not is sent again while
	// the reservation lasts. Each acknowledged write costs a second round
	// trip and the replicas' own (docs/operations.md, "Replica
	// acknowledgement"). It cannot be combined with RedisAutoPipeline or
	// record format 1.
	RedisReplicaAcks int `split_words:"true" default:"0" desc:"replicas that must acknowledge (WAIT) each reservation and completion before the call goes on; 0: off"`

	// RedisReplicaAckFsync (REDIS_REPLICA_ACK_FSYNC, default false) waits
	// with WAITAOF instead of WAIT: the master's append-only file (it must
	// run with appendonly yes) and those of RedisReplicaAcks replicas hold
	// each write. Redis 7.2 or later, or Valkey 8.
	RedisReplicaAckFsync bool `split_words:"true" default:"false" desc:"acknowledge with WAITAOF: the write is in the append-only files of the master and of IDEMPOTENCY_REDIS_REPLICA_ACKS replicas"`

	// RedisReplicaAckOperations (REDIS_REPLICA_ACK_OPERATIONS, default
	// empty: every operation) lists the operations whose writes are
	// acknowledged, comma-separated.
	RedisReplicaAckOperations []string `split_words:"true" default:"" desc:"comma-separated operations whose writes are acknowledged (empty: every operation)"`

	// RedisAllowEviction (REDIS_ALLOW_EVICTION, default false) accepts a
	// Redis whose maxmemory-policy can evict the store's records (every
	// allkeys-* policy, and every volatile-* one, since every record has a
	// TTL): start-up refuses such a server unless it is set, because an
	// evicted record is a key whose action runs again. Start-up then logs a
	// warning instead.
	RedisAllowEviction bool `split_words:"true" default:"false" desc:"accept a Redis whose maxmemory-policy can evict records (an evicted record lets its key run again)"`

	// KeyPrefix (KEY_PREFIX, default "idempotency:") starts every Redis key:
	// a record lives under {KeyPrefix}{operation}:{key}. It may be empty.
	KeyPrefix string `split_words:"true" default:"idempotency:" desc:"prefix of every Redis key: {prefix}{operation}:{key}"`

	// RecordFormat (RECORD_FORMAT, default 2) is the format of the records
	// the store writes: 2, one STRING read by plain commands, or 1, the HASH
	// that releases before format 2 wrote. Both are always read. Set 1 for
	// the length of a rolling upgrade from such a release: its instances take
	// a format 2 record for something unreadable and run its action again
	// (redisrepo.Format1; docs/architecture.md, "Rolling out a format").
	RecordFormat int `split_words:"true" default:"2" desc:"format of the records written: 2, or 1 while a release before format 2 still serves the same keys"`

	// DefaultTTL (DEFAULT_TTL, default 1h) is how long a completed record is
	// kept when neither the call nor OperationTTLS gives a TTL. It must lie
	// within MinTTL and MaxTTL.
	DefaultTTL time.Duration `split_words:"true" option:"WithDefaultTTL" default:"1h" desc:"how long a result is kept when neither the call nor IDEMPOTENCY_OPERATION_TTLS says"`

	// MinTTL (MIN_TTL, default 1s) is the shortest accepted record TTL; at
	// least 1ms.
	MinTTL time.Duration `split_words:"true" option:"WithMinTTL" default:"1s" desc:"shortest accepted record TTL (at least 1ms)"`

	// MaxTTL (MAX_TTL, default 720h, 30 days) is the longest accepted record
	// TTL; not shorter than MinTTL.
	MaxTTL time.Duration `split_words:"true" option:"WithMaxTTL" default:"720h" desc:"longest accepted record TTL"`

	// OperationTTLS (OPERATION_TTLS, default empty) sets record TTLs per
	// operation, e.g. "payment.charge:24h,order.create:1h"; an entry wins
	// over a call's own TTL (Call.TTL), so that an operator can change a TTL
	// written in code. Each operation must be valid
	// (coordinator.ValidateOperation) and each TTL within MinTTL and MaxTTL.
	//
	// The field is spelled TTLS, not TTLs, because envconfig's split_words
	// would turn "TTLs" into OPERATION_TT_LS, and an explicit envconfig tag
	// would also read an unprefixed OPERATION_TTLS variable.
	OperationTTLS OperationTTLs `split_words:"true" option:"WithOperationTTLs,WithOperations" default:"" desc:"per-operation record TTLs: payment.charge:24h,order.create:1h"`

	// FencedOperations (FENCED_OPERATIONS, default empty) lists the
	// operations whose reservations carry a fence
	// (coordinator.WithFencedOperations; Reservation.Fence), e.g.
	// "payment.charge,ledger.post" (spaces around an entry and empty entries
	// are dropped). Each must be a valid operation; fences need RecordFormat
	// 2 and a store that hands them out (the Redis store does, idempg's does
	// not).
	FencedOperations []string `split_words:"true" option:"WithFencedOperations" default:"" desc:"comma-separated operations whose reservations carry a fence for downstream writes"`

	// InFlight (IN_FLIGHT, default wait) is what a second caller does while
	// the first holds the key: wait, raise or run. Empty means wait.
	InFlight coordinator.InFlightMode `split_words:"true" option:"WithInFlight" default:"wait" desc:"a second caller while the first holds the key: wait, raise or run (empty: wait)"`

	// Lease (LEASE, default 30s) is how long a reservation outlives a caller
	// that stopped renewing it (crashed); at least 1ms.
	Lease time.Duration `split_words:"true" option:"WithLease" default:"30s" desc:"reservation lease, renewed while the action runs (at least 1ms)"`

	// RenewInterval (RENEW_INTERVAL, default 0s) is how often a running
	// action's lease is renewed; 0 means Lease/3. It must be shorter than the
	// lease.
	RenewInterval time.Duration `split_words:"true" option:"WithRenewInterval" default:"0s" desc:"how often a running action's lease is renewed; 0s: lease/3"`

	// WaitTimeout (WAIT_TIMEOUT, default 0s) bounds how long a caller in
	// mode wait waits for another caller's result; 0 means one Lease. A
	// caller never waits past its context's deadline.
	WaitTimeout time.Duration `split_words:"true" option:"WithWaitTimeout" default:"0s" desc:"how long a second caller waits for the first one's result (mode wait); 0s: one lease"`

	// PollInterval (POLL_INTERVAL, default 10ms) is a waiter's first
	// interval between reads; it backs off from there. Positive.
	PollInterval time.Duration `split_words:"true" option:"WithPollInterval" default:"10ms" desc:"a waiting caller's first interval between reads; it backs off from there"`

	// OnStorageError (ON_STORAGE_ERROR, default run) is what a call does when
	// the store fails before the action ran: run it unprotected, or raise a
	// *coordinator.StorageError. Empty means run.
	OnStorageError coordinator.OnStorageErrorMode `split_words:"true" option:"WithOnStorageError" default:"run" desc:"when the store fails before the action ran: run (unprotected) or raise (empty: run)"`

	// StorageTimeout (STORAGE_TIMEOUT, default 1s) bounds every store call.
	// Positive.
	StorageTimeout time.Duration `split_words:"true" option:"WithStorageTimeout" default:"1s" desc:"timeout of each store call"`

	// BreakerFailures (BREAKER_FAILURES, default 5) is how many consecutive
	// connection failures (a dial error, a timeout; not an error reply of
	// Redis, nor a call its caller cancelled) open the circuit breaker of
	// the Redis client the module builds: then every store call fails at
	// once, as a storage error, instead of paying a storage timeout, until a
	// probe finds Redis back (see BreakerCooldown). 0 turns the breaker off.
	// Not negative.
	BreakerFailures int `split_words:"true" default:"5" desc:"consecutive Redis connection failures that open the circuit breaker (calls then fail at once); 0: no breaker"`

	// BreakerCooldown (BREAKER_COOLDOWN, default 1s) is how long the open
	// breaker fails every call before it lets one through as a probe, and
	// how long after a failed probe the next one goes; one probe at a time.
	// It is at most a tenth of the lease (a longer one is lowered to it), so
	// that a result still being saved in the background is not kept from a
	// Redis that came back. Positive when the breaker is on.
	BreakerCooldown time.Duration `split_words:"true" default:"1s" desc:"how long the open circuit breaker fails calls at once before one probe goes through (at most a tenth of IDEMPOTENCY_LEASE)"`

	// MaxResultBytes (MAX_RESULT_BYTES, default 1048576, 1 MiB) is the
	// largest encoded result that is stored; a larger one is returned but not
	// stored. Positive.
	MaxResultBytes int `split_words:"true" option:"WithMaxResultBytes" default:"1048576" desc:"largest encoded result that is stored, in bytes"`

	// MetricsEnabled (METRICS_ENABLED, default true) turns the Prometheus
	// metrics on or off.
	MetricsEnabled bool `split_words:"true" default:"true" desc:"export Prometheus metrics"`

	// MetricsNamespace (METRICS_NAMESPACE, default empty) is prepended to
	// every metric name: "shop" gives shop_idempotency_... . Empty or a
	// Prometheus name without colons ([a-zA-Z_][a-zA-Z0-9_]*).
	MetricsNamespace string `split_words:"true" option:"WithNamespace" default:"" desc:"prefix of every metric name, e.g. shop gives shop_idempotency_..."`

	// TracingEnabled (TRACING_ENABLED, default true) records every call on
	// the OpenTelemetry span of its context (package idemotel), through the
	// graph's trace.TracerProvider, else the global one
	// (otel.GetTracerProvider); false turns that off.
	TracingEnabled bool `split_words:"true" default:"true" desc:"record each call on its OpenTelemetry span (the graph's trace.TracerProvider, else the global one)"`

	// LogKeys (LOG_KEYS, default hashed) is how idempotency keys appear in
	// log lines: hashed (a digest that correlates the lines of one key
	// without writing it), plain, or omitted. Empty means hashed. Keys may
	// carry user or tenant identifiers, hence the default.
	LogKeys observability.LogKeysMode `split_words:"true" option:"WithLogKeys" default:"hashed" desc:"how keys appear in log lines: hashed, plain or omitted (empty: hashed)"`

	// RedisLogs (REDIS_LOGS, default zap) is where go-redis's own log lines
	// go: zap, the module's logger; off, nowhere; keep, wherever go-redis's
	// logger points already (its default is standard error, unstructured).
	// go-redis has one logger per process, so this applies to every go-redis
	// client in it (RedisLogsMode). Empty means zap.
	RedisLogs RedisLogsMode `split_words:"true" default:"zap" desc:"where go-redis's own log lines go: zap (the module's logger), off, or keep (leave go-redis's logger alone) (empty: zap)"`
}

// The defaults of the circuit breaker's settings.
const (
	// DefaultBreakerFailures is the default of BreakerFailures.
	DefaultBreakerFailures = 5
	// DefaultBreakerCooldown is the default of BreakerCooldown.
	DefaultBreakerCooldown = time.Second
)

// DefaultSettings returns the documented defaults: what LoadSettings returns
// when no IDEMPOTENCY_* variable is set.
func DefaultSettings() Settings {
	return Settings{
		Enabled:            true,
		RedisURL:           "redis://localhost:6379/0",
		RedisCoalesceLanes: redisrepo.DefaultLanes,
		KeyPrefix:          redisrepo.DefaultKeyPrefix,
		RecordFormat:       int(redisrepo.Format2),
		DefaultTTL:         coordinator.DefaultTTL,
		MinTTL:             coordinator.DefaultMinTTL,
		MaxTTL:             coordinator.DefaultMaxTTL,
		InFlight:           coordinator.InFlightWait,
		Lease:              coordinator.DefaultLease,
		PollInterval:       coordinator.DefaultPollInterval,
		OnStorageError:     coordinator.OnStorageErrorRun,
		StorageTimeout:     coordinator.DefaultStorageTimeout,
		BreakerFailures:    DefaultBreakerFailures,
		BreakerCooldown:    DefaultBreakerCooldown,
		MaxResultBytes:     coordinator.DefaultMaxResultBytes,
		MetricsEnabled:     true,
		TracingEnabled:     true,
		LogKeys:            observability.LogKeysHashed,
		RedisLogs:          RedisLogsZap,
	}
}

// String returns s as fmt's %+v would, with the password in RedisURL and
// RedisSentinelPassword replaced by "xxxxx", so that Settings can be logged.
func (s Settings) String() string {
	type fields Settings // without this String method
	return fmt.Sprintf("%+v", fields(s.Redacted()))
}

// Redacted returns s with its secrets masked, as String shows them: the
// password in RedisURL replaced by "xxxxx" (a URL whose user information
// cannot be told apart from the rest, or that does not parse, by "(invalid
// URL)", since there is no telling where its password is), and
// RedisSentinelPassword, when set, by "xxxxx". For showing settings field by
// field, as idemctl check does.
func (s Settings) Redacted() Settings {
	s.RedisURL = redactURL(s.RedisURL)
	if s.RedisSentinelPassword != "" {
		s.RedisSentinelPassword = "xxxxx"
	}
	return s
}

// RedisAddr describes where the settings point, for messages: the host:port
// of RedisURL, the seed nodes of RedisClusterAddrs, or the master that
// RedisSentinelMaster names and the sentinels of RedisSentinelAddrs. It never
// includes a user name or password; for a URL that does not parse it is
// "(invalid URL)".
func (s Settings) RedisAddr() string {
	switch s.topology() {
	case redisurl.Cluster:
		return "cluster " + strings.Join(s.RedisClusterAddrs, ",")
	case redisurl.Sentinel:
		return fmt.Sprintf("sentinel master %s via %s", s.RedisSentinelMaster, strings.Join(s.RedisSentinelAddrs, ","))
	}
	opts, err := redisurl.Parse(s.RedisURL, redisurl.Server)
	if err != nil {
		return "(invalid URL)"
	}
	return opts.Addr
}

// redactURL hides the password of a URL; a URL that does not parse, or whose
// user information cannot be told apart from the rest (see userinfo), is not
// shown at all, since there is no telling where its password is.
func redactURL(raw string) string {
	info, clear := redisurl.Userinfo(raw)
	u, err := url.Parse(raw)
	if err != nil || info != "" && !clear {
		return "(invalid URL)"
	}
	return u.Redacted()
}

// CoordinatorOptions returns the options for coordinator.New that carry s:
// the kill switch, the modes, the lease and its timings, the storage timeout,
// the TTLs, the fenced operations and the result size cap. It adds no Observer; append
// coordinator.WithObserver for one. coordinator.New refuses exactly what
// Validate refuses of these values; Validate's messages name the variables.
func (s Settings) CoordinatorOptions() []coordinator.Option {
	return []coordinator.Option{
		coordinator.WithEnabled(s.Enabled),
		coordinator.WithInFlight(s.InFlight),
		coordinator.WithOnStorageError(s.OnStorageError),
		coordinator.WithLease(s.Lease),
		coordinator.WithRenewInterval(s.RenewInterval),
		coordinator.WithWaitTimeout(s.WaitTimeout),
		coordinator.WithPollInterval(s.PollInterval),
		coordinator.WithStorageTimeout(s.StorageTimeout),
		coordinator.WithDefaultTTL(s.DefaultTTL),
		coordinator.WithMinTTL(s.MinTTL),
		coordinator.WithMaxTTL(s.MaxTTL),
		coordinator.WithOperationTTLs(s.OperationTTLS),
		coordinator.WithFencedOperations(s.FencedOperations...),
		coordinator.WithMaxResultBytes(s.MaxResultBytes),
	}
}

// OperationTTLs maps operation names to record TTLs. Its text form, read
// from IDEMPOTENCY_OPERATION_TTLS, is comma-separated operation:duration
// entries: "payment.charge:24h,order.create:1h".
type OperationTTLs map[string]time.Duration

// UnmarshalText parses comma-separated operation:duration entries. Spaces
// around entries, operations and durations are ignored, and so are empty
// entries ("a:1h,,b:2h," is two entries); no entries at all give a nil map.
// It returns an error naming the entry when an entry has no colon, its
// duration is not a Go duration, or its operation appeared before. Whether
// operations are valid and TTLs within bounds is coordinator.New's to say
// (WithOperationTTLs), and Settings.Validate reports it.
func (m *OperationTTLs) UnmarshalText(text []byte) error {
	var out OperationTTLs
	for entry := range strings.SplitSeq(string(text), ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		op, dur, ok := strings.Cut(entry, ":")
		if !ok {
			return fmt.Errorf("entry %q: want operation:duration, e.g. payment.charge:24h", entry)
		}
		op, dur = strings.TrimSpace(op), strings.TrimSpace(dur)
		ttl, err := time.ParseDuration(dur)
		if err != nil {
			return fmt.Errorf("entry %q: %q is not a duration; use a Go duration such as 30m or 24h", entry, dur)
		}
		if _, dup := out[op]; dup {
			return fmt.Errorf("entry %q: operation %q appears more than once", entry, op)
		}
		if out == nil {
			out = make(OperationTTLs)
		}
		out[op] = ttl
	}
	*m = out
	return nil
}

// String returns the entries in their text form, sorted by operation.
func (m OperationTTLs) String() string {
	var b strings.Builder
	for i, op := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(op)
		b.WriteByte(':')
		b.WriteString(m[op].String())
	}
	return b.String()
}

// observerOptions returns the options for observability.New that carry s,
// metrics or not (Validate checks them either way). NewObserver adds the
// logger and the registerer.
func (s Settings) observerOptions() []observability.Option {
	return []observability.Option{
		observability.WithLogKeys(s.LogKeys),
		observability.WithNamespace(s.MetricsNamespace),
		observability.WithOperations(slices.Sorted(maps.Keys(s.OperationTTLS))...),
	}
}

// topology says what kind of client s describes.
func (s Settings) topology() redisurl.Topology {
	switch {
	case len(s.RedisClusterAddrs) > 0:
		return redisurl.Cluster
	case s.RedisSentinelMaster != "":
		return redisurl.Sentinel
	}
	return redisurl.Server
}
