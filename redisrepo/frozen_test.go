//go:build unix

package redisrepo_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// threeMasters is a Redis Cluster of three masters of one test's own, which
// the test may freeze one at a time.
type threeMasters struct {
	procs [3]*redistest.Process
}

// firstSlot returns the first hash slot that master i of a threeMasters
// serves: each serves a third of the slots, in order.
func firstSlot(i int) int { return i * 16384 / 3 }

// startThreeMasters starts a threeMasters, killed when t ends. Its node
// timeout is long and it serves the slots of the nodes that answer, so that
// a frozen master never takes the others down.
func startThreeMasters(t *testing.T) *threeMasters {
	t.Helper()
	redistest.NeedRedisServer(t)
	ctx := t.Context()
	m := &threeMasters{}
	var nodes [3]*redis.Client
	for i := range m.procs {
		p, err := redistest.StartProcess(redistest.MemDir(t), "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "15000", "--cluster-require-full-coverage", "no")
		if err != nil {
			t.Fatalf("start cluster node %d: %v", i, err)
		}
		t.Cleanup(p.Kill)
		m.procs[i] = p
		nodes[i] = redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, DialerRetries: 1})
		t.Cleanup(func() { _ = nodes[i].Close() })
		last := 16383
		if i < 2 {
			last = firstSlot(i+1) - 1
		}
		if err := nodes[i].ClusterAddSlotsRange(ctx, firstSlot(i), last).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range m.procs[1:] {
		host, port, _ := strings.Cut(p.Addr(), ":")
		if err := nodes[0].ClusterMeet(ctx, host, port).Err(); err != nil {
			t.Fatal(err)
		}
	}
	m.waitOK(t, nodes[:])
	return m
}

// waitOK waits until every node says the cluster is ok and knows all three.
func (m *threeMasters) waitOK(t *testing.T, nodes []*redis.Client) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range nodes {
		for {
			info, err := n.ClusterInfo(t.Context()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_slots_ok:16384") &&
				strings.Contains(info, "cluster_known_nodes:3") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the cluster is not ok: %q, %v", info, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// owner returns the master that serves slot.
func (m *threeMasters) owner(slot int) int {
	i := len(m.procs) - 1
	for slot < firstSlot(i) {
		i--
	}
	return i
}

// client returns a new cluster client of m, as another process would have
// one, closed when t ends.
func (m *threeMasters) client(t *testing.T) *redis.ClusterClient {
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 []string{m.procs[0].Addr(), m.procs[1].Addr(), m.procs[2].Addr()},
		ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { _ = c.Close() })
	// Dial the connections of the round up front: on a busy machine a
	// first dial can take longer than the storage timeout.
	err := c.ForEachMaster(t.Context(), func(ctx context.Context, n *redis.Client) error {
		conns := make([]*redis.Conn, 10)
		for i := range conns {
			conns[i] = n.Conn()
			defer conns[i].Close()
			if err := conns[i].Ping(ctx).Err(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// freeze stops master i with SIGSTOP and returns the func that thaws it,
// which t's cleanup calls too.
func (m *threeMasters) freeze(t *testing.T, i int) (thaw func()) {
	t.Helper()
	p := m.procs[i]
	thaw = sync.OnceFunc(func() {
		if err := p.Signal(syscall.SIGCONT); err != nil {
			t.Errorf("SIGCONT master %d: %v", i, err)
		}
	})
	t.Cleanup(thaw)
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP master %d: %v", i, err)
	}
	return thaw
}

// await receives n values from ch, or fails t after 30s waiting for what.
func await(t *testing.T, ch <-chan struct{}, n int, what string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for range n {
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// outcome is what one call returned.
type outcome struct {
	key int // index of the key
	got charge
	err error
}

// TestFrozenMasterWeakensNoOtherWait: while one master of three is frozen
// (SIGSTOP), waiters of another process on the other masters' keys get the
// holder's result before it thaws, with no run and no storage error, in both
// storage-error modes. They poll only every 20s, so the sharded
// wake-up must carry their waits; each master is frozen in turn, so a
// wake-up through any one node fails a round. Callers on the frozen
// master's keys share the waiters' client; in mode raise none of them runs
// the action.
func TestFrozenMasterWeakensNoOtherWait(t *testing.T) {
	cluster := startThreeMasters(t)
	// One key prefix, so that a wake-up channel of the Store's own would be
	// on the same node in every round.
	prefix := redistest.Prefix(t)
	for _, mode := range []coordinator.OnStorageErrorMode{coordinator.OnStorageErrorRaise, coordinator.OnStorageErrorRun} {
		t.Run(string(mode), func(t *testing.T) {
			for frozen := range 3 {
				t.Run("master"+strconv.Itoa(frozen), func(t *testing.T) {
					testFrozenMaster(t, cluster, prefix, frozen, mode)
				})
			}
		})
	}
}

// testFrozenMaster runs TestFrozenMasterWeakensNoOtherWait with master
// frozen frozen, in mode.
func testFrozenMaster(t *testing.T, cluster *threeMasters, prefix string, frozen int, mode coordinator.OnStorageErrorMode) {
	const (
		liveKeysPerMaster = 4
		frozenKeys        = 2
		waitersPerKey     = 2
		lateCallers       = 2 // calls on the frozen master's keys once it is frozen
		storageTimeout    = 500 * time.Millisecond
		lease             = 6 * time.Second
		pollInterval      = 20 * time.Second
		liveBound         = 8 * time.Second // for the waits on the live masters, while frozen
		freezeFor         = time.Second
	)
	ctx := t.Context()
	holderStore := redisrepo.New(cluster.client(t), redisrepo.WithKeyPrefix(prefix))
	waiterStore := redisrepo.New(cluster.client(t), redisrepo.WithKeyPrefix(prefix))

	// Keys: liveKeysPerMaster on each master that stays up, frozenKeys on
	// the frozen one.
	var keys []idemstore.Key
	live := map[idemstore.Key]bool{}
	perMaster := [3]int{}
	for i := 0; len(keys) < 2*liveKeysPerMaster+frozenKeys; i++ {
		k := idemstore.Key{Operation: "frozen", Key: "k" + strconv.Itoa(i) + "-" + token()[:8]}
		owner := cluster.owner(redisrepo.HashSlot(holderStore.Key(k)))
		want := liveKeysPerMaster
		if owner == frozen {
			want = frozenKeys
		}
		if perMaster[owner] == want {
			continue
		}
		perMaster[owner]++
		keys = append(keys, k)
		live[k] = owner != frozen
	}

	holder, _ := coord(t, holderStore, coordinator.WithLease(lease), coordinator.WithStorageTimeout(storageTimeout))
	collided, watched := make(chan struct{}, 1000), make(chan struct{}, 1000)
	var liveErrors, liveUnprotected atomic.Int64
	obs := idemevent.ObserverFunc(func(_ context.Context, ev idemevent.Event) {
		switch ev.Kind {
		case idemevent.InFlight:
			select {
			case collided <- struct{}{}:
			default:
			}
		case idemevent.StorageCall:
			// Before the freeze the waiters' only reads are their watches:
			// the poll interval is long.
			if ev.Method == idemevent.MethodGet && ev.Err == nil {
				select {
				case watched <- struct{}{}:
				default:
				}
			}
		case idemevent.Error:
			if live[ev.Key] {
				liveErrors.Add(1)
			}
		case idemevent.Unprotected:
			if live[ev.Key] {
				liveUnprotected.Add(1)
			}
		}
	})
	waiter, _ := coord(t, waiterStore, coordinator.WithObserver(obs),
		coordinator.WithInFlight(coordinator.InFlightWait), coordinator.WithOnStorageError(mode),
		coordinator.WithStorageTimeout(storageTimeout), coordinator.WithLease(lease),
		coordinator.WithPollInterval(pollInterval), coordinator.WithWaitTimeout(time.Minute))

	// The holders: one call per key, in the holder's process, whose action
	// returns the key's own result once its group is released.
	liveRelease, frozenRelease := make(chan struct{}), make(chan struct{})
	var liveWG, allWG sync.WaitGroup
	holderOut := make(chan outcome, len(keys))
	for i, k := range keys {
		release := frozenRelease
		if live[k] {
			release = liveRelease
			liveWG.Add(1)
		}
		allWG.Add(1)
		inside := make(chan struct{})
		go func() {
			defer allWG.Done()
			if live[k] {
				defer liveWG.Done()
			}
			got, err := coordinator.Do(ctx, holder, callOf(k), func(context.Context) (charge, error) {
				close(inside)
				<-release
				return charge{ID: "holder", N: int64(i)}, nil
			})
			holderOut <- outcome{key: i, got: got, err: err}
		}()
		await(t, inside, 1, "the holder of "+k.Key+" to run")
	}

	// The waiters, in the other process, each with an action that counts
	// its runs.
	var liveRuns, frozenRuns runs
	waiterOut := make(chan outcome, len(keys)*waitersPerKey+lateCallers)
	call := func(i int, k idemstore.Key) {
		r := &frozenRuns
		if live[k] {
			r = &liveRuns
		}
		got, err := coordinator.Do(ctx, waiter, callOf(k), r.action("waiter"))
		waiterOut <- outcome{key: i, got: got, err: err}
	}
	for i, k := range keys {
		for range waitersPerKey {
			allWG.Add(1)
			if live[k] {
				liveWG.Add(1)
			}
			go func() {
				defer allWG.Done()
				if live[k] {
					defer liveWG.Done()
				}
				call(i, k)
			}()
		}
	}
	await(t, collided, len(keys)*waitersPerKey, "the waiters to collide")
	await(t, watched, len(keys), "the waiters to watch") // the waiters on a key share one watch

	frozenAt := time.Now()
	thaw := cluster.freeze(t, frozen)
	var onFrozen []int
	for i, k := range keys {
		if !live[k] {
			onFrozen = append(onFrozen, i)
		}
	}
	for n := range lateCallers {
		allWG.Add(1)
		go func() {
			defer allWG.Done()
			i := onFrozen[n%len(onFrozen)]
			call(i, keys[i])
		}()
	}
	time.Sleep(freezeFor / 3) // the frozen master's calls time out meanwhile
	close(liveRelease)
	liveDone := make(chan struct{})
	go func() {
		liveWG.Wait()
		close(liveDone)
	}()
	select {
	case <-liveDone:
	case <-time.After(liveBound):
		t.Errorf("the calls on the live masters' keys had not all returned %v after their holders finished, "+
			"with master %d frozen: the frozen master delayed waits on other masters", liveBound, frozen)
	}
	liveTook := time.Since(frozenAt)
	time.Sleep(time.Until(frozenAt.Add(freezeFor)))
	thaw()
	frozenFor := time.Since(frozenAt)
	close(frozenRelease)
	allWG.Wait()
	close(holderOut)
	close(waiterOut)

	results := make([]charge, len(keys))
	for o := range holderOut {
		if o.err != nil || o.got.ID != "holder" {
			t.Errorf("holder of %s: %+v, %v", keys[o.key], o.got, o.err)
		}
		results[o.key] = o.got
	}
	var frozenOutcomes []string
	for o := range waiterOut {
		k := keys[o.key]
		if !live[k] {
			frozenOutcomes = append(frozenOutcomes, fmt.Sprintf("%+v %v", o.got, o.err))
			continue
		}
		if o.err != nil {
			var se *coordinator.StorageError
			t.Errorf("waiter of %s on a live master: %v (storage error: %v)", k, o.err, errors.As(o.err, &se))
		} else if o.got != results[o.key] {
			t.Errorf("waiter of %s on a live master got %+v, want the holder's %+v", k, o.got, results[o.key])
		}
	}
	if n := liveRuns.n.Load(); n != 0 {
		t.Errorf("the waiters on the live masters ran the action %d times, want 0", n)
	}
	if n, m := liveErrors.Load(), liveUnprotected.Load(); n != 0 || m != 0 {
		t.Errorf("%d error and %d unprotected events on the live masters' keys, want 0", n, m)
	}
	if n := frozenRuns.n.Load(); mode == coordinator.OnStorageErrorRaise && n != 0 {
		t.Errorf("mode raise: the callers on the frozen master's keys ran the action %d times, want 0", n)
	}
	t.Logf("master %d frozen for %v; the live masters' calls were done %v after the freeze; on the frozen master: %d runs, %s",
		frozen, frozenFor.Round(time.Millisecond), liveTook.Round(time.Millisecond), frozenRuns.n.Load(),
		strings.Join(frozenOutcomes, "; "))
}
