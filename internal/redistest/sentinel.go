package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the name under which a Sentinel's sentinel monitors its
// master.
const SentinelMaster = "idemkit"

// Sentinel is a Redis Sentinel setup of one test's own: a master, one
// replica, and one sentinel watching them, each a redis-server process. The
// sentinel's quorum is 1, so SENTINEL FAILOVER (Failover) promotes the
// replica without waiting for other sentinels to agree. The shared servers
// of Server and Cluster are not used: a failover changes which process is
// the master.
type Sentinel struct {
	servers  [2]*proc // the first master and its replica
	sentinel *proc
}

// StartSentinel starts a master, a replica in sync with it, and a sentinel
// that knows both, for t alone, and kills them when t ends. It skips t
// without redis-server, or fails it when EnvRequire is set: miniredis has no
// Sentinel.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	ServerBinary(t) // miniredis has no Sentinel
	root := MemDir(t)
	s := &Sentinel{}
	t.Cleanup(s.stop)
	var err error
	for i := range s.servers {
		dir := filepath.Join(root, strconv.Itoa(i))
		if err = os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		var extra []string
		if i > 0 {
			extra = []string{"--replicaof", "127.0.0.1", strconv.Itoa(s.servers[0].port)}
		}
		if s.servers[i], err = startServer(dir, 0, extra...); err != nil {
			t.Fatalf("start the sentinel setup's server %d: %v", i, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := waitReplicaInSync(ctx, s.servers[1].addr()); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "sentinel")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for range 5 { // a port taken between picking it and binding it: again
		if s.sentinel, err = startSentinelProcess(dir, s.servers[0].addr()); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("start the sentinel: %v", err)
	}
	// A failover needs a replica the sentinel knows: it learns of it from
	// the master's INFO, which it reads on connecting and every 10s.
	if err := s.waitReplicaKnown(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *Sentinel) stop() {
	for _, p := range []*proc{s.sentinel, s.servers[0], s.servers[1]} {
		if p != nil {
			p.kill()
		}
	}
}

// Addrs returns the sentinel's address: what a failover client's
// SentinelAddrs (IDEMPOTENCY_REDIS_SENTINEL_ADDRS) lists.
func (s *Sentinel) Addrs() []string { return []string{s.sentinel.addr()} }

// Master returns the address the sentinel gives for the master now.
func (s *Sentinel) Master(ctx context.Context) (string, error) {
	c := s.client()
	defer c.Close()
	hp, err := c.GetMasterAddrByName(ctx, SentinelMaster).Result()
	if err != nil {
		return "", fmt.Errorf("SENTINEL GET-MASTER-ADDR-BY-NAME: %w", err)
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}

// FailoverResult is what Failover did.
type FailoverResult struct {
	// Master is the promoted replica's address: the new master.
	Master string
	// Announced is when the sentinel announced the failover (the
	// +switch-master message of its Pub/Sub, which go-redis's failover
	// clients wait for to switch), as this process received it.
	Announced time.Time
}

// Failover makes the sentinel fail the master over to the replica
// (SENTINEL FAILOVER) and returns once the replica is the master, answers
// writes, and the sentinel names it, and the former master has become the
// new master's replica in sync. The sentinel reconfigures a former master
// that is still up only some seconds after the promotion (about 20s with
// Redis 7.0: it waits 8s after the former master last reported its role,
// which it reads every 10s); until then that server takes the writes of
// clients that have not switched, which its resynchronisation then drops.
// Failover waits for it so that another Failover can follow, and reports
// when the sentinel announced the switch.
func (s *Sentinel) Failover(ctx context.Context) (FailoverResult, error) {
	before, err := s.Master(ctx)
	if err != nil {
		return FailoverResult{}, err
	}
	res, err := s.Promote(ctx)
	if err != nil {
		return FailoverResult{}, err
	}
	if err := waitReplicaInSync(ctx, before); err != nil {
		return FailoverResult{}, fmt.Errorf("the former master %s: %w", before, err)
	}
	if err := s.waitReplicaKnown(ctx); err != nil {
		return FailoverResult{}, err
	}
	return res, nil
}

func (s *Sentinel) client() *redis.SentinelClient {
	return redis.NewSentinelClient(&redis.Options{Addr: s.sentinel.addr(), MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second})
}

// waitReplicaKnown waits until the sentinel lists a replica of the master
// that is up and linked to it, which SENTINEL FAILOVER needs.
func (s *Sentinel) waitReplicaKnown(ctx context.Context) error {
	return WaitSentinelReplica(ctx, s.sentinel.addr())
}

// StartSentinelProcess starts a sentinel in dir on a free port, monitoring
// the master at masterAddr under SentinelMaster with a quorum of 1 and a
// down-after of 1s, as StartSentinel's: for a test that builds its master
// and replicas itself (a replication link through a fault proxy, say). The
// caller kills it.
func StartSentinelProcess(dir, masterAddr string) (*Process, error) {
	var err error
	for range 5 { // a port taken between picking it and binding it: again
		var p *proc
		if p, err = startSentinelProcess(dir, masterAddr); err == nil {
			return &Process{p: p}, nil
		}
	}
	return nil, err
}

// WaitSentinelReplica waits until the sentinel at addr lists a replica of
// SentinelMaster that is up and linked to it, which a failover needs.
func WaitSentinelReplica(ctx context.Context, addr string) error {
	c := redis.NewSentinelClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second})
	defer c.Close()
	var last string
	for {
		replicas, err := c.Replicas(ctx, SentinelMaster).Result()
		if err == nil {
			for _, r := range replicas {
				if r["flags"] == "slave" && r["master-link-status"] == "ok" {
					return nil
				}
			}
			last = fmt.Sprint(replicas)
		} else {
			last = err.Error()
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return fmt.Errorf("the sentinel knows no replica in sync (last: %s): %w", last, err)
		}
	}
}

// startSentinelProcess starts the server binary (redis-server, or
// EnvServer's: valkey-server takes --sentinel too) in sentinel mode in dir, on a
// free port, monitoring the master at masterAddr with a quorum of 1.
func startSentinelProcess(dir, masterAddr string) (*proc, error) {
	bin, err := serverPath()
	if err != nil {
		return nil, err
	}
	return startSentinelWith(bin, dir, masterAddr)
}

// startSentinelWith is startSentinelProcess with the server binary bin.
func startSentinelWith(bin, dir, masterAddr string) (*proc, error) {
	port, err := freePort(false)
	if err != nil {
		return nil, err
	}
	host, masterPort, _ := net.SplitHostPort(masterAddr)
	conf := filepath.Join(dir, "sentinel.conf")
	logPath := filepath.Join(dir, "sentinel-"+strconv.Itoa(port)+".log")
	// down-after and failover-timeout are short so that the tests' failovers
	// take seconds; the sentinel rewrites this file as it learns.
	text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n"+
		"sentinel monitor %s %s %s 1\n"+
		"sentinel down-after-milliseconds %s 1000\n"+
		"sentinel failover-timeout %s 5000\n",
		port, dir, logPath, SentinelMaster, host, masterPort, SentinelMaster, SentinelMaster)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		return nil, err
	}
	return startProc(exec.Command(bin, conf, "--sentinel"), dir, port, logPath, filepath.Base(bin)+" --sentinel")
}

// waitReplicaInSync waits until the server at addr is a replica whose link
// to its master is up.
func waitReplicaInSync(ctx context.Context, addr string) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second})
	defer c.Close()
	var last string
	for {
		info, err := c.Info(ctx, "replication").Result()
		if err == nil && containsAll(info, []string{"role:slave", "master_link_status:up"}) {
			return nil
		}
		last = fmt.Sprint(info, err)
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return fmt.Errorf("%s is not a replica in sync (last: %q): %w", addr, last, err)
		}
	}
}

// waitRole waits until the server at addr reports role (INFO replication's
// role: "master" or "slave").
func waitRole(ctx context.Context, addr, role string) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second})
	defer c.Close()
	for {
		info, err := c.Info(ctx, "replication").Result()
		if err == nil && containsAll(info, []string{"role:" + role + "\r\n"}) {
			return nil
		}
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			return fmt.Errorf("%s is not a %s: %w", addr, role, err)
		}
	}
}

// sleep waits for d or until ctx is done, and then returns ctx's error.
func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
