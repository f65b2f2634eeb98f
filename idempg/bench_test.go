package idempg_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idempg"
	"github.com/idemkit/idempotency/idempg/internal/pgtest"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// BenchmarkFlows measures idempg's transactional call beside the least a
// hand-written PostgreSQL check does and beside the Redis store, in one run,
// on one PostgreSQL server (and one redis-server) that the run starts. Every
// impl has the same effect per key: one ledger row inserted, the result
// stored, the result returned to every call of the key.
//
//	impl=idempg      idempg.DoResult through a coordinator with the default
//	                 settings over idempg.New(pool) (benchPGCall); the action
//	                 inserts the ledger row through the pgx.Tx and returns the
//	                 payment
//	impl=floor       by hand, in one READ COMMITTED transaction: INSERT INTO
//	                 my_keys ... ON CONFLICT DO NOTHING RETURNING; if it
//	                 inserted, the ledger row, UPDATE the response, COMMIT;
//	                 if not (it waited for a holder's transaction, as ON
//	                 CONFLICT does), SELECT the stored response, COMMIT
//	impl=floor-read  floor after a plain SELECT of the response, outside any
//	                 transaction (idempg reads first too): a replay is one
//	                 statement, a first run one more
//	impl=redis       coordinator.DoResult over redisrepo.New (what
//	                 idempotency.NewStore builds with the default settings) on
//	                 a redis-server; the action inserts the ledger row with an
//	                 autocommit INSERT into PostgreSQL (the same effect, not
//	                 atomic with the record)
//
// The flows: flow=replay (a completed key: every op repeats the call),
// flow=first (a fresh key per op) and flow=contended (benchGroup consecutive
// ops share a fresh key: with 64 callers about 8 keys are hammered by 8
// callers each at any moment, one runs and seven wait and replay; with 1
// caller the same mix runs in sequence, one first run and seven replays per
// key, with no waiting). Each runs with callers=1 and callers=64
// (RunParallel, at least 64 goroutines). Every pool has benchConns
// connections: the pgxpool that all PostgreSQL work goes through, and the
// go-redis client of impl=redis. idempg's and Redis's calls carry a
// fingerprint, as in benchmarks/; the floors keep none.
//
// Before each timed loop (not timed): the tables (idempotency_records,
// my_keys, ledger) are truncated and Redis flushed, every connection is
// warmed up with the impl's first run and replay, and the tables are
// truncated again; after it, the ledger is checked to hold exactly one row
// per key. See measure for the metrics.
//
// Run it with
//
//	cd idempg && for i in 1 2 3 4 5 6; do go test -run '^$' -bench Flows -benchmem -benchtime 2s -count 1 . | tee -a bench.out; done
//	go run golang.org/x/perf/cmd/benchstat@latest -col /impl bench.out
func BenchmarkFlows(b *testing.B) {
	env := newBenchEnv(b)
	for _, flow := range benchFlows {
		for _, callers := range []int{1, 64} {
			for _, impl := range env.impls {
				b.Run(fmt.Sprintf("flow=%s/callers=%d/impl=%s", flow.name, callers, impl.name), func(b *testing.B) {
					if impl.skip != "" {
						b.Skip(impl.skip)
					}
					flow.run(b, env, impl, callers)
				})
			}
		}
	}
}

const (
	// benchOperation is the calls' operation, as in benchmarks/.
	benchOperation = "payment.charge"
	// benchConns is the size of every pool: pgxpool's MaxConns, go-redis's
	// PoolSize; the number of callers of the concurrent runs.
	benchConns = 64
	// benchGroup is how many consecutive ops of flow=contended share a key.
	benchGroup = 8
	// benchLedgerValue is what each action writes to the ledger.
	benchLedgerValue = "charge 10990 eur"
)

// benchPayment is every action's result, benchmarks.Payment: 109 bytes of
// JSON.
type benchPayment struct {
	ID       string `json:"id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Status   string `json:"status"`
	Created  int64  `json:"created"`
	Updated  int64  `json:"updated"`
}

var benchPaymentValue = benchPayment{ID: "pay_1MmlLr", Amount: 10990, Currency: "eur", Status: "paid", Created: 1679090539, Updated: 1679090541}

// benchFingerprint is the fingerprint of idempg's and the Redis store's
// calls, computed once outside the timed loops, as in benchmarks/ (a handler
// computes it per request); the floors keep none.
var benchFingerprint = sync.OnceValue(func() string {
	fp, err := coordinator.Fingerprint(struct {
		Amount   int64  `json:"amount"`
		Currency string `json:"currency"`
		Customer string `json:"customer"`
		Source   string `json:"source"`
	}{10990, "eur", "cus_9s6XKzkNRiz8i3", "tok_visa"})
	if err != nil {
		panic(err)
	}
	return fp
})

// benchPGCall is the one place where the benchmarks build idempg and call
// it: it returns a call of idempg.DoResult through a coordinator with the
// default settings over a Store on pool (idempg.Do takes the coordinator,
// whose settings it follows, and whose store must be an idempg Store).
func benchPGCall(b testing.TB, pool *pgxpool.Pool) func(context.Context, coordinator.Call, func(context.Context, pgx.Tx) (benchPayment, error)) (coordinator.Result[benchPayment], error) {
	b.Helper()
	s, err := idempg.New(pool)
	if err != nil {
		b.Fatalf("idempg.New: %v", err)
	}
	c, err := coordinator.New(s)
	if err != nil {
		b.Fatalf("coordinator.New: %v", err)
	}
	b.Cleanup(func() { _ = c.Close() })
	return func(ctx context.Context, call coordinator.Call, action func(context.Context, pgx.Tx) (benchPayment, error)) (coordinator.Result[benchPayment], error) {
		return idempg.DoResult(ctx, c, call, action)
	}
}

// benchImpl is one impl: do makes one call with key and returns its result.
type benchImpl struct {
	name string
	skip string // why it cannot run; "" when it can
	do   func(ctx context.Context, key string) (benchPayment, error)
}

// benchEnv is what every sub-benchmark shares: a schema on the test server,
// the pool, the Redis server and the impls.
type benchEnv struct {
	pool   *pgxpool.Pool
	admin  *pgx.Conn // untraced, for pg_stat_activity
	trace  *benchTracer
	redis  *redis.Client // admin client, for FLUSHALL; nil without Redis
	rsent  *benchRedisHook
	impls  []benchImpl
	tables string // the tables to truncate
}

// newBenchEnv starts what the benchmarks need, or skips b when there is no
// PostgreSQL (fails with IDEMPOTENCY_TEST_REQUIRE_POSTGRES=1). Without a
// redis-server only impl=redis skips (and fails with that variable).
func newBenchEnv(b *testing.B) *benchEnv {
	b.Helper()
	env := &benchEnv{trace: &benchTracer{}, rsent: &benchRedisHook{}}
	env.pool = newBenchDB(b, benchConns, env.trace)
	env.tables = "idempotency_records, my_keys, ledger"
	admin, err := pgx.Connect(context.Background(), server.DSN)
	if err != nil {
		b.Fatalf("connect: %v", err)
	}
	b.Cleanup(func() { _ = admin.Close(context.Background()) })
	env.admin = admin

	doPG := benchPGCall(b, env.pool)
	fp := benchFingerprint()
	pool := env.pool
	env.impls = append(env.impls,
		benchImpl{name: "idempg", do: func(ctx context.Context, key string) (benchPayment, error) {
			res, err := doPG(ctx, coordinator.Call{Operation: benchOperation, Key: key, Fingerprint: fp},
				func(ctx context.Context, tx pgx.Tx) (benchPayment, error) {
					if err := insertLedger(ctx, tx, key, benchLedgerValue); err != nil {
						return benchPayment{}, err
					}
					return benchPaymentValue, nil
				})
			return res.Value, err
		}},
		benchImpl{name: "floor", do: func(ctx context.Context, key string) (benchPayment, error) {
			return floorDo(ctx, pool, key)
		}},
		benchImpl{name: "floor-read", do: func(ctx context.Context, key string) (benchPayment, error) {
			return floorReadDo(ctx, pool, key)
		}},
		env.redisImpl(b),
	)
	return env
}

// newBenchDB is newDB for benchmarks: a fresh schema on the test server,
// migrated, with the ledger and the floor's my_keys table, and a pool of
// maxConns connections whose search_path is that schema, traced by tr.
func newBenchDB(tb testing.TB, maxConns int32, tr *benchTracer) *pgxpool.Pool {
	tb.Helper()
	if server == nil {
		pgtest.Skip(tb, serverErr)
	}
	ctx := context.Background()
	schema := "b_" + strings.ToLower(rand.Text()[:12])
	admin, err := pgx.Connect(ctx, server.DSN)
	if err != nil {
		tb.Fatalf("connect: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		tb.Fatalf("create schema: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(server.DSN)
	if err != nil {
		tb.Fatalf("parse DSN: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.ConnConfig.Tracer = tr
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	if err := idempg.Migrate(ctx, pool); err != nil {
		tb.Fatalf("Migrate: %v", err)
	}
	for _, ddl := range []string{
		`CREATE TABLE ledger (key text NOT NULL, value text NOT NULL)`,
		// The floor's own table: the key, and the response once there is one.
		`CREATE TABLE my_keys (key text PRIMARY KEY, response bytea)`,
	} {
		if _, err := pool.Exec(ctx, ddl); err != nil {
			tb.Fatalf("%s: %v", ddl, err)
		}
	}
	return pool
}

// redisImpl returns impl=redis on a redis-server of its own, or the impl
// with skip set when there is none.
func (env *benchEnv) redisImpl(b *testing.B) benchImpl {
	b.Helper()
	impl := benchImpl{name: "redis"}
	in := redistest.Start(b)
	if in.Kind() != redistest.KindRedisServer {
		impl.skip = fmt.Sprintf("no redis-server (got %s): impl=redis measures real Redis; install redis-server", in.Kind())
		if pgtest.Required() {
			b.Fatalf("%s=1: %s", pgtest.RequireEnv, impl.skip)
		}
		return impl
	}
	env.redis = in.Client(b)
	opts := in.Options()
	opts.ContextTimeoutEnabled = true // as redisrepo asks, and idempotency.NewRedisClient sets
	opts.PoolSize = benchConns
	c := redis.NewClient(opts)
	c.AddHook(env.rsent)
	b.Cleanup(func() { _ = c.Close() })
	// What idempotency.NewStore builds with the default settings.
	store := redisrepo.New(c)
	if err := store.LoadScripts(context.Background()); err != nil {
		b.Fatal(err)
	}
	co, err := coordinator.New(store)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = co.Close() })
	fp := benchFingerprint()
	pool := env.pool
	impl.do = func(ctx context.Context, key string) (benchPayment, error) {
		res, err := coordinator.DoResult(ctx, co, coordinator.Call{Operation: benchOperation, Key: key, Fingerprint: fp},
			func(ctx context.Context) (benchPayment, error) {
				if _, err := pool.Exec(ctx, `INSERT INTO ledger (key, value) VALUES ($1, $2)`, key, benchLedgerValue); err != nil {
					return benchPayment{}, err
				}
				return benchPaymentValue, nil
			})
		return res.Value, err
	}
	return impl
}

// The floor's statements.
const (
	floorClaim    = `INSERT INTO my_keys (key, response) VALUES ($1, NULL) ON CONFLICT DO NOTHING RETURNING true`
	floorLedger   = `INSERT INTO ledger (key, value) VALUES ($1, $2)`
	floorComplete = `UPDATE my_keys SET response = $2 WHERE key = $1`
	floorRead     = `SELECT response FROM my_keys WHERE key = $1`
)

// floorDo is what a careful team writes without the library: claim the key
// with an uncommitted INSERT in a READ COMMITTED transaction; if it
// inserted, write the ledger row and the response and commit; if it did not
// (the key is taken: ON CONFLICT waited for a holder's transaction to end),
// read the response that committed. A holder that rolled back leaves no row,
// and then the INSERT inserts.
func floorDo(ctx context.Context, pool *pgxpool.Pool, key string) (benchPayment, error) {
	tx, err := pool.Begin(ctx) // READ COMMITTED, the server's default
	if err != nil {
		return benchPayment{}, err
	}
	defer func() { _ = tx.Rollback(ctx) }() // nothing after a commit
	var inserted bool
	err = tx.QueryRow(ctx, floorClaim, key).Scan(&inserted)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// Taken by a transaction that has committed: this statement sees
		// its row (READ COMMITTED takes a snapshot per statement).
		var resp []byte
		if err := tx.QueryRow(ctx, floorRead, key).Scan(&resp); err != nil {
			return benchPayment{}, fmt.Errorf("floor: read %s: %w", key, err)
		}
		if err := tx.Commit(ctx); err != nil {
			return benchPayment{}, err
		}
		return floorDecode(key, resp)
	case err != nil:
		return benchPayment{}, err
	}
	// The action and its result, in the claim's transaction.
	if _, err := tx.Exec(ctx, floorLedger, key, benchLedgerValue); err != nil {
		return benchPayment{}, err
	}
	p := benchPaymentValue
	data, err := json.Marshal(p)
	if err != nil {
		return benchPayment{}, err
	}
	if _, err := tx.Exec(ctx, floorComplete, key, data); err != nil {
		return benchPayment{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return benchPayment{}, err
	}
	return p, nil
}

// floorReadDo is floorDo after a plain read of the response, outside any
// transaction: a completed key is one statement.
func floorReadDo(ctx context.Context, pool *pgxpool.Pool, key string) (benchPayment, error) {
	var resp []byte
	err := pool.QueryRow(ctx, floorRead, key).Scan(&resp)
	switch {
	case err == nil && resp != nil:
		return floorDecode(key, resp)
	case err != nil && !errors.Is(err, pgx.ErrNoRows):
		return benchPayment{}, err
	}
	return floorDo(ctx, pool, key)
}

func floorDecode(key string, resp []byte) (benchPayment, error) {
	if resp == nil {
		// Never: a response is written in the claim's own transaction.
		return benchPayment{}, fmt.Errorf("floor: %s committed without a response", key)
	}
	var p benchPayment
	err := json.Unmarshal(resp, &p)
	return p, err
}

// A flow: run sets up (untimed), measures and checks one sub-benchmark.
type benchFlow struct {
	name string
	run  func(b *testing.B, env *benchEnv, impl benchImpl, callers int)
}

var benchFlows = []benchFlow{
	{"replay", benchReplay},
	{"first", benchFirst},
	{"contended", benchContended},
}

// benchReplay: the key was completed (by the impl itself, before the timed
// loop); every op repeats the call.
func benchReplay(b *testing.B, env *benchEnv, impl benchImpl, callers int) {
	ctx := context.Background()
	env.reset(b, impl)
	key := newBenchKeys().key(0)
	if _, err := impl.do(ctx, key); err != nil {
		b.Fatalf("the first call: %v", err)
	}
	env.measure(b, callers, func(int) error {
		return benchCheck(impl.do(ctx, key))
	})
	env.checkLedger(b, 1)
}

// benchFirst: a fresh key per op.
func benchFirst(b *testing.B, env *benchEnv, impl benchImpl, callers int) {
	ctx := context.Background()
	env.reset(b, impl)
	keys := newBenchKeys().keys(b.N)
	env.measure(b, callers, func(i int) error {
		return benchCheck(impl.do(ctx, keys[i]))
	})
	env.checkLedger(b, b.N)
}

// benchContended: op i calls with key i/benchGroup, a fresh key per group of
// benchGroup ops. Concurrent callers take consecutive ops at once, so a
// group's calls meet on their key: one claims it and runs, the others wait
// for it and replay.
func benchContended(b *testing.B, env *benchEnv, impl benchImpl, callers int) {
	ctx := context.Background()
	env.reset(b, impl)
	keys := newBenchKeys().keys((b.N + benchGroup - 1) / benchGroup)
	env.measure(b, callers, func(i int) error {
		return benchCheck(impl.do(ctx, keys[i/benchGroup]))
	})
	env.checkLedger(b, len(keys))
}

func benchCheck(p benchPayment, err error) error {
	switch {
	case err != nil:
		return err
	case p != benchPaymentValue:
		return fmt.Errorf("got %+v, want %+v", p, benchPaymentValue)
	}
	return nil
}

// reset empties the tables and Redis, warms every connection up with impl
// (a first run and a replay on each of benchConns callers at once), and
// empties them again. It is not timed.
func (env *benchEnv) reset(b *testing.B, impl benchImpl) {
	b.Helper()
	b.StopTimer()
	env.empty(b)
	ctx := context.Background()
	keys := newBenchKeys()
	var wg sync.WaitGroup
	errs := make(chan error, benchConns)
	for i := range benchConns {
		wg.Go(func() {
			for range 2 {
				if err := benchCheck(impl.do(ctx, keys.key(i))); err != nil {
					errs <- fmt.Errorf("warm-up: %w", err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	env.empty(b)
	b.StartTimer()
}

func (env *benchEnv) empty(b *testing.B) {
	b.Helper()
	ctx := context.Background()
	if _, err := env.pool.Exec(ctx, "TRUNCATE "+env.tables); err != nil {
		b.Fatalf("truncate: %v", err)
	}
	if env.redis != nil {
		if err := env.redis.FlushAll(ctx).Err(); err != nil {
			b.Fatalf("FLUSHALL: %v", err)
		}
	}
}

// checkLedger fails b unless the ledger holds want rows, of want keys: each
// key's action ran exactly once.
func (env *benchEnv) checkLedger(b *testing.B, want int) {
	b.Helper()
	var rows, keys int
	if err := env.pool.QueryRow(context.Background(), "SELECT count(*), count(DISTINCT key) FROM ledger").Scan(&rows, &keys); err != nil {
		b.Fatalf("count the ledger: %v", err)
	}
	if rows != want || keys != want {
		b.Fatalf("the ledger holds %d rows of %d keys, want %d of %d", rows, keys, want, want)
	}
}

// measure runs op b.N times, with i from 0 to b.N-1: on this goroutine with
// one caller, else on callers goroutines at once (RunParallel, as in
// benchmarks/). It reports allocations and, per op: pg-rt (round trips to
// PostgreSQL: statements and batches) and pg-stmts (statements, a batch's
// each counted), client-cpu-µs (this process's CPU: the callers, pgx,
// go-redis, the GC), pg-cpu-µs (the PostgreSQL server processes' CPU) and,
// when Redis was used, redis-rt (commands and pipelines) and redis-cpu-µs
// (INFO cpu). All are taken outside the timed loop. The CPU figures are of
// this machine's clock, so a machine busy with other work inflates them
// less than ns/op but does not leave them alone (cache, frequency).
func (env *benchEnv) measure(b *testing.B, callers int, op func(i int) error) {
	b.Helper()
	b.ReportAllocs()
	before := env.snapshot(b)
	b.ResetTimer()
	if callers == 1 {
		for i := range b.N {
			if err := op(i); err != nil {
				b.Fatal(err)
			}
		}
	} else {
		b.SetParallelism((callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
		var next atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := op(int(next.Add(1) - 1)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	b.StopTimer()
	if b.N == 0 {
		return
	}
	after := env.snapshot(b)
	n := float64(b.N)
	b.ReportMetric(float64(after.pgRT-before.pgRT)/n, "pg-rt/op")
	b.ReportMetric(float64(after.pgStmts-before.pgStmts)/n, "pg-stmts/op")
	b.ReportMetric(float64(after.client-before.client)/float64(time.Microsecond)/n, "client-cpu-µs/op")
	if pg, ok := after.pgCPU(before); ok {
		b.ReportMetric(float64(pg)/float64(time.Microsecond)/n, "pg-cpu-µs/op")
	}
	if r := after.redisRT - before.redisRT; r > 0 {
		b.ReportMetric(float64(r)/n, "redis-rt/op")
		b.ReportMetric(float64(after.redisCPU-before.redisCPU)/float64(time.Microsecond)/n, "redis-cpu-µs/op")
	}
}

// benchSnapshot is what measure compares before and after the timed loop.
type benchSnapshot struct {
	pgRT, pgStmts, redisRT int64
	client                 time.Duration           // this process's CPU, user and system
	pg                     map[int32]time.Duration // CPU of each PostgreSQL process, by pid
	redisCPU               time.Duration           // INFO cpu: used_cpu_user + used_cpu_sys
}

func (env *benchEnv) snapshot(b *testing.B) benchSnapshot {
	b.Helper()
	s := benchSnapshot{
		pgRT:    env.trace.queries.Load() + env.trace.batches.Load(),
		pgStmts: env.trace.queries.Load() + env.trace.batchQueries.Load(),
		redisRT: env.rsent.n.Load(),
		client:  processCPU(b),
		pg:      env.serverCPU(b),
	}
	if env.redis != nil {
		info, err := env.redis.Info(context.Background(), "cpu").Result()
		if err != nil {
			b.Fatalf("INFO cpu: %v", err)
		}
		for line := range strings.Lines(info) {
			name, val, _ := strings.Cut(strings.TrimSpace(line), ":")
			if name == "used_cpu_user" || name == "used_cpu_sys" {
				f, err := strconv.ParseFloat(val, 64)
				if err != nil {
					b.Fatalf("INFO cpu: %q: %v", line, err)
				}
				s.redisCPU += time.Duration(f * float64(time.Second))
			}
		}
	}
	return s
}

// pgCPU returns the PostgreSQL processes' CPU between before and s, over
// the processes in both (the pool's backends live through a sub-benchmark);
// false when /proc told nothing.
func (s benchSnapshot) pgCPU(before benchSnapshot) (time.Duration, bool) {
	var sum time.Duration
	ok := false
	for pid, t := range s.pg {
		if t0, in := before.pg[pid]; in {
			sum += t - t0
			ok = true
		}
	}
	return sum, ok
}

// processCPU returns this process's CPU time, user and system.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serverCPU returns the CPU time of each process of the PostgreSQL server
// that pg_stat_activity lists (the backends and the background processes),
// from /proc/<pid>/schedstat (nanoseconds); an empty map off Linux.
func (env *benchEnv) serverCPU(b *testing.B) map[int32]time.Duration {
	b.Helper()
	rows, _ := env.admin.Query(context.Background(), "SELECT pid FROM pg_stat_activity")
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		b.Fatalf("pg_stat_activity: %v", err)
	}
	m := make(map[int32]time.Duration, len(pids))
	for _, pid := range pids {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
		if err != nil {
			continue // gone, or not Linux
		}
		f := strings.Fields(string(data))
		if len(f) == 0 {
			continue
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		m[pid] = time.Duration(ns)
	}
	return m
}

// benchKeys makes idempotency keys of 36 characters (a UUID's length),
// unique to the generator, as benchmarks/ does.
type benchKeys struct{ run string }

func newBenchKeys() benchKeys {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return benchKeys{run: hex.EncodeToString(b[:])}
}

func (g benchKeys) key(i int) string { return g.run + "-" + fmt.Sprintf("%027d", i) }

func (g benchKeys) keys(n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = g.key(i)
	}
	return ks
}

// benchTracer counts what the benchmarks' pool sends: a statement (Exec,
// Query, QueryRow; BEGIN, COMMIT and ROLLBACK are Execs) or a batch is a
// round trip, and a batch's statements are statements. It does not see
// pgx's preparation of a statement on a connection's first use of it (the
// warm-up does those) nor the pool's liveness pings. The snapshots' own
// query goes through another connection (benchEnv.admin).
type benchTracer struct{ queries, batches, batchQueries atomic.Int64 }

func (t *benchTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	t.queries.Add(1)
	return ctx
}

func (t *benchTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (t *benchTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	t.batches.Add(1)
	return ctx
}

func (t *benchTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	t.batchQueries.Add(1)
}

func (t *benchTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// benchRedisHook counts the round trips of impl=redis's client: a command
// or a pipeline each.
type benchRedisHook struct{ n atomic.Int64 }

func (h *benchRedisHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *benchRedisHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h *benchRedisHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}
