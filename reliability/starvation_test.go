//go:build linux

package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/redisrepo"
)

// busyLoops is how many CPU-bound processes the starvation storms run
// beside them.
const busyLoops = 12

// startBusyLoops starts n `sh -c 'while :; do :; done'` processes, killed
// (by their own PID) when t ends.
func startBusyLoops(t *testing.T, n int) {
	t.Helper()
	for range n {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
}

// TestStarvation: storms without a fault, with the storms' short timings
// (lease 1s, storage timeout 100ms), beside busy loops that starve the
// callers, the coordinator and Redis of CPU. The background save rounds
// and renewals may use what is left of the reservation, so no save is given
// up and no protected run is run again (issue 17); with on-storage-error run,
// a reserve that misses the storage timeout runs unprotected, as documented.
func TestStarvation(t *testing.T) {
	lv := suiteLevel(t)
	ms := []modes{{coordinator.InFlightWait, coordinator.OnStorageErrorRaise}, {coordinator.InFlightRaise, coordinator.OnStorageErrorRaise}}
	if lv == levelFull {
		ms = append(ms, modes{coordinator.InFlightWait, coordinator.OnStorageErrorRun})
	}
	// Beside the busy loops (and whatever else loads the machine) the
	// scheduler alone can hold a caller's goroutine for seconds: a call
	// that took 5.2s, with a 100ms storage timeout, was measured beside a
	// load average of 20. A hang is a call that never ends, so the limit
	// here is 20s.
	starved := fault{name: "starvation", expect: "no extra run, no save given up", quiet: true, inject: faultNone.inject, hangLimit: 20 * time.Second}
	for _, be := range []string{"standalone", "cluster"} {
		for _, m := range ms {
			sc := scenario{backend: be, modes: m, fault: starved}
			t.Run(sc.name(), func(t *testing.T) {
				var b backend
				var env *faultEnv
				var nodes func() []string
				if be == "cluster" {
					cb, e := startClusterBackend(t)
					b, env, nodes = cb, e, cb.c.addrs
				} else {
					sb, e := startStandalone(t, false)
					b, env, nodes = sb, e, func() []string { return []string{sb.in.Addr()} }
				}
				startBusyLoops(t, busyLoops)
				probe := startStallProbe(nodes)
				steal := stealTicks()
				o := check(t, lv, sc, b, env)
				windows := probe.end()
				t.Logf("longest unanswered ping of each node, and longest late heartbeat of this process (every %v): %s; %s; %s",
					stallProbeEvery, longestStalls(windows), longestGCPause(), stolenSince(steal))
				// check has already failed every extra run and unstored
				// result without an allowed cause. A save given up and a
				// lease lost are such causes: the guarantee holds only
				// while the store answers within the 1s lease, and beside
				// these busy loops (and whatever else loads the machine)
				// Redis or this process can stall for longer. The short
				// suite (CI) reports them, so that a busy machine does not
				// read as a defect. The full suite fails on them unless
				// the stall probe saw Redis answer nothing, or this
				// process run nothing, for half a lease or more: a save
				// given up or a lease lost while both ran is a defect
				// (docs/reliability.md, finding 9).
				report := t.Errorf
				if w := longestStall(windows); lv != levelFull || w.to.Sub(w.from) >= lease/2 {
					report = t.Logf
				}
				// With on-storage-error run, a reserve that misses the
				// 100ms storage timeout runs its action unprotected: that
				// is the mode, documented and chosen, so those extra runs
				// (and the runs after them) are logged, not failed. What
				// starvation must not cause is a protected run lost.
				starved := o.r.extraRuns() - o.r.extra[reasonUnprotected] - o.r.extra[reasonAfterUnprot]
				if n := o.r.extra[reasonUnprotected] + o.r.extra[reasonAfterUnprot]; n > 0 {
					t.Logf("%d extra runs of unprotected calls (on-storage-error %s: a reserve missed the storage timeout)", n, m.onError)
				}
				longest := "no stall of " + stallProbeMin.String() + " or more"
				if w := longestStall(windows); w.addr != "" {
					longest = "the longest stall: " + w.String()
				}
				if starved > 0 {
					report("%d keys ran twice after a protected run (extra runs %s); want none while Redis and this process run (%s)", starved, o.r.summary(), longest)
				}
				if n := o.given; n > 0 {
					report("%d saves given up (storage_save_error, not stored: could have expired); want none while Redis and this process run (%s)", n, longest)
				}
			})
		}
	}
}

// TestUnstorableResults: keys whose actions return a result larger than the
// coordinator's max result bytes. Each such key's action runs once; every
// later call gets ErrNotReplayable, never a second run (issue 17). Keys with
// a small result replay it.
func TestUnstorableResults(t *testing.T) {
	lv := suiteLevel(t)
	keys, rounds, callers := 40, 3, 8
	if lv == levelFull {
		keys, rounds = 200, 5
	}
	const maxBytes = 1024
	for _, be := range []string{"standalone", "cluster"} {
		t.Run(be, func(t *testing.T) {
			var b backend
			if be == "cluster" {
				b, _ = startClusterBackend(t)
			} else {
				b, _ = startStandalone(t, false)
			}
			client := b.client(t)
			t.Cleanup(func() { _ = client.Close() })
			prefix := "unstorable:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
			obs := &observer{}
			c, err := coordinator.New(redisrepo.New(client, redisrepo.WithKeyPrefix(prefix)),
				// Not the storms' short timings: this scenario is about the
				// record state, and raise so that a store timeout is an error,
				// not an unprotected run.
				coordinator.WithLease(5*time.Second), coordinator.WithStorageTimeout(time.Second), coordinator.WithRenewInterval(time.Second),
				coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise),
				coordinator.WithMaxResultBytes(maxBytes), coordinator.WithObserver(obs))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			big := func(k int) bool { return k%2 == 0 }
			runs := make([]atomic.Int64, keys)
			var mu sync.Mutex
			outcomes := map[string]int{}
			var bad []string
			for round := range rounds {
				var wg sync.WaitGroup
				for k := range keys {
					for i := range callers {
						wg.Go(func() {
							key := "u" + strconv.Itoa(k)
							ctx, cancel := context.WithTimeout(context.Background(), callDeadline)
							defer cancel()
							v, err := coordinator.Do(ctx, c, coordinator.Call{Operation: "storm.unstorable", Key: key, Fingerprint: "fp"},
								func(context.Context) (string, error) {
									runs[k].Add(1)
									if big(k) {
										return strings.Repeat("x", 2*maxBytes), nil
									}
									return "small-" + key, nil
								})
							mu.Lock()
							defer mu.Unlock()
							switch {
							case errors.Is(err, coordinator.ErrNotReplayable):
								outcomes["not_replayable"]++
								if !big(k) {
									bad = append(bad, fmt.Sprintf("%s (small result): round %d caller %d: %v", key, round, i, err))
								}
							case errors.Is(err, coordinator.ErrInProgress):
								outcomes["in_progress"]++
							case errors.Is(err, coordinator.ErrStorage):
								outcomes["storage"]++
							case err != nil:
								outcomes["error"]++
								bad = append(bad, fmt.Sprintf("%s: round %d caller %d: unexpected error %v", key, round, i, err))
							case big(k) && len(v) == 2*maxBytes:
								outcomes["big_value"]++
							case !big(k) && v == "small-"+key:
								outcomes["value"]++
							default:
								bad = append(bad, fmt.Sprintf("%s: round %d caller %d: got %.40q", key, round, i, v))
							}
						})
					}
				}
				wg.Wait()
			}
			twice := 0
			for k := range keys {
				if n := runs[k].Load(); n != 1 {
					twice++
					t.Errorf("key u%d (big %v): the action ran %d times; want once", k, big(k), n)
				}
			}
			// Each big key's result reached its first caller only: the
			// callers that waited on it, and every later one, got
			// ErrNotReplayable.
			if want := keys / 2 * (rounds - 1) * callers; outcomes["not_replayable"]+outcomes["storage"] < want {
				t.Errorf("%d calls got ErrNotReplayable; want at least %d (every call of a big key after the first round)", outcomes["not_replayable"], want)
			}
			for i, s := range bad {
				if i == 10 {
					t.Errorf("... and %d more", len(bad)-i)
					break
				}
				t.Error(s)
			}
			t.Logf("unstorable/%s: keys=%d (half with a %d-byte result, max %d) rounds=%d callers/key=%d; keys run twice=%d; outcomes %s; events: %s",
				be, keys, 2*maxBytes, maxBytes, rounds, callers, twice, formatCounts(outcomes), obs.counts())
		})
	}
}
