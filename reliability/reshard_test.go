//go:build linux

package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	zapobserver "go.uber.org/zap/zaptest/observer"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// Resharding a Redis Cluster under traffic (issue 34). While the CLI moves
// slots (reshard, add-node + rebalance, reshard away + del-node), the nodes
// answer MOVED (a stale slot map), ASK (a slot in migration), TRYAGAIN and
// CLUSTERDOWN (a slot handed over), and a removed node refuses connections.
// None of that is an outage: every store call must ride through it within
// its storage timeout. Before the fix (go-redis's redirect loop of three
// tries, the raw path's one re-send), storms logged storage errors for these
// replies, and with IDEMPOTENCY_ON_STORAGE_ERROR=run keys ran twice.

// reshardStorm sizes a reshard storm.
type reshardStorm struct {
	callers int
	keys    int           // key space; Zipf-drawn, so a few keys are hot
	warmup  time.Duration // traffic before the first operation
	after   time.Duration // traffic after the last
	rounds  int           // how many times the three operations run
	slots   int           // slots of the first reshard
}

func reshardConfig(lv level) reshardStorm {
	c := reshardStorm{callers: 32, keys: 1000, warmup: 500 * time.Millisecond, after: 500 * time.Millisecond, rounds: 1, slots: 1000}
	if lv == levelFull {
		c.warmup, c.after, c.rounds, c.slots = 2*time.Second, 2*time.Second, 3, 3000
	}
	return c
}

// TestReshardUnderTraffic runs two coordinators, on two clients built as
// idempotency.NewRedisClient builds them, with the module's circuit breaker
// (one of them auto-pipelined, as IDEMPOTENCY_REDIS_AUTO_PIPELINE), that
// share keys, while the cluster is
// resharded, grown and shrunk. It counts every run of every key, a run
// under the storage-error fallback included, and every storage error the
// coordinators report: a resharding must cost none.
func TestReshardUnderTraffic(t *testing.T) {
	lv := suiteLevel(t)
	// The short suite runs the default mode (a resharding is some 20s under
	// -race, mostly redis-cli's); the full one both.
	modes := []coordinator.OnStorageErrorMode{coordinator.OnStorageErrorRun}
	if lv == levelFull {
		modes = append(modes, coordinator.OnStorageErrorRaise)
	}
	for _, mode := range modes {
		t.Run("onerror="+mode.String(), func(t *testing.T) {
			runReshardStorm(t, lv, mode)
		})
	}
}

// reshardObserver counts the coordinators' storage errors and unprotected
// runs, and keeps a few of the errors.
type reshardObserver struct {
	errors      atomic.Int64
	unprotected atomic.Int64
	mu          sync.Mutex
	samples     map[string]int // by error type and message, with the port numbers masked
	at          []time.Time    // when each storage error was reported
}

// as returns an observer that counts into o and labels its samples with
// name, the coordinator's.
func (o *reshardObserver) as(name string) idemevent.Observer {
	return idemevent.ObserverFunc(func(ctx context.Context, e idemevent.Event) { o.observe(name, e) })
}

func (o *reshardObserver) observe(name string, e idemevent.Event) {
	switch {
	case e.Kind == idemevent.Unprotected:
		o.unprotected.Add(1)
	case e.Kind == idemevent.Error && strings.HasPrefix(string(e.ErrorType), "storage_"):
		o.errors.Add(1)
		msg := name + " " + string(e.ErrorType) + ": " + maskNumbers(fmt.Sprint(e.Err))
		o.mu.Lock()
		o.samples[msg]++
		o.at = append(o.at, time.Now())
		o.mu.Unlock()
	}
}

// maskNumbers replaces the digits of s by "N", so that errors that differ
// only in a slot or a port count as one.
func maskNumbers(s string) string {
	var b strings.Builder
	digits := false
	for _, r := range s {
		if r >= '0' && r <= '9' {
			if !digits {
				b.WriteByte('N')
			}
			digits = true
			continue
		}
		digits = false
		b.WriteRune(r)
	}
	return b.String()
}

func runReshardStorm(t *testing.T, lv level, mode coordinator.OnStorageErrorMode) {
	cfg := reshardConfig(lv)
	cl := redistest.NewCluster(t, 3)
	prefix := "reshard:" + strconv.FormatUint(rand.Uint64()%1e9, 36) + ":"
	obs := &reshardObserver{samples: map[string]int{}}

	// Every change of a breaker's state is logged: a resharding must open
	// none (finding 8), not even a removed node's.
	breakerCore, breakerLogs := zapobserver.New(zap.WarnLevel)
	breakerLog := zap.New(breakerCore)
	var coords []*coordinator.Coordinator
	trace := &nodeTrace{}
	for i := range 2 {
		s := idempotency.DefaultSettings()
		s.RedisClusterAddrs = cl.Addrs()
		s.RedisAutoPipeline = i == 1
		client, err := idempotency.NewRedisClient(s)
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		trace.attach([]string{"plain", "auto-pipelined"}[i], client.(*redis.ClusterClient))
		// The module's circuit breaker, as Module adds it: a node removed
		// from the cluster opens its breaker, and that must not fail
		// calls either.
		if err := idempotency.AddBreaker(client, s, breakerLog); err != nil {
			t.Fatal(err)
		}
		sc, err := idempotency.NewStoreClient(s, client)
		if err != nil {
			t.Fatal(err)
		}
		c, err := coordinator.New(redisrepo.New(sc, redisrepo.WithKeyPrefix(prefix)),
			coordinator.WithStorageTimeout(s.StorageTimeout), coordinator.WithOnStorageError(mode), coordinator.WithObserver(obs.as([]string{"plain", "auto-pipelined"}[i])))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		coords = append(coords, c)
	}

	var (
		mu      sync.Mutex
		runs    = map[string]int{}                 // by key: every run of its action
		values  = map[string]map[string]struct{}{} // by key: the values its calls got
		calls   atomic.Int64
		refused atomic.Int64 // calls that got ErrStorage
		other   atomic.Int64 // calls that got any other error
		errs    = map[string]int{}
	)
	probe := startStallProbe(ownNodes(cl))
	steal := stealTicks()
	var windows []stallWindow
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var once sync.Once
	end := func() { once.Do(func() { close(stop); wg.Wait(); windows = probe.end() }) }
	defer end() // a failed operation ends the test: stop the callers first
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	for i := range cfg.callers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(i)))
			z := rand.NewZipf(r, 1.1, 1, uint64(cfg.keys-1))
			c := coords[i%len(coords)]
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				key := "k" + strconv.FormatUint(z.Uint64(), 10)
				own := key + "/" + strconv.Itoa(i) + "/" + strconv.Itoa(n)
				v, err := coordinator.Do(context.Background(), c, coordinator.Call{Operation: "reshard", Key: key},
					func(ctx context.Context) (string, error) {
						mu.Lock()
						runs[key]++
						mu.Unlock()
						if d := time.Duration(r.IntN(3)) * time.Millisecond; d > 0 {
							time.Sleep(d)
						}
						return own, nil
					})
				calls.Add(1)
				switch {
				case errors.Is(err, coordinator.ErrStorage):
					refused.Add(1)
				case err != nil:
					other.Add(1)
					mu.Lock()
					errs[maskNumbers(err.Error())]++
					mu.Unlock()
				default:
					mu.Lock()
					if values[key] == nil {
						values[key] = map[string]struct{}{}
					}
					values[key][v] = struct{}{}
					mu.Unlock()
				}
			}
		})
	}

	start := time.Now()
	var phases []phase // the resharding's steps, for a failure's log
	step := func(name string, from time.Time) {
		phases = append(phases, phase{name: name, from: from, to: time.Now()})
		t.Logf("%s took %v", name, time.Since(from).Round(time.Millisecond))
	}
	time.Sleep(cfg.warmup)
	for round := range cfg.rounds {
		nodes := cl.Nodes()
		a, b := nodes[0], nodes[1]
		t0 := time.Now()
		cl.Reshard(t, a, b, min(cfg.slots, cl.Slots(t, a)))
		step(fmt.Sprintf("round %d: reshard of %d slots %s -> %s", round, cfg.slots, a.Addr(), b.Addr()), t0)
		t0 = time.Now()
		added := cl.AddMaster(t)
		cl.Rebalance(t)
		step(fmt.Sprintf("round %d: add-node %s + rebalance (%d slots on it)", round, added.Addr(), cl.Slots(t, added)), t0)
		t0 = time.Now()
		victim := cl.Nodes()[0] // an original master: the first round removes one of the create's
		to := cl.Nodes()[1]
		cl.Remove(t, victim, to)
		step(fmt.Sprintf("round %d: reshard away to %s + del-node of %s", round, to.Addr(), victim.Addr()), t0)
		// The removed node lives on for a while, reset: a client that
		// still knows it may ask it, and then it is shut down.
		time.Sleep(time.Second)
		cl.Kill(victim)
	}
	time.Sleep(cfg.after)
	end()
	took := time.Since(start)

	twice, extra := 0, 0
	var sample []string
	for key, n := range runs {
		if n > 1 {
			twice++
			extra += n - 1
			if len(sample) < 5 {
				sample = append(sample, fmt.Sprintf("%s ran %d times", key, n))
			}
		}
	}
	wrong := 0 // values beyond each key's one
	for _, vs := range values {
		wrong += len(vs) - 1
	}
	t.Logf("%d calls on %d keys in %v (%d nodes at the end); %d keys ran twice or more; %d storage errors reported, %d unprotected runs; %d calls refused (ErrStorage), %d other errors, %d extra values",
		calls.Load(), len(runs), took.Round(time.Millisecond), len(cl.Nodes()), twice, obs.errors.Load(), obs.unprotected.Load(), refused.Load(), other.Load(), wrong)
	t.Logf("longest unanswered ping of each node, and longest late heartbeat of this process (every %v): %s; %s; %s", stallProbeEvery, longestStalls(windows), longestGCPause(), stolenSince(steal))
	for msg, n := range obs.samples {
		t.Logf("  %5d × %s", n, msg)
	}
	if len(obs.at) > 0 {
		t.Logf("  storage errors reported from %v to %v after the traffic began",
			obs.at[0].Sub(start).Round(time.Millisecond), obs.at[len(obs.at)-1].Sub(start).Round(time.Millisecond))
	}
	for msg, n := range errs {
		t.Logf("  %5d × call error %s", n, msg)
	}
	for _, e := range breakerLogs.All() {
		t.Errorf("a breaker changed during the resharding: %s %v", e.Message, e.ContextMap())
	}
	// A storage error is the resharding's unless a node, or this process,
	// answered no ping for half the storage timeout around it: then it met
	// an outage, and the storage-error mode governs what follows (finding 10
	// in docs/reliability.md). Only then may a key run unprotected, again,
	// or answer another value, and only once for each such error.
	var excused []stallWindow
	defaultTimeout := idempotency.DefaultSettings().StorageTimeout
	for _, at := range obs.at {
		if w, ok := stalledDuring(windows, at, defaultTimeout); ok {
			excused = append(excused, w)
		}
	}
	if n := len(obs.at) - len(excused); n > 0 {
		t.Errorf("%d storage errors reported during the resharding while every node answered its pings: want none", n)
		logAround(t, start, phases, windows, trace, obs.at[0].Add(-defaultTimeout-500*time.Millisecond), obs.at[len(obs.at)-1].Add(200*time.Millisecond))
	}
	if len(excused) > 0 {
		t.Logf("%d storage errors met a node or this process that answered no ping for half the storage timeout or more: an outage, not the resharding's (e.g. %v)", len(excused), excused[0])
	}
	allowed := int64(len(excused))
	if int64(extra) > obs.unprotected.Load() {
		t.Errorf("%d keys ran more than once, %d extra runs beyond the %d unprotected ones, e.g. %v", twice, int64(extra)-obs.unprotected.Load(), obs.unprotected.Load(), sample)
	}
	if n := obs.unprotected.Load(); n > allowed {
		t.Errorf("%d actions ran unprotected, %d beyond the storage errors an outage explains", n, n-allowed)
	}
	if n := refused.Load(); n > allowed {
		t.Errorf("%d calls refused with ErrStorage, %d beyond the storage errors an outage explains", n, n-allowed)
	}
	if n := other.Load(); n > 0 {
		t.Errorf("%d calls failed with another error", n)
	}
	if int64(wrong) > obs.unprotected.Load() {
		t.Errorf("%d values beyond each key's one, %d beyond the unprotected runs", wrong, int64(wrong)-obs.unprotected.Load())
	}
	if calls.Load() < int64(cfg.callers) {
		t.Errorf("only %d calls", calls.Load())
	}
}
