//go:build linux

package reliability_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator/idemstore"
	"github.com/idemkit/idempotency/internal/faultproxy"
	"github.com/idemkit/idempotency/internal/redistest"
)

// faultEnv is what a fault acts on.
type faultEnv struct {
	now     func() int64          // the storm's clock
	pause   func()                // holds the storm's new calls back (calls in flight go on)
	resume  func()                // lets them go again
	prefix  string                // the store's key prefix
	in      *redistest.Instance   // the standalone server, if any
	admin   redis.UniversalClient // a client straight to Redis, for the faults' commands
	proxy   *faultproxy.Proxy     // between the storm's client and Redis, if any
	cluster *testCluster          // the cluster, if any
	// sentinel is the master, replica and sentinel, if any.
	sentinel *redistest.Sentinel
	// store is the storm's store, for a fault that acts on a wrapper of it
	// (reserveAgain).
	store idemstore.Store
}

// faultResult is what a fault did: when it began and ended on the storm's
// clock, the windows in which Redis may have lost records, and a note.
type faultResult struct {
	start, end int64
	windows    []lossWindow
	note       string
}

// fault is one kind of fault, injected while a storm runs. inject runs on
// the test's goroutine and returns once the fault has ended.
type fault struct {
	name string
	// expect is what the docs say happens, for the report.
	expect string
	// needs is what the fault acts on: "standalone", "proxy" (a standalone
	// server behind the fault proxy), "cluster" or "sentinel"; "" for any.
	needs string
	// quiet says that no call may meet a store failure other than a
	// timeout.
	quiet  bool
	inject func(t *testing.T, env *faultEnv) faultResult
	// hangLimit, if set, is the longest a call may take instead of the
	// default (hangLimit).
	hangLimit time.Duration
}

// The faults' durations: each stall is longer than the storage timeout
// (100ms) and shorter than the lease (1s), the case the docs promise to
// survive without a second run ("as long as Redis comes back within the
// lease").
const (
	outage    = 300 * time.Millisecond // kill -9 to restart
	stall     = 600 * time.Millisecond // SIGSTOP, DEBUG SLEEP
	holdFor   = 400 * time.Millisecond // the held link
	loopFor   = time.Second            // CLIENT KILL and SCRIPT FLUSH loops
	killEvery = 50 * time.Millisecond
	slowBy    = 150 * time.Millisecond // the slow link, each way
	// flushSlowBy is the link's delay each way under SCRIPT FLUSH loops:
	// a round trip (70ms and Redis's time) within the storage timeout, two
	// (an EVALSHA answered NOSCRIPT, then the EVAL) beyond it.
	flushSlowBy = 35 * time.Millisecond
)

var (
	faultNone = fault{
		name:   "none",
		expect: "no extra run but run-mode collisions; no store failure",
		quiet:  true,
		inject: func(t *testing.T, env *faultEnv) faultResult {
			now := env.now()
			return faultResult{start: now, end: now}
		},
	}

	faultKill = fault{
		name: "kill9-restart",
		expect: "calls fail (raise) or run unprotected (run) while Redis is down; the restarted Redis is empty, " +
			"so a key whose record was lost runs again: allowed (data loss, the store was not up); nothing else",
		needs: "standalone",
		inject: func(t *testing.T, env *faultEnv) faultResult {
			start := env.now()
			env.in.Stop(t)
			time.Sleep(outage)
			env.in.Restart(t)
			end := env.now()
			// The kill lands somewhere in [start, end], late on a busy
			// machine: a record written after start may be lost too.
			return faultResult{start: start, end: end,
				windows: []lossWindow{{start: start, end: end, wipe: true, spans: true, reason: reasonWipe}},
				note:    fmt.Sprintf("down %v", time.Duration(end-start).Round(time.Millisecond))}
		},
	}

	faultStop = fault{
		name: "sigstop",
		expect: "calls time out: *StorageError (raise) or unprotected runs (run); completions that timed out are " +
			"saved in the background once Redis resumes, within the lease: no other extra run, no lost result",
		needs: "standalone",
		inject: func(t *testing.T, env *faultEnv) faultResult {
			pid := serverPID(t, env.admin)
			start := env.now()
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				t.Fatalf("SIGSTOP: %v", err)
			}
			cont := func() { _ = syscall.Kill(pid, syscall.SIGCONT) }
			t.Cleanup(cont)
			time.Sleep(stall)
			cont()
			end := env.now()
			return faultResult{start: start, end: end, note: fmt.Sprintf("stopped %v", time.Duration(end-start).Round(time.Millisecond))}
		},
	}

	faultSleep = fault{
		name:   "debug-sleep",
		expect: "as SIGSTOP: a server that stalls for longer than the storage timeout and less than the lease",
		needs:  "standalone",
		inject: func(t *testing.T, env *faultEnv) faultResult {
			start := env.now()
			secs := strconv.FormatFloat(stall.Seconds(), 'f', 3, 64)
			if err := env.admin.Do(context.Background(), "DEBUG", "SLEEP", secs).Err(); err != nil {
				t.Fatalf("DEBUG SLEEP: %v", err)
			}
			end := env.now()
			return faultResult{start: start, end: end, note: fmt.Sprintf("slept %v", time.Duration(end-start).Round(time.Millisecond))}
		},
	}

	faultClientKill = fault{
		name: "client-kill",
		expect: "connections killed under calls in flight; go-redis retries, the engine recognises its own " +
			"reservation or completion met again; at most unprotected runs (run) or *StorageError (raise), no other extra run",
		needs: "standalone",
		inject: func(t *testing.T, env *faultEnv) faultResult {
			return loop(t, env, killEvery, func(ctx context.Context) (int64, error) {
				return env.admin.ClientKillByFilter(ctx, "TYPE", "normal").Result()
			}, "CLIENT KILL TYPE normal", "connections killed")
		},
	}

	faultScriptFlush = fault{
		name:   "script-flush",
		expect: "NOSCRIPT answered and the script sent again with EVAL: no store failure, no extra run",
		needs:  "standalone",
		quiet:  true,
		inject: func(t *testing.T, env *faultEnv) faultResult {
			return loop(t, env, 20*time.Millisecond, func(ctx context.Context) (int64, error) {
				return 0, env.admin.ScriptFlush(ctx).Err()
			}, "SCRIPT FLUSH", "")
		},
	}

	faultFlushSlow = fault{
		name: "script-flush-slow-link",
		expect: "SCRIPT FLUSH loops while every chunk is delayed 35ms each way: one round trip fits the storage " +
			"timeout, the EVAL sent after a NOSCRIPT does not, so hot-script calls time out mid-fallback and the " +
			"late EVAL may still land; the background save completes them; no extra run but unprotected runs " +
			"(run), no lost result",
		needs: "proxy",
		inject: func(t *testing.T, env *faultEnv) faultResult {
			env.proxy.SetLatency(flushSlowBy)
			defer env.proxy.SetLatency(0)
			fr := loop(t, env, 20*time.Millisecond, func(ctx context.Context) (int64, error) {
				return 0, env.admin.ScriptFlush(ctx).Err()
			}, "SCRIPT FLUSH", "")
			fr.note += fmt.Sprintf(", the link slowed by %v each way", flushSlowBy)
			return fr
		},
	}

	faultHold = fault{
		name: "held-link",
		expect: "every request held in the network, then delivered late, newest first: calls time out, late " +
			"reservations and completions land after later requests; the background save completes them; no " +
			"extra run but unprotected runs (run), no lost result",
		needs: "proxy",
		inject: func(t *testing.T, env *faultEnv) faultResult {
			start := env.now()
			env.proxy.Hold()
			time.Sleep(holdFor)
			held := env.proxy.Stats().Held
			// The proxy holds what arrives while it releases too, and
			// returns once a round finds nothing held: with the storm's
			// new calls held back meanwhile, that ends. (Calls in flight,
			// go-redis's retries and the background saves go on.)
			env.pause()
			env.proxy.Release(faultproxy.NewestFirst)
			env.resume()
			end := env.now()
			return faultResult{start: start, end: end,
				note: fmt.Sprintf("held %v: %d chunks, %d bytes, delivered newest first", time.Duration(end-start).Round(time.Millisecond), held.Chunks, held.Bytes)}
		},
	}

	faultSlow = fault{
		name: "slow-link",
		expect: "every chunk delayed 150ms each way, beyond the storage timeout: calls time out (the breaker, " +
			"when on, opens and refuses them at once), while the background saves, which may take what is left " +
			"of the lease, go through; no extra run but unprotected runs (run), no lost result",
		needs: "proxy",
		inject: func(t *testing.T, env *faultEnv) faultResult {
			start := env.now()
			env.proxy.SetLatency(slowBy)
			time.Sleep(stall)
			env.proxy.SetLatency(0)
			end := env.now()
			return faultResult{start: start, end: end,
				note: fmt.Sprintf("slowed by %v each way for %v", slowBy, time.Duration(end-start).Round(time.Millisecond))}
		},
	}

	faultStallLink = stallFault("stalled-link", false, "then arrive late: the call on it, and the calls "+
		"coalesced behind it, time out; the other lane and connections go on; the background save completes "+
		"what timed out")

	faultResetLink = stallFault("reset-link", true, "then the connection is reset: the call on it, and the "+
		"calls coalesced behind it, fail; the rest go on")

	faultFailover = fault{
		name: "master-killed",
		expect: "kill -9 of one of three masters; its replica is promoted; calls on its slots fail (raise) or run " +
			"unprotected (run) until then; a write that had not reached the replica may be lost, and its key run " +
			"again: allowed (failover); other slots unaffected",
		needs:  "cluster",
		inject: killMaster,
	}
)

// stallLink stalls the next connection that sends for stall, then lets it
// go on, or resets it.
func stallLink(t *testing.T, env *faultEnv, reset bool) faultResult {
	t.Helper()
	start := env.now()
	env.proxy.StallOne()
	time.Sleep(stall)
	stalled := env.proxy.Unstall(reset)
	end := env.now()
	what := "delivered late"
	if reset {
		what = "reset"
	}
	if !stalled {
		what = "no connection sent meanwhile: nothing stalled"
	}
	return faultResult{start: start, end: end,
		note: fmt.Sprintf("one connection stalled %v, %s", time.Duration(end-start).Round(time.Millisecond), what)}
}

// loop runs cmd every interval for loopFor and sums what it returns.
func loop(t *testing.T, env *faultEnv, interval time.Duration, cmd func(context.Context) (int64, error), what, counted string) faultResult {
	t.Helper()
	start := env.now()
	deadline := time.Now().Add(loopFor)
	rounds, total := 0, int64(0)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		n, err := cmd(ctx)
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		rounds++
		total += n
		time.Sleep(interval)
	}
	end := env.now()
	note := fmt.Sprintf("%d× %s in %v", rounds, what, time.Duration(end-start).Round(time.Millisecond))
	if counted != "" {
		note += fmt.Sprintf(", %d %s", total, counted)
	}
	return faultResult{start: start, end: end, note: note}
}

// serverPID returns the process id of the Redis server c talks to.
func serverPID(t *testing.T, c redis.UniversalClient) int {
	t.Helper()
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			pid, err := strconv.Atoi(v)
			if err != nil {
				t.Fatal(err)
			}
			return pid
		}
	}
	t.Fatalf("no process_id in INFO server: %q", info)
	return 0
}

// killMaster kills one master of the cluster with SIGKILL and waits until
// its replica serves its slots.
func killMaster(t *testing.T, env *faultEnv) faultResult {
	t.Helper()
	victim, replica, slots := env.cluster.masterWithReplica(t)
	start := env.now()
	victim.kill()
	promoted := env.cluster.waitPromoted(t, replica, 30*time.Second)
	end := env.now()
	prefix := env.prefix
	affects := func(pkey string) bool {
		s := keySlot(prefix + pkey)
		for _, r := range slots {
			if s >= r[0] && s <= r[1] {
				return true
			}
		}
		return false
	}
	return faultResult{start: start, end: end,
		windows: []lossWindow{{start: start, end: end, reason: reasonFailover, affects: affects}},
		note: fmt.Sprintf("master %s killed, replica %s promoted after %v (slots %v)", victim.addr(), replica.addr(),
			promoted.Round(time.Millisecond), slots)}
}

// keySlot is Redis Cluster's hash slot of a key: CRC16 (XMODEM) of the key,
// or of its hash tag, modulo 16384.
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

// stallFault is a fault that stalls one connection's requests for 600ms
// while the others answer (stallLink), and then delivers them late or, with
// reset, resets the connection; then says what follows.
func stallFault(name string, reset bool, then string) fault {
	return fault{
		name: name,
		expect: "one connection's requests stop for 600ms while the others answer, " + then +
			"; no extra run but unprotected runs (run), no lost result",
		needs:  "proxy",
		inject: func(t *testing.T, env *faultEnv) faultResult { return stallLink(t, env, reset) },
	}
}
