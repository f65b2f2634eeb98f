package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

// The environment variables this package reads.
const (
	// EnvURL points Server at an existing server: a redis:// or rediss://
	// URL.
	EnvURL = "IDEMPOTENCY_TEST_REDIS_URL"
	// EnvClusterAddrs points Cluster at an existing cluster: comma-separated
	// host:port seed addresses.
	EnvClusterAddrs = "IDEMPOTENCY_TEST_REDIS_CLUSTER_ADDRS"
	// EnvRequire, set to 1 (or true), makes a missing redis-server or
	// redis-cli binary fail the test instead of falling back or skipping.
	EnvRequire = "IDEMPOTENCY_TEST_REQUIRE_REDIS"
	// EnvServer names the server binary to start instead of redis-server
	// on PATH: a path, or a name looked up on PATH. Valkey's valkey-server
	// is one. A binary it names that is missing, or whose --version is not
	// a Redis or Valkey server's, fails the test (no fallback, no skip).
	EnvServer = "IDEMPOTENCY_TEST_REDIS_SERVER"
	// EnvCLI names the CLI binary (for --cluster create) instead of the one
	// beside EnvServer's server ("server" replaced by "cli" in its name:
	// valkey-server's valkey-cli), or redis-cli on PATH without EnvServer.
	EnvCLI = "IDEMPOTENCY_TEST_REDIS_CLI"
)

// Kind says what serves a test's Redis.
type Kind string

// The kinds of server.
const (
	// KindRedisServer is a server process this package started:
	// redis-server, or the binary EnvServer names.
	KindRedisServer Kind = "redis-server"
	// KindExternal is a server or cluster named by EnvURL or
	// EnvClusterAddrs.
	KindExternal Kind = "external"
	// KindMiniredis is miniredis, the embedded fallback.
	KindMiniredis Kind = "miniredis"
)

// fallbackMessage is logged by every test that gets miniredis instead of
// redis-server.
const fallbackMessage = "redistest: no redis-server on PATH: using miniredis, an embedded Redis that is not the real thing " +
	"(install redis-server to test against Redis; set " + EnvRequire + "=1 to make this a failure)"

// required reports whether EnvRequire is set.
func required() bool {
	v := strings.ToLower(strings.TrimSpace(os.Getenv(EnvRequire)))
	return v == "1" || v == "true" || v == "yes"
}

// standalone is the server shared by the test binary.
type standalone struct {
	kind Kind
	opts redis.Options
	stop func()
}

// The servers shared by the tests of one binary, started on first use and
// stopped by Main.
var shared struct {
	standaloneOnce sync.Once
	standalone     *standalone
	standaloneErr  error

	clusterOnce sync.Once
	cluster     *cluster
	clusterErr  error
}

// sharedStandalone returns the shared standalone server, starting it on first
// use.
func sharedStandalone(t testing.TB) *standalone {
	t.Helper()
	if os.Getenv(EnvURL) == "" {
		b, err := findServer()
		switch {
		case err == nil:
			logServer(t, b)
		case !errors.Is(err, errNoDefault):
			t.Fatalf("redistest: %v", err)
		case required():
			t.Fatalf("redistest: %s=1 but %v", EnvRequire, err)
		}
	}
	shared.standaloneOnce.Do(func() {
		shared.standalone, shared.standaloneErr = startStandalone()
	})
	if shared.standaloneErr != nil {
		t.Fatalf("redistest: %v", shared.standaloneErr)
	}
	if shared.standalone.kind == KindMiniredis {
		t.Log(fallbackMessage)
	}
	return shared.standalone
}

func startStandalone() (*standalone, error) {
	if url := os.Getenv(EnvURL); url != "" {
		opts, err := redis.ParseURL(url)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", EnvURL, err)
		}
		if err := ping(context.Background(), opts); err != nil {
			return nil, fmt.Errorf("%s=%s: %w", EnvURL, url, err)
		}
		return &standalone{kind: KindExternal, opts: *opts, stop: func() {}}, nil
	}
	if _, err := findServer(); errors.Is(err, errNoDefault) {
		m, err := startMiniredis(true)
		if err != nil {
			return nil, err
		}
		return &standalone{kind: KindMiniredis, opts: redis.Options{Addr: m.m.Addr()}, stop: m.close}, nil
	}
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, err
	}
	p, err := startServer(dir, 0)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return &standalone{
		kind: KindRedisServer,
		opts: redis.Options{Addr: p.addr()},
		stop: func() {
			p.kill()
			_ = os.RemoveAll(dir)
		},
	}, nil
}

// Server returns a new client of the standalone Redis server that the tests
// of this binary share, and closes it when t ends. The server is a
// redis-server process started on first use, the server EnvURL names, or
// miniredis when there is no redis-server binary (see the package
// documentation). Use a key prefix of the test's own (Prefix).
func Server(t testing.TB) *redis.Client {
	t.Helper()
	return newClient(t, ServerOptions(t))
}

// ServerOptions returns the options of a client of the server that Server
// connects to, for a test that builds its own client (with a hook, or other
// timeouts). The test closes that client itself.
func ServerOptions(t testing.TB) *redis.Options {
	t.Helper()
	opts := sharedStandalone(t).opts
	return &opts
}

// ServerKind returns what serves Server: KindRedisServer, KindExternal or
// KindMiniredis.
func ServerKind(t testing.TB) Kind {
	t.Helper()
	return sharedStandalone(t).kind
}

// Prefix returns a Redis key prefix for t alone: "test:", the test's name,
// and a random part, ending with ":". Tests that share a server keep to
// their own prefix and so never see each other's keys.
func Prefix(t testing.TB) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-', r == '.', r == '/':
			return r
		}
		return '_'
	}, t.Name())
	return "test:" + name + ":" + hex.EncodeToString(b[:]) + ":"
}

// newClient returns a client with opts, closed when t ends.
func newClient(t testing.TB, opts *redis.Options) *redis.Client {
	t.Helper()
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestingM is what Main wraps: *testing.M, and what goleak.VerifyTestMain
// takes.
type TestingM interface {
	Run() int
}

// Main wraps m so that its Run, after running the tests, stops the servers
// that Server and Cluster started and removes their directories:
//
//	func TestMain(m *testing.M) {
//		goleak.VerifyTestMain(redistest.Main(m))
//	}
//
// or, without goleak, os.Exit(redistest.Main(m).Run()).
func Main(m TestingM) TestingM {
	return mainFunc(func() int {
		code := m.Run()
		stopShared()
		return code
	})
}

type mainFunc func() int

func (f mainFunc) Run() int { return f() }

// stopShared stops the shared servers. Tests that run after it start them
// anew.
func stopShared() {
	if s := shared.standalone; s != nil {
		s.stop()
	}
	if c := shared.cluster; c != nil {
		c.stop()
	}
	shared.standaloneOnce = sync.Once{}
	shared.standalone, shared.standaloneErr = nil, nil
	shared.clusterOnce = sync.Once{}
	shared.cluster, shared.clusterErr = nil, nil
}

// CommandStat returns one field of command's line in the server's INFO
// commandstats (calls, rejected_calls, failed_calls, ...): 0 when the
// server has not run command (it has no line then).
func CommandStat(ctx context.Context, c *redis.Client, command, field string) (int, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(info) {
		rest, ok := strings.CutPrefix(line, "cmdstat_"+command+":")
		if !ok {
			continue
		}
		for kv := range strings.SplitSeq(strings.TrimSpace(rest), ",") {
			if v, ok := strings.CutPrefix(kv, field+"="); ok {
				return strconv.Atoi(v)
			}
		}
		return 0, fmt.Errorf("redistest: no %s in %q", field, line)
	}
	return 0, nil
}
