package redisrepo_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/redisrepo"
)

// reply is an error reply of Redis, as go-redis returns one (a redis.Error).
type reply string

func (r reply) Error() string { return string(r) }
func (reply) RedisError()     {}

// fakeCluster stands for a cluster client: it counts the slot map reloads
// asked of it.
type fakeCluster struct{ reloads atomic.Int64 }

func (f *fakeCluster) ReloadState(context.Context) { f.reloads.Add(1) }

var refusedDial = &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}

// TestClusterRetryClassifies: the replies of a resharding are retried (the
// command did not run); a refused dial only on a cluster (a standalone
// server that refuses is down); everything that may have run, or that says
// something final, is not.
func TestClusterRetryClassifies(t *testing.T) {
	cluster := &fakeCluster{}
	for _, c := range []struct {
		err            error
		cluster, plain bool
	}{
		{reply("MOVED 3535 127.0.0.1:7001"), true, true},
		{reply("ASK 3535 127.0.0.1:7001"), true, true},
		{reply("TRYAGAIN Multiple keys request during rehashing of slot"), true, true},
		{reply("CLUSTERDOWN Hash slot not served"), true, true},
		{reply("CLUSTERDOWN The cluster is down"), true, true},
		{reply("LOADING Redis is loading the dataset in memory"), true, true},
		{refusedDial, true, false},
		{nil, false, false},
		{reply("WRONGTYPE Operation against a key holding the wrong kind of value"), false, false},
		{reply("NOSCRIPT No matching script"), false, false},
		{reply("OOM command not allowed when used memory > 'maxmemory'"), false, false},
		{io.EOF, false, false},
		{context.DeadlineExceeded, false, false},
		{&net.OpError{Op: "read", Net: "tcp", Err: errors.New("i/o timeout")}, false, false},
	} {
		if got := redisrepo.ClusterRetry(cluster, c.err); got != c.cluster {
			t.Errorf("on a cluster, retry %v: %v, want %v", c.err, got, c.cluster)
		}
		if got := redisrepo.ClusterRetry(struct{}{}, c.err); got != c.plain {
			t.Errorf("on a standalone client, retry %v: %v, want %v", c.err, got, c.plain)
		}
	}
}

// TestRideThroughUntilAnswered: a command that meets resharding replies is
// sent again, with the slot map reloaded each time, until it is answered.
func TestRideThroughUntilAnswered(t *testing.T) {
	cluster := &fakeCluster{}
	replies := []error{reply("ASK 1 127.0.0.1:7002"), reply("CLUSTERDOWN Hash slot not served"), refusedDial, nil}
	sent := 0
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := redisrepo.RideThrough(ctx, cluster, reply("MOVED 1 127.0.0.1:7001"), func() error {
		sent++
		return replies[sent-1]
	})
	if err != nil || sent != len(replies) {
		t.Fatalf("rideThrough: %v after %d sends, want nil after %d", err, sent, len(replies))
	}
	if n := cluster.reloads.Load(); n != int64(len(replies)) {
		t.Errorf("%d slot map reloads, want one before each of the %d sends", n, len(replies))
	}
}

// TestRideThroughStopsAtAnotherError: an error that is not a resharding's
// ends the retries at once, and is returned as it is.
func TestRideThroughStopsAtAnotherError(t *testing.T) {
	final := reply("WRONGTYPE Operation against a key holding the wrong kind of value")
	sent := 0
	err := redisrepo.RideThrough(context.Background(), &fakeCluster{}, reply("TRYAGAIN Multiple keys request during rehashing of slot"), func() error {
		sent++
		return final
	})
	if !errors.Is(err, final) || sent != 1 {
		t.Fatalf("rideThrough: %v after %d sends, want %v after 1", err, sent, final)
	}
}

// TestRideThroughEndsBeforeTheDeadline: a cluster that keeps answering
// CLUSTERDOWN (an outage: the cluster is down) fails the call with that
// reply within its deadline, not after it.
func TestRideThroughEndsBeforeTheDeadline(t *testing.T) {
	const timeout = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	down := reply("CLUSTERDOWN The cluster is down")
	start := time.Now()
	sent := 0
	err := redisrepo.RideThrough(ctx, &fakeCluster{}, down, func() error { sent++; return down })
	if took := time.Since(start); took > timeout {
		t.Errorf("rideThrough took %v, beyond the deadline (%v)", took, timeout)
	}
	if !errors.Is(err, down) {
		t.Errorf("rideThrough: %v, want the cluster's last reply %v", err, down)
	}
	if sent < 3 {
		t.Errorf("%d sends in %v: want a few (2ms, doubling)", sent, timeout)
	}
}

// TestRideThroughCancelled: a cancelled context ends the retries at once.
func TestRideThroughCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	sent := 0
	err := redisrepo.RideThrough(ctx, &fakeCluster{}, reply("TRYAGAIN Multiple keys request during rehashing of slot"), func() error { sent++; return nil })
	if err == nil || sent != 0 {
		t.Fatalf("rideThrough on a cancelled context: %v after %d sends, want the last reply and none", err, sent)
	}
}
