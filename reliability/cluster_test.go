//go:build linux

package reliability_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/internal/redistest"
)

// A Redis Cluster of three masters with one replica each, of one test's own:
// internal/redistest's shared cluster has no replicas and does not let a
// test kill one of its processes, and a failover needs both.

// nodeTimeout is the cluster's node timeout: how long a master must be
// unreachable before the cluster fails it over.
const nodeTimeout = 1000 * time.Millisecond

// node is one redis-server of a test cluster.
type node struct{ proc *redistest.Process }

func (n *node) addr() string { return n.proc.Addr() }

// kill kills the process with SIGKILL and waits for it to exit.
func (n *node) kill() { n.proc.Kill() }

// testCluster is a cluster of three masters and three replicas.
type testCluster struct {
	nodes []*node
}

// startCluster starts a cluster for t alone and kills it when t ends. It
// skips t without redis-server and redis-cli, or fails it when
// IDEMPOTENCY_TEST_REQUIRE_REDIS is set (redistest.ServerBinary and
// CLIBinary, which IDEMPOTENCY_TEST_REDIS_SERVER points at another server).
func startCluster(t *testing.T) *testCluster {
	t.Helper()
	redistest.ServerBinary(t)
	cli := redistest.CLIBinary(t).Path
	var err error
	for range 3 { // a port taken between picking it and binding it: again
		var c *testCluster
		if c, err = createCluster(t, cli); err == nil {
			return c
		}
	}
	t.Fatalf("start a cluster: %v", err)
	return nil
}

func createCluster(t *testing.T, cli string) (*testCluster, error) {
	root := redistest.MemDir(t)
	c := &testCluster{}
	ok := false
	defer func() {
		if !ok {
			c.stop()
		}
	}()
	for i := range 6 {
		dir := filepath.Join(root, strconv.Itoa(i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, err
		}
		n, err := startNode(dir)
		if err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, n)
	}
	args := []string{"--cluster", "create"}
	for _, n := range c.nodes {
		args = append(args, n.addr())
	}
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%s --cluster create: %w: %s", cli, err, out)
	}
	if err := c.waitHealthy(ctx); err != nil {
		return nil, err
	}
	ok = true
	t.Cleanup(c.stop)
	return c, nil
}

func (c *testCluster) stop() {
	for _, n := range c.nodes {
		n.kill()
	}
}

// startNode starts one cluster-mode redis-server in dir on a free port
// (whose bus port, +10000, is free too) and waits until it answers PING.
func startNode(dir string) (*node, error) {
	p, err := redistest.StartProcess(dir,
		"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", strconv.Itoa(int(nodeTimeout/time.Millisecond)),
		// A failed master stops its own slots only, not the whole cluster.
		"--cluster-require-full-coverage", "no")
	if err != nil {
		return nil, err
	}
	return &node{proc: p}, nil
}

// client returns a plain client of one node, for the checks below.
func (n *node) client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: n.addr(), MaxRetries: -1, DialerRetries: 1, DialTimeout: 200 * time.Millisecond})
}

// waitHealthy waits until every node sees six nodes, all slots served and
// the cluster ok, and every replica's link to its master is up.
func (c *testCluster) waitHealthy(ctx context.Context) error {
	for _, n := range c.nodes {
		cl := n.client()
		for {
			info, err := cl.ClusterInfo(ctx).Result()
			repl, err2 := cl.Info(ctx, "replication").Result()
			if err == nil && err2 == nil &&
				strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_slots_ok:16384") &&
				strings.Contains(info, "cluster_known_nodes:6") &&
				(strings.Contains(repl, "role:master") || strings.Contains(repl, "master_link_status:up")) {
				break
			}
			select {
			case <-ctx.Done():
				_ = cl.Close()
				return fmt.Errorf("cluster node %s not healthy: %v %v\n%s\n%s", n.addr(), err, err2, info, repl)
			case <-time.After(50 * time.Millisecond):
			}
		}
		_ = cl.Close()
	}
	return nil
}

// addrs returns every node's address.
func (c *testCluster) addrs() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.addr())
	}
	return out
}

// clusterNode is a line of CLUSTER NODES.
type clusterNode struct {
	id, addr, master string
	isMaster         bool
	failed           bool
	slots            [][2]int
}

// nodesView returns CLUSTER NODES as n sees it.
func nodesView(ctx context.Context, n *node) ([]clusterNode, error) {
	cl := n.client()
	defer cl.Close()
	s, err := cl.ClusterNodes(ctx).Result()
	if err != nil {
		return nil, err
	}
	var out []clusterNode
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		cn := clusterNode{id: f[0], addr: strings.SplitN(f[1], "@", 2)[0], master: f[3],
			isMaster: strings.Contains(f[2], "master"), failed: strings.Contains(f[2], "fail")}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue // a slot being migrated
			}
			lo, hi, found := strings.Cut(r, "-")
			a, _ := strconv.Atoi(lo)
			b := a
			if found {
				b, _ = strconv.Atoi(hi)
			}
			cn.slots = append(cn.slots, [2]int{a, b})
		}
		out = append(out, cn)
	}
	return out, nil
}

// masterWithReplica returns a master, its replica and the master's slots.
func (c *testCluster) masterWithReplica(t *testing.T) (victim, replica *node, slots [][2]int) {
	t.Helper()
	view, err := nodesView(context.Background(), c.nodes[0])
	if err != nil {
		t.Fatal(err)
	}
	byAddr := map[string]*node{}
	for _, n := range c.nodes {
		byAddr[n.addr()] = n
	}
	for _, m := range view {
		if !m.isMaster || len(m.slots) == 0 {
			continue
		}
		for _, r := range view {
			if r.master == m.id {
				return byAddr[m.addr], byAddr[r.addr], m.slots
			}
		}
	}
	t.Fatalf("no master with a replica in %+v", view)
	return nil, nil, nil
}

// waitPromoted waits until replica is a master that serves slots, as every
// live node sees it, and returns how long that took.
func (c *testCluster) waitPromoted(t *testing.T, replica *node, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		done := true
		for _, n := range c.nodes {
			select {
			case <-n.proc.Exited():
				continue // the victim
			default:
			}
			view, err := nodesView(ctx, n)
			if err != nil {
				done = false
				break
			}
			promoted := false
			for _, cn := range view {
				if cn.addr == replica.addr() && cn.isMaster && !cn.failed && len(cn.slots) > 0 {
					promoted = true
				}
			}
			if !promoted {
				done = false
				break
			}
		}
		if done {
			return time.Since(start)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("replica %s not promoted within %v", replica.addr(), timeout)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
