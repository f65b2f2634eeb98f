package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/fx"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/faultproxy"
	"github.com/idemkit/idempotency/internal/redistest"
)

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
