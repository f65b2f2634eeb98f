//go:build linux

package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/faultproxy"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// TestFailoverWithReplicaAcks is issue 40's failover: a master and a
// replica behind one endpoint, as managed Redis offers them, take payment
// traffic in which every request is sent twice (a client that retries a
// timed-out request, 0.3–2.5s later) and every failed call is sent again.
// Replication is cut for 2s, then the master is killed -9, the replica is
// promoted behind the endpoint and a new replica attaches to it. Calls run
// with on-storage-error raise, in in-flight modes raise and wait.
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
	for _, acks := range []int{0, 1} {
		for _, mode := range []coordinator.InFlightMode{coordinator.InFlightRaise, coordinator.InFlightWait} {
			t.Run(fmt.Sprintf("acks=%d/%s", acks, mode), func(t *testing.T) {
				keys, twice, failed := failoverStorm(t, acks, mode)
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

// failoverStorm runs one storm and returns how many keys it sent, how many
// ran more than once, and how many calls failed.
func failoverStorm(t *testing.T, acks int, mode coordinator.InFlightMode) (keys, twice int, failed int64) {
	redistest.NeedRedisServer(t)
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
	link, err := faultproxy.Start(master.Addr()) // the replication link
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = link.Close() })
	replica := start(replicaOf(link.Addr())...)
	waitSynced(t, master.Addr(), 1)

	// The endpoint: every new connection goes to the current master.
	var endpoint atomic.Pointer[string]
	addr := master.Addr()
	endpoint.Store(&addr)
	client := redis.NewClient(&redis.Options{
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
	t.Cleanup(func() { _ = client.Close() })
	store := redisrepo.New(client, redisrepo.WithKeyPrefix(redistest.Prefix(t)),
		redisrepo.WithReplicaAcks(redisrepo.ReplicaAcks{Replicas: acks}))
	// Each key's history, and the storm's milestones under "storm", for
	// the keys that ran twice when they must not have.
	var timeline keyHistory
	c, err := coordinator.New(store, coordinator.WithObserver(coordinator.ObserverFunc(func(_ context.Context, e coordinator.Event) {
		if e.Kind != coordinator.EventStorageCall || e.Err != nil {
			timeline.note(e.Key.Key, e)
		}
	})),
		coordinator.WithInFlight(mode), coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise),
		coordinator.WithLease(5*time.Second), coordinator.WithStorageTimeout(400*time.Millisecond),
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
	link.Cut(true) // replication stops
	time.Sleep(2 * time.Second)
	timeline.note("storm", "master killed")
	master.Kill()
	promoted := replica.Addr()
	admin := redis.NewClient(&redis.Options{Addr: promoted})
	err = admin.Do(context.Background(), "replicaof", "no", "one").Err()
	_ = admin.Close()
	if err != nil {
		t.Fatalf("promote the replica: %v", err)
	}
	endpoint.Store(&promoted)
	timeline.note("storm", "replica promoted")
	start(replicaOf(promoted)...) // the promoted master's new replica
	waitSynced(t, promoted, 1)
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

// keyHistory is a timeline of what happened to each key, kept cheaply (no
// formatting until it is shown: the storm must not starve its own process).
type keyHistory struct {
	mu     sync.Mutex
	start  time.Time
	events map[string][]keyEvent
}

// A keyEvent is something that happened to a key: a string, a
// coordinator.Event or a callReturned.
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
		case coordinator.Event:
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
