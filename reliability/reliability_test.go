//go:build linux

package reliability_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/faultproxy"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// standaloneBackend is a redis-server of the test's own, behind the fault
// proxy when the fault needs it.
type standaloneBackend struct {
	in    *redistest.Instance
	proxy *faultproxy.Proxy
	// pipelined builds the storm's client as IDEMPOTENCY_REDIS_AUTO_PIPELINE
	// does (see newClient).
	pipelined bool
}

func (b *standaloneBackend) client(t *testing.T) redis.UniversalClient {
	addr := b.in.Addr()
	if b.proxy != nil {
		addr = b.proxy.Addr()
	}
	return newClient(t, []string{addr}, false, b.pipelined)
}

func (b *standaloneBackend) direct(t *testing.T) redis.UniversalClient {
	return newClient(t, []string{b.in.Addr()}, false, false)
}

// clusterBackend is a cluster of three masters with a replica each.
type clusterBackend struct{ c *testCluster }

func (b *clusterBackend) client(t *testing.T) redis.UniversalClient {
	return newClient(t, b.c.addrs(), true, false)
}

func (b *clusterBackend) direct(t *testing.T) redis.UniversalClient { return b.client(t) }

// startStandalone starts a redis-server for t alone (a fault changes it),
// with the proxy in front of it when withProxy.
func startStandalone(t *testing.T, withProxy bool) (*standaloneBackend, *faultEnv) {
	t.Helper()
	in := redistest.Start(t)
	if in.Kind() != redistest.KindRedisServer {
		t.Skip("the reliability suite needs redis-server: kill -9, SIGSTOP and DEBUG SLEEP are not miniredis's")
	}
	b := &standaloneBackend{in: in}
	if withProxy {
		p, err := faultproxy.Start(in.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		b.proxy = p
	}
	admin := redis.NewClient(&redis.Options{Addr: in.Addr(), ReadTimeout: 5 * time.Second})
	t.Cleanup(func() { _ = admin.Close() })
	return b, &faultEnv{in: in, admin: admin, proxy: b.proxy}
}

// startClusterBackend starts a cluster for t alone.
func startClusterBackend(t *testing.T) (*clusterBackend, *faultEnv) {
	t.Helper()
	c := startCluster(t)
	return &clusterBackend{c: c}, &faultEnv{cluster: c}
}

// check runs sc against b and fails t on every finding of the checker.
func check(t *testing.T, lv level, sc scenario, b backend, env *faultEnv) *outcome {
	t.Helper()
	o := runStorm(t, lv, sc, b, env)
	logOutcome(t, sc, o)
	if u := o.r.unproven(); u != "" {
		t.Log(u)
	}
	fails := o.r.failures()
	if sc.fenced {
		fails = append(fails, checkFences(o.h)...)
	}
	for i, f := range fails {
		if i == 20 {
			t.Errorf("... and %d more", len(fails)-i)
			break
		}
		t.Error(f)
	}
	// A quiet fault allows no store failure but timeouts: with a 100ms
	// storage timeout, 64 callers and -race on two cores, the scheduler
	// alone can make a call miss it now and then.
	if sc.fault.quiet && len(o.otherFailures) > 0 {
		t.Errorf("%d calls met a store failure other than a timeout, e.g. %v; want none (%s)", len(o.otherFailures), o.otherFailures[0], sc.fault.expect)
	}
	if sc.fault.quiet && o.storeFailures > 0 {
		t.Logf("%d calls met a storage timeout without a fault (a busy machine)", o.storeFailures)
	}
	return o
}

// reportMu serialises the lines appended to the report file.
var reportMu sync.Mutex

// logOutcome logs the scenario's figures, and appends them to the file that
// IDEMPOTENCY_TEST_RELIABILITY_REPORT names, if any (one tab-separated line
// per scenario, for docs/reliability.md).
func logOutcome(t *testing.T, sc scenario, o *outcome) {
	t.Helper()
	t.Logf("%s: %s; %v storm; store failures %d (%d not timeouts), recovery %v after the fault ended; %s; events: %s",
		sc.name(), o.fault.note, o.duration.Round(time.Millisecond), o.storeFailures, len(o.otherFailures), o.recovery.Round(time.Millisecond), o.r.summary(), o.events)
	path := os.Getenv("IDEMPOTENCY_TEST_RELIABILITY_REPORT")
	if path == "" {
		return
	}
	reportMu.Lock()
	defer reportMu.Unlock()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Errorf("report: %v", err)
		return
	}
	defer f.Close()
	backend := sc.backend
	if sc.label != "" {
		backend = "self-test " + sc.label
	}
	fmt.Fprintf(f, "%s\t%s\t%s\t%s\t%s\t%d\t%v\t%s\t%s\n", backend, sc.fault.name, sc.modes.inFlight, sc.modes.onError,
		o.fault.note, o.storeFailures, o.recovery.Round(time.Millisecond), o.r.summary(), o.events)
}

// faultModes returns the mode pairs a fault runs in: every pair in the full
// suite; in the short one two pairs per fault, one per on-storage-error
// mode, chosen so that the faults together cover every pair.
func faultModes(lv level, f fault) []modes {
	if lv == levelFull {
		return allModes
	}
	m := func(i coordinator.InFlightMode, e coordinator.OnStorageErrorMode) modes { return modes{i, e} }
	const (
		wait, raise, run = coordinator.InFlightWait, coordinator.InFlightRaise, coordinator.InFlightRun
		eRun, eRaise     = coordinator.OnStorageErrorRun, coordinator.OnStorageErrorRaise
	)
	switch f.name {
	case faultKill.name:
		return []modes{m(wait, eRun), m(raise, eRaise)}
	case faultStop.name:
		return []modes{m(wait, eRaise), m(run, eRun)}
	case faultSleep.name:
		return []modes{m(raise, eRun), m(wait, eRaise)}
	case faultClientKill.name:
		return []modes{m(run, eRaise), m(wait, eRun)}
	case faultScriptFlush.name:
		return []modes{m(raise, eRaise), m(run, eRun)}
	case faultFlushSlow.name:
		return []modes{m(wait, eRun), m(run, eRaise)}
	case faultHold.name:
		return []modes{m(wait, eRaise), m(raise, eRun)}
	case faultFailover.name:
		return []modes{m(wait, eRaise), m(run, eRun)}
	case faultSlow.name:
		return []modes{m(wait, eRaise), m(raise, eRun)}
	case faultStallLink.name:
		return []modes{m(wait, eRaise), m(run, eRun)}
	case faultResetLink.name:
		return []modes{m(raise, eRun), m(run, eRaise)}
	case faultReserveAgainFails.name:
		return []modes{m(raise, eRaise), m(wait, eRun)}
	case faultReserveAgainHangs.name:
		return []modes{m(wait, eRun), m(raise, eRaise)}
	case faultReserveAgainSlow.name:
		return []modes{m(raise, eRun), m(wait, eRaise)}
	case faultSentinelFailover.name:
		return []modes{m(wait, eRaise), m(raise, eRaise)}
	}
	return allModes
}

// TestStorms: storms without a fault on a standalone server, in every mode
// pair.
func TestStorms(t *testing.T) {
	lv := suiteLevel(t)
	for _, m := range allModes {
		sc := scenario{backend: "standalone", modes: m, fault: faultNone}
		t.Run(sc.name(), func(t *testing.T) {
			b, env := startStandalone(t, false)
			check(t, lv, sc, b, env)
		})
	}
}

// TestFaults: storms on a standalone server, each with one fault.
func TestFaults(t *testing.T) {
	lv := suiteLevel(t)
	for _, f := range []fault{faultKill, faultStop, faultSleep, faultClientKill, faultScriptFlush, faultFlushSlow, faultHold, faultSlow} {
		for _, m := range faultModes(lv, f) {
			sc := scenario{backend: "standalone", modes: m, fault: f}
			t.Run(sc.name(), func(t *testing.T) {
				b, env := startStandalone(t, f.needs == "proxy")
				check(t, lv, sc, b, env)
			})
		}
	}
}

// TestBreaker: storms with the module's circuit breaker on the client,
// against a dead Redis (kill -9), a hung one (SIGSTOP) and a slow one (every
// chunk delayed past the storage timeout): the breaker opens and refuses
// calls as storage errors, and must never cost a result. The checker's rules
// are the same as without it: no extra run but the faults' own, no lost
// result.
func TestBreaker(t *testing.T) {
	lv := suiteLevel(t)
	for _, f := range []fault{faultKill, faultStop, faultSlow} {
		for _, m := range faultModes(lv, f) {
			sc := scenario{backend: "standalone", modes: m, fault: f, breaker: true}
			t.Run(sc.name(), func(t *testing.T) {
				b, env := startStandalone(t, f.needs == "proxy")
				o := check(t, lv, sc, b, env)
				t.Logf("breaker refusals: %d", o.refused)
			})
		}
	}
}

// TestAutoPipeline: storms whose store sends through what
// IDEMPOTENCY_REDIS_AUTO_PIPELINE gives it (idempotency.NewStoreClient: the
// AutoPipeliner's deferred face, each wait ended by the caller's context),
// without a fault and against a hung Redis (SIGSTOP: callers leave their
// commands behind in a batch that runs later), a slow link, a held link
// delivered newest first, and SCRIPT FLUSH loops (EVALSHA's NOSCRIPT, then
// EVAL, in batches). The faults' own expectations hold, as without it.
func TestAutoPipeline(t *testing.T) {
	lv := suiteLevel(t)
	for _, f := range []fault{faultNone, faultStop, faultSlow, faultHold, faultScriptFlush} {
		ms := faultModes(lv, f)
		if f.name == faultNone.name && lv != levelFull {
			ms = []modes{{coordinator.InFlightWait, coordinator.OnStorageErrorRaise}, {coordinator.InFlightRun, coordinator.OnStorageErrorRun}}
		}
		for _, m := range ms {
			sc := scenario{backend: "standalone", modes: m, fault: f, autoPipeline: true}
			t.Run(sc.name(), func(t *testing.T) {
				b, env := startStandalone(t, f.needs == "proxy")
				b.pipelined = true
				check(t, lv, sc, b, env)
			})
		}
	}
}

// TestCoalescing: storms against the faults of one lane of the store's
// coalescing (redisrepo.WithCoalescing, on by default, as in every storm of
// the suite): one connection whose requests stop arriving while every
// other connection answers, then arrive late, or then is reset. The calls
// that queued behind the stalled lane's command wait with it and time out;
// the others go through the other lane. (A Redis that hangs, is slow or
// drops every connection, every lane at once, is TestFaults's SIGSTOP,
// slow-link and client-kill.) The faults' own expectations hold: no extra
// run but the unprotected runs of mode run, no lost result. The short level
// runs one mode pair per fault.
func TestCoalescing(t *testing.T) {
	lv := suiteLevel(t)
	for _, f := range []fault{faultStallLink, faultResetLink} {
		ms := faultModes(lv, f)
		if lv != levelFull {
			ms = ms[:1]
		}
		for _, m := range ms {
			sc := scenario{backend: "standalone", modes: m, fault: f}
			t.Run(sc.name(), func(t *testing.T) {
				b, env := startStandalone(t, true)
				check(t, lv, sc, b, env)
			})
		}
	}
}

// TestBatches: storms whose callers make batches of calls (DoBatch: the
// keys reserved or read in one ReserveMany, the results stored in
// CompleteMany), without a fault and with the faults that strike a bulk
// call in flight: kill -9, SIGSTOP (the pipeline hangs), a slow link, a held
// link delivered newest first, SCRIPT FLUSH loops (NOSCRIPT in the middle
// of a pipeline), and on a cluster, where a batch spans masters, a master
// killed. The checker's rules are those of single calls. The short level
// runs one mode pair per fault.
func TestBatches(t *testing.T) {
	lv := suiteLevel(t)
	modesOf := func(f fault) []modes {
		m := faultModes(lv, f)
		if lv != levelFull && f.name != faultNone.name {
			m = m[:1]
		}
		if lv != levelFull && f.name == faultNone.name {
			m = []modes{{coordinator.InFlightWait, coordinator.OnStorageErrorRaise}, {coordinator.InFlightRaise, coordinator.OnStorageErrorRun}}
		}
		return m
	}
	for _, f := range []fault{faultNone, faultKill, faultStop, faultSlow, faultHold, faultScriptFlush} {
		for _, m := range modesOf(f) {
			sc := scenario{backend: "standalone", modes: m, fault: f, batched: true}
			t.Run(sc.name(), func(t *testing.T) {
				b, env := startStandalone(t, f.needs == "proxy")
				check(t, lv, sc, b, env)
			})
		}
	}
	// An entry's second reservation (its lease lost at its turn, a held
	// key read again) failing, hanging and slow, while the rest answers.
	// In-flight mode run has no bulk path (DoBatch makes single calls),
	// hence no second reservation: it is left out.
	for _, f := range []fault{faultReserveAgainFails, faultReserveAgainHangs, faultReserveAgainSlow} {
		for _, m := range modesOf(f) {
			if m.inFlight == coordinator.InFlightRun {
				continue
			}
			sc := scenario{backend: "standalone", modes: m, fault: f, batched: true, wrap: wrapReserveAgain}
			t.Run(sc.name(), func(t *testing.T) {
				b, env := startStandalone(t, false)
				check(t, lv, sc, b, env)
			})
		}
	}
	for _, f := range []fault{faultNone, faultFailover} {
		for _, m := range modesOf(f)[:1] {
			sc := scenario{backend: "cluster", modes: m, fault: f, batched: true}
			t.Run(sc.name(), func(t *testing.T) {
				b, env := startClusterBackend(t)
				check(t, lv, sc, b, env)
			})
		}
	}
}

// TestFences: fenced storms (every reservation through the fence script),
// with the faults that touch what a fence depends on: kill -9 and an empty
// restart (the fence keys are lost), SCRIPT FLUSH loops (the script is
// gone from the cache), held links delivered newest first, and a cluster
// master failover (a replica without the last fence key). Beside the
// checker's rules, checkFences checks that a later reservation of a key
// always has the greater fence. The short level runs one mode pair per
// fault.
func TestFences(t *testing.T) {
	lv := suiteLevel(t)
	modesOf := func(f fault) []modes {
		m := faultModes(lv, f)
		if lv != levelFull {
			m = m[:1]
		}
		return m
	}
	for _, f := range []fault{faultKill, faultScriptFlush, faultHold} {
		for _, m := range modesOf(f) {
			sc := scenario{backend: "standalone", modes: m, fault: f, fenced: true}
			t.Run(sc.name(), func(t *testing.T) {
				b, env := startStandalone(t, f.needs == "proxy")
				check(t, lv, sc, b, env)
			})
		}
	}
	for _, m := range modesOf(faultFailover) {
		sc := scenario{backend: "cluster", modes: m, fault: faultFailover, fenced: true}
		t.Run(sc.name(), func(t *testing.T) {
			b, env := startClusterBackend(t)
			check(t, lv, sc, b, env)
		})
	}
}

// TestCluster: storms on a cluster of three masters with replicas, without a
// fault in every mode pair, and with a master killed.
func TestCluster(t *testing.T) {
	lv := suiteLevel(t)
	t.Run("none", func(t *testing.T) {
		b, env := startClusterBackend(t)
		checkKeySlot(t, b)
		for _, m := range allModes {
			sc := scenario{backend: "cluster", modes: m, fault: faultNone}
			t.Run(sc.name(), func(t *testing.T) { check(t, lv, sc, b, env) })
		}
	})
	for _, m := range faultModes(lv, faultFailover) {
		sc := scenario{backend: "cluster", modes: m, fault: faultFailover}
		t.Run(sc.name(), func(t *testing.T) {
			b, env := startClusterBackend(t)
			check(t, lv, sc, b, env)
		})
	}
}

// The checker's self-test: stores that forget records, or mix them up, must
// make the checker fail. The same storm as TestStorms, on a store wrapped
// in one that misbehaves.

// forgetful is a Store that loses every tenth completed result: it drops the
// completion silently (and reports it done), or completes and then deletes
// the record.
type forgetful struct {
	idemstore.Store
	inner  *redisrepo.Store
	delete bool
	n      atomic.Int64
}

func (f *forgetful) Complete(ctx context.Context, key idemstore.Key, token string, c idemstore.Completion) (bool, error) {
	if f.n.Add(1)%10 != 0 {
		return f.Store.Complete(ctx, key, token, c)
	}
	if !f.delete {
		return true, nil
	}
	ok, err := f.Store.Complete(ctx, key, token, c)
	if ok && err == nil {
		_, _ = f.inner.Forget(ctx, key)
	}
	return ok, err
}

// mixer is a Store that, once in twenty reads of a completed record, returns
// the result of the last other key it read instead.
type mixer struct {
	idemstore.Store
	mu   sync.Mutex
	n    int
	last map[idemstore.Key][]byte
}

func (m *mixer) mix(key idemstore.Key, rec idemstore.Record) idemstore.Record {
	if rec.State != idemstore.StateCompleted {
		return rec
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.n++
	if m.n%20 == 0 {
		for k, res := range m.last {
			if k != key {
				rec.Result = res
				return rec
			}
		}
	}
	if m.last == nil {
		m.last = map[idemstore.Key][]byte{}
	}
	clear(m.last)
	m.last[key] = rec.Result
	return rec
}

func (m *mixer) Reserve(ctx context.Context, key idemstore.Key, w idemstore.Write) (idemstore.Record, bool, error) {
	rec, ok, err := m.Store.Reserve(ctx, key, w)
	return m.mix(key, rec), ok, err
}

func (m *mixer) Get(ctx context.Context, key idemstore.Key) (idemstore.Record, error) {
	rec, err := m.Store.Get(ctx, key)
	return m.mix(key, rec), err
}

// minSelfTestEffects is how many actions a self-test storm must run for a
// store that spoils one in ten or twenty to be caught (a quiet machine's
// storms run about 3500).
const minSelfTestEffects = 200

func TestCheckerCatchesABadStore(t *testing.T) {
	lv := suiteLevel(t)
	completes := []modes{{coordinator.InFlightWait, coordinator.OnStorageErrorRaise}, {coordinator.InFlightRaise, coordinator.OnStorageErrorRaise}}
	reads := []modes{{coordinator.InFlightWait, coordinator.OnStorageErrorRaise}, {coordinator.InFlightRun, coordinator.OnStorageErrorRun}}
	for _, tt := range []struct {
		name  string
		modes []modes // mode run writes with Reserve, not Complete
		wrap  func(*redisrepo.Store) idemstore.Store
		// caught reports whether the checker found what the store did.
		caught func(r *report) bool
	}{
		{"drops-every-10th-completion", completes, func(s *redisrepo.Store) idemstore.Store { return &forgetful{Store: s, inner: s} },
			func(r *report) bool { return len(r.notAllowed)+len(r.lost) > 0 && r.linearizable == "Illegal" }},
		{"deletes-every-10th-record", completes, func(s *redisrepo.Store) idemstore.Store { return &forgetful{Store: s, inner: s, delete: true} },
			func(r *report) bool { return len(r.notAllowed)+len(r.lost) > 0 && r.linearizable == "Illegal" }},
		{"replays-another-keys-result", reads, func(s *redisrepo.Store) idemstore.Store { return &mixer{Store: s} },
			func(r *report) bool { return len(r.wrong) > 0 && r.linearizable == "Illegal" }},
	} {
		for _, m := range tt.modes {
			sc := scenario{backend: "standalone", modes: m, fault: faultNone, wrap: tt.wrap, label: tt.name}
			t.Run(sc.name(), func(t *testing.T) {
				// On a machine loaded beyond the storms' timings, nearly
				// every call can miss the 100ms storage timeout, and a
				// storm that ran few actions gives the bad store nothing
				// to spoil: such a storm is run again, up to three times.
				var o *outcome
				for try := 1; ; try++ {
					b, env := startStandalone(t, false)
					o = runStorm(t, lv, sc, b, env)
					logOutcome(t, sc, o)
					if o.r.effects >= minSelfTestEffects {
						break
					}
					if try == 3 {
						t.Skipf("three storms ran %d actions or fewer (want %d): the machine is too loaded for the self-test to mean anything", o.r.effects, minSelfTestEffects)
					}
					t.Logf("the storm ran %d actions (want %d for the self-test): again", o.r.effects, minSelfTestEffects)
				}
				if !tt.caught(o.r) {
					t.Fatalf("the checker did not catch a store that %s: %s", tt.name, o.r.summary())
				}
				fails := o.r.failures()
				t.Logf("caught: %d findings, e.g. %s", len(fails), strings.Join(fails[:min(3, len(fails))], "; "))
			})
		}
	}
}

// checkKeySlot checks keySlot, which says which records a killed master
// held, against the cluster's own CLUSTER KEYSLOT.
func checkKeySlot(t *testing.T, b *clusterBackend) {
	t.Helper()
	c := b.client(t)
	defer c.Close()
	for _, k := range []string{"", "a", "rel:abc:storm.charge:k17", "{tag}x", "x{}y", "x{tag}", "{}", "k{a}{b}"} {
		want, err := c.(*redis.ClusterClient).ClusterKeySlot(context.Background(), k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := keySlot(k); int64(got) != want {
			t.Errorf("keySlot(%q) = %d, CLUSTER KEYSLOT %d", k, got, want)
		}
	}
}
