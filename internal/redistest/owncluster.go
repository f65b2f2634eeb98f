package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// OwnCluster is a Redis Cluster of one test's own, with no replicas until
// the test adds some, that the test may change while it serves: add a
// master or a replica, move slots between masters with the CLI's --cluster
// reshard and rebalance, empty a master and remove it (del-node), or kill
// one. The shared cluster of Cluster must stay
// as it is for every test of the binary, so a test that reshards starts one
// of these. Its methods are safe for concurrent use, but the CLI operations
// (Reshard, Rebalance, AddMaster, Remove) run one at a time.
type OwnCluster struct {
	cli  string
	root string

	op sync.Mutex // one CLI operation at a time

	mu    sync.Mutex
	nodes []*ClusterNode // every node started, removed ones too
	next  int            // the name of the next node's directory
}

// ClusterNode is one redis-server of an OwnCluster.
type ClusterNode struct {
	proc   *proc
	id     string
	member bool // joined, and not del-node'd or killed since
}

// Addr returns the node's address, 127.0.0.1:port.
func (n *ClusterNode) Addr() string { return n.proc.addr() }

// ID returns the node's cluster node ID.
func (n *ClusterNode) ID() string { return n.id }

// ownNodeTimeout is an OwnCluster's cluster-node-timeout: short, so that a
// killed master is failed within seconds, long enough that a loaded test
// machine does not fail a live one.
const ownNodeTimeout = 2000 * time.Millisecond

// NewCluster starts a Redis Cluster of masters masters (no replicas) for t
// alone, joined with the CLI's --cluster create, waits until every node
// agrees that it is ok, and kills it when t ends. extra are more arguments
// of every server (say "--cluster-require-full-coverage", "no"). It skips t
// without redis-server and redis-cli, or fails it when EnvRequire is set
// (ServerBinary, CLIBinary). It never uses EnvClusterAddrs: the test
// changes the cluster it gets.
func NewCluster(t testing.TB, masters int, extra ...string) *OwnCluster {
	t.Helper()
	ServerBinary(t)
	c := &OwnCluster{cli: CLIBinary(t).Path, root: MemDir(t)}
	t.Cleanup(c.stop)
	for range masters {
		n, err := c.start(extra)
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		n.member = true
	}
	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	if out, err := exec.CommandContext(ctx, c.cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: %s --cluster create: %v: %s", filepath.Base(c.cli), err, out)
	}
	if err := c.waitConverged(ctx); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return c
}

// start starts one cluster-mode server and reads its node ID.
func (c *OwnCluster) start(extra []string) (*ClusterNode, error) {
	c.mu.Lock()
	dir := filepath.Join(c.root, strconv.Itoa(c.next))
	c.next++
	c.mu.Unlock()
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	args := append([]string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", strconv.Itoa(int(ownNodeTimeout / time.Millisecond)),
	}, extra...)
	p, err := startServer(dir, 0, args...)
	if err != nil {
		return nil, err
	}
	n := &ClusterNode{proc: p}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	cl := nodeClient(n.Addr())
	defer cl.Close()
	if n.id, err = cl.ClusterMyID(ctx).Result(); err != nil {
		p.kill()
		return nil, fmt.Errorf("CLUSTER MYID of %s: %w", n.Addr(), err)
	}
	c.mu.Lock()
	c.nodes = append(c.nodes, n)
	c.mu.Unlock()
	return n, nil
}

func (c *OwnCluster) stop() {
	c.mu.Lock()
	nodes := slices.Clone(c.nodes)
	c.mu.Unlock()
	for _, n := range nodes {
		n.proc.kill()
	}
}

// nodeClient returns a plain client of one node that tries once.
func nodeClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second})
}

// live returns the nodes that are in the cluster: joined, and not removed
// or killed.
func (c *OwnCluster) live() []*ClusterNode {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*ClusterNode
	for _, n := range c.nodes {
		if n.member {
			out = append(out, n)
		}
	}
	return out
}

// Addrs returns the addresses of the nodes in the cluster: seed addresses
// for a client.
func (c *OwnCluster) Addrs() []string {
	var out []string
	for _, n := range c.live() {
		out = append(out, n.Addr())
	}
	return out
}

// Nodes returns the nodes in the cluster, in the order they were started.
func (c *OwnCluster) Nodes() []*ClusterNode { return c.live() }

// Slots returns how many hash slots n serves, as n itself sees it.
func (c *OwnCluster) Slots(t testing.TB, n *ClusterNode) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	view, err := slotView(ctx, n.Addr())
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	count := 0
	for _, id := range view.owner {
		if id == n.id {
			count++
		}
	}
	return count
}

// AddMaster starts a server, adds it to the cluster as an empty master
// (--cluster add-node), and returns it once every node knows it.
func (c *OwnCluster) AddMaster(t testing.TB, extra ...string) *ClusterNode {
	t.Helper()
	c.op.Lock()
	defer c.op.Unlock()
	seed := c.live()[0]
	n, err := c.start(extra)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	c.run(t, func() { n.member = true }, "add-node", n.Addr(), seed.Addr())
	return n
}

// AddReplica starts a server, has it meet master of and replicate it
// (CLUSTER MEET, CLUSTER REPLICATE), and returns it once its link to of is
// up and every node knows it. The replica connects to the address of
// announces (cluster-announce-ip and -port), as every node would; once of
// is killed, the cluster's own failover promotes one of its replicas.
func (c *OwnCluster) AddReplica(t testing.TB, of *ClusterNode, extra ...string) *ClusterNode {
	t.Helper()
	c.op.Lock()
	defer c.op.Unlock()
	n, err := c.start(extra)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	cl := nodeClient(n.Addr())
	defer cl.Close()
	host, port, _ := strings.Cut(of.Addr(), ":")
	if err := cl.ClusterMeet(ctx, host, port).Err(); err != nil {
		t.Fatalf("redistest: CLUSTER MEET %s from %s: %v", of.Addr(), n.Addr(), err)
	}
	// CLUSTER REPLICATE needs of known by its ID, once the handshake is
	// over, at the address of announces (which the new node learns from
	// of's own messages, after the MEET's address); then the replica's
	// link must come up.
	announced, err := nodeAddress(ctx, of.Addr(), of.id)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	for {
		seen, err := nodeAddress(ctx, n.Addr(), of.id)
		if err == nil && seen == announced {
			err = cl.Do(ctx, "cluster", "replicate", of.id).Err()
		} else if err == nil {
			err = fmt.Errorf("%s knows %s at %s, not at %s", n.Addr(), of.id, seen, announced)
		}
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("redistest: CLUSTER REPLICATE %s on %s: %v", of.id, n.Addr(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	for {
		info, err := cl.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("redistest: the replica %s of %s has no link up: %v\n%s", n.Addr(), of.Addr(), err, info)
		case <-time.After(50 * time.Millisecond):
		}
	}
	c.mu.Lock()
	n.member = true
	c.mu.Unlock()
	if err := c.waitConverged(ctx); err != nil {
		t.Fatalf("redistest: after adding the replica %s of %s: %v", n.Addr(), of.Addr(), err)
	}
	return n
}

// nodeAddress returns the address (ip:port@cport) at which the node at
// addr knows the node of ID id, as its CLUSTER NODES says.
func nodeAddress(ctx context.Context, addr, id string) (string, error) {
	cl := nodeClient(addr)
	defer cl.Close()
	s, err := cl.ClusterNodes(ctx).Result()
	if err != nil {
		return "", fmt.Errorf("CLUSTER NODES of %s: %w", addr, err)
	}
	for _, line := range strings.Split(s, "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[0] == id && !strings.Contains(f[2], "handshake") {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("%s does not know %s yet", addr, id)
}

// Reshard moves slots hash slots, with their keys, from master from to
// master to (--cluster reshard), and returns once every node agrees on the
// new owners.
func (c *OwnCluster) Reshard(t testing.TB, from, to *ClusterNode, slots int) {
	t.Helper()
	c.op.Lock()
	defer c.op.Unlock()
	c.run(t, nil, "reshard", to.Addr(), "--cluster-from", from.id, "--cluster-to", to.id,
		"--cluster-slots", strconv.Itoa(slots), "--cluster-yes")
}

// MoveSlot moves hash slot slot, with its keys, to master to, as the CLI's
// reshard moves each slot: the target imports it, the owner migrates it,
// its keys are MIGRATEd in batches, and every node is told the new owner
// (CLUSTER SETSLOT ... NODE). It returns once every node agrees.
func (c *OwnCluster) MoveSlot(t testing.TB, slot int, to *ClusterNode) {
	t.Helper()
	c.op.Lock()
	defer c.op.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	if err := c.waitConverged(ctx); err != nil {
		t.Fatalf("redistest: before moving slot %d: %v", slot, err)
	}
	v, err := slotView(ctx, to.Addr())
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	var from *ClusterNode
	for _, n := range c.live() {
		if n.id == v.owner[slot] {
			from = n
		}
	}
	if from == nil {
		t.Fatalf("redistest: slot %d has no owner", slot)
	}
	if from == to {
		return
	}
	src, dst := nodeClient(from.Addr()), nodeClient(to.Addr())
	defer src.Close()
	defer dst.Close()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("redistest: move slot %d from %s to %s: %v", slot, from.Addr(), to.Addr(), err)
		}
	}
	must(dst.Do(ctx, "cluster", "setslot", slot, "importing", from.id).Err())
	must(src.Do(ctx, "cluster", "setslot", slot, "migrating", to.id).Err())
	host, port, _ := strings.Cut(to.Addr(), ":")
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, 100).Result()
		must(err)
		if len(keys) == 0 {
			break
		}
		args := []any{"migrate", host, port, "", 0, 5000, "keys"}
		for _, k := range keys {
			args = append(args, k)
		}
		must(src.Do(ctx, args...).Err())
	}
	// The target first, as the CLI does: once the source says MOVED, the
	// target must already serve the slot.
	must(dst.Do(ctx, "cluster", "setslot", slot, "node", to.id).Err())
	must(src.Do(ctx, "cluster", "setslot", slot, "node", to.id).Err())
	for _, n := range c.live() {
		if n != from && n != to {
			cl := nodeClient(n.Addr())
			err := cl.Do(ctx, "cluster", "setslot", slot, "node", to.id).Err()
			_ = cl.Close()
			must(err)
		}
	}
	if err := c.waitConverged(ctx); err != nil {
		t.Fatalf("redistest: after moving slot %d: %v", slot, err)
	}
}

// SlotOwner returns the master that serves hash slot slot, as the nodes
// agree once the cluster has converged.
func (c *OwnCluster) SlotOwner(t testing.TB, slot int) *ClusterNode {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	if err := c.waitConverged(ctx); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	nodes := c.live()
	v, err := slotView(ctx, nodes[0].Addr())
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	for _, n := range nodes {
		if n.id == v.owner[slot] {
			return n
		}
	}
	t.Fatalf("redistest: slot %d has no owner", slot)
	return nil
}

// Rebalance evens the slots out over the masters, empty ones included
// (--cluster rebalance --cluster-use-empty-masters).
func (c *OwnCluster) Rebalance(t testing.TB) {
	t.Helper()
	c.op.Lock()
	defer c.op.Unlock()
	c.run(t, nil, "rebalance", c.live()[0].Addr(), "--cluster-use-empty-masters")
}

// Remove moves every slot of n to master to (--cluster reshard), then
// removes n from the cluster (--cluster del-node: the others forget it, and
// it is reset to an empty cluster node of its own). Its process keeps
// running, as an operator's would until they shut it down: clients that
// still know its address may ask it; Kill it to end it.
func (c *OwnCluster) Remove(t testing.TB, n, to *ClusterNode) {
	t.Helper()
	if slots := c.Slots(t, n); slots > 0 {
		c.Reshard(t, n, to, slots)
	}
	c.op.Lock()
	defer c.op.Unlock()
	c.run(t, func() { n.member = false }, "del-node", to.Addr(), n.id)
}

// Kill kills n with SIGKILL, as a crash would: a master's slots are then
// not served until the cluster promotes one of its replicas (AddReplica),
// or for good if it has none, and a removed node's address refuses
// connections.
func (c *OwnCluster) Kill(n *ClusterNode) {
	c.mu.Lock()
	n.member = false
	c.mu.Unlock()
	n.proc.kill()
}

// run runs the CLI with --cluster op args, then changes the membership with
// joined (when not nil, under c.mu) and waits until every member agrees on
// the slots' owners. Called with c.op held.
func (c *OwnCluster) run(t testing.TB, joined func(), op string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*clusterTimeout)
	defer cancel()
	// The CLI refuses to start while the nodes disagree (a previous
	// operation's gossip still spreading).
	if err := c.waitConverged(ctx); err != nil {
		t.Fatalf("redistest: before --cluster %s: %v", op, err)
	}
	full := append([]string{"--cluster", op}, args...)
	out, err := exec.CommandContext(ctx, c.cli, full...).CombinedOutput()
	if err != nil || strings.Contains(string(out), "[ERR]") {
		t.Fatalf("redistest: %s %s: %v\n%s", filepath.Base(c.cli), strings.Join(full, " "), err, out)
	}
	if joined != nil {
		c.mu.Lock()
		joined()
		c.mu.Unlock()
	}
	if err := c.waitConverged(ctx); err != nil {
		t.Fatalf("redistest: after --cluster %s: %v", op, err)
	}
}

// view is one node's view of the cluster: the owner of every slot (a node
// ID, "" for none), and whether any slot is being migrated.
type view struct {
	owner     [16384]string
	known     int
	migrating bool
	ok        bool
}

// slotView reads CLUSTER NODES and CLUSTER INFO of the node at addr.
func slotView(ctx context.Context, addr string) (*view, error) {
	cl := nodeClient(addr)
	defer cl.Close()
	s, err := cl.ClusterNodes(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("CLUSTER NODES of %s: %w", addr, err)
	}
	info, err := cl.ClusterInfo(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("CLUSTER INFO of %s: %w", addr, err)
	}
	v := &view{ok: strings.Contains(info, "cluster_state:ok")}
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || slices.Contains(strings.Split(f[2], ","), "fail") {
			continue // a killed node that the cluster has failed is not known
		}
		v.known++
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				v.migrating = true
				continue
			}
			lo, hi, found := strings.Cut(r, "-")
			a, _ := strconv.Atoi(lo)
			b := a
			if found {
				b, _ = strconv.Atoi(hi)
			}
			for i := a; i <= b && i < len(v.owner); i++ {
				v.owner[i] = f[0]
			}
		}
	}
	return v, nil
}

// waitConverged waits until every live node is ok, knows every live node
// (and no other), sees no slot in migration, and agrees with the others on
// the owner of every slot.
func (c *OwnCluster) waitConverged(ctx context.Context) error {
	var last string
	for {
		nodes := c.live()
		var first *view
		same := true
		for _, n := range nodes {
			v, err := slotView(ctx, n.Addr())
			switch {
			case err != nil:
				last, same = err.Error(), false
			case !v.ok || v.migrating || v.known != len(nodes):
				last, same = fmt.Sprintf("node %s: ok %v, migrating %v, knows %d nodes of %d", n.Addr(), v.ok, v.migrating, v.known, len(nodes)), false
			case first == nil:
				first = v
			case v.owner != first.owner:
				last, same = "node "+n.Addr()+" disagrees on the slots' owners", false
			}
			if !same {
				break
			}
		}
		if same {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the cluster did not converge: %s", last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
