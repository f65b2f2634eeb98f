package benchmarks

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

func TestMain(m *testing.M) {
	os.Exit(redistest.Main(m).Run())
}

// Payment is the result type of every flow: a realistic JSON result, 109
// bytes encoded. Both impls encode and decode it with encoding/json.
type Payment struct {
	ID       string `json:"id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Status   string `json:"status"`
	Created  int64  `json:"created"`
	Updated  int64  `json:"updated"`
}

// payment is the result every action returns.
var payment = Payment{ID: "pay_1MmlLr", Amount: 10990, Currency: "eur", Status: "paid", Created: 1679090539, Updated: 1679090541}

// request is what a client would POST; its fingerprint goes in every
// idemkit call, as a real HTTP handler would set it.
type request struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Customer string `json:"customer"`
	Source   string `json:"source"`
}

const (
	operation = "payment.charge"
	// lease and ttl are the coordinator's defaults, which the raw impl uses
	// too.
	lease = coordinator.DefaultLease
	ttl   = coordinator.DefaultTTL
	// callers and pipes are the settings of the flows that run with many
	// callers and both go-redis modes.
	pipeOff  = "off"
	pipeAuto = "auto"
)

var (
	callerCounts = []int{1, 64}
	pipes        = []string{pipeOff, pipeAuto}
)

// fingerprint is the request's fingerprint. It is computed once, outside the
// timed loops: a handler computes it per request, but that cost is the
// handler's choice of what to fingerprint, not the store's, and the raw impl
// has no fingerprint at all.
var fingerprint = sync.OnceValue(func() string {
	fp, err := coordinator.Fingerprint(request{Amount: 10990, Currency: "eur", Customer: "cus_9s6XKzkNRiz8i3", Source: "tok_visa"})
	if err != nil {
		panic(err)
	}
	return fp
})

// rawToken is the raw impl's pending value. It is one constant: the least a
// raw check needs is a value that says "taken"; idemkit draws a 128-bit
// random token per call, which is part of what it costs.
const rawToken = "9f86d081884c7d659a2feaa0c55ad015"

// errRan is returned by an action that must not run.
var errRan = errors.New("benchmarks: the action ran")

func neverRun(context.Context) (Payment, error) { return Payment{}, errRan }

func runAction(context.Context) (Payment, error) { return payment, nil }

// admin returns a client of the benchmarks' redis-server, for FLUSHALL and
// INFO, or skips b when there is no redis-server to start.
func admin(b *testing.B) *redis.Client {
	b.Helper()
	switch kind := redistest.ServerKind(b); kind {
	case redistest.KindRedisServer:
	case redistest.KindMiniredis:
		b.Skip("benchmarks: no redis-server on PATH: these benchmarks measure real Redis (latency, CPU, memory), " +
			"which miniredis cannot stand in for; install redis-server (Redis 7) to run them")
	default:
		b.Skipf("benchmarks: %s names a server of yours; these benchmarks flush their server (FLUSHALL) "+
			"and read its statistics, so they run only on the redis-server they start: unset it", redistest.EnvURL)
	}
	return redistest.Server(b)
}

// client returns a new client of the benchmarks' server, closed when b
// ends, with ContextTimeoutEnabled as redisrepo asks (and as
// idempotency.NewRedisClient sets); otherwise go-redis's defaults. It counts
// the commands it sends in sent.
func client(b *testing.B) *redis.Client {
	b.Helper()
	opts := redistest.ServerOptions(b)
	opts.ContextTimeoutEnabled = true
	c := redis.NewClient(opts)
	c.AddHook(&sent)
	b.Cleanup(func() { _ = c.Close() })
	return c
}

func flush(b *testing.B, admin *redis.Client) {
	b.Helper()
	if err := admin.FlushAll(context.Background()).Err(); err != nil {
		b.Fatal(err)
	}
}

// side is one go-redis mode (pipe off or auto) of the benchmarks: the
// commands of the raw impl, and a coordinator with a redisrepo store for
// idemkit.
type side struct {
	pipe  string
	cmd   redis.UniversalClient // *redis.Client, or its *redis.AutoPipeliner
	names *redisrepo.Store      // names keys as the store does, for the raw impl
	co    *coordinator.Coordinator
}

// newSide returns a side on a new client of its own. The coordinator has the
// default settings and opts. With pipe auto, raw sends through the client's
// AutoPipeliner, and idemkit's store through what the fx module gives it
// with IDEMPOTENCY_REDIS_AUTO_PIPELINE (idempotency.NewStoreClient), so that
// the figures are the module's users', the storage timeout kept.
func newSide(b *testing.B, pipe string, opts ...coordinator.Option) *side {
	b.Helper()
	c := client(b)
	s := &side{pipe: pipe, cmd: c, names: redisrepo.New(c)}
	var rc redisrepo.Client = c
	if pipe == pipeAuto {
		ap, err := c.AutoPipeline()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = ap.Close() })
		s.cmd = ap
		st := idempotency.DefaultSettings()
		st.RedisAutoPipeline = true
		if rc, err = idempotency.NewStoreClient(st, c); err != nil {
			b.Fatal(err)
		}
	}
	store := redisrepo.New(rc)
	if err := store.LoadScripts(context.Background()); err != nil {
		b.Fatal(err)
	}
	co, err := coordinator.New(store, opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = co.Close() })
	s.co = co
	return s
}

// coordinator returns the side's coordinator.
func (s *side) coordinator(b *testing.B) *coordinator.Coordinator {
	b.Helper()
	return s.co
}

// rawKey returns the Redis key that the store would use for key, so that both
// impls write keys of the same shape.
func (s *side) rawKey(key string) string {
	return s.names.Key(idemstore.Key{Operation: operation, Key: key})
}

// keyGen makes idempotency keys of 36 characters (the length of a UUID),
// unique to the generator.
type keyGen struct{ run string }

func newKeyGen() keyGen {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return keyGen{run: hex.EncodeToString(b[:])}
}

func (g keyGen) key(i int) string {
	return g.run + "-" + fmt.Sprintf("%027d", i)
}

// keys returns n new keys.
func (g keyGen) keys(n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = g.key(i)
	}
	return ks
}

// parallelism returns the argument of b.SetParallelism that makes
// RunParallel run at least callers goroutines: callers on 2 cores for 64.
func parallelism(callers int) int {
	p := runtime.GOMAXPROCS(0)
	return (callers + p - 1) / p
}

// measure runs op b.N times, with i from 0 to b.N-1: on this goroutine when
// callers is 1, else on callers goroutines at once (RunParallel). It turns
// allocation reporting on and reports the server's work per op (see
// serverStats). Setup before measure is not timed.
func measure(b *testing.B, admin *redis.Client, callers int, op func(i int) error) {
	b.Helper()
	b.ReportAllocs()
	before := serverStats(b, admin)
	b.ResetTimer()
	if callers == 1 {
		for i := range b.N {
			if err := op(i); err != nil {
				b.Fatal(err)
			}
		}
	} else {
		b.SetParallelism(parallelism(callers))
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
	after := serverStats(b, admin)
	after.report(b, before)
}

// stats is what INFO commandstats and INFO cpu say, and what the clients
// sent.
type stats struct {
	usec  map[string]int64 // microseconds per command
	calls map[string]int64
	cpu   float64          // used_cpu_sys + used_cpu_user, seconds
	sent  map[string]int64 // commands the benchmarks' clients sent
}

func serverStats(b *testing.B, admin *redis.Client) stats {
	b.Helper()
	info, err := admin.Info(context.Background(), "commandstats", "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	st, err := parseStats(info)
	if err != nil {
		b.Fatal(err)
	}
	st.sent = sent.snapshot()
	return st
}

// sent counts the commands that the benchmarks' clients send, by name: a
// go-redis hook, which costs both impls the same and allocates nothing.
var sent counter

type counter struct {
	mu sync.Mutex                               // for adding a name
	m  atomic.Pointer[map[string]*atomic.Int64] // copied on write
}

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.add(cmd)
		return next(ctx, cmd)
	}
}

func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.add(cmd)
		}
		return next(ctx, cmds)
	}
}

// add counts cmd under its lower-case name. The map is keyed by the name as
// sent too, so that counting a known name never converts it.
func (c *counter) add(cmd redis.Cmder) {
	args := cmd.Args()
	if len(args) == 0 {
		return
	}
	name, _ := args[0].(string)
	if m := c.m.Load(); m != nil {
		if n := (*m)[name]; n != nil {
			n.Add(1)
			return
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	m := map[string]*atomic.Int64{}
	if old := c.m.Load(); old != nil {
		maps.Copy(m, *old)
	}
	n := m[strings.ToLower(name)]
	if n == nil {
		n = new(atomic.Int64)
		m[strings.ToLower(name)] = n
	}
	m[name] = n
	c.m.Store(&m)
	n.Add(1)
}

// snapshot returns the counts by lower-case name.
func (c *counter) snapshot() map[string]int64 {
	out := map[string]int64{}
	if m := c.m.Load(); m != nil {
		for name, n := range *m {
			if name == strings.ToLower(name) {
				out[name] = n.Load()
			}
		}
	}
	return out
}

func parseStats(info string) (stats, error) {
	st := stats{usec: map[string]int64{}, calls: map[string]int64{}}
	for line := range strings.Lines(info) {
		line = strings.TrimSpace(line)
		name, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch {
		case strings.HasPrefix(name, "cmdstat_"):
			cmd := strings.TrimPrefix(name, "cmdstat_")
			for f := range strings.SplitSeq(val, ",") {
				k, v, _ := strings.Cut(f, "=")
				if k != "calls" && k != "usec" {
					continue
				}
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return stats{}, fmt.Errorf("INFO commandstats: %q: %w", line, err)
				}
				if k == "calls" {
					st.calls[cmd] = n
				} else {
					st.usec[cmd] = n
				}
			}
		case name == "used_cpu_sys" || name == "used_cpu_user":
			f, err := strconv.ParseFloat(val, 64)
			if err != nil {
				return stats{}, fmt.Errorf("INFO cpu: %q: %w", line, err)
			}
			st.cpu += f
		}
	}
	return st, nil
}

// commandUsec returns the command time between before and st, in
// microseconds, without INFO (ours). Redis counts a command that a Lua script
// runs twice: in its own line and in the script's (EVAL, EVALSHA, FCALL).
// So when scripts ran, a command that scripts may run counts only in the
// share that the clients sent themselves (sent / calls: the calls from
// scripts are taken to cost what the others cost).
func (st stats) commandUsec(before stats) int64 {
	scripted := false
	for cmd, n := range st.calls {
		if isScript(cmd) && n > before.calls[cmd] {
			scripted = true
		}
	}
	var sum int64
	for cmd, us := range st.usec {
		us -= before.usec[cmd]
		switch calls := st.calls[cmd] - before.calls[cmd]; {
		case cmd == "info" || calls <= 0:
		case !scripted || isScript(cmd) || !scriptable(cmd):
			sum += us
		default:
			own := min(st.sent[cmd]-before.sent[cmd], calls)
			sum += us * own / calls
		}
	}
	return sum
}

func isScript(cmd string) bool {
	return strings.HasPrefix(cmd, "eval") || strings.HasPrefix(cmd, "fcall")
}

// scriptable reports whether a script may run cmd: not the connection's
// own commands (HELLO, CLIENT ...) and subscriptions, which go-redis sends
// without hooks.
func scriptable(cmd string) bool {
	switch cmd {
	case "hello", "auth", "subscribe", "unsubscribe", "psubscribe", "punsubscribe", "ssubscribe", "sunsubscribe":
		return false
	}
	return !strings.HasPrefix(cmd, "client|") && !strings.HasPrefix(cmd, "script|")
}

// report reports redis-µs/op (command time, INFO commandstats) and
// redis-cpu-µs/op (the server process's CPU, INFO cpu: command time plus
// reading requests and writing replies) since before.
func (st stats) report(b *testing.B, before stats) {
	if b.N == 0 {
		return
	}
	b.ReportMetric(float64(st.commandUsec(before))/float64(b.N), "redis-µs/op")
	b.ReportMetric((st.cpu-before.cpu)*1e6/float64(b.N), "redis-cpu-µs/op")
}

// usedMemory returns INFO memory's used_memory.
func usedMemory(b *testing.B, admin *redis.Client) int64 {
	b.Helper()
	info, err := admin.Info(context.Background(), "memory").Result()
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatalf("no used_memory in INFO memory: %q", info)
	return 0
}

// percentile returns the p-th percentile (0 < p <= 1, nearest rank) of ds,
// which it sorts.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	i := int(math.Ceil(p*float64(len(ds)))) - 1
	return ds[max(i, 0)]
}
