package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterTimeout bounds how long creating a cluster may take.
const clusterTimeout = 60 * time.Second

// cluster is the cluster shared by the test binary.
type cluster struct {
	kind  Kind
	addrs []string
	stop  func()
}

// Cluster returns a new client of the three-master Redis Cluster that the
// tests of this binary share, and closes it when t ends. The cluster is
// three redis-server processes (or EnvServer's) with cluster mode on, joined
// with "redis-cli --cluster create" (or EnvCLI's) on first use, or the
// cluster that EnvClusterAddrs names. Without the redis-server and redis-cli
// binaries it skips the test, or fails it when EnvRequire is set or the
// environment names binaries that are not there (ServerBinary, CLIBinary). Use a key prefix of
// the test's own (Prefix).
func Cluster(t testing.TB) *redis.ClusterClient {
	t.Helper()
	c := redis.NewClusterClient(ClusterOptions(t))
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// ClusterOptions returns the options of a client of the cluster that Cluster
// connects to, for a test that builds its own client. The test closes that
// client itself.
func ClusterOptions(t testing.TB) *redis.ClusterOptions {
	t.Helper()
	c := sharedCluster(t)
	return &redis.ClusterOptions{Addrs: append([]string(nil), c.addrs...)}
}

// ClusterAddrs returns the addresses of the masters of the cluster that
// Cluster connects to (the seed addresses, for an external cluster).
func ClusterAddrs(t testing.TB) []string {
	t.Helper()
	return append([]string(nil), sharedCluster(t).addrs...)
}

// ClusterKind returns what serves Cluster: KindRedisServer or KindExternal.
func ClusterKind(t testing.TB) Kind {
	t.Helper()
	return sharedCluster(t).kind
}

func sharedCluster(t testing.TB) *cluster {
	t.Helper()
	if os.Getenv(EnvClusterAddrs) == "" {
		why := "the test needs a Redis Cluster, which miniredis cannot stand in for (or set " + EnvClusterAddrs + ")"
		logServer(t, needBinary(t, findServer, why))
		needBinary(t, findCLI, why)
	}
	shared.clusterOnce.Do(func() {
		shared.cluster, shared.clusterErr = startCluster()
	})
	if shared.clusterErr != nil {
		t.Fatalf("redistest: %v", shared.clusterErr)
	}
	return shared.cluster
}

func startCluster() (*cluster, error) {
	if v := os.Getenv(EnvClusterAddrs); v != "" {
		var addrs []string
		for _, a := range strings.Split(v, ",") {
			if a = strings.TrimSpace(a); a != "" {
				addrs = append(addrs, a)
			}
		}
		if len(addrs) == 0 {
			return nil, fmt.Errorf("%s=%q names no address", EnvClusterAddrs, v)
		}
		return &cluster{kind: KindExternal, addrs: addrs, stop: func() {}}, nil
	}
	var err error
	for range 3 { // a port taken between picking and binding: try again
		var c *cluster
		if c, err = createCluster(); err == nil {
			return c, nil
		}
	}
	return nil, err
}

// createCluster starts three cluster-mode servers, joins them with the CLI's
// --cluster create, and waits until every node says the cluster
// is ok.
func createCluster() (_ *cluster, err error) {
	root, err := memTempDir("redistest-cluster-")
	if err != nil {
		return nil, err
	}
	var procs []*proc
	stop := func() {
		for _, p := range procs {
			p.kill()
		}
		_ = os.RemoveAll(root)
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()

	var addrs []string
	for i := range 3 {
		dir := filepath.Join(root, strconv.Itoa(i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, err
		}
		p, err := startServer(dir, 0,
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "5000")
		if err != nil {
			return nil, err
		}
		procs = append(procs, p)
		addrs = append(addrs, p.addr())
	}

	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	cli, err := findCLI()
	if err != nil {
		return nil, err
	}
	out, err := exec.CommandContext(ctx, cli.Path, args...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s --cluster create: %w: %s", filepath.Base(cli.Path), err, out)
	}
	if err := waitClusterOK(ctx, addrs); err != nil {
		return nil, err
	}
	return &cluster{kind: KindRedisServer, addrs: addrs, stop: stop}, nil
}

// waitClusterOK waits until every node reports cluster_state:ok, all slots
// served and every node known.
func waitClusterOK(ctx context.Context, addrs []string) error {
	want := []string{
		"cluster_state:ok",
		"cluster_slots_ok:16384",
		"cluster_known_nodes:" + strconv.Itoa(len(addrs)),
	}
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1})
		var info string
		var err error
		for ok := false; !ok; {
			info, err = c.ClusterInfo(ctx).Result()
			ok = err == nil && containsAll(info, want)
			if ok {
				break
			}
			select {
			case <-ctx.Done():
				_ = c.Close()
				return fmt.Errorf("cluster node %s not ok: %w (last CLUSTER INFO: %v %q)",
					addr, errors.Join(ctx.Err(), err), err, info)
			case <-time.After(20 * time.Millisecond):
			}
		}
		_ = c.Close()
	}
	return nil
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
