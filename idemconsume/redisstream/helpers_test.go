package redisstream_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/idemconsume/redisstream"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashEnv) != "" {
		os.Exit(runCrasher())
	}
	goleak.VerifyTestMain(redistest.Main(m),
		// go-redis probes a server it failed to dial from a goroutine that
		// sleeps a second and exits, even after Close: go-redis's, bounded.
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

// env is one test's Redis: a client, a stream and a store under the test's
// own prefix.
type env struct {
	t      *testing.T
	rdb    *redis.Client
	stream string
	group  string
	store  *redisrepo.Store
	// started are the consumers start ran, for stopAll.
	started []*consumer
}

func newEnv(t *testing.T) *env {
	t.Helper()
	rdb := redistest.Server(t)
	prefix := redistest.Prefix(t)
	return &env{
		t:      t,
		rdb:    rdb,
		stream: prefix + "orders",
		group:  "billing",
		store:  redisrepo.New(rdb, redisrepo.WithKeyPrefix(prefix+"idem:")),
	}
}

// coordinator returns a coordinator over store with a short lease, closed
// when the test ends.
func (e *env) coordinator(store idemstore.Store, opts ...coordinator.Option) *coordinator.Coordinator {
	e.t.Helper()
	opts = append([]coordinator.Option{coordinator.WithLease(3 * time.Second)}, opts...)
	c, err := coordinator.New(store, opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = c.Close() })
	return c
}

// processor returns a Processor of operation "billing.credit" over c.
func (e *env) processor(c *coordinator.Coordinator, opts ...idemconsume.Option) *idemconsume.Processor {
	e.t.Helper()
	p, err := idemconsume.New(c, "billing.credit", opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

// publish adds an entry with the idempotency key key and returns its ID.
func (e *env) publish(key string, fields ...string) string {
	e.t.Helper()
	values := []any{"idempotency-key", key}
	for _, f := range fields {
		values = append(values, f)
	}
	id, err := e.rdb.XAdd(e.t.Context(), &redis.XAddArgs{Stream: e.stream, Values: values}).Result()
	if err != nil {
		e.t.Fatal(err)
	}
	return id
}

// fast are the options of a consumer that claims quickly.
func fast(opts ...redisstream.Option) []redisstream.Option {
	return append([]redisstream.Option{
		redisstream.WithBlock(50 * time.Millisecond),
		redisstream.WithMinIdle(300 * time.Millisecond),
		redisstream.WithClaimInterval(50 * time.Millisecond),
	}, opts...)
}

// consumer is a running Consumer.
type consumer struct {
	*redisstream.Consumer
	cancel context.CancelFunc
	done   chan error
}

// start runs a Consumer of e's stream until stop or the end of the test.
func (e *env) start(client redisstream.Client, p *idemconsume.Processor, handle idemconsume.Handler, opts ...redisstream.Option) *consumer {
	e.t.Helper()
	opts = append([]redisstream.Option{redisstream.WithOnError(func(_ context.Context, err error) {
		if !errors.Is(err, errAckLost) {
			e.t.Logf("consumer error: %v", err)
		}
	})}, opts...)
	sc, err := redisstream.New(client, p, e.stream, e.group, handle, opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &consumer{Consumer: sc, cancel: cancel, done: make(chan error, 1)}
	go func() { c.done <- sc.Run(ctx) }()
	e.t.Cleanup(c.stop)
	e.started = append(e.started, c)
	return c
}

// stopAll stops every consumer start ran. A consumer reports a decision
// after its acknowledgement, so a drained stream does not mean that every
// decision was reported; once Run has returned, it was.
func (e *env) stopAll() {
	for _, c := range e.started {
		c.stop()
	}
}

// stop cancels the consumer's context and waits for Run to return.
func (c *consumer) stop() {
	c.cancel()
	if err := <-c.done; err != nil {
		panic(fmt.Sprintf("Run: %v", err))
	}
	c.done <- nil // for a second stop
}

// groupInfo returns the group's state; Pending is -1 while the group does
// not exist (Run has not created it yet).
func (e *env) groupInfo() redis.XInfoGroup {
	e.t.Helper()
	groups, _ := e.rdb.XInfoGroups(context.Background(), e.stream).Result()
	for _, g := range groups {
		if g.Name == e.group {
			return g
		}
	}
	return redis.XInfoGroup{Pending: -1}
}

// drained reports whether the group has read every entry of the stream and
// acknowledged them all.
func (e *env) drained() bool {
	last, err := e.rdb.XRevRangeN(context.Background(), e.stream, "+", "-", 1).Result()
	if err != nil || len(last) == 0 {
		return false
	}
	g := e.groupInfo()
	return g.Pending == 0 && g.LastDeliveredID == last[0].ID
}

// eventually fails the test unless cond holds within d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// effects counts the effects made per key.
type effects struct {
	mu sync.Mutex
	n  map[string]int
}

func newEffects() *effects { return &effects{n: make(map[string]int)} }

func (e *effects) add(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n[key]++
}

// check fails the test unless every key of keys had exactly one effect,
// and no other key any.
func (e *effects) check(t *testing.T, keys []string) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, k := range keys {
		if e.n[k] != 1 {
			t.Errorf("key %s: %d effects, want 1", k, e.n[k])
		}
	}
	if len(e.n) != len(keys) {
		t.Errorf("%d keys had effects, want %d", len(e.n), len(keys))
	}
}

// decisions counts decisions by reason.
type decisions struct {
	mu sync.Mutex
	n  map[idemconsume.Reason]int
	d  []idemconsume.Decision
}

func newDecisions() *decisions { return &decisions{n: make(map[idemconsume.Reason]int)} }

func (d *decisions) hook(_ context.Context, _ idemconsume.Message, dec idemconsume.Decision) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.n[dec.Reason]++
	d.d = append(d.d, dec)
}

func (d *decisions) get(r idemconsume.Reason) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n[r]
}

func (d *decisions) String() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return fmt.Sprint(d.n)
}

var errAckLost = errors.New("test: acknowledgement lost")

// lossyAcks is a client whose XACKs are lost when drop says so: the
// consumer made the effect and crashed before its acknowledgement reached
// Redis.
type lossyAcks struct {
	*redis.Client
	drop func(id string) bool
}

// XAck acknowledges the entries of ids that drop keeps, and fails when it
// dropped any: the acknowledgements of a batch lost in part.
func (l lossyAcks) XAck(ctx context.Context, stream, group string, ids ...string) *redis.IntCmd {
	var kept []string
	for _, id := range ids {
		if !l.drop(id) {
			kept = append(kept, id)
		}
	}
	if len(kept) == len(ids) {
		return l.Client.XAck(ctx, stream, group, ids...)
	}
	if len(kept) > 0 {
		l.Client.XAck(ctx, stream, group, kept...)
	}
	cmd := redis.NewIntCmd(ctx)
	cmd.SetErr(errAckLost)
	return cmd
}
