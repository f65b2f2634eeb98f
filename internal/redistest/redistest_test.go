package redistest_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/internal/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(redistest.Main(m))
}

func TestServer(t *testing.T) {
	ctx := context.Background()
	a, b := redistest.Server(t), redistest.Server(t)
	if a == b {
		t.Error("Server returned the same client twice")
	}
	if a.Options().Addr != b.Options().Addr {
		t.Errorf("Server: two servers (%s, %s), want one shared", a.Options().Addr, b.Options().Addr)
	}
	if err := a.Set(ctx, redistest.Prefix(t)+"k", "v", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("kind %s at %s", redistest.ServerKind(t), a.Options().Addr)
}

func TestPrefix(t *testing.T) {
	p1, p2 := redistest.Prefix(t), redistest.Prefix(t)
	if p1 == p2 {
		t.Errorf("Prefix returned %q twice", p1)
	}
	if !strings.HasPrefix(p1, "test:TestPrefix:") || !strings.HasSuffix(p1, ":") {
		t.Errorf("Prefix = %q, want test:TestPrefix:...:", p1)
	}
	t.Run("odd name {x} y", func(t *testing.T) {
		if p := redistest.Prefix(t); strings.ContainsAny(p, "{} ") {
			t.Errorf("Prefix = %q: a hash tag or space from the test's name", p)
		}
	})
}

func TestCluster(t *testing.T) {
	ctx := context.Background()
	c := redistest.Cluster(t)
	info, err := c.ClusterInfo(ctx).Result()
	if err != nil || !strings.Contains(info, "cluster_state:ok") {
		t.Fatalf("CLUSTER INFO = %q, %v", info, err)
	}
	var masters atomic.Int32
	if err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		masters.Add(1)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if masters := masters.Load(); masters != 3 {
		t.Errorf("%d masters, want 3", masters)
	}
	// Keys in every slot work: no CROSSSLOT, no MOVED left to the caller.
	p := redistest.Prefix(t)
	for i := range 100 {
		if err := c.Set(ctx, p+string(rune('a'+i%26))+strings.Repeat("x", i), i, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if len(redistest.ClusterAddrs(t)) != 3 {
		t.Errorf("ClusterAddrs = %v", redistest.ClusterAddrs(t))
	}
}

func TestStartStopRestart(t *testing.T) {
	ctx := context.Background()
	in := redistest.Start(t)
	opts := in.Options()
	opts.MaxRetries, opts.DialerRetries = -1, 1
	c := redis.NewClient(opts)
	defer c.Close()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	in.Stop(t)
	in.Stop(t) // twice is fine
	if err := c.Ping(ctx).Err(); err == nil {
		t.Error("PING after Stop: nil error")
	}
	in.Restart(t)
	in.Restart(t) // twice is fine
	if err := c.Ping(ctx).Err(); err != nil {
		t.Errorf("PING after Restart: %v", err)
	}
	if in.Addr() != c.Options().Addr {
		t.Errorf("Addr changed from %s to %s", c.Options().Addr, in.Addr())
	}
}

func TestMiniredis(t *testing.T) {
	ctx := context.Background()
	c, m := redistest.Miniredis(t)
	if err := c.Set(ctx, "k", "v", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	m.FastForward(time.Hour)
	if n := c.Exists(ctx, "k").Val(); n != 0 {
		t.Error("a key outlived FastForward past its TTL")
	}
}

// TestNoBinary: without redis-server on PATH (and no EnvServer), Start falls
// back to miniredis (whose keys expire in real time) and the helpers that
// need a real server or the CLI skip; with the variable that requires Redis,
// they all fail.
func TestNoBinary(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv(redistest.EnvRequire, "")
	t.Setenv(redistest.EnvClusterAddrs, "")
	t.Setenv(redistest.EnvServer, "")
	t.Setenv(redistest.EnvCLI, "")

	t.Run("Start falls back", func(t *testing.T) {
		in := redistest.Start(t)
		if in.Kind() != redistest.KindMiniredis {
			t.Fatalf("Kind = %s, want miniredis", in.Kind())
		}
		ctx := context.Background()
		c := in.Client(t)
		if err := c.Set(ctx, "k", "v", 30*time.Millisecond).Err(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		if n := c.Exists(ctx, "k").Val(); n != 0 {
			t.Error("miniredis fallback: a key outlived its TTL in real time")
		}
		in.Stop(t)
		in.Restart(t)
		if err := c.Ping(ctx).Err(); err != nil {
			t.Errorf("PING after Restart: %v", err)
		}
	})
	skippers := map[string]func(tb *recorder){
		"Cluster":       func(tb *recorder) { redistest.Cluster(tb) },
		"StartSentinel": func(tb *recorder) { redistest.StartSentinel(tb) },
		"ServerBinary":  func(tb *recorder) { redistest.ServerBinary(tb) },
		"CLIBinary":     func(tb *recorder) { redistest.CLIBinary(tb) },
	}
	t.Run("the others skip", func(t *testing.T) {
		for name, fn := range skippers {
			r := run(t, fn)
			if !r.skipped || r.failed || !strings.Contains(r.msg, "redis-") {
				t.Errorf("%s without binaries: skipped %v, failed %v, %q; want a skip that says why", name, r.skipped, r.failed, r.msg)
			}
		}
	})
	t.Run("required", func(t *testing.T) {
		t.Setenv(redistest.EnvRequire, "1")
		skippers["Start"] = func(tb *recorder) { redistest.Start(tb) }
		for name, fn := range skippers {
			if r := run(t, fn); !r.failed || !strings.Contains(r.msg, redistest.EnvRequire) {
				t.Errorf("%s with %s=1 and no binary: failed %v, %q; want a failure", name, redistest.EnvRequire, r.failed, r.msg)
			}
		}
	})
}

// recorder is a testing.TB whose Fatal and Skip end only the goroutine that
// run starts, and are recorded.
type recorder struct {
	testing.TB
	failed, skipped bool
	msg             string
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed, r.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Skipf(format string, args ...any) {
	r.skipped, r.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Log(args ...any) {}

// run calls fn with a recorder on a goroutine of its own and returns the
// recorder once fn has returned or ended the goroutine.
func run(t *testing.T, fn func(tb *recorder)) *recorder {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(r)
	}()
	<-done
	return r
}
