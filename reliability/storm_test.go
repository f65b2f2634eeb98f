//go:build linux

package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/redisrepo"
)

// The coordinator's options in every storm: short, so that faults resolve
// quickly. The lease rule holds: renew + storage timeout (300ms) < 0.9 ×
// lease (900ms).
const (
	lease          = time.Second
	storageTimeout = 100 * time.Millisecond
	renewInterval  = 200 * time.Millisecond
)

// The operations of a storm. Every key is used under both, so that a replay
// of the other operation's result would show. storm.charge calls carry one
// fingerprint per key; storm.reuse calls carry one of two fingerprints at
// random, so that one of them is refused with ErrKeyReuse and a replay of
// the other's result would show.
const (
	opCharge = "storm.charge"
	opReuse  = "storm.reuse"
)

// modes is a pair of an in-flight mode and an on-storage-error mode.
type modes struct {
	inFlight coordinator.InFlightMode
	onError  coordinator.OnStorageErrorMode
}

func (m modes) String() string {
	return "inflight=" + string(m.inFlight) + ",onerror=" + string(m.onError)
}

// allModes is every mode pair.
var allModes = []modes{
	{coordinator.InFlightWait, coordinator.OnStorageErrorRun},
	{coordinator.InFlightWait, coordinator.OnStorageErrorRaise},
	{coordinator.InFlightRaise, coordinator.OnStorageErrorRun},
	{coordinator.InFlightRaise, coordinator.OnStorageErrorRaise},
	{coordinator.InFlightRun, coordinator.OnStorageErrorRun},
	{coordinator.InFlightRun, coordinator.OnStorageErrorRaise},
}

// stormConfig sizes a storm.
type stormConfig struct {
	callers int
	// Keys are drawn with a Zipf distribution (s=1.1) over ranks 0..ranks-1;
	// rank r is key "k<r+shift>", and shift grows by shiftBy every
	// shiftEvery, so that the hot keys change during the storm and first
	// runs (reservations, completions) keep happening while faults strike,
	// not only replays.
	ranks      int
	shiftBy    int
	shiftEvery time.Duration
	warmup     time.Duration // before the fault
	after      time.Duration // after the fault has ended
	maxAction  time.Duration // actions take a random 0..maxAction
	seed       uint64
}

func configFor(lv level) stormConfig {
	c := stormConfig{callers: 64, ranks: 500, shiftBy: 25, shiftEvery: 100 * time.Millisecond,
		warmup: 400 * time.Millisecond, after: 1500 * time.Millisecond, maxAction: 5 * time.Millisecond}
	if lv == levelFull {
		c.warmup, c.after = 2*time.Second, 4*time.Second
	}
	if v := os.Getenv("IDEMPOTENCY_TEST_RELIABILITY_SEED"); v != "" {
		c.seed, _ = strconv.ParseUint(v, 10, 64)
	} else {
		c.seed = rand.Uint64()
	}
	return c
}

// storm is one run of concurrent callers against one coordinator.
type storm struct {
	fencing coordinator.Option // WithFencedOperations in a fenced storm, else nil
	batched bool               // the callers make batches of calls (DoBatch)
	cfg     stormConfig
	modes   modes
	base    time.Time // the clock's zero: every time is time.Since(base), monotonic
	coord   *coordinator.Coordinator
	obs     *observer

	// gate, when not nil, holds new calls back until it is closed: a fault
	// pauses the storm (the held link's release); calls in flight go on.
	gateMu sync.Mutex
	gate   chan struct{}
	nextID atomic.Int64
	mu     sync.Mutex
	calls  [][]*call        // by client
	effect map[string]int64 // by pkey: the actions' own count of their effects
}

func (s *storm) now() int64 { return int64(time.Since(s.base)) }

// action returns the action of call cl: it sleeps a random short time
// (0..maxAction, or until its context ends: an action that honours
// cancellation, as the docs ask), then makes its effect (counted per key,
// recorded on the call) and returns the call's own value.
func (s *storm) action(cl *call, r *rand.Rand) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		cl.invoked = true
		cl.actStart = s.now()
		res, ok := coordinator.ReservationFromContext(ctx)
		cl.protected, cl.token, cl.fence = ok, res.Token, res.Fence
		if d := time.Duration(r.Int64N(int64(s.cfg.maxAction) + 1)); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
		if ctx.Err() != nil {
			cl.actEnd = s.now()
			return "", context.Cause(ctx)
		}
		s.mu.Lock()
		s.effect[cl.pkey()]++
		s.mu.Unlock()
		cl.ran = true
		cl.actEnd = s.now()
		return cl.own, nil
	}
}

// pause holds the callers' new calls back until resume.
func (s *storm) pause() {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	s.gate = make(chan struct{})
}

func (s *storm) resume() {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	close(s.gate)
	s.gate = nil
}

// callDeadline is the own deadline of every call whose context can end: far
// beyond any documented bound, so that a call that reaches it is a hang
// (errContext).
const callDeadline = 20 * time.Second

// do makes one call of Do and records it. Every other call runs under a
// context that cannot end (a queue consumer's context.Background), so that
// its store calls are bounded only by the storage timeout's shared deadline
// (coordinator/deadline.go) and a deadline that failed to end one would show
// as a hang; the others under a context that can (net/http's), with
// callDeadline.
func (s *storm) do(c *coordinator.Coordinator, client int, r *rand.Rand, op, key, fp string, final bool) *call {
	id := int(s.nextID.Add(1))
	cl := &call{id: id, client: client, op: op, key: key, fp: fp, own: value(op, key, fp, id), final: final}
	ctx := context.WithValue(context.Background(), callKey{}, cl)
	if id%2 == 1 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, callDeadline)
		defer cancel()
	}
	cl.start = s.now()
	func() {
		defer func() {
			if p := recover(); p != nil {
				cl.panicked = p
				cl.err = fmt.Errorf("panic: %v", p)
			}
		}()
		cl.value, cl.err = coordinator.Do(ctx, c, coordinator.Call{Operation: op, Key: key, Fingerprint: fp}, s.action(cl, r))
	}()
	cl.end = s.now()
	cl.class = classify(cl.err)
	if cl.class != okValue {
		cl.value = ""
	}
	s.mu.Lock()
	s.calls[client] = append(s.calls[client], cl)
	s.mu.Unlock()
	return cl
}

// caller issues calls until stop is closed.
func (s *storm) caller(client int, stop <-chan struct{}) {
	r := rand.New(rand.NewPCG(s.cfg.seed, uint64(client)))
	z := rand.NewZipf(r, 1.1, 1, uint64(s.cfg.ranks-1))
	for {
		select {
		case <-stop:
			return
		default:
		}
		s.gateMu.Lock()
		gate := s.gate
		s.gateMu.Unlock()
		if gate != nil {
			<-gate
		}
		n := 1
		if s.batched {
			n = 2 + r.IntN(7)
		}
		var batch []coordinator.Call
		seen := map[idemstore.Key]bool{}
		for range n {
			shift := int(s.now()/int64(s.cfg.shiftEvery)) * s.cfg.shiftBy
			key := "k" + strconv.Itoa(int(z.Uint64())+shift)
			op, fp := opCharge, "fp-"+key
			if r.IntN(8) == 0 {
				op, fp = opReuse, []string{"fpA", "fpB"}[r.IntN(2)]
			}
			if k := (idemstore.Key{Operation: op, Key: key}); !seen[k] {
				seen[k] = true
				batch = append(batch, coordinator.Call{Operation: op, Key: key, Fingerprint: fp})
			}
		}
		if !s.batched {
			s.do(s.coord, client, r, batch[0].Operation, batch[0].Key, batch[0].Fingerprint, false)
			continue
		}
		s.doBatch(s.coord, client, r, batch)
	}
}

// batchCallsKey carries the calls of a batch in the context of its
// DoBatch, by key, so that the observer can attribute events to them.
type batchCallsKey struct{}

// doBatch makes one DoBatch of calls, whose keys are distinct, and records
// each as a call of its own that spans the batch. As do, every other batch
// runs under a context that cannot end.
func (s *storm) doBatch(c *coordinator.Coordinator, client int, r *rand.Rand, calls []coordinator.Call) {
	cls := make([]*call, len(calls))
	byKey := make(map[idemstore.Key]*call, len(calls))
	actions := make([]func(context.Context) (string, error), len(calls))
	for i, k := range calls {
		id := int(s.nextID.Add(1))
		cls[i] = &call{id: id, client: client, op: k.Operation, key: k.Key, fp: k.Fingerprint, own: value(k.Operation, k.Key, k.Fingerprint, id)}
		byKey[idemstore.Key{Operation: k.Operation, Key: k.Key}] = cls[i]
		actions[i] = s.action(cls[i], r)
	}
	ctx := context.WithValue(context.Background(), batchCallsKey{}, byKey)
	if cls[0].id%2 == 1 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, callDeadline)
		defer cancel()
	}
	start := s.now()
	var res []coordinator.Result[string]
	var errs []error
	var panicked any
	func() {
		defer func() { panicked = recover() }()
		res, errs = coordinator.DoBatch(ctx, c, calls, func(ctx context.Context, i int) (string, error) { return actions[i](ctx) })
	}()
	end := s.now()
	for i, cl := range cls {
		cl.start, cl.end = start, end
		switch {
		case panicked != nil:
			cl.panicked, cl.err = panicked, fmt.Errorf("panic: %v", panicked)
		default:
			cl.value, cl.err = res[i].Value, errs[i]
		}
		cl.class = classify(cl.err)
		if cl.class != okValue {
			cl.value = ""
		}
	}
	s.mu.Lock()
	s.calls[client] = append(s.calls[client], cls...)
	s.mu.Unlock()
}

// backend is a Redis that a storm runs against.
type backend interface {
	// client returns a new client for the storm's coordinator, through the
	// fault proxy when the backend has one.
	client(t *testing.T) redis.UniversalClient
	// direct returns a new client straight to Redis, for the final reads.
	direct(t *testing.T) redis.UniversalClient
}

// newClient returns the client that idempotency.NewRedisClient builds (what
// the fx module uses) for a server, or for a cluster when cluster is set,
// with the storms' storage timeout: one dial attempt per connection, a dial
// timeout of the storage timeout, context deadlines honoured; and, when
// pipelined, read and write timeouts of the storage timeout, as with
// IDEMPOTENCY_REDIS_AUTO_PIPELINE (the storm then sends through
// idempotency.NewStoreClient).
func newClient(t *testing.T, addrs []string, cluster, pipelined bool) redis.UniversalClient {
	t.Helper()
	s := idempotency.DefaultSettings()
	s.StorageTimeout, s.Lease, s.RedisAutoPipeline = storageTimeout, lease, pipelined
	if cluster {
		s.RedisClusterAddrs = addrs
	} else {
		s.RedisURL = "redis://" + addrs[0] + "/0"
	}
	c, err := idempotency.NewRedisClient(s)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// scenario is one storm: a backend, a mode pair, a fault.
type scenario struct {
	backend string
	modes   modes
	fault   fault
	// wrap, when set, wraps the store (the checker's self-test), which
	// label names.
	wrap  func(*redisrepo.Store) idemstore.Store
	label string
	// breaker adds the module's circuit breaker to the storm's client
	// (idempotency.AddBreaker, the module's defaults but the storm's lease).
	breaker bool
	// fenced fences both operations (coordinator.WithFencedOperations):
	// reservations go through the fence script, and checkFences checks
	// their fences.
	fenced bool
	// autoPipeline sends the store's commands through what
	// IDEMPOTENCY_REDIS_AUTO_PIPELINE gives the store
	// (idempotency.NewStoreClient over go-redis's AutoPipeliner); the
	// backend builds its client for it.
	autoPipeline bool
	// batched makes the callers' calls in batches of 2 to 8 distinct keys
	// (coordinator.DoBatch: one ReserveMany, completions in CompleteMany).
	batched bool
}

func (sc scenario) name() string {
	name := sc.backend + "/" + sc.fault.name + "/" + sc.modes.inFlight.String() + "-" + sc.modes.onError.String()
	if sc.breaker {
		name = "breaker/" + name
	}
	if sc.fenced {
		name = "fenced/" + name
	}
	if sc.autoPipeline {
		name = "autopipeline/" + name
	}
	if sc.batched {
		name = "batched/" + name
	}
	if sc.label != "" {
		name = sc.label + "/" + name
	}
	return name
}

// outcome is a storm's history, its report and the fault's figures.
type outcome struct {
	h      *history
	r      *report
	fault  faultResult
	events string
	// storeFailures counts the calls that the store's failure reached
	// (a *StorageError, or an unprotected run) among those that began once
	// the fault had begun; recovery is how long after the fault's end the
	// last of them returned.
	storeFailures int
	// otherFailures are those of the store failures that were not
	// timeouts, one error each, for a quiet fault.
	otherFailures []error
	recovery      time.Duration
	duration      time.Duration
	// given is how many saves the coordinator gave up.
	given int
	// refused is how many calls' store failures were the breaker's
	// refusals (idempotency.ErrBreakerOpen).
	refused int
}

// runStorm runs sc against b and checks the history. It does not fail t on
// the checker's findings: the caller decides (the self-test expects some).
func runStorm(t *testing.T, lv level, sc scenario, b backend, env *faultEnv) *outcome {
	t.Helper()
	cfg := configFor(lv)
	t.Logf("seed %d (IDEMPOTENCY_TEST_RELIABILITY_SEED)", cfg.seed)
	prefix := "rel:" + strconv.FormatUint(rand.Uint64()%1e9, 36) + ":"
	env.prefix = prefix

	leaks := goleak.IgnoreCurrent()
	client := b.client(t)
	if sc.breaker {
		bs := idempotency.DefaultSettings()
		bs.Lease = lease // a cool-down of a tenth of it
		if err := idempotency.AddBreaker(client, bs, nil); err != nil {
			t.Fatal(err)
		}
	}
	var rc redisrepo.Client = client
	if sc.autoPipeline {
		ps := idempotency.DefaultSettings()
		ps.StorageTimeout, ps.Lease, ps.RedisAutoPipeline = storageTimeout, lease, true
		var err error
		if rc, err = idempotency.NewStoreClient(ps, client); err != nil {
			t.Fatal(err)
		}
	}
	var store idemstore.Store = redisrepo.New(rc, redisrepo.WithKeyPrefix(prefix))
	if sc.wrap != nil {
		store = sc.wrap(store.(*redisrepo.Store))
	}
	base := time.Now()
	obs := &observer{now: func() int64 { return int64(time.Since(base)) }}
	var fencing coordinator.Option
	if sc.fenced {
		fencing = coordinator.WithFencedOperations(opCharge, opReuse)
	}
	c, err := coordinator.New(store,
		coordinator.WithLease(lease), coordinator.WithStorageTimeout(storageTimeout), coordinator.WithRenewInterval(renewInterval),
		coordinator.WithInFlight(sc.modes.inFlight), coordinator.WithOnStorageError(sc.modes.onError), coordinator.WithObserver(obs),
		fencing)
	if err != nil {
		t.Fatal(err)
	}
	s := &storm{fencing: fencing, batched: sc.batched, cfg: cfg, modes: sc.modes, base: base, coord: c, obs: obs,
		calls: make([][]*call, cfg.callers+finalReaders), effect: map[string]int64{}}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range cfg.callers {
		wg.Go(func() { s.caller(i, stop) })
	}
	time.Sleep(cfg.warmup)
	env.now = s.now
	env.pause, env.resume = s.pause, s.resume
	env.store = store
	fr := sc.fault.inject(t, env)
	time.Sleep(cfg.after)
	close(stop)
	wg.Wait()
	duration := time.Duration(s.now())
	_ = c.Close() // waits for the background saves and releases
	_ = client.Close()

	s.finalReads(t, b, prefix)

	h := &history{inFlight: sc.modes.inFlight, onError: sc.modes.onError, windows: fr.windows, effects: s.effect, hangLimit: sc.fault.hangLimit}
	for _, cs := range s.calls {
		h.calls = append(h.calls, cs...)
	}
	o := &outcome{h: h, fault: fr, events: obs.counts(), duration: duration, given: obs.count(saveGivenUpEvent)}
	var lastFail int64 = -1
	for _, cl := range h.calls {
		if cl.final || cl.start < fr.start {
			continue
		}
		if err := cl.storeErr(); err != nil {
			o.storeFailures++
			lastFail = max(lastFail, cl.end)
			if errors.Is(err, idempotency.ErrBreakerOpen) {
				o.refused++
			}
			if !isTimeout(err) {
				o.otherFailures = append(o.otherFailures, err)
			}
		}
	}
	if lastFail > fr.end {
		o.recovery = time.Duration(lastFail - fr.end)
	}
	// A server that a fault restarted has its own waiter goroutine.
	goleak.VerifyNone(t, leaks, ignoreProbe, goleak.IgnoreAnyFunction("github.com/idemkit/idempotency/internal/redistest.startProc.func1"))
	o.r = h.check()
	if fails := o.r.failures(); len(fails) > 0 {
		keys := maps.Clone(o.r.badKeys)
		for _, k := range append(o.r.illegalKeys, o.r.unknownKeys...) {
			keys[k] = true
		}
		var dump strings.Builder
		for _, k := range sortedKeys(keys) {
			dump.WriteString(h.dump(k))
		}
		path := t.ArtifactDir() + "/keys.txt"
		if err := os.WriteFile(path, []byte(dump.String()), 0o644); err == nil {
			t.Logf("the failing keys' histories are in %s", path)
		}
		if d := dump.String(); len(d) < 6000 {
			t.Log(d)
		} else {
			t.Log(d[:6000])
		}
	}
	if o.r.smallestIllegal != nil && len(o.r.smallestIllegal) < 2000 {
		if dir := t.ArtifactDir(); dir != "" {
			// porcupine's visualisation of the failing keys
			path := dir + "/history.html"
			if err := visualize(o.r, path); err == nil {
				t.Logf("history visualised in %s", path)
			}
		}
	}
	return o
}

// finalReaders is how many clients read every key after the storm.
const finalReaders = 8

// finalReads reads every key the storm used, after it, with a coordinator
// of its own on a fresh client (in-flight wait, on-storage-error raise, so
// that it never runs unprotected): a key whose result is stored replays it;
// a key whose action runs here had no result stored. The reads are part of
// the history. A read that fails (the store still recovering) is retried.
func (s *storm) finalReads(t *testing.T, b backend, prefix string) {
	t.Helper()
	client := b.direct(t)
	defer client.Close()
	c, err := coordinator.New(redisrepo.New(client, redisrepo.WithKeyPrefix(prefix)),
		coordinator.WithLease(3*time.Second), coordinator.WithStorageTimeout(500*time.Millisecond), coordinator.WithRenewInterval(time.Second),
		coordinator.WithWaitTimeout(3*time.Second), coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise), s.fencing)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var all []*call
	for _, cs := range s.calls {
		all = append(all, cs...)
	}
	readAll(s.cfg.seed, s.cfg.callers, targetsOf(all), func(client int, r *rand.Rand, tg readTarget) *call {
		return s.do(c, client, r, tg.op, tg.key, tg.fp, true)
	})
}

// readTarget is a key to read after a storm, with the fingerprint to read it
// with: none for opReuse, whose two fingerprints race, so that the read
// replays whichever was stored.
type readTarget struct{ op, key, fp string }

// targetsOf returns every key that calls (final reads aside) used, once
// each, sorted.
func targetsOf(calls []*call) []readTarget {
	seen := map[string]bool{}
	var targets []readTarget
	for _, cl := range calls {
		if cl.final || seen[cl.pkey()] {
			continue
		}
		seen[cl.pkey()] = true
		fp := cl.fp
		if cl.op == opReuse {
			fp = ""
		}
		targets = append(targets, readTarget{cl.op, cl.key, fp})
	}
	slices.SortFunc(targets, func(a, b readTarget) int {
		if a.op != b.op {
			return compareStrings(a.op, b.op)
		}
		return compareStrings(a.key, b.key)
	})
	return targets
}

// readAll reads every target with finalReaders readers at once (reader w is
// client firstClient+w) through read, which makes and records one call; a
// read that failed with a storage error or ErrInProgress (the store still
// recovering, a holder killed) is made again for up to 10s.
func readAll(seed uint64, firstClient int, targets []readTarget, read func(client int, r *rand.Rand, tg readTarget) *call) {
	var wg sync.WaitGroup
	for w := range finalReaders {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(1000+firstClient+w)))
			for i := w; i < len(targets); i += finalReaders {
				deadline := time.Now().Add(10 * time.Second)
				for {
					cl := read(firstClient+w, r, targets[i])
					if retry := cl.class == errStorage || cl.class == errInProgress; !retry || time.Now().After(deadline) {
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
