package coordinator

import (
	"context"
	"sync"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"
)

// DoBatch runs a batch of calls as Do runs each of them, with the store
// round trips of the batch shared: it reserves or reads every key at once
// (one idemstore.BulkStore.ReserveMany), runs the actions of the keys it reserved one
// after another in the order of calls, and completes them together: a
// result is sent as soon as its action returns when no completion of the
// batch is in flight, and the results that become ready meanwhile go
// together in the next idemstore.BulkStore.CompleteMany. A result thus waits for no
// more than one other round trip, whatever the actions after it take; a
// process that dies in the middle of a batch leaves unrecorded the actions
// that ended within about a round trip of its death (single calls, one
// after another, leave at most the one in hand), whose keys run again once
// their leases run out. action(ctx, i) is the action of calls[i]; it runs
// at most once per key, as Do's would. The results and errors come back in
// the order of calls, each as DoResult would return it; a key that appears
// twice in calls is run once, and its later calls replay its result.
//
// When ctx ends, the actions that have not begun do not run: their calls
// return ctx's error and their keys are released. A key whose record
// another caller holds is waited on (or refused) as the
// in-flight mode says, in its turn; the keys the batch reserved keep their
// leases renewed meanwhile, from the batch's reservation until their
// completion. A ReserveMany that fails fails the keys whose outcome it
// does not know (every key, unless the store says which it knows; see
// idemstore.BulkStore), each as its own call's Reserve would (the on-storage-error
// mode decides), and a CompleteMany that fails is retried per key in the
// background, as a single completion is.
//
// DoBatch falls back to one call after another, each as DoResult, when the
// store has no bulk operations, for an idemstore.Transactor (each call then has its
// own transaction), in in-flight mode "run", for a fenced operation, and
// when the coordinator is disabled. It reports idemevent.BulkHit and
// idemevent.BulkMiss per operation when it used the bulk path.
func DoBatch[T any](ctx context.Context, c *Coordinator, calls []Call, action func(ctx context.Context, i int) (T, error)) ([]Result[T], []error) {
	res, errs := make([]Result[T], len(calls)), make([]error, len(calls))
	if action == nil {
		for i := range errs {
			errs[i] = invalid("action is nil")
		}
		return res, errs
	}
	one := func(i int) {
		res[i], errs[i] = do(ctx, c, calls[i], JSONCodec[T]{}, func(ctx context.Context) (T, error) { return action(ctx, i) })
	}
	bulk, ok := c.store.(idemstore.BulkStore)
	if !ok || !c.cfg.enabled || c.tx != nil || c.cfg.inFlight == InFlightRun {
		for i := range calls {
			one(i)
		}
		return res, errs
	}
	b := &batch[T]{c: c, bulk: bulk, res: res, errs: errs, flows: make([]*flow[T], len(calls))}
	b.prepare(calls, action)
	b.reserve(ctx)
	b.run(ctx, one)
	return res, errs
}

// batch is one DoBatch on the bulk path.
type batch[T any] struct {
	c     *Coordinator
	bulk  idemstore.BulkStore
	res   []Result[T]
	errs  []error
	flows []*flow[T] // nil for a call that takes another path (see prepare)
	later []int      // calls of a key met earlier in the batch: run after it
	again []bool     // again[i]: call i is one of later
	// Parallel, one entry per call of the bulk path, in order:
	at      []int // the call's index
	answers []answer
	held    []*holding // this batch's reservation, or nil
	missed  []bool     // the action ran under the batch's reservation
	acted   bool       // an action of the batch has run: answers may be stale

	// The completions: see ready.
	mu       sync.Mutex
	queue    []int // entries whose action ran, not yet sent
	flushing bool  // a flush goroutine runs
	done     sync.WaitGroup
}

// holding is a reservation the batch made: the action's context and the
// lease's renewer, from the reservation until the completion.
type holding struct {
	actx    context.Context
	cancel  context.CancelCauseFunc
	renewer *renewer
	ran     bool // the action returned successfully: complete
}

// prepare checks the calls and makes a flow for each call that takes the
// bulk path: valid, of an operation that is not fenced, and of a key not
// met before in the batch.
func (b *batch[T]) prepare(calls []Call, action func(context.Context, int) (T, error)) {
	seen := make(map[idemstore.Key]bool, len(calls))
	b.again = make([]bool, len(calls))
	for i, call := range calls {
		ttl, err := b.c.check(call)
		key := idemstore.Key{Operation: call.Operation, Key: call.Key}
		switch {
		case err != nil:
			b.errs[i] = err
			continue
		case b.c.cfg.fenced[call.Operation]:
			continue // one call, as Do, for its fence
		case seen[key]:
			b.later = append(b.later, i)
			b.again[i] = true
			continue
		}
		seen[key] = true
		f := &flow[T]{
			exec:  exec{c: b.c, key: key, fp: call.Fingerprint, ttl: ttl},
			codec: JSONCodec[T]{},
		}
		f.action = func(ctx context.Context) (T, error) { return action(ctx, i) }
		f.newToken()
		b.flows[i] = f
		b.at = append(b.at, i)
	}
}

// reserve reserves or reads every key of the bulk path in one ReserveMany,
// and holds the keys it reserved.
func (b *batch[T]) reserve(ctx context.Context) {
	n := len(b.at)
	if n == 0 {
		return
	}
	keys, ws := make([]idemstore.Key, n), make([]idemstore.Write, n)
	for j, i := range b.at {
		f := b.flows[i]
		keys[j] = f.key
		ws[j] = idemstore.Write{State: idemstore.StatePending, Token: f.token, Fingerprint: f.fp, TTL: b.c.cfg.lease}
	}
	first := b.flows[b.at[0]]
	sctx, cancel, sent := first.begin(ctx)
	existing, written, err := b.bulk.ReserveMany(sctx, keys, ws, false)
	b.bulkCall(ctx, cancel, sent, idemevent.MethodReserveMany, err)
	b.answers, b.held, b.missed = make([]answer, n), make([]*holding, n), make([]bool, n)
	partial := err != nil && len(existing) == n && len(written) == n
	for j, i := range b.at {
		a := &b.answers[j]
		a.sent, a.err = sent, err
		if err != nil && !(partial && (written[j] || existing[j].State != idemstore.StateAbsent)) {
			continue // unknown: the entry takes the error, as its own Reserve would
		}
		a.err = nil
		a.rec, a.written = existing[j], written[j]
		if f := b.flows[i]; a.written || f.ours(a.rec, idemstore.StatePending) {
			b.held[j] = b.hold(ctx, f, sent)
		}
	}
}

// bulkCall reports a bulk store call that ended with err.
func (b *batch[T]) bulkCall(ctx context.Context, cancel context.CancelFunc, start time.Time, m idemevent.Method, err error) {
	if cancel != nil {
		cancel()
	}
	first := b.flows[b.at[0]]
	b.c.obs.Observe(ctx, idemevent.Event{Kind: idemevent.StorageCall, Key: idemstore.Key{Operation: first.key.Operation}, Method: m, Duration: time.Since(start), Err: err})
}

// hold starts the lease of f's reservation, sent at sent.
func (b *batch[T]) hold(ctx context.Context, f *flow[T], sent time.Time) *holding {
	res := Reservation{Operation: f.key.Operation, Key: f.key.Key, Token: f.token}
	actx, cancel := context.WithCancelCause(context.WithValue(ctx, reservationKey{}, res))
	return &holding{actx: actx, cancel: cancel, renewer: f.startRenewer(ctx, cancel, sent)}
}

// run settles every call in order, waits for the completions, then runs
// the calls of keys met twice.
func (b *batch[T]) run(ctx context.Context, one func(int)) {
	j := 0 // the next entry of the bulk path
	returned := false
	defer func() {
		if !returned { // an action panicked: keep what ran, free the rest
			b.done.Wait()
			for j, h := range b.held {
				if h != nil && !h.ran {
					b.free(ctx, j)
				}
			}
		}
	}()
	for i := range b.flows {
		f := b.flows[i]
		switch {
		case b.errs[i] != nil:
		case f == nil && !b.again[i]:
			one(i)
		case f != nil:
			b.settle(ctx, j)
			j++
		}
	}
	returned = true
	b.done.Wait()
	b.count(ctx)
	for _, i := range b.later {
		one(i)
	}
}

// settle settles entry j of the bulk path: it runs the action under the
// batch's reservation and hands its result to the completions, or takes
// the record another caller wrote as a single call's Reserve would.
func (b *batch[T]) settle(ctx context.Context, j int) {
	i := b.at[j]
	f, h := b.flows[i], b.held[j]
	if h == nil {
		a := &b.answers[j]
		if b.acted && a.err == nil && a.rec.State == idemstore.StatePending {
			// Another caller held the key at the batch's read, and actions
			// of the batch have run since: the holder may have finished.
			// The entry reserves again, as a call starting now would, so
			// that raise and run decide on what the store says now.
			a = nil
		}
		b.res[i], b.errs[i] = f.reservedAfter(ctx, a)
		return
	}
	if err := ctx.Err(); err != nil {
		// The caller hung up before the action's turn: it does not run,
		// as a single call whose Reserve met the ended context would not.
		b.free(ctx, j)
		b.errs[i] = err
		return
	}
	if context.Cause(h.actx) != nil {
		// The lease was lost, or may have run out (the watchdog), while
		// the entry waited for its turn: the action does not start on it.
		// The entry gives the reservation up and reserves again, as a call
		// that starts now would, and runs, waits or replays on what the
		// store says then.
		b.free(ctx, j)
		b.res[i], b.errs[i] = f.reservedAfter(ctx, nil)
		return
	}
	f.observe(ctx, idemevent.Event{Kind: idemevent.Miss})
	b.missed[j] = true
	b.acted = true
	err := f.run(h.actx)
	b.res[i] = f.mine()
	if err != nil {
		b.free(ctx, j)
		b.errs[i] = err
		return
	}
	f.keep(ctx)
	h.ran = true
	b.ready(ctx, j)
}

// free ends entry j's reservation without a result: its action failed,
// or never ran.
func (b *batch[T]) free(ctx context.Context, j int) {
	h := b.held[j]
	b.held[j] = nil
	h.renewer.stop()
	h.cancel(nil)
	b.flows[b.at[j]].release(ctx)
}

// ready queues entry j, whose action ran, for completion. A result is
// stored as soon as it is ready, as a single call's is, when no completion
// of the batch is in flight; the results that become ready while one is
// in flight go together in the next: one CompleteMany for as many actions
// as ended during a round trip. A result thus waits for at most one other
// completion, whatever the actions after it take; a process that dies in
// the middle of a batch leaves unrecorded the actions that ended within
// about a round trip of its death.
func (b *batch[T]) ready(ctx context.Context, j int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.queue = append(b.queue, j)
	if !b.flushing {
		b.flushing = true
		b.done.Add(1)
		go b.flush(ctx)
	}
}

// flush completes the queued entries, a CompleteMany at a time, until the
// queue is empty.
func (b *batch[T]) flush(ctx context.Context) {
	defer b.done.Done()
	for {
		b.mu.Lock()
		js := b.queue
		b.queue = nil
		if len(js) == 0 {
			b.flushing = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		b.complete(ctx, js)
	}
}

// complete stores the results of entries js in one CompleteMany. A
// completion that fails is retried per key in the background, as
// runReserved's is.
func (b *batch[T]) complete(ctx context.Context, js []int) {
	var keep []int
	for _, j := range js {
		if h := b.held[j]; h.renewer.stop() {
			h.cancel(nil) // the lease was lost: reported by the renewer
		} else {
			keep = append(keep, j)
		}
	}
	if len(keep) == 0 {
		return
	}
	keys, tokens, cs := make([]idemstore.Key, len(keep)), make([]string, len(keep)), make([]idemstore.Completion, len(keep))
	for n, j := range keep {
		f := b.flows[b.at[j]]
		keys[n], tokens[n] = f.key, f.token
		cs[n] = idemstore.Completion{State: f.state, Result: f.payload, TTL: f.ttl}
	}
	dctx := context.WithoutCancel(ctx)
	sctx, cancel, start := b.flows[b.at[keep[0]]].begin(dctx)
	ok, err := b.bulk.CompleteMany(sctx, keys, tokens, cs)
	b.bulkCall(ctx, cancel, start, idemevent.MethodCompleteMany, err)
	for n, j := range keep {
		f, h := b.flows[b.at[j]], b.held[j]
		h.cancel(nil)
		if err != nil {
			f.storageFailed(ctx, idemevent.ErrorStorageSave, idemevent.MethodComplete, err)
			f.saveLater(ctx, h.renewer.deadline.Add(watchdogMargin(b.c.cfg.lease)))
			continue
		}
		f.settle(ctx, ok[n])
	}
}

// count reports the batch's replays and runs per operation.
func (b *batch[T]) count(ctx context.Context) {
	type counts struct{ hits, misses int }
	per := map[string]*counts{}
	var order []string
	for j, i := range b.at {
		op := b.flows[i].key.Operation
		n := per[op]
		if n == nil {
			n = &counts{}
			per[op] = n
			order = append(order, op)
		}
		switch {
		case b.missed[j]:
			n.misses++
		case b.errs[i] == nil && b.res[i].Replayed:
			n.hits++
		}
	}
	for _, op := range order {
		if n := per[op]; n.hits > 0 {
			b.c.obs.Observe(ctx, idemevent.Event{Kind: idemevent.BulkHit, Key: idemstore.Key{Operation: op}, Count: n.hits})
		}
		if n := per[op]; n.misses > 0 {
			b.c.obs.Observe(ctx, idemevent.Event{Kind: idemevent.BulkMiss, Key: idemstore.Key{Operation: op}, Count: n.misses})
		}
	}
}
