package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/kelseyhightower/envconfig"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idempg"
)

// check prints the settings and checks the store: on Redis, PING, the
// server version (Redis 7.0 or newer, which the store needs) and, on a
// cluster, every master and its cluster_state; on PostgreSQL, what the
// module checks at start-up (checkPostgres).
func (a *app) check(ctx context.Context, args []string) int {
	fs, o := a.newFlagSet("check", "check [flags]")
	rest, err := parse(fs, o, args)
	if err != nil {
		return parseStatus(err)
	}
	if len(rest) > 0 {
		return a.usageError(fs, "no arguments expected, got %q", rest)
	}
	s, err := o.settings()
	if err != nil {
		return a.fail("check", err)
	}
	a.printSettings(s, o)
	fmt.Fprintln(a.stdout)
	if s.pg.URL != "" {
		return a.checkPostgres(ctx, s)
	}

	client, err := a.client(s.Settings)
	if err != nil {
		return a.fail("check", err)
	}
	defer client.Close()
	var ok bool
	switch c := client.(type) {
	case *redis.ClusterClient:
		ok = a.checkCluster(ctx, c, s.Settings)
	case *redis.Client:
		if s.RedisSentinelMaster != "" {
			ok = a.checkSentinel(ctx, c, s.Settings)
		} else {
			ok = a.checkServer(ctx, c, s.Settings)
		}
	default:
		return a.fail("check", fmt.Errorf("unexpected client %T", client))
	}
	if !ok {
		fmt.Fprintln(a.stdout, "FAILED")
		fmt.Fprintln(a.stderr, "idemctl check: Redis failed the check (see above)")
		return exitFailure
	}
	fmt.Fprintln(a.stdout, "OK")
	return exitOK
}

// printSettings prints every field of s with its variable, its value (with
// the secrets masked, as Redacted masks them) and where the value comes
// from: the core's settings, then idempg's.
func (a *app) printSettings(s config, o *overrides) {
	names := variables()
	flagOf := map[string]string{
		idempotency.EnvPrefix + "_REDIS_URL":           "redis-url",
		idempotency.EnvPrefix + "_REDIS_CLUSTER_ADDRS": "cluster-addrs",
		idempotency.EnvPrefix + "_KEY_PREFIX":          "key-prefix",
		idempotency.EnvPrefix + "_POSTGRES_URL":        "postgres-url",
	}
	fmt.Fprintln(a.stdout, "Settings:")
	w := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	source := func(name string) string {
		if f := flagOf[name]; o.set[f] {
			return "flag -" + f
		} else if _, set := os.LookupEnv(name); set {
			return "environment"
		}
		return "default"
	}
	plain, redacted := reflect.ValueOf(s.Settings), reflect.ValueOf(s.Redacted())
	for i := range redacted.NumField() {
		name := redacted.Type().Field(i).Name
		if i < len(names) {
			name = names[i]
		}
		masked := !reflect.DeepEqual(plain.Field(i).Interface(), redacted.Field(i).Interface())
		fmt.Fprintf(w, "  %s\t%s\t(%s)\n", name, settingValue(redacted.Type().Field(i).Name, redacted.Field(i), masked), source(name))
	}
	pg := s.pg.Redacted()
	for _, v := range []struct{ name, value string }{
		{"URL", pg.URL}, {"MAX_CONNS", fmt.Sprint(pg.MaxConns)}, {"MIN_CONNS", fmt.Sprint(pg.MinConns)}, {"MIGRATE", fmt.Sprint(pg.Migrate)},
	} {
		name := idempotency.EnvPrefix + "_POSTGRES_" + v.name
		fmt.Fprintf(w, "  %s\t%s\t(%s)\n", name, v.value, source(name))
	}
	_ = w.Flush()
}

// variables returns the names of the variables LoadSettings reads, in the
// order of the fields of Settings, as envconfig derives them.
func variables() []string {
	var b strings.Builder
	_ = envconfig.Usagef(idempotency.EnvPrefix, &idempotency.Settings{}, &b, "{{range .}}{{usage_key .}}\n{{end}}")
	return strings.Fields(b.String())
}

// settingValue formats v, the value of the field name of Settings.Redacted,
// as its variable would say it, with strings quoted (so that an empty key
// prefix shows), but a URL (a field whose name ends in URL) and a value that
// Redacted masked (masked) shown as they are.
func settingValue(name string, v reflect.Value, masked bool) string {
	switch x := v.Interface().(type) {
	case string:
		if masked || strings.HasSuffix(name, "URL") {
			return x
		}
		return strconv.Quote(x)
	case []string:
		return strings.Join(x, ",")
	case idempotency.OperationTTLs:
		var entries []string
		for _, op := range slices.Sorted(maps.Keys(x)) {
			entries = append(entries, op+":"+x[op].String())
		}
		return strings.Join(entries, ",")
	case time.Duration:
		return x.String()
	}
	return fmt.Sprint(v.Interface())
}

// checkServer pings a single server and reports its version. It reports
// false when the server is unreachable or older than Redis 7.0.
func (a *app) checkServer(ctx context.Context, c *redis.Client, s idempotency.Settings) bool {
	fmt.Fprintf(a.stdout, "Redis %s:\n", s.RedisAddr())
	r := probe(ctx, c, s.StorageTimeout)
	r.misconfigured(ctx, s)
	a.printProbe(r, "  server", "")
	if r.err == nil && r.clusterEnabled {
		fmt.Fprintf(a.stdout, "  WARNING: this server is a Redis Cluster node: set %s_REDIS_CLUSTER_ADDRS, or keys on other nodes fail with MOVED\n", idempotency.EnvPrefix)
	}
	return r.err == nil && !r.old
}

// checkCluster checks every master of the cluster: reachable, Redis 7.0 or
// newer, and cluster_state ok as it sees it. It reports false when the
// cluster's slot map cannot be read or a master fails a check.
func (a *app) checkCluster(ctx context.Context, c *redis.ClusterClient, s idempotency.Settings) bool {
	fmt.Fprintf(a.stdout, "Redis %s:\n", s.RedisAddr())
	// Loading the slot map tries the seeds one after the other; a few
	// storage timeouts bound it.
	lctx, cancel := context.WithTimeout(ctx, 3*s.StorageTimeout)
	defer cancel()
	if err := c.Ping(lctx).Err(); err != nil {
		if merr := idempotency.RedisMisconfiguration(ctx, err, s); merr != nil {
			fmt.Fprintf(a.stdout, "  FAILED: %v\n", merr)
		} else {
			fmt.Fprintf(a.stdout, "  unreachable: %v\n", err)
		}
		return false
	}
	var mu sync.Mutex
	var probes []probeResult
	err := c.ForEachMaster(lctx, func(ctx context.Context, node *redis.Client) error {
		r := probe(ctx, node, s.StorageTimeout)
		mu.Lock()
		probes = append(probes, r)
		mu.Unlock()
		return r.err
	})
	slices.SortFunc(probes, func(x, y probeResult) int { return strings.Compare(x.addr, y.addr) })
	ok := err == nil && len(probes) > 0
	for _, r := range probes {
		a.printProbe(r, "  master "+r.addr, "cluster_state "+r.clusterState)
		if r.err == nil && (r.clusterState != "ok" || r.old) {
			ok = false
		}
	}
	switch {
	case len(probes) == 0 && err != nil:
		fmt.Fprintf(a.stdout, "  masters unknown: %v\n", err)
	case ok:
		fmt.Fprintf(a.stdout, "  %d masters, every one reachable, cluster_state ok\n", len(probes))
	}
	return ok
}

// checkSentinel checks a failover client's setup: that every sentinel
// answers and names a master, and the master itself, through c, as the
// module reaches it: reachable, Redis 7.0 or newer, and a master (role
// master in its INFO). It reports false when a sentinel fails (the client
// tries the others, but the setup has lost one) or the master fails a
// check. Sentinels that name different masters (a failover in progress) are
// a warning.
func (a *app) checkSentinel(ctx context.Context, c *redis.Client, s idempotency.Settings) bool {
	fmt.Fprintf(a.stdout, "Redis %s:\n", s.RedisAddr())
	ok := true
	masters := map[string]bool{}
	var master string // the first sentinel's answer
	for _, addr := range s.RedisSentinelAddrs {
		r := probeSentinel(ctx, addr, s)
		if r.err != nil {
			fmt.Fprintf(a.stdout, "  sentinel %s: FAILED: %v\n", addr, r.err)
			ok = false
			continue
		}
		fmt.Fprintf(a.stdout, "  sentinel %s: PONG in %v, master %s at %s\n", addr, r.rtt.Round(time.Microsecond), s.RedisSentinelMaster, r.master)
		if master == "" {
			master = r.master
		}
		masters[r.master] = true
	}
	if len(masters) > 1 {
		fmt.Fprintf(a.stdout, "  WARNING: the sentinels name different masters (%s): a failover in progress, or sentinels that do not talk to each other\n",
			strings.Join(slices.Sorted(maps.Keys(masters)), ", "))
	}
	r := probe(ctx, c, s.StorageTimeout)
	r.misconfigured(ctx, s)
	r.addr = master
	if master == "" {
		r.addr = "(no sentinel named it)"
	}
	if r.err == nil && r.role != "master" {
		r.err = fmt.Errorf("role %s, not master: writes would fail with READONLY", r.role)
	}
	a.printProbe(r, "  master "+r.addr, "role "+r.role)
	if r.err != nil || r.old {
		ok = false
	}
	if ok {
		fmt.Fprintf(a.stdout, "  %s, every one answering; master %s at %s\n", plural(len(s.RedisSentinelAddrs), "sentinel"), s.RedisSentinelMaster, master)
	}
	return ok
}

// sentinelResult is what probeSentinel found out about one sentinel.
type sentinelResult struct {
	rtt    time.Duration
	master string // host:port of the master it names
	err    error
}

// probeSentinel pings the sentinel at addr and asks it for the master of s,
// each call within the storage timeout. It connects as the failover client
// of idempotency.NewRedisClient does: with s.RedisSentinelPassword, and
// with TLS when the URL is rediss://, the sentinel verified under its own
// name.
func probeSentinel(ctx context.Context, addr string, s idempotency.Settings) sentinelResult {
	var r sentinelResult
	opts := &redis.Options{
		Addr:                  addr,
		Password:              s.RedisSentinelPassword,
		DialTimeout:           s.StorageTimeout,
		DialerRetries:         1,
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
	}
	if u, err := redis.ParseURL(s.RedisURL); err == nil && u.TLSConfig != nil {
		opts.TLSConfig = u.TLSConfig.Clone()
		opts.TLSConfig.ServerName = ""
	}
	sc := redis.NewSentinelClient(opts)
	defer sc.Close()
	pctx, cancel := context.WithTimeout(ctx, s.StorageTimeout)
	defer cancel()
	start := time.Now()
	if err := sc.Ping(pctx).Err(); err != nil {
		r.err = fmt.Errorf("ping: %w", err)
		return r
	}
	r.rtt = time.Since(start)
	hp, err := sc.GetMasterAddrByName(pctx, s.RedisSentinelMaster).Result()
	switch {
	case errors.Is(err, redis.Nil):
		r.err = fmt.Errorf("it monitors no master named %s", strconv.Quote(s.RedisSentinelMaster))
	case err != nil:
		r.err = fmt.Errorf("sentinel get-master-addr-by-name: %w", err)
	case len(hp) != 2:
		r.err = fmt.Errorf("sentinel get-master-addr-by-name: want host and port, got %q", hp)
	default:
		r.master = net.JoinHostPort(hp[0], hp[1])
	}
	return r
}

// probeResult is what probe found out about one server.
type probeResult struct {
	addr           string
	rtt            time.Duration
	version        string // redis_version
	valkey         string // valkey_version, "" on Redis
	old            bool   // version older than 7.0
	clusterEnabled bool   // cluster_enabled:1
	clusterState   string // cluster_state, "" outside a cluster
	role           string // master or slave
	err            error
	pingErr        error // the error of the PING, when it failed
}

// misconfigured replaces the error of a failed PING with the
// misconfiguration it shows, if any, as lookup, forget and count word it
// (pingError).
func (r *probeResult) misconfigured(ctx context.Context, s idempotency.Settings) {
	if r.pingErr == nil {
		return
	}
	if merr := idempotency.RedisMisconfiguration(ctx, r.pingErr, s); merr != nil {
		r.err = merr
	}
}

// probe pings the server of c and reads its version and cluster state, each
// call within timeout.
func probe(ctx context.Context, c *redis.Client, timeout time.Duration) probeResult {
	r := probeResult{addr: c.Options().Addr}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	if err := c.Ping(pctx).Err(); err != nil {
		r.err, r.pingErr = fmt.Errorf("ping: %w", err), err
		return r
	}
	r.rtt = time.Since(start)
	info, err := c.Info(pctx).Result()
	if err != nil {
		r.err = fmt.Errorf("info: %w", err)
		return r
	}
	fields := infoFields(info)
	r.version = fields["redis_version"]
	// Valkey reports the Redis release it is compatible with as
	// redis_version (7.2.4 for Valkey 8), and its own as valkey_version.
	r.valkey = fields["valkey_version"]
	r.old = oldRedis(r.version)
	r.role = fields["role"]
	r.clusterEnabled = fields["cluster_enabled"] == "1"
	if r.clusterEnabled {
		ci, err := c.ClusterInfo(pctx).Result()
		if err != nil {
			r.err = fmt.Errorf("cluster info: %w", err)
			return r
		}
		r.clusterState = infoFields(ci)["cluster_state"]
		if r.clusterState == "" {
			r.err = errors.New("cluster info: no cluster_state")
		}
	}
	return r
}

// printProbe prints r, a server's, under what ("  server", "  master
// host:port"), with extra after its version when there is extra.
func (a *app) printProbe(r probeResult, what, extra string) {
	if r.err != nil {
		fmt.Fprintf(a.stdout, "%s: FAILED: %v\n", what, r.err)
		return
	}
	line := fmt.Sprintf("%s: PONG in %v, redis_version %s", what, r.rtt.Round(time.Microsecond), r.version)
	if r.valkey != "" {
		line += ", valkey_version " + r.valkey
	}
	if extra != "" {
		line += ", " + extra
	}
	fmt.Fprintln(a.stdout, line)
	if r.old {
		fmt.Fprintf(a.stdout, "  FAILED: %s runs Redis %s: the store needs Redis 7.0 or newer (SET with NX and GET); every call to it would fail with a storage error\n", r.addr, r.version)
	}
}

// infoFields returns the "name:value" lines of a reply of INFO or CLUSTER
// INFO.
func infoFields(info string) map[string]string {
	out := map[string]string{}
	for line := range strings.SplitSeq(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && !strings.HasPrefix(k, "#") {
			out[k] = v
		}
	}
	return out
}

// oldRedis reports whether version, a redis_version, is older than 7.0,
// which the store needs. A version it cannot read is not called old.
func oldRedis(version string) bool {
	major, _, _ := strings.Cut(version, ".")
	n, err := strconv.Atoi(major)
	return err == nil && n < 7
}

// checkPostgres checks the PostgreSQL store as idempg.Module does at
// start-up (idempg.CheckPool: reachable, no statement cache behind a
// pooler, the schema version), and prints the server's version and its
// default isolation, which the store does not depend on.
func (a *app) checkPostgres(ctx context.Context, s config) int {
	pool, err := idempg.NewPool(s.pg)
	if err != nil {
		return a.fail("check", err)
	}
	defer pool.Close()
	c := pool.Config().ConnConfig
	fmt.Fprintf(a.stdout, "PostgreSQL %s:%d/%s:\n", c.Host, c.Port, c.Database)
	ctx, cancel := context.WithTimeout(ctx, max(s.StorageTimeout, 5*time.Second))
	defer cancel()
	var version, isolation string
	begun := time.Now()
	err = pool.QueryRow(ctx, "SELECT current_setting('server_version'), current_setting('default_transaction_isolation')",
		pgx.QueryExecModeSimpleProtocol).Scan(&version, &isolation)
	if err == nil {
		fmt.Fprintf(a.stdout, "  answered in %v: server_version %s, default_transaction_isolation %s (the store runs at read committed whatever it is)\n",
			time.Since(begun).Round(time.Microsecond), version, isolation)
		err = idempg.CheckPool(ctx, pool)
	}
	if err != nil {
		fmt.Fprintf(a.stdout, "  FAILED: %v\nFAILED\n", err)
		fmt.Fprintln(a.stderr, "idemctl check: PostgreSQL failed the check (see above)")
		return exitFailure
	}
	fmt.Fprintf(a.stdout, "  schema version %d, as this idemctl expects; the store's statements run through this connection\nOK\n", idempg.SchemaVersion)
	return exitOK
}
