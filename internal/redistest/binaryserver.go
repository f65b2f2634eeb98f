package redistest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// This file starts servers from binaries that the test names, not from the
// one EnvServer selects for every helper: a setup that mixes two servers
// (a Redis 7.0 master and a Valkey 8.0.1 replica, the reliability suite's
// server upgrade by failover) needs both in one test binary.

// BinaryAt returns the server binary at path (a path, or a name looked up
// on PATH) with the product and release its --version names. It returns an
// error when there is none, or when it is not a Redis or Valkey server.
func BinaryAt(path string) (Binary, error) {
	p, err := exec.LookPath(path)
	if err != nil {
		return Binary{}, err
	}
	return serverVersion(p)
}

// startServerWith is startServer with the server binary bin instead of
// EnvServer's: it starts bin in dir on a free port (another one when the
// port it picked was taken meanwhile), with the arguments of every server
// of this package and then extra, and returns once it answers PING.
func startServerWith(bin, dir string, extra ...string) (*proc, error) {
	var err error
	for range 5 {
		var port int
		if port, err = freePort(false); err != nil {
			return nil, err
		}
		var p *proc
		if p, err = spawnBinary(bin, dir, port, extra); err == nil {
			return p, nil
		}
	}
	return nil, err
}

// mixedSyncTimeout bounds a replica's first full sync in StartSentinelOf:
// a Redis 7.0 master delays a diskless sync by 5s (repl-diskless-sync-delay)
// to gather replicas, and -race on two busy cores slows the rest.
const mixedSyncTimeout = 30 * time.Second

// StartSentinelOf starts, for t alone, what StartSentinel starts (a master,
// one replica in sync with it, and a sentinel with a quorum of 1 that knows
// both) from the binaries the test names: the master from master, the
// replica from replica, and the sentinel from sentinel (a server binary,
// run with --sentinel). It kills them when t ends and fails t when a
// server does not start or the replica does not sync. Failover waits for
// the former master to become the new master's replica in sync, which a
// newer replica's data format may forbid: see Promote.
func StartSentinelOf(t testing.TB, master, replica, sentinel string) *Sentinel {
	t.Helper()
	root := MemDir(t)
	s := &Sentinel{}
	t.Cleanup(s.stop)
	for i, bin := range []string{master, replica} {
		dir := filepath.Join(root, strconv.Itoa(i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		var extra []string
		if i > 0 {
			extra = []string{"--replicaof", "127.0.0.1", strconv.Itoa(s.servers[0].port)}
		}
		var err error
		if s.servers[i], err = startServerWith(bin, dir, extra...); err != nil {
			t.Fatalf("start the sentinel setup's server %d (%s): %v", i, bin, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), mixedSyncTimeout)
	defer cancel()
	if err := waitReplicaInSync(ctx, s.servers[1].addr()); err != nil {
		t.Fatalf("%v; the replica's log: %s", err, tail(s.logPath(s.servers[1])))
	}
	dir := filepath.Join(root, "sentinel")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var err error
	for range 5 { // a port taken between picking it and binding it: again
		if s.sentinel, err = startSentinelWith(sentinel, dir, s.servers[0].addr()); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("start the sentinel (%s): %v", sentinel, err)
	}
	if err := s.waitReplicaKnown(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// Promote makes the sentinel fail the master over to the replica (SENTINEL
// FAILOVER) and returns once the sentinel has announced it
// (+switch-master), names the replica, and the replica is a master. Unlike
// Failover it does not wait for the former master to follow the new one:
// a Redis 7.0 cannot load the RDB of a Valkey 8.0.1 (format 11; 7.0 reads
// up to 10), so after a server upgrade by failover it never gets in sync.
// FormerMasterSync says how it fared.
func (s *Sentinel) Promote(ctx context.Context) (FailoverResult, error) {
	before, err := s.Master(ctx)
	if err != nil {
		return FailoverResult{}, err
	}
	c := s.client()
	defer c.Close()
	sub := c.Subscribe(ctx, "+switch-master")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		return FailoverResult{}, fmt.Errorf("SUBSCRIBE +switch-master: %w", err)
	}
	if err := c.Failover(ctx, SentinelMaster).Err(); err != nil {
		return FailoverResult{}, fmt.Errorf("SENTINEL FAILOVER: %w", err)
	}
	var res FailoverResult
	select {
	case <-sub.Channel():
		res.Announced = time.Now()
	case <-ctx.Done():
		return FailoverResult{}, fmt.Errorf("no +switch-master from the sentinel: %w", ctx.Err())
	}
	for {
		if res.Master, err = s.Master(ctx); err == nil && res.Master != before {
			break
		}
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			return FailoverResult{}, fmt.Errorf("the sentinel still names %s as the master: %w", before, err)
		}
	}
	if err := waitRole(ctx, res.Master, "master"); err != nil {
		return FailoverResult{}, err
	}
	return res, nil
}

// SyncResult is how a former master fared as the new master's replica.
type SyncResult struct {
	// InSync says that its link to the new master is up.
	InSync bool
	// Refused is the line of its log that says why it could not load the
	// new master's data ("Can't handle RDB format version 11"), when it
	// could not.
	Refused string
	// Keys is how many keys it holds (DBSIZE) once it is in sync or has
	// refused: a replica that failed to load its master's data has flushed
	// its own first.
	Keys int64
}

// syncRefusals are the log lines of a replica that failed to load its
// master's RDB: the cause first (Redis 7.0 and Valkey), then the outcome.
var syncRefusals = []string{"Can't handle RDB format version", "Failed trying to load the MASTER synchronization"}

// FormerMasterSync waits until the sentinel has made former, the master
// before Promote, a replica of master (the sentinel's +convert-to-slave,
// some seconds after the promotion), and then until its link is up or its
// log says that it refused the new master's data, and returns which. An
// error means neither happened before ctx ended.
func (s *Sentinel) FormerMasterSync(ctx context.Context, former, master string) (SyncResult, error) {
	var p *proc
	for _, sp := range s.servers {
		if sp.addr() == former {
			p = sp
		}
	}
	if p == nil {
		return SyncResult{}, fmt.Errorf("%s is not a server of this setup", former)
	}
	c := redis.NewClient(&redis.Options{Addr: former, MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second})
	defer c.Close()
	host, port, _ := net.SplitHostPort(master)
	converted := []string{"role:slave\r\n", "master_host:" + host + "\r\n", "master_port:" + port + "\r\n"}
	var last string
	for {
		info, err := c.Info(ctx, "replication").Result()
		if err == nil && containsAll(info, converted) {
			var res SyncResult
			if containsAll(info, []string{"master_link_status:up"}) {
				res.InSync = true
			} else {
				res.Refused = logLine(s.logPath(p), syncRefusals)
			}
			if res.InSync || res.Refused != "" {
				res.Keys, err = c.DBSize(ctx).Result()
				return res, err
			}
		}
		last = fmt.Sprint(info, err)
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return SyncResult{}, fmt.Errorf("the former master %s is not a replica of %s in sync, and its log says no refusal (last: %q): %w",
				former, master, last, err)
		}
	}
}

// logPath returns the log file of a server of the setup.
func (s *Sentinel) logPath(p *proc) string {
	return filepath.Join(p.dir, "redis-"+strconv.Itoa(p.port)+".log")
}

// logLine returns, from the first line of the file at path that contains
// one of subs (the first of subs first), the text from that sub on,
// without the process id and time; "" when none does or there is no file.
func logLine(path string, subs []string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	found := make([]string, len(subs))
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		for i, sub := range subs {
			if j := strings.Index(sc.Text(), sub); found[i] == "" && j >= 0 {
				found[i] = sc.Text()[j:]
			}
		}
	}
	for _, l := range found {
		if l != "" {
			return l
		}
	}
	return ""
}
