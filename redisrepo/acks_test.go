package redisrepo_test

import (
	"context"
	"errors"
	"runtime"
	"slices"
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
	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/internal/faultproxy"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// replicated starts a master and one replica of it for t alone, waits until
// the replica is in sync, and returns clients of both and the replica's
// process (to freeze it).
func replicated(t testing.TB, extra ...string) (master, replica *redis.Client, replicaProc *redistest.Process) {
	t.Helper()
	redistest.NeedRedisServer(t)
	m, err := redistest.StartProcess(t.TempDir(), extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Kill)
	host, port, _ := strings.Cut(m.Addr(), ":")
	r, err := redistest.StartProcess(t.TempDir(), append([]string{"--replicaof", host, port}, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Kill)
	master = redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
	replica = redis.NewClient(&redis.Options{Addr: r.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = master.Close(); _ = replica.Close() })
	for deadline := time.Now().Add(10 * time.Second); ; {
		info, _ := master.Info(context.Background(), "replication").Result()
		rinfo, _ := replica.Info(context.Background(), "replication").Result()
		if strings.Contains(info, "connected_slaves:1") && strings.Contains(rinfo, "master_link_status:up") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica did not sync:\n%s\n%s", info, rinfo)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return master, replica, r
}

// freeze stops p (SIGSTOP) until thaw or the end of the test.
func freeze(t testing.TB, p *redistest.Process) (thaw func()) {
	t.Helper()
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	thawed := false
	thaw = func() {
		if !thawed {
			thawed = true
			_ = p.Signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(thaw)
	return thaw
}

// Acknowledged reservations and completions are on the replica when the
// call returns; with the replica frozen, a reservation is a storage error
// that matches ErrNotAcknowledged and is taken back, and a completion is a
// storage error that, sent again once the replica is back, is acknowledged
// without being written twice. Operations outside the list are not
// acknowledged.
func TestReplicaAcks(t *testing.T) {
	master, replica, proc := replicated(t)
	s := redisrepo.New(master, redisrepo.WithKeyPrefix(redistest.Prefix(t)),
		redisrepo.WithReplicaAcks(redisrepo.ReplicaAcks{Replicas: 1, Operations: []string{"test.op"}}))
	// A call's deadline: a WAIT takes three quarters of it, and the rest
	// is margin for its reply on a busy machine.
	call := func() (context.Context, context.CancelFunc) { return context.WithTimeout(t.Context(), 2*time.Second) }
	onReplica := func(key idemstore.Key) string {
		t.Helper()
		v, err := replica.Get(t.Context(), s.Key(key)).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		return v
	}

	key, tok := newKey("acked"), token()
	ctx, cancel := call()
	if _, ok, err := s.Reserve(ctx, key, pendingWrite(tok, "", time.Minute)); err != nil || !ok {
		t.Fatalf("Reserve with the replica up: %v, %v", ok, err)
	}
	cancel()
	if onReplica(key) == "" {
		t.Fatal("an acknowledged reservation is not on the replica when Reserve returns")
	}
	done := idemstore.Completion{State: idemstore.StateCompleted, Result: []byte("charged"), TTL: time.Hour}
	ctx, cancel = call()
	if ok, err := s.Complete(ctx, key, tok, done); err != nil || !ok {
		t.Fatalf("Complete with the replica up: %v, %v", ok, err)
	}
	cancel()
	if v := onReplica(key); !strings.HasSuffix(v, "charged") {
		t.Fatalf("an acknowledged completion is not on the replica when Complete returns: %q", v)
	}

	// The replica stops answering.
	second, tok2 := newKey("frozen"), token()
	ctx, cancel = call()
	if _, ok, err := s.Reserve(ctx, second, pendingWrite(tok2, "", time.Minute)); err != nil || !ok {
		t.Fatalf("Reserve before the freeze: %v, %v", ok, err)
	}
	cancel()
	thaw := freeze(t, proc)
	third := newKey("unacked")
	ctx, cancel = call()
	_, ok, err := s.Reserve(ctx, third, pendingWrite(token(), "", time.Minute))
	cancel()
	var se *coordinator.StorageError
	if ok || !errors.As(err, &se) || !errors.Is(err, redisrepo.ErrNotAcknowledged) {
		t.Fatalf("Reserve with the replica frozen: %v, %v; want a storage error matching ErrNotAcknowledged", ok, err)
	}
	if n, err := master.Exists(t.Context(), s.Key(third)).Result(); err != nil || n != 0 {
		t.Errorf("the reservation that was not acknowledged is still on the master (%d, %v): want it taken back", n, err)
	}
	ctx, cancel = call()
	ok, err = s.Complete(ctx, second, tok2, done)
	cancel()
	if ok || !errors.Is(err, redisrepo.ErrNotAcknowledged) {
		t.Fatalf("Complete with the replica frozen: %v, %v; want a storage error matching ErrNotAcknowledged", ok, err)
	}
	other := idemstore.Key{Operation: "other.op", Key: second.Key}
	ctx, cancel = call()
	if _, ok, err := s.Reserve(ctx, other, pendingWrite(token(), "", time.Minute)); err != nil || !ok {
		t.Errorf("Reserve of an operation that is not acknowledged, with the replica frozen: %v, %v; want written", ok, err)
	}
	cancel()

	// The replica is back: the completion sent again is acknowledged, and
	// the record is written once, with its time to live set again.
	thaw()
	ctx, cancel = context.WithTimeout(t.Context(), 5*time.Second)
	ok, err = s.Complete(ctx, second, tok2, done)
	cancel()
	if !ok || err != nil {
		t.Fatalf("Complete sent again once the replica is back: %v, %v; want done", ok, err)
	}
	if v := onReplica(second); !strings.HasSuffix(v, "charged") {
		t.Fatalf("the completion sent again is not on the replica: %q", v)
	}
	rec, err := s.Get(t.Context(), second)
	if err != nil || rec.State != idemstore.StateCompleted || string(rec.Result) != "charged" || rec.Token == "" {
		t.Fatalf("Get after the resend: %+v, %v", rec, err)
	}
	// Another owner's resend is not done, and neither is the owner's of
	// another state.
	for _, tc := range []struct {
		tok string
		c   idemstore.Completion
	}{
		{token(), done},
		{tok2, idemstore.Completion{State: idemstore.StateNotReplayable, Result: []byte("too big"), TTL: time.Hour}},
	} {
		ctx, cancel = call()
		ok, err := s.Complete(ctx, second, tc.tok, tc.c)
		cancel()
		if ok || err != nil {
			t.Errorf("Complete of a completed record by token %s in state %s: %v, %v; want not done", tc.tok, tc.c.State, ok, err)
		}
	}
}

// With Fsync the store waits with WAITAOF: on servers with append-only
// files, a reservation is acknowledged; with the replica frozen it is not.
// Skipped on a server without WAITAOF (Redis before 7.2; make test-valkey
// runs it on Valkey 8).
func TestReplicaAcksFsync(t *testing.T) {
	master, _, proc := replicated(t, "--appendonly", "yes")
	if v, err := master.Do(t.Context(), "command", "info", "waitaof").Slice(); err != nil || len(v) == 0 || v[0] == nil {
		t.Skipf("the server has no WAITAOF (%v, %v)", v, err)
	}
	s := redisrepo.New(master, redisrepo.WithKeyPrefix(redistest.Prefix(t)), redisrepo.WithReplicaAcks(redisrepo.ReplicaAcks{Replicas: 1, Fsync: true}))
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if _, ok, err := s.Reserve(ctx, newKey("aof"), pendingWrite(token(), "", time.Minute)); err != nil || !ok {
		t.Fatalf("Reserve with WAITAOF, the replica up: %v, %v", ok, err)
	}
	freeze(t, proc)
	ctx, cancel = context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	_, ok, err := s.Reserve(ctx, newKey("aof-frozen"), pendingWrite(token(), "", time.Minute))
	if ok || !errors.Is(err, redisrepo.ErrNotAcknowledged) || !strings.Contains(err.Error(), "WAITAOF") {
		t.Fatalf("Reserve with WAITAOF, the replica frozen: %v, %v; want ErrNotAcknowledged", ok, err)
	}
}

// More acknowledgements than there are replicas: every reservation is a
// storage error, after the wait.
func TestReplicaAcksMoreThanReplicas(t *testing.T) {
	master, _, _ := replicated(t)
	// The replica acknowledges (a loaded machine's fresh replica may take
	// a moment): then the count below is 1, not 0.
	one := redisrepo.New(master, redisrepo.WithKeyPrefix(redistest.Prefix(t)), redisrepo.WithReplicaAcks(redisrepo.ReplicaAcks{Replicas: 1}))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, ok, err := one.Reserve(ctx, newKey("one"), pendingWrite(token(), "", time.Minute)); !ok || err != nil {
		t.Fatalf("Reserve with 1 acknowledgement and 1 replica: %v, %v", ok, err)
	}
	s := redisrepo.New(master, redisrepo.WithKeyPrefix(redistest.Prefix(t)), redisrepo.WithReplicaAcks(redisrepo.ReplicaAcks{Replicas: 2}))
	ctx, cancel = context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	_, ok, err := s.Reserve(ctx, newKey("two"), pendingWrite(token(), "", time.Minute))
	if ok || !errors.Is(err, redisrepo.ErrNotAcknowledged) || !strings.Contains(err.Error(), "1 of 2 replicas") {
		t.Fatalf("Reserve with 2 acknowledgements and 1 replica: %v, %v", ok, err)
	}
}

// Writes that wait for acknowledgement share one WAIT per master at a time
// (an ack round), so that a replica that stops acknowledging holds one
// connection, not the client's pool: with the replica frozen, 40
// reservations that each wait up to 3s for it leave a pool of 4
// connections free for a GET, and none of them is acknowledged. Once the
// replica is back, 64 concurrent reservations are acknowledged with fewer
// WAITs than writes.
func TestReplicaAcksShareRounds(t *testing.T) {
	master, _, proc := replicated(t)
	client := redis.NewClient(&redis.Options{Addr: master.Options().Addr, PoolSize: 4, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	s := redisrepo.New(client, redisrepo.WithKeyPrefix(redistest.Prefix(t)), redisrepo.WithReplicaAcks(redisrepo.ReplicaAcks{Replicas: 1}))
	thaw := freeze(t, proc)
	done := make(chan [2]int)
	go func() {
		a, r, _ := reserveAll(t, s, manyKeys("frozen-", 40), 3*time.Second)
		done <- [2]int{a, r}
	}()
	time.Sleep(200 * time.Millisecond) // the reservations are out, waiting
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	err := client.Get(ctx, "unrelated").Err()
	cancel()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Errorf("a GET while 40 reservations wait for a frozen replica: %v; want an answer (the pool of 4 is held by WAITs?)", err)
	}
	if got := <-done; got != [2]int{0, 40} {
		t.Errorf("with the replica frozen: %d acknowledged, %d not; want 0, 40", got[0], got[1])
	}
	thaw()

	before := waitCalls(t, master)
	if acked, _, _ := reserveAll(t, s, manyKeys("thawed-", 64), 5*time.Second); acked != 64 {
		t.Fatalf("%d of 64 concurrent reservations acknowledged with the replica back", acked)
	}
	if waits := waitCalls(t, master) - before; waits >= 64 {
		t.Errorf("64 concurrent reservations sent %d WAITs; want fewer (rounds shared)", waits)
	} else {
		t.Logf("64 concurrent reservations: %d WAITs", waits)
	}
}

// A slow replica (latency on its replication link, the master and the
// clients unaffected): while its round trip fits the callers' deadlines,
// every concurrent reservation is acknowledged, later by that round trip,
// in shared rounds, and the pool stays free for other calls; once it does
// not, reservations are refused and taken back, and the keys are free
// again when the link is fast.
func TestReplicaAcksSlowReplica(t *testing.T) {
	redistest.NeedRedisServer(t)
	m, err := redistest.StartProcess(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Kill)
	link, err := faultproxy.Start(m.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = link.Close() })
	host, port, _ := strings.Cut(link.Addr(), ":")
	r, err := redistest.StartProcess(t.TempDir(), "--replicaof", host, port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Kill)
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), PoolSize: 4, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info, _ := client.Info(t.Context(), "replication").Result()
		if strings.Contains(info, "connected_slaves:1") && strings.Contains(info, "state=online") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica did not sync:\n%s", info)
		}
	}
	s := redisrepo.New(client, redisrepo.WithKeyPrefix(redistest.Prefix(t)), redisrepo.WithReplicaAcks(redisrepo.ReplicaAcks{Replicas: 1}))
	const latency = 100 * time.Millisecond
	link.SetLatency(latency)
	before := waitCalls(t, client)
	done := make(chan struct{})
	var acked, refused int
	var slowest time.Duration
	go func() {
		defer close(done)
		acked, refused, slowest = reserveAll(t, s, manyKeys("slow-", 32), 5*time.Second)
	}()
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	err = client.Get(ctx, "unrelated").Err()
	cancel()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Errorf("a GET while 32 reservations wait for a slow replica: %v; want an answer", err)
	}
	<-done
	waits := waitCalls(t, client) - before
	t.Logf("latency %v each way: %d acknowledged, %d refused, slowest %v, %d WAITs", latency, acked, refused, slowest.Round(time.Millisecond), waits)
	if acked != 32 {
		t.Errorf("%d of 32 reservations acknowledged through a link %v slow each way, within 5s", acked, latency)
	}
	if slowest < 2*latency {
		t.Errorf("the slowest reservation took %v, less than the link's round trip %v: was it acknowledged?", slowest, 2*latency)
	}
	if waits >= 32 {
		t.Errorf("32 concurrent reservations sent %d WAITs; want fewer (rounds shared)", waits)
	}

	// A round trip longer than the deadline: refused, and taken back.
	link.SetLatency(time.Second)
	late := manyKeys("late-", 8)
	if acked, refused, _ := reserveAll(t, s, late, 500*time.Millisecond); acked != 0 || refused != 8 {
		t.Errorf("with a 2s round trip and 500ms deadlines: %d acknowledged, %d refused; want 0, 8", acked, refused)
	}
	link.SetLatency(0)
	if acked, refused, _ := reserveAll(t, s, late, 5*time.Second); acked != 8 {
		t.Errorf("the refused keys, once the link is fast: %d acknowledged, %d refused; want 8 acknowledged (taken back)", acked, refused)
	}
}

// A round that the goroutine of rounds sends is off the request path when
// a write it carries is (a completion retried in the background), so that
// the module's circuit breaker lets it through as it would that write
// alone; a round of writes that callers wait for is not.
func TestReplicaAcksRoundsOffTheRequestPath(t *testing.T) {
	master, _, proc := replicated(t)
	client := redis.NewClient(&redis.Options{Addr: master.Options().Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	rounds := &roundPaths{out: make(chan struct{}, 8)}
	client.AddHook(rounds)
	s := redisrepo.New(client, redisrepo.WithKeyPrefix(redistest.Prefix(t)), redisrepo.WithReplicaAcks(redisrepo.ReplicaAcks{Replicas: 1}))
	off := offRequestPathContext(t)
	if !coordinator.OffRequestPath(off) {
		t.Fatal("the renewal's context is not off the request path")
	}

	freeze(t, proc) // every round waits its budget out
	reserve := func(ctx context.Context, name string, within time.Duration) <-chan error {
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(ctx, within)
			defer cancel()
			_, _, err := s.Reserve(ctx, newKey(name), pendingWrite(token(), "", time.Minute))
			done <- err
		}()
		return done
	}
	// Each call keeps a quarter of its time for the WAIT's reply: 250ms
	// for the first (125ms was overrun once by a -race build in CI), more
	// for the queued ones, which wait for the first round to end.
	first := reserve(t.Context(), "first", time.Second) // sends its own round
	<-rounds.out
	queued := []<-chan error{ // queued behind it: the goroutine's rounds
		reserve(off, "background", 4*time.Second),
		reserve(t.Context(), "caller", 4*time.Second),
	}
	for _, done := range append(queued, first) {
		if err := <-done; !errors.Is(err, redisrepo.ErrNotAcknowledged) {
			t.Errorf("Reserve with the replica frozen: %v, want ErrNotAcknowledged", err)
		}
	}
	rounds.mu.Lock()
	defer rounds.mu.Unlock()
	// The first round is the caller's own; the second carries both queued
	// writes, one of them off the request path.
	if want := []bool{false, true}; !slices.Equal(rounds.off, want) {
		t.Errorf("rounds off the request path: %v, want %v", rounds.off, want)
	}
}

// roundPaths is a client hook that records, for each ack round (a pipeline
// with a WAIT), whether its context is off the request path.
type roundPaths struct {
	mu  sync.Mutex
	off []bool
	out chan struct{} // a round is out
}

func (h *roundPaths) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *roundPaths) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *roundPaths) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return c.Name() == "wait" }) {
			h.mu.Lock()
			h.off = append(h.off, coordinator.OffRequestPath(ctx))
			h.mu.Unlock()
			h.out <- struct{}{}
		}
		return next(ctx, cmds)
	}
}

// offRequestPathContext returns the values of a renewal's context, which
// the coordinator marks off the request path, without its cancellation.
func offRequestPathContext(t *testing.T) context.Context {
	t.Helper()
	fs := faultstore.Wrap(memstore.New())
	var (
		once    sync.Once
		renewal context.Context
		renewed = make(chan struct{})
	)
	fs.Before(idemevent.MethodRenew, func(ctx context.Context, _ idemstore.Key) error {
		once.Do(func() { renewal = context.WithoutCancel(ctx); close(renewed) })
		return nil
	})
	c, err := coordinator.New(fs, coordinator.WithLease(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = coordinator.Do(t.Context(), c, coordinator.Call{Operation: "op", Key: "k"}, func(context.Context) (int, error) {
		<-renewed
		return 1, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return renewal
}

// reserveAll reserves keys on s at once, each within a deadline, and
// returns how many were acknowledged and refused (ErrNotAcknowledged), and
// how long the slowest took; any other outcome fails t.
func reserveAll(t *testing.T, s *redisrepo.Store, keys []idemstore.Key, within time.Duration) (acked, refused int, slowest time.Duration) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, k := range keys {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), within)
			defer cancel()
			start := time.Now()
			_, ok, err := s.Reserve(ctx, k, pendingWrite(token(), "", time.Minute))
			took := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			slowest = max(slowest, took)
			switch {
			case ok && err == nil:
				acked++
			case errors.Is(err, redisrepo.ErrNotAcknowledged):
				refused++
			default:
				t.Errorf("Reserve %s: %v, %v", k.Key, ok, err)
			}
		})
	}
	wg.Wait()
	return acked, refused, slowest
}

// manyKeys returns n keys named prefix0, prefix1, ...
func manyKeys(prefix string, n int) []idemstore.Key {
	var out []idemstore.Key
	for i := range n {
		out = append(out, newKey(prefix+strconv.Itoa(i)))
	}
	return out
}

// waitCalls returns how many WAITs the server has run.
func waitCalls(t *testing.T, c *redis.Client) int {
	t.Helper()
	n, err := redistest.CommandStat(t.Context(), c, "wait", "calls")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// The coordinator over an acknowledging Store: with the replica frozen, a
// call in on-storage-error mode raise fails and runs nothing; once the
// replica is back, the call runs once and replays.
func TestReplicaAcksThroughTheCoordinator(t *testing.T) {
	master, _, proc := replicated(t)
	s := redisrepo.New(master, redisrepo.WithKeyPrefix(redistest.Prefix(t)), redisrepo.WithReplicaAcks(redisrepo.ReplicaAcks{Replicas: 1}))
	c, err := coordinator.New(s, coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise), coordinator.WithStorageTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	key := newKey("coord")
	var k runs
	thaw := freeze(t, proc)
	if _, err := coordinator.Do(t.Context(), c, callOf(key), k.action("frozen")); !errors.Is(err, redisrepo.ErrNotAcknowledged) || k.n.Load() != 0 {
		t.Fatalf("a call with the replica frozen: %v after %d runs; want ErrNotAcknowledged, no run", err, k.n.Load())
	}
	thaw()
	for i := range 3 {
		got, err := coordinator.Do(t.Context(), c, callOf(key), k.action("thawed"))
		if err != nil || got.ID != "thawed" || k.n.Load() != 1 {
			t.Fatalf("call %d with the replica back: %+v, %v after %d runs; want one run, replayed", i, got, err, k.n.Load())
		}
	}
}

func TestReplicaAcksOptions(t *testing.T) {
	client := redis.NewClient(&redis.Options{})
	ring := redis.NewRing(&redis.RingOptions{})
	t.Cleanup(func() { _ = client.Close(); _ = ring.Close() })
	for _, tc := range []struct {
		name string
		opts []redisrepo.Option
		want string
	}{
		{"negative", []redisrepo.Option{redisrepo.WithReplicaAcks(redisrepo.ReplicaAcks{Replicas: -1})}, "replicas must be 0 or more"},
		{"operations alone", []redisrepo.Option{redisrepo.WithReplicaAcks(redisrepo.ReplicaAcks{Operations: []string{"pay"}})}, "acknowledge nothing"},
		{"invalid operation", []redisrepo.Option{redisrepo.WithReplicaAcks(redisrepo.ReplicaAcks{Replicas: 1, Operations: []string{"a b"}})}, "operation"},
		{"format 1", []redisrepo.Option{redisrepo.WithRecordFormat(redisrepo.Format1), redisrepo.WithReplicaAcks(redisrepo.ReplicaAcks{Replicas: 1})}, "format 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				r := recover()
				err, _ := r.(error)
				var oe *coordinator.OptionError
				if !errors.As(err, &oe) || oe.Option != "WithReplicaAcks" || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("New panicked with %v, want an OptionError of WithReplicaAcks saying %q", r, tc.want)
				}
			}()
			redisrepo.New(client, tc.opts...)
		})
	}
	if !redisrepo.CanAcknowledge(client) || redisrepo.CanAcknowledge(ring) {
		t.Error("CanAcknowledge: want a *redis.Client yes, a *redis.Ring no")
	}
}

// BenchmarkReplicaAcks is what acknowledgement costs a first run (a
// reservation and its completion) at 1 caller and at 64, and a replay, on
// one master with one replica on this machine: impl=plain without it,
// impl=acked with WAIT 1.
// The replica's round trip is a loopback one here; across hosts it is the
// network's.
//
//	go test -run '^$' -bench ReplicaAcks -benchmem -count 6 ./redisrepo > acks.txt
//	benchstat -col /impl acks.txt
func BenchmarkReplicaAcks(b *testing.B) {
	master, _, _ := replicated(b)
	prefix := redistest.Prefix(b)
	for _, impl := range []struct {
		name string
		acks redisrepo.ReplicaAcks
	}{{"plain", redisrepo.ReplicaAcks{}}, {"acked", redisrepo.ReplicaAcks{Replicas: 1}}} {
		s := redisrepo.New(master, redisrepo.WithKeyPrefix(prefix+impl.name+":"), redisrepo.WithReplicaAcks(impl.acks))
		if err := s.LoadScripts(context.Background()); err != nil {
			b.Fatal(err)
		}
		done := idemstore.Completion{State: idemstore.StateCompleted, Result: result, TTL: time.Minute}
		b.Run("flow=first-run/impl="+impl.name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			run, i := token()[:8], 0
			for b.Loop() {
				i++
				key := idemstore.Key{Operation: "payment.charge", Key: "order-" + run + "-" + strconv.Itoa(i)}
				tok := token()
				if _, ok, err := s.Reserve(ctx, key, pendingWrite(tok, "", time.Minute)); err != nil || !ok {
					b.Fatal(ok, err)
				}
				if ok, err := s.Complete(ctx, key, tok, done); err != nil || !ok {
					b.Fatal(ok, err)
				}
			}
		})
		b.Run("flow=first-run-64/impl="+impl.name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			run := token()[:8]
			var n atomic.Int64
			b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					key := idemstore.Key{Operation: "payment.charge", Key: "par-" + run + "-" + strconv.FormatInt(n.Add(1), 10)}
					tok := token()
					if _, ok, err := s.Reserve(ctx, key, pendingWrite(tok, "", time.Minute)); err != nil || !ok {
						b.Error(ok, err)
						return
					}
					if ok, err := s.Complete(ctx, key, tok, done); err != nil || !ok {
						b.Error(ok, err)
						return
					}
				}
			})
		})
		b.Run("flow=replay/impl="+impl.name, func(b *testing.B) {
			ctx := context.Background()
			key := idemstore.Key{Operation: "payment.charge", Key: "replayed-" + token()}
			mustReserve(b, s, key, completedWrite(token(), "", result, time.Hour))
			b.ReportAllocs()
			for b.Loop() {
				if rec, ok, err := s.Reserve(ctx, key, pendingWrite(token(), "", time.Minute)); err != nil || ok || rec.State != idemstore.StateCompleted {
					b.Fatal(rec, ok, err)
				}
			}
		})
	}
}
