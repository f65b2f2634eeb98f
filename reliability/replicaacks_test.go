//go:build linux

package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/faultproxy"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// TestFailoverWithReplicaAcks is issue 40's failover: a master and a
// replica, behind one endpoint as managed Redis offers them, behind a
// sentinel, or in a cluster (newFailoverRig), take payment traffic in
// which every request is sent twice (a client that retries a timed-out
// request, 0.3–2.5s later) and every failed call is sent again.
// Replication is cut for 2s, then the master is killed -9, a replica is
// promoted (by the test behind the endpoint, by the sentinel or the
// cluster) and a replica attaches to it. Calls run with on-storage-error
// raise, in in-flight modes raise and wait.
//
// Without acknowledgement the records written during the cut are lost with
// the master, and the keys sent again after the failover run again: the
// storm counts them (it fails if it sees none, since then it proved
// nothing). With one replica's acknowledgement no key runs twice, and
// every call that failed is answered within a minute of the end of the
// traffic; a key that ran twice is shown with its history. The full suite
// only.
func TestFailoverWithReplicaAcks(t *testing.T) {
	if suiteLevel(t) != levelFull {
		t.Skip("the full suite only (make test-reliability)")
	}
	for _, topology := range []string{"endpoint", "sentinel", "cluster"} {
		for _, acks := range []int{0, 1} {
			for _, mode := range []coordinator.InFlightMode{coordinator.InFlightRaise, coordinator.InFlightWait} {
				t.Run(fmt.Sprintf("%s/acks=%d/%s", topology, acks, mode), func(t *testing.T) {
					keys, twice, failed := failoverStorm(t, topology, acks, mode)
					t.Logf("%d keys, %d run twice, %d calls failed (and were sent again)", keys, twice, failed)
					switch {
					case acks > 0 && twice > 0:
						t.Errorf("%d of %d keys ran twice with replica acknowledgement", twice, keys)
					case acks == 0 && twice == 0:
						t.Errorf("no key of %d ran twice without acknowledgement: the storm did not lose the records written during the cut, so it proves nothing", keys)
					}
				})
			}
		}
	}
}

// failoverStorm runs one storm on topology and returns how many keys it
// sent, how many ran more than once, and how many calls failed.
func failoverStorm(t *testing.T, topology string, acks int, mode coordinator.InFlightMode) (keys, twice int, failed int64) {
	rig := newFailoverRig(t, topology)
	client := rig.client
	store := redisrepo.New(client, redisrepo.WithKeyPrefix(redistest.Prefix(t)),
		redisrepo.WithReplicaAcks(redisrepo.ReplicaAcks{Replicas: acks}))
	// Each key's history, and the storm's milestones under "storm", for
	// the keys that ran twice when they must not have.
	var timeline keyHistory
	c, err := coordinator.New(store, coordinator.WithObserver(idemevent.ObserverFunc(func(_ context.Context, e idemevent.Event) {
		if e.Kind != idemevent.StorageCall || e.Err != nil {
			timeline.note(e.Key.Key, e)
		}
	})),
		coordinator.WithInFlight(mode), coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise),
		// The lease outlasts the cut and the failover: a reservation is
		// protected for one lease from its last acknowledged write, so a
		// completion that the cut held back must reach the promoted
		// replica within it (docs/operations.md, "Replica
		// acknowledgement"). The sentinel's promotion took 2.2s after the
		// kill under the race detector; with a 5s lease (2s of cut before
		// the kill) 3 keys of 5,614 ran twice.
		coordinator.WithLease(10*time.Second), coordinator.WithStorageTimeout(400*time.Millisecond),
		coordinator.WithWaitTimeout(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })

	var (
		mu      sync.Mutex
		effects = map[string]int{}
		pending sync.WaitGroup // calls still to send: every key's two
		stop    atomic.Bool    // no new keys
	)
	var send func(key string, attempt int, after time.Duration)
	call := func(key string, attempt int) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := c.Execute(ctx, coordinator.Call{Operation: "payment.charge", Key: key}, func(ctx context.Context) ([]byte, error) {
			timeline.note(key, "the action runs")
			time.Sleep(time.Duration(5+rand.IntN(15)) * time.Millisecond)
			mu.Lock()
			effects[key]++
			mu.Unlock()
			return []byte("charged"), nil
		})
		timeline.note(key, callReturned{err})
		if err != nil && !errors.Is(err, context.Canceled) {
			atomic.AddInt64(&failed, 1)
			pending.Add(1)
			// Sent again until it succeeds, backing off as clients do:
			// 200ms doubled on each failure up to 3.2s, with jitter.
			backoff := 200 * time.Millisecond << min(attempt, 4)
			send(key, attempt+1, backoff/2+rand.N(backoff/2))
		}
	}
	send = func(key string, attempt int, after time.Duration) {
		time.AfterFunc(after, func() {
			defer pending.Done()
			call(key, attempt)
		})
	}
	// 800 new keys a second, two calls each; half that under the race
	// detector, which makes this process several times slower: at the
	// full rate the calls sent again after the cut outgrow what it can
	// send, and every call times out waiting for a connection.
	workers, rate := sync.WaitGroup{}, 8
	if raceDetector {
		rate = 4
	}
	for w := range rate {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for i := 0; !stop.Load(); i++ {
				key := fmt.Sprintf("order-%d-%d", w, i)
				mu.Lock()
				effects[key] += 0
				mu.Unlock()
				pending.Add(2)
				send(key, 0, 0)
				send(key, 0, time.Duration(300+rand.IntN(2200))*time.Millisecond) // the client's retry
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}

	time.Sleep(3 * time.Second)
	timeline.note("storm", "replication cut")
	rig.link.Cut(true) // replication stops
	time.Sleep(2 * time.Second)
	rig.failOver(t, func(what string) { timeline.note("storm", what) })
	time.Sleep(4 * time.Second)
	stop.Store(true)
	workers.Wait()
	done := make(chan struct{})
	go func() { pending.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("calls still failing a minute after the traffic stopped")
	}

	mu.Lock()
	defer mu.Unlock()
	for k, n := range effects {
		if n > 1 {
			if acks > 0 && twice < 3 {
				t.Logf("%s ran %d times:\n%s%s", k, n, timeline.of("storm"), timeline.of(k))
			}
			twice++
		}
	}
	return len(effects), twice, atomic.LoadInt64(&failed)
}

// A failoverRig is a master and its replicas whose replication link is
// link, the client of a service that uses them, and failOver: kill the
// master -9, have a replica promoted, and give it a replica in sync.
type failoverRig struct {
	client   redis.UniversalClient
	link     *faultproxy.Proxy
	failOver func(t *testing.T, note func(string))
}

// newFailoverRig builds the rig of topology:
//   - "endpoint", a master and a replica behind one endpoint that the test
//     moves to the replica it promotes, as managed Redis offers them;
//   - "sentinel", the same behind a sentinel (quorum 1, down-after 1s)
//     that detects the death and promotes the replica, and go-redis's
//     failover client;
//   - "cluster", a cluster of three masters with a replica each, and a
//     second replica for the master killed; the cluster fails it and
//     promotes one of its replicas, and the other replicates the promoted
//     one.
func newFailoverRig(t *testing.T, topology string) *failoverRig {
	redistest.NeedRedisServer(t)
	rig := &failoverRig{}
	var (
		kill    func()                    // kills the master -9
		promote func(t *testing.T) string // waits for a promotion, returns the new master
		attach  func(t *testing.T, promoted string)
		what    string // who promotes
	)
	switch topology {
	case "endpoint", "sentinel":
		start := func(extra ...string) *redistest.Process {
			p, err := redistest.StartProcess(t.TempDir(), extra...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Kill)
			return p
		}
		replicaOf := func(addr string) []string {
			host, port, _ := strings.Cut(addr, ":")
			return []string{"--replicaof", host, port}
		}
		master := start()
		rig.link = startLink(t, master.Addr())
		replica := start(replicaOf(rig.link.Addr())...)
		waitSynced(t, master.Addr(), 1)
		kill = master.Kill
		attach = func(t *testing.T, promoted string) {
			start(replicaOf(promoted)...)
			waitSynced(t, promoted, 1)
		}
		if topology == "endpoint" { // every new connection goes to the current master
			var endpoint atomic.Pointer[string]
			addr := master.Addr()
			endpoint.Store(&addr)
			rig.client = redis.NewClient(&redis.Options{
				Addr: "endpoint",
				Dialer: func(ctx context.Context, _, _ string) (net.Conn, error) {
					var d net.Dialer
					return d.DialContext(ctx, "tcp", *endpoint.Load())
				},
				ContextTimeoutEnabled: true,
				DialTimeout:           time.Second,
				MaxRetries:            -1,
				PoolSize:              32,
			})
			what = "the test"
			promote = func(t *testing.T) string {
				promoted := replica.Addr()
				admin := redis.NewClient(&redis.Options{Addr: promoted})
				err := admin.Do(context.Background(), "replicaof", "no", "one").Err()
				_ = admin.Close()
				if err != nil {
					t.Fatalf("promote the replica: %v", err)
				}
				endpoint.Store(&promoted)
				return promoted
			}
			break
		}
		sentinel, err := redistest.StartSentinelProcess(redistest.MemDir(t), master.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(sentinel.Kill)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := redistest.WaitSentinelReplica(ctx, sentinel.Addr()); err != nil {
			t.Fatal(err)
		}
		rig.client = redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName:            redistest.SentinelMaster,
			SentinelAddrs:         []string{sentinel.Addr()},
			ContextTimeoutEnabled: true,
			DialTimeout:           time.Second,
			MaxRetries:            -1,
			PoolSize:              32,
		})
		what = "the sentinel"
		promote = func(t *testing.T) string {
			s := redis.NewSentinelClient(&redis.Options{Addr: sentinel.Addr()})
			defer s.Close()
			for deadline := time.Now().Add(30 * time.Second); ; {
				hp, err := s.GetMasterAddrByName(context.Background(), redistest.SentinelMaster).Result()
				if err == nil && net.JoinHostPort(hp[0], hp[1]) == replica.Addr() {
					return replica.Addr()
				}
				if time.Now().After(deadline) {
					t.Fatalf("the sentinel has not promoted the replica %s 30s after the kill: %v, %v", replica.Addr(), hp, err)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	case "cluster":
		cl := redistest.NewCluster(t, 3)
		masters, master := cl.Nodes(), cl.SlotOwner(t, 0)
		// The master announces the link's port, so its replicas
		// replicate through it; the service's client dials the master
		// itself when the slot map names the link.
		rig.link = startLink(t, master.Addr())
		_, port, _ := net.SplitHostPort(rig.link.Addr())
		admin := redis.NewClient(&redis.Options{Addr: master.Addr()})
		err := admin.ConfigSet(context.Background(), "cluster-announce-port", port).Err()
		_ = admin.Close()
		if err != nil {
			t.Fatalf("announce the link: %v", err)
		}
		// Neither replica migrates to a master without one (replica
		// migration): the one not promoted must follow the promoted one.
		noMigration := []string{"--cluster-allow-replica-migration", "no"}
		replicas := []*redistest.ClusterNode{cl.AddReplica(t, master, noMigration...), cl.AddReplica(t, master, noMigration...)}
		for _, r := range replicas {
			c := redis.NewClient(&redis.Options{Addr: r.Addr()})
			info, _ := c.Info(context.Background(), "replication").Result()
			_ = c.Close()
			if !strings.Contains(info, "master_port:"+port+"\r\n") {
				t.Fatalf("the replica %s does not replicate through the link %s:\n%s", r.Addr(), rig.link.Addr(), info)
			}
		}
		waitSynced(t, master.Addr(), 2)
		for _, other := range masters {
			if other != master {
				cl.AddReplica(t, other, noMigration...)
			}
		}
		rig.client = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: cl.Addrs(),
			Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
				if addr == rig.link.Addr() {
					addr = master.Addr()
				}
				var d net.Dialer
				return d.DialContext(ctx, network, addr)
			},
			ContextTimeoutEnabled: true,
			DialTimeout:           time.Second,
			MaxRetries:            -1,
			PoolSize:              32,
		})
		kill = func() { cl.Kill(master) }
		what = "the cluster"
		promote = func(t *testing.T) string {
			owner := cl.SlotOwner(t, 0) // once the cluster agrees again
			if !slices.Contains(replicas, owner) {
				t.Fatalf("slot 0 is served by %s, not by a replica of the killed master", owner.Addr())
			}
			return owner.Addr()
		}
		attach = func(t *testing.T, promoted string) { waitSynced(t, promoted, 1) } // the other replica
	default:
		t.Fatalf("no failover topology %q", topology)
	}
	rig.failOver = func(t *testing.T, note func(string)) {
		note("master killed")
		kill()
		promoted := promote(t)
		note("replica promoted by " + what)
		attach(t, promoted)
	}
	t.Cleanup(func() { _ = rig.client.Close() })
	return rig
}

// startLink starts the proxy that a replica of addr replicates through.
func startLink(t *testing.T, addr string) *faultproxy.Proxy {
	link, err := faultproxy.Start(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = link.Close() })
	return link
}

// keyHistory is a timeline of what happened to each key, kept cheaply (no
// formatting until it is shown: the storm must not starve its own process).
type keyHistory struct {
	mu     sync.Mutex
	start  time.Time
	events map[string][]keyEvent
}

// A keyEvent is something that happened to a key: a string, a
// idemevent.Event or a callReturned.
type keyEvent struct {
	at   time.Duration
	what any
}

// callReturned is what a call returned.
type callReturned struct{ err error }

// note adds what happened to key now.
func (h *keyHistory) note(key string, what any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.events == nil {
		h.start, h.events = time.Now(), map[string][]keyEvent{}
	}
	h.events[key] = append(h.events[key], keyEvent{time.Since(h.start), what})
}

// of returns key's timeline, a line per event.
func (h *keyHistory) of(key string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var b strings.Builder
	for _, e := range h.events[key] {
		fmt.Fprintf(&b, "%7dms ", e.at.Milliseconds())
		switch w := e.what.(type) {
		case idemevent.Event:
			fmt.Fprintf(&b, "%s %s %s %v\n", w.Kind, w.ErrorType, w.Method, w.Err)
		case callReturned:
			fmt.Fprintf(&b, "the call returns %v\n", w.err)
		default:
			fmt.Fprintf(&b, "%v\n", w)
		}
	}
	return b.String()
}

// waitSynced waits until the server at addr has n replicas in sync.
func waitSynced(t *testing.T, addr string, n int) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	want := fmt.Sprintf("connected_slaves:%d", n)
	for deadline := time.Now().Add(20 * time.Second); ; {
		info, _ := c.Info(context.Background(), "replication").Result()
		if strings.Contains(info, want) && strings.Contains(info, "state=online") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s has not %d replicas in sync:\n%s", addr, n, info)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestReplicaAcksThroughASlotMove: an acknowledged reservation whose slot
// moved to another master while the client's slot map still named the old
// one. The reservation follows go-redis's redirection; its touch, sent to
// the master the stale map names, meets MOVED, and the store sends it again
// to the new master once the map is reloaded, so that the new master's
// replica acknowledges it. The client's map stays stale until the old
// master has refused the touch (its PEXPIRE's rejected calls), so the test
// goes down that path every time.
func TestReplicaAcksThroughASlotMove(t *testing.T) {
	c := startCluster(t)
	ctx := t.Context()
	fresh := func(ctx context.Context) ([]redis.ClusterSlot, error) {
		cl := c.nodes[0].client()
		defer cl.Close()
		//lint:ignore SA1019 ClusterOptions.ClusterSlots, the hook that keeps the map stale, takes CLUSTER SLOTS' shape
		return cl.ClusterSlots(ctx).Result()
	}
	before, err := fresh(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var stale atomic.Bool
	var source *redis.Client // the slot's master before the move
	client := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: c.addrs(),
		ClusterSlots: func(ctx context.Context) ([]redis.ClusterSlot, error) {
			if stale.Load() && pexpireRejected(ctx, source) == 0 {
				return before, nil
			}
			return fresh(ctx)
		},
	})
	t.Cleanup(func() { _ = client.Close() })
	store := redisrepo.New(client, redisrepo.WithKeyPrefix(redistest.Prefix(t)),
		redisrepo.WithReplicaAcks(redisrepo.ReplicaAcks{Replicas: 1}))
	key := idemstore.Key{Operation: "payment.charge", Key: "moved"}
	rkey := store.Key(key)
	slot := int(redisKeySlot(t, client, rkey))

	// Move the slot (empty: the key is new) to another master.
	var sourceAddr, targetAddr, sourceID, targetID string
	view, err := nodesView(ctx, c.nodes[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range view {
		if !n.isMaster || n.failed || len(n.slots) == 0 {
			continue
		}
		owns := false
		for _, r := range n.slots {
			owns = owns || (slot >= r[0] && slot <= r[1])
		}
		switch {
		case owns:
			sourceAddr, sourceID = n.addr, n.id
		case targetID == "":
			targetAddr, targetID = n.addr, n.id
		}
	}
	if sourceID == "" || targetID == "" {
		t.Fatalf("no owner and other master of slot %d in %+v", slot, view)
	}
	source = redis.NewClient(&redis.Options{Addr: sourceAddr})
	target := redis.NewClient(&redis.Options{Addr: targetAddr})
	t.Cleanup(func() { _ = source.Close(); _ = target.Close() })
	stale.Store(true)
	client.ReloadState(ctx)
	for _, step := range []struct {
		on   *redis.Client
		args []any
	}{
		{target, []any{"cluster", "setslot", slot, "importing", sourceID}},
		{source, []any{"cluster", "setslot", slot, "migrating", targetID}},
		{target, []any{"cluster", "setslot", slot, "node", targetID}},
		{source, []any{"cluster", "setslot", slot, "node", targetID}},
	} {
		if err := step.on.Do(ctx, step.args...).Err(); err != nil {
			t.Fatalf("%v: %v", step.args, err)
		}
	}

	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	_, ok, err := store.Reserve(rctx, key, idemstore.Write{State: idemstore.StatePending, Token: "0123456789abcdef", TTL: time.Minute})
	if err != nil || !ok {
		t.Fatalf("Reserve after the slot moved, the client's map stale: %v, %v; want written and acknowledged", ok, err)
	}
	if n := pexpireRejected(ctx, source); n == 0 {
		t.Fatal("the old master refused no touch: the test did not go down the MOVED path")
	}
	if n, err := target.Exists(ctx, rkey).Result(); err != nil || n != 1 {
		t.Fatalf("the record is not on the new master: %d, %v", n, err)
	}
}

// pexpireRejected returns how many PEXPIREs c's server refused (MOVED among
// them): commandstats' rejected_calls.
func pexpireRejected(ctx context.Context, c *redis.Client) int {
	if c == nil {
		return 0
	}
	n, _ := redistest.CommandStat(ctx, c, "pexpire", "rejected_calls")
	return n
}

// redisKeySlot returns the cluster slot of key (CLUSTER KEYSLOT).
func redisKeySlot(t *testing.T, c *redis.ClusterClient, key string) int64 {
	t.Helper()
	slot, err := c.ClusterKeySlot(t.Context(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return slot
}
