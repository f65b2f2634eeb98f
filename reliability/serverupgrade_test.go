//go:build linux

package reliability_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/internal/redistest"
)

// A server upgrade by failover: a Redis 7.0 master with a Valkey 8.0.1
// replica behind Sentinel, the master failed over to the replica under a
// storm. Found by experiment before the storm was written (docs/operations.md,
// "Valkey"): Valkey 8.0.1 follows Redis 7.0.15 (its full sync loads the
// master's RDB, format 10; every write streams, scripts as their effects),
// and SENTINEL FAILOVER promotes it; the way back is closed: the former
// master, which the sentinel makes the new master's replica, cannot load
// Valkey's RDB (format 11: "Can't handle RDB format version 11"), flushes
// its own data first, and retries for ever, empty and read-only. The storm
// checks the way there, and reports how the former master fared.

// The places of Valkey's binaries, as the Makefile's test-valkey target
// finds them: VALKEY_DIR, a folder holding valkey-server; else VALKEY_BUILD,
// or the first of valkeyBuildCandidates, the shared tools' build script,
// which builds Valkey once into its cache folder and prints the folder.
const (
	envValkeyDir   = "VALKEY_DIR"
	envValkeyBuild = "VALKEY_BUILD"
)

// valkeyBuildCandidates are the Makefile's VALKEY_CANDIDATES, relative to
// the repository's root (the test runs in reliability/): beside the
// checkout, or beside its parent.
var valkeyBuildCandidates = []string{"../../shared/tools/build-valkey.sh", "../../../shared/tools/build-valkey.sh"}

// valkeyBuildTimeout bounds the build script: minutes the first time (3-5
// on two cores), then it only prints its cache folder.
const valkeyBuildTimeout = 15 * time.Minute

// valkeyFound is where Valkey's server is, or why there is none: skip when
// nothing names or builds it (the storm is skipped, as the suite's others
// are without redis-server), err when what the environment names is not
// there (a failure).
type valkeyFound struct {
	server string
	how    string
	skip   string
	err    error
}

// findValkey finds Valkey's server once per test binary: the build script
// may take minutes the first time.
var findValkey = sync.OnceValue(func() valkeyFound {
	if dir := strings.TrimSpace(os.Getenv(envValkeyDir)); dir != "" {
		server := filepath.Join(dir, "valkey-server")
		if _, err := exec.LookPath(server); err != nil {
			return valkeyFound{err: fmt.Errorf("%s=%s: %w", envValkeyDir, dir, err)}
		}
		return valkeyFound{server: server, how: envValkeyDir}
	}
	script := strings.TrimSpace(os.Getenv(envValkeyBuild))
	if script == "" {
		for _, c := range valkeyBuildCandidates {
			if _, err := os.Stat(c); err == nil {
				script, _ = filepath.Abs(c)
				break
			}
		}
	}
	if script == "" {
		return valkeyFound{skip: fmt.Sprintf("no Valkey: set %s to a folder with valkey-server, or provide the shared tools' build-valkey.sh (looked for %s)",
			envValkeyDir, strings.Join(valkeyBuildCandidates, ", "))}
	}
	ctx, cancel := context.WithTimeout(context.Background(), valkeyBuildTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return valkeyFound{skip: fmt.Sprintf("no Valkey: %s failed (%v): %s (set %s to a folder with valkey-server)",
			script, err, strings.TrimSpace(stderr.String()), envValkeyDir)}
	}
	lines := strings.Fields(stdout.String())
	if len(lines) == 0 {
		return valkeyFound{err: fmt.Errorf("%s printed no folder", script)}
	}
	server := filepath.Join(lines[len(lines)-1], "valkey-server")
	if _, err := exec.LookPath(server); err != nil {
		return valkeyFound{err: fmt.Errorf("%s: %w", script, err)}
	}
	return valkeyFound{server: server, how: fmt.Sprintf("%s (%v)", script, time.Since(start).Round(time.Millisecond))}
})

// upgradeBinaries returns the master's binary, Redis's redis-server on
// PATH, and the replica's, Valkey's, or ends t: the storm is about that
// pair, so it starts both itself, whatever IDEMPOTENCY_TEST_REDIS_SERVER
// says (under make test-valkey too).
func upgradeBinaries(t *testing.T) (from, to redistest.Binary) {
	t.Helper()
	from, err := redistest.BinaryAt("redis-server")
	switch {
	case err != nil && os.Getenv(redistest.EnvRequire) != "":
		t.Fatalf("%s is set but there is no Redis master for the upgrade: redis-server: %v", redistest.EnvRequire, err)
	case err != nil:
		t.Skipf("no Redis master for the upgrade: redis-server: %v", err)
	case from.Product != "Redis":
		t.Skipf("redis-server on PATH is %s: the upgrade needs a Redis master", from)
	}
	v := findValkey()
	switch {
	case v.err != nil:
		t.Fatal(v.err)
	case v.skip != "":
		t.Skip(v.skip)
	}
	if to, err = redistest.BinaryAt(v.server); err != nil {
		t.Fatal(err)
	}
	if to.Product != "Valkey" {
		t.Fatalf("%s is %s, not Valkey", v.server, to)
	}
	t.Logf("upgrade from %s to %s (found by %s)", from, to, v.how)
	return from, to
}

// upgradeFailover is the fault: SENTINEL FAILOVER from the Redis master to
// the Valkey replica, and then the sentinel's reconfiguration of the
// former master into the Valkey's replica, both while the storm runs. Its
// loss window is the Sentinel failover's (faultSentinelFailover): the
// upgrade changes what runs the master, not how the client finds it, and a
// record on the former master after the promotion is lost as it would be
// on two Redis 7.0 (there it is dropped by the resynchronisation; here the
// former master flushes everything when it fails to load Valkey's RDB).
func upgradeFailover(from, to redistest.Binary) fault {
	return fault{
		name: "upgrade-failover",
		expect: "SENTINEL FAILOVER from a Redis master to its Valkey replica, a server upgrade: as a Sentinel " +
			"failover: calls that meet the former master before the client switches fail (raise) or run unprotected " +
			"(run); a write that had not reached the replica, or that reached the former master after the " +
			"promotion, may be lost and its key run again: allowed (failover); the promoted Valkey keeps every " +
			"record it had and takes every write after the switch: nothing else lost",
		needs: "sentinel",
		inject: func(t *testing.T, env *faultEnv) faultResult {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), sentinelFailoverBound)
			defer cancel()
			former, err := env.sentinel.Master(ctx)
			if err != nil {
				t.Fatal(err)
			}
			start, began := env.now(), time.Now()
			res, err := env.sentinel.Promote(ctx)
			if err != nil {
				t.Fatal(err)
			}
			checkServerName(t, ctx, res.Master, "valkey")
			// The sentinel makes the former master the new master's
			// replica some seconds later; the storm runs through that too.
			fs, err := env.sentinel.FormerMasterSync(ctx, former, res.Master)
			if err != nil {
				t.Fatal(err)
			}
			end := env.now()
			announced := start + int64(res.Announced.Sub(began))
			lossEnd := min(end, announced+int64(storageTimeout+switchMargin))
			fared := fmt.Sprintf("in sync with it, %d keys", fs.Keys)
			if !fs.InSync {
				fared = fmt.Sprintf("refused its data (%q), %d keys left", fs.Refused, fs.Keys)
			}
			return faultResult{start: start, end: end,
				windows: []lossWindow{{start: start, end: lossEnd, spans: true, reason: reasonSentinel}},
				note: fmt.Sprintf("master %s %s %s failed over to %s %s %s, announced after %v; the former master its replica after %v: %s",
					from.Product, from.Version, former, to.Product, to.Version, res.Master, res.Announced.Sub(began).Round(time.Millisecond),
					time.Duration(end-start).Round(time.Millisecond), fared)}
		},
	}
}

// checkServerName fails t unless the server at addr says it is name
// (INFO server's server_name, which Valkey sends and Redis 7.0 does not):
// the promoted master must be the Valkey, or the storm upgraded nothing.
func checkServerName(t *testing.T, ctx context.Context, addr, name string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		t.Fatalf("INFO server on the new master %s: %v", addr, err)
	}
	if !strings.Contains(info, "server_name:"+name+"\r\n") {
		t.Fatalf("the new master %s is not %s: INFO server says %q", addr, name, info)
	}
}

// TestServerUpgrade: storms on a Redis 7.0 master and a Valkey 8.0.1
// replica behind a Redis 7.0 sentinel (the sentinels keep no data, so an
// upgrade replaces the data servers under the sentinels it has), with the
// master failed over to the Valkey while they run: a server upgrade by
// failover. Every history is checked as TestSentinel's: every extra run in
// the failover's window, no result lost outside it. The full suite runs
// every mode pair, the short one TestSentinel's two. (Finding 4 had kept it
// in the full suite: on a loaded machine a dial that asked the sentinel
// just before the failover switched the client back to the former master;
// sentinelcheck now refuses such a connection.)
func TestServerUpgrade(t *testing.T) {
	lv := suiteLevel(t)
	from, to := upgradeBinaries(t)
	f := upgradeFailover(from, to)
	for _, m := range faultModes(lv, faultSentinelFailover) {
		sc := scenario{backend: "sentinel-redis-to-valkey", modes: m, fault: f}
		t.Run(sc.name(), func(t *testing.T) {
			s := redistest.StartSentinelOf(t, from.Path, to.Path, from.Path)
			o := check(t, lv, sc, &sentinelBackend{s: s}, &faultEnv{sentinel: s})
			// The storm must have gone on on the promoted Valkey: a call
			// that began once the fault had ended and returned a value.
			var after int
			for _, cl := range o.h.calls {
				if !cl.final && cl.start > o.fault.end && cl.class == okValue {
					after++
				}
			}
			if after == 0 {
				t.Errorf("no call that began after the failover returned a value: the storm did not run on the promoted %s", to)
			}
			t.Logf("%d calls returned a value on the promoted %s after the failover", after, to)
		})
	}
}
