package reliability_test

import (
	"cmp"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemkit/idempotency/coordinator"
)

// The model: the documented per-key guarantee as a sequential specification
// (docs/architecture.md, "The guarantee, honestly" and "When the store
// fails"). The history is partitioned by key (operation and key): keys are
// independent, and each key's history must be linearizable on its own.
//
// The state of a key is its committed result: "" before any (absent, or
// pending: a reservation whose action has not stored a result), else the
// value that a later call replays. An operation is one call of Do, or one
// loss window (below), and steps the state as follows:
//
//   - A call that returned an error (ErrInProgress, ErrKeyReuse, a
//     *StorageError, an action cancelled with ErrLeaseLost, a context error)
//     does not change the state, in any state. Its action must not have made
//     its effect: once the action has run, Do returns its result, whatever
//     the store does ("Once the action has run, nothing raises").
//   - A call that returned v without running its action is a replay: v must
//     be the committed result (state == v, state != "").
//   - A call that ran its action under a reservation (ReservationFromContext
//     is set: in-flight modes wait and raise with the store up) and returned
//     its own value v committed it: allowed only when nothing is committed
//     (state == ""), and then the state is v. This is "at most one live lease
//     holder per key", and "a result that ran is stored if the store lets
//     it": a protected run whose result was lost with the store up shows as
//     a second protected run (or the final read's run) in a state that is
//     not "", which is illegal.
//   - A call that ran its action without a reservation (the documented
//     exceptions: in-flight mode run, which reads, runs and writes only if
//     the key is absent; or on-storage-error mode run with the store failing,
//     where the action runs unprotected and its result is written best
//     effort, only if the key is absent) and returned its own value v: if
//     nothing is committed, v may have been written or not (state becomes v
//     or stays ""); if something is committed, it stays.
//   - A call in in-flight mode run that ran its action but returned another
//     value v adopted the winner of a collision: v must be the committed
//     result.
//   - A loss window of a kill -9 with an empty restart (a wipe) empties the
//     state: Redis lost every record, and a run after it is allowed (the
//     docs' guarantee holds "while the store is up"). A loss window of a
//     failover may empty it or not: a failover can lose what had not reached
//     the replica.
//
// The expiry of a pending record (a holder that stalled past its lease) is
// not modelled: no scenario stalls Redis or a holder for a lease.

// opKind is what an operation of the model is.
type opKind uint8

const (
	opCall      opKind = iota // a call of Do
	opWipe                    // every record lost (kill -9, empty restart)
	opMaybeLose               // records may be lost (a failover)
)

// opInput is an operation's input: the key, and the value the call's action
// would produce.
type opInput struct {
	pkey    string
	kind    opKind
	own     string
	runMode bool // in-flight mode run
}

// opOutput is an operation's output.
type opOutput struct {
	value     string // the value returned; "" for an error
	failed    bool   // Do returned an error
	class     errClass
	ran       bool // the action made its effect
	protected bool // under a reservation
	// mayLose: a protected run whose result the coordinator reported not
	// kept for a cause the docs allow (its save was given up because the
	// store failed until the reservation could have expired, or its lease
	// was lost): it may have committed or not.
	mayLose bool
}

// step is the model's step function: the states the key may be in after the
// operation, none if the operation is impossible in state.
func step(state, input, output any) []any {
	s, in, out := state.(string), input.(opInput), output.(opOutput)
	switch in.kind {
	case opWipe:
		return []any{""}
	case opMaybeLose:
		if s == "" {
			return []any{""}
		}
		return []any{s, ""}
	}
	switch {
	case out.class == errKilled:
		// The process died while the call ran: if its action made its
		// effect, its result may have been committed or not.
		switch {
		case !out.ran:
			return []any{s}
		case s == "":
			return []any{in.own, ""}
		case out.protected:
			return nil // it ran under a reservation while a result was committed
		}
		return []any{s}
	case out.class == errNotReplayable:
		// A result is committed that cannot be replayed (the model does not
		// tell which).
		if s != "" && !out.ran {
			return []any{s}
		}
		return nil
	case out.failed:
		if out.ran {
			return nil // an error after the action made its effect
		}
		return []any{s}
	case !out.ran: // a replay
		if s != "" && out.value == s {
			return []any{s}
		}
		return nil
	case out.value != in.own: // run mode: adopted the winner's result
		if in.runMode && s != "" && out.value == s {
			return []any{s}
		}
		return nil
	case out.protected && out.mayLose:
		if s == "" {
			return []any{in.own, ""}
		}
		return []any{s} // its completion was refused: another result is committed
	case out.protected:
		if s == "" {
			return []any{in.own}
		}
		return nil
	default: // unreserved: written only if absent, best effort
		if s == "" {
			return []any{in.own, ""}
		}
		return []any{s}
	}
}

// model is the per-key model for porcupine.
var model = porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(opInput).pkey
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(byKey))
		for _, k := range slices.Sorted(maps.Keys(byKey)) {
			out = append(out, byKey[k])
		}
		return out
	},
	Init:  func() []any { return []any{""} },
	Step:  step,
	Equal: func(a, b any) bool { return a.(string) == b.(string) },
	DescribeOperation: func(input, output any) string {
		in, out := input.(opInput), output.(opOutput)
		switch in.kind {
		case opWipe:
			return "wipe"
		case opMaybeLose:
			return "failover"
		}
		switch {
		case out.failed:
			return fmt.Sprintf("%s -> error %s", in.own, out.class)
		case !out.ran:
			return fmt.Sprintf("%s -> replay %s", in.own, out.value)
		case out.protected:
			return fmt.Sprintf("%s -> ran (reserved) %s", in.own, out.value)
		}
		return fmt.Sprintf("%s -> ran (unreserved) %s", in.own, out.value)
	},
	DescribeState: func(s any) string {
		if s.(string) == "" {
			return "(none)"
		}
		return s.(string)
	},
}

// operations returns the history as porcupine operations: one per call, and
// one per loss window for every key that it covers and that has calls.
func (h *history) operations() []porcupine.Operation {
	ops := make([]porcupine.Operation, 0, len(h.calls))
	keys := map[string]bool{}
	maxClient := 0
	for _, c := range h.calls {
		keys[c.pkey()] = true
		maxClient = max(maxClient, c.client)
		out := opOutput{value: c.value, failed: c.class != okValue, class: c.class, ran: c.ran, protected: c.protected, mayLose: c.protected && c.lossCause() != ""}
		ops = append(ops, porcupine.Operation{
			ClientId: c.client,
			Input:    opInput{pkey: c.pkey(), kind: opCall, own: c.own, runMode: h.inFlightOf(c) == coordinator.InFlightRun},
			Call:     c.start,
			Output:   out,
			Return:   c.end,
		})
	}
	for i, w := range h.windows {
		kind := opMaybeLose
		if w.wipe {
			kind = opWipe
		}
		for _, k := range slices.Sorted(maps.Keys(keys)) {
			if w.covers(k) {
				ops = append(ops, porcupine.Operation{
					ClientId: maxClient + 1 + i,
					Input:    opInput{pkey: k, kind: kind},
					Call:     w.start,
					Output:   opOutput{},
					Return:   w.end,
				})
			}
		}
	}
	return ops
}

// The bounds of porcupine's search. A valid history is checked in well
// under a second per storm; a hot key whose replays all overlap a failover's
// loss window, with a second run after it, makes the search try every order
// of the replays before it places the loss after them, which on a busy
// machine can take longer than keyTimeout. A key whose check does not finish
// within keyTimeout, or that the budget leaves unchecked, is reported
// (unproven) but does not fail the suite: running out of time is not a
// defect, and the same key's effects, results and replays are still checked
// one by one (checkKey), which fails on any extra run, lost result or wrong
// replay. Only a history porcupine proves illegal fails.
const (
	keyTimeout  = 30 * time.Second
	checkBudget = 2 * time.Minute
)

// report is what the checker found in one history, with the figures for
// docs/reliability.md.
type report struct {
	calls      int // calls of the storm (final reads not counted)
	finalReads int
	outcomes   map[string]int // by class: value (ran / replayed), errors
	keys       int            // keys with at least one effect
	effects    int            // effects of the storm's actions
	extra      map[string]int // extra runs allowed by the docs, by reason
	notAllowed []string       // extra runs the docs do not allow
	unstored   map[string]int // results the final read did not find, allowed by the docs, by reason
	lost       []string       // lost results: unstored for no cause the docs allow
	wrong      []string       // wrong replays
	violations []string       // anything else the docs do not allow
	overlaps   map[string]int // two protected actions of one key at once, allowed (by reason)
	badKeys    map[string]bool

	linearizable porcupine.CheckResult // Ok only if every key is Ok
	illegalKeys  []string              // keys whose history is not linearizable
	unknownKeys  []string              // keys not checked within the bounds
	checkTime    time.Duration
	// smallestIllegal is the smallest illegal partition, for porcupine's
	// visualisation.
	smallestIllegal []porcupine.Operation

	maxLatency time.Duration
}

// failures returns every finding that fails the suite, one line each.
func (r *report) failures() []string {
	var out []string
	for _, s := range r.notAllowed {
		out = append(out, "extra run not allowed: "+s)
	}
	for _, s := range r.lost {
		out = append(out, "lost result: "+s)
	}
	for _, s := range r.wrong {
		out = append(out, "wrong replay: "+s)
	}
	out = append(out, r.violations...)
	if len(r.illegalKeys) > 0 {
		out = append(out, fmt.Sprintf("history not linearizable: %d keys (%s)", len(r.illegalKeys), strings.Join(r.illegalKeys[:min(20, len(r.illegalKeys))], ", ")))
	}
	return out
}

// unproven describes the keys porcupine did not finish, "" if none: for the
// log, not a failure.
func (r *report) unproven() string {
	if len(r.unknownKeys) == 0 {
		return ""
	}
	return fmt.Sprintf("history not proven linearizable within %v per key and %v in all (checked call by call instead): %d keys (%s)",
		keyTimeout, checkBudget, len(r.unknownKeys), strings.Join(r.unknownKeys[:min(20, len(r.unknownKeys))], ", "))
}

// extraRuns returns the number of extra runs, allowed or not.
func (r *report) extraRuns() int {
	n := len(r.notAllowed)
	for _, v := range r.extra {
		n += v
	}
	return n
}

// check checks h: the model with porcupine, effects and their extra runs,
// lost results, wrong replays, and the rules the model does not express.
func (h *history) check() *report {
	r := &report{outcomes: map[string]int{}, extra: map[string]int{}, unstored: map[string]int{}, overlaps: map[string]int{}, badKeys: map[string]bool{}}
	byID := make(map[int]*call, len(h.calls))
	byKey := map[string][]*call{}
	for _, c := range h.calls {
		byID[c.id] = c
		byKey[c.pkey()] = append(byKey[c.pkey()], c)
	}
	for _, c := range h.calls {
		h.checkCall(r, c, byID)
	}
	counted := map[string]int64{}
	for _, k := range slices.Sorted(maps.Keys(byKey)) {
		h.checkKey(r, k, byKey[k])
		for _, c := range byKey[k] {
			if c.ran {
				counted[k]++
			}
		}
	}
	for k, n := range h.effects {
		if counted[k] != n {
			r.violations = append(r.violations, fmt.Sprintf("%s: the actions counted %d effects, the calls %d", k, n, counted[k]))
		}
	}

	h.linearize(r)
	return r
}

// constraining returns ops without the calls that failed before their
// action ran. Such a call is legal in every state and leaves it as it was
// (step), so it can be linearized anywhere in its interval: a history is
// linearizable with it exactly when it is without it. Dropping it is what
// keeps a storm's check fast when the store fails: hundreds of failing
// calls at once on a hot key give porcupine's search 2^n orders to try for
// nothing (a sentinel failover on a busy machine did not finish in 30 s).
func constraining(ops []porcupine.Operation) []porcupine.Operation {
	out := ops[:0:0]
	for _, op := range ops {
		in, res := op.Input.(opInput), op.Output.(opOutput)
		// ErrNotReplayable says a result is committed: it constrains.
		if in.kind == opCall && res.failed && !res.ran && res.class != errNotReplayable {
			continue
		}
		out = append(out, op)
	}
	return out
}

// linearize checks every key's history with porcupine, smallest first, on
// every core.
func (h *history) linearize(r *report) {
	start := time.Now()
	m := model.ToModel()
	parts := m.Partition(constraining(h.operations()))
	slices.SortStableFunc(parts, func(a, b []porcupine.Operation) int { return cmp.Compare(len(a), len(b)) })
	results := make([]porcupine.CheckResult, len(parts))
	budget := start.Add(checkBudget)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(parts) {
					return
				}
				left := time.Until(budget)
				if left <= 0 {
					results[i] = porcupine.Unknown
					continue
				}
				results[i] = porcupine.CheckOperationsTimeout(m, parts[i], min(keyTimeout, left))
			}
		})
	}
	wg.Wait()
	r.checkTime = time.Since(start)
	r.linearizable = porcupine.Ok
	for i, res := range results {
		k := parts[i][0].Input.(opInput).pkey
		switch res {
		case porcupine.Illegal:
			r.illegalKeys = append(r.illegalKeys, k)
			r.badKeys[k] = true
			if r.smallestIllegal == nil {
				r.smallestIllegal = parts[i]
			}
			r.linearizable = porcupine.Illegal
		case porcupine.Unknown:
			r.unknownKeys = append(r.unknownKeys, k)
			if r.linearizable == porcupine.Ok {
				r.linearizable = porcupine.Unknown
			}
		}
	}
	slices.Sort(r.illegalKeys)
	slices.Sort(r.unknownKeys)
}

// hangLimit is the longest a call may take: far beyond the documented
// bounds (a storage timeout per store call, the wait bound of one lease)
// with the scenarios' options.
const hangLimit = 5 * time.Second

// checkCall checks what one call returned, against the rules that do not
// need the rest of its key's history.
func (h *history) checkCall(r *report, c *call, byID map[int]*call) {
	if c.final {
		r.finalReads++
	} else {
		r.calls++
		switch {
		case c.class != okValue:
			r.outcomes[c.class.String()]++
		case c.ran && c.value == c.own:
			r.outcomes["ran"]++
		case c.ran:
			r.outcomes["ran_adopted"]++
		default:
			r.outcomes["replayed"]++
		}
	}
	lat := time.Duration(c.end - c.start)
	r.maxLatency = max(r.maxLatency, lat)
	bad := func(format string, args ...any) {
		r.badKeys[c.pkey()] = true
		r.violations = append(r.violations, fmt.Sprintf("call %d (%s, client %d): ", c.id, c.pkey(), c.client)+fmt.Sprintf(format, args...))
	}
	if c.panicked != nil {
		bad("Do panicked: %v", c.panicked)
	}
	if limit := cmp.Or(h.hangLimit, hangLimit); lat > limit && c.class != errKilled {
		bad("took %v (hang limit %v)", lat, limit)
	}
	switch c.class {
	case errOther:
		bad("unexpected error: %v", c.err)
	case errContext:
		bad("the caller's deadline passed (a hang): %v", c.err)
	case errStorage:
		// The final reads have a coordinator of their own, in modes wait
		// and raise, and retry a storage error or ErrInProgress.
		if h.onErrorOf(c) != coordinator.OnStorageErrorRaise && !c.final {
			bad("*StorageError in on-storage-error mode %s: %v", h.onErrorOf(c), c.err)
		}
	case errInProgress:
		// Mode raise at once, mode wait past the wait bound; mode run
		// never waits.
		if h.inFlightOf(c) == coordinator.InFlightRun && !c.final {
			bad("ErrInProgress in in-flight mode run: %v", c.err)
		}
	}
	if c.class != okValue && c.class != errKilled && c.ran {
		bad("returned %v after its action made its effect", c.err)
	}
	if c.ran && c.value == c.own && c.protected && c.token == "" {
		bad("ran under a reservation without a token")
	}
	if h.unprotectedRun(c) && !c.unprotected.Load() && c.class != errKilled {
		bad("ran without a reservation in in-flight mode %s, and no unprotected event was reported", h.inFlightOf(c))
	}
	if c.unprotected.Load() && h.onErrorOf(c) == coordinator.OnStorageErrorRaise {
		bad("ran unprotected in on-storage-error mode raise")
	}
	if c.unprotected.Load() && c.protected {
		bad("reported unprotected, but ran under a reservation")
	}
	if c.class == okValue && c.value != c.own {
		n := len(r.wrong)
		defer func() {
			if len(r.wrong) > n {
				r.badKeys[c.pkey()] = true
			}
		}()
		op, key, fp, id, ok := parseValue(c.value)
		switch src := byID[id]; {
		case !ok || src == nil || src.own != c.value:
			r.wrong = append(r.wrong, fmt.Sprintf("call %d (%s) got %q, which no call produced", c.id, c.pkey(), c.value))
		case op != c.op || key != c.key:
			r.wrong = append(r.wrong, fmt.Sprintf("call %d (%s) got the result of call %d of %s:%s", c.id, c.pkey(), id, op, key))
		case fp != c.fp && c.fp != "": // a final read without a fingerprint replays either
			r.wrong = append(r.wrong, fmt.Sprintf("call %d (%s, fingerprint %s) got the result of call %d, fingerprint %s", c.id, c.pkey(), c.fp, id, fp))
		case !src.ran:
			r.wrong = append(r.wrong, fmt.Sprintf("call %d (%s) got the value of call %d, whose action did not run", c.id, c.pkey(), id))
		}
	}
}

// lastWindowBefore returns the start of the last loss window of pkey that
// started at or before t, or -1.
func (h *history) lastWindowBefore(pkey string, t int64) int64 {
	last := int64(-1)
	for _, w := range h.windows {
		if w.covers(pkey) && w.start <= t {
			last = max(last, w.start)
		}
	}
	return last
}

// windowBetween returns a loss window of pkey that started within [from, to],
// or, for a window that spans, that overlaps it.
func (h *history) windowBetween(pkey string, from, to int64) (lossWindow, bool) {
	for _, w := range h.windows {
		if !w.covers(pkey) || w.start > to {
			continue
		}
		if w.start >= from || w.spans && w.end >= from {
			return w, true
		}
	}
	return lossWindow{}, false
}

// The reasons the docs give for an extra run.
const (
	reasonUnprotected = "unprotected run: on-storage-error=run while the store failed"
	reasonRunMode     = "in-flight=run: a collision (read, run, write if absent)"
	reasonAfterUnprot = "the earlier runs were unprotected and their best-effort save did not land"
	reasonWipe        = "data loss: kill -9 and an empty restart lost the record (the store was not up)"
	reasonFailover    = "failover: a master killed, a replica promoted, and writes that had not reached it lost"
	reasonSentinel    = "failover: Sentinel promoted the replica; writes that had not reached it, or that reached the former master before it was reconfigured, lost"
	// reasonSaveGivenUp: the coordinator gave the save up (storage_save_error,
	// "not stored ... could have expired"): the store failed every save
	// round until the reservation could have expired; the store was not up.
	reasonSaveGivenUp = "save given up: the store failed until the reservation could have expired"
	// reasonLeaseLost: the holder's lease was lost (lease_lost: the watchdog
	// fired with no renewal confirmed, or a renewal or the completion found
	// the key gone): a holder cut off from the store for its lease.
	reasonLeaseLost = "lease lost: no renewal confirmed for the lease, the record may have expired"
	// reasonKilled: the holder's process was killed (kill -9) before its
	// completion reached Redis: its reservation expired after its lease.
	reasonKilled = "killed: the holder's process was killed before its completion reached Redis"
)

// lossCause returns why the coordinator reported that c's result may not be
// kept, "" when it reported nothing of the kind.
func (c *call) lossCause() string {
	switch {
	case c.class == errKilled:
		return reasonKilled
	case c.saveGivenUp.Load():
		return reasonSaveGivenUp
	case c.leaseLost.Load():
		return reasonLeaseLost
	}
	return ""
}

// checkKey checks one key's calls: its effects and their extra runs, two
// reservations running at once, and a lost result.
func (h *history) checkKey(r *report, pkey string, calls []*call) {
	var effects, invoked []*call
	var final *call
	for _, c := range calls {
		if c.invoked && c.protected {
			invoked = append(invoked, c)
		}
		if c.final {
			if c.ran {
				final = c
			}
			continue
		}
		if c.ran {
			effects = append(effects, c)
		}
	}
	slices.SortFunc(effects, func(a, b *call) int { return cmp.Compare(a.actEnd, b.actEnd) })
	if len(effects) > 0 {
		r.keys++
		r.effects += len(effects)
	}
	for i, e := range effects {
		if i == 0 {
			continue
		}
		prev := effects[i-1]
		if reason, ok := h.extraReason(pkey, e, prev, effects[:i]); ok {
			r.extra[reason]++
		} else {
			r.badKeys[pkey] = true
			r.notAllowed = append(r.notAllowed, fmt.Sprintf("%s: call %d ran at %v (%s) after call %d ran at %v (%s)",
				pkey, e.id, time.Duration(e.actEnd), h.runKind(e), prev.id, time.Duration(prev.actEnd), h.runKind(prev)))
		}
	}

	// At most one live lease holder: two actions under reservations of one
	// key never run at once, unless a loss window lost the first one's.
	slices.SortFunc(invoked, func(a, b *call) int { return cmp.Compare(a.actStart, b.actStart) })
	for i := 1; i < len(invoked); i++ {
		a, b := invoked[i-1], invoked[i]
		if b.actStart >= a.actEnd {
			continue
		}
		if w, ok := h.windowBetween(pkey, a.start, b.actStart); ok {
			r.overlaps[w.reason]++
			continue
		}
		r.badKeys[pkey] = true
		r.violations = append(r.violations, fmt.Sprintf("%s: calls %d and %d ran their actions under reservations at once (%v..%v and %v..%v)",
			pkey, a.id, b.id, time.Duration(a.actStart), time.Duration(a.actEnd), time.Duration(b.actStart), time.Duration(b.actEnd)))
	}

	// A lost result: the final read ran the action although an earlier
	// result was stored (or protected: "stored if the store lets it") and
	// no loss window came after it.
	if final == nil {
		return
	}
	for _, e := range effects {
		if !e.protected && !e.stored.Load() {
			continue // unreserved and not written: best effort
		}
		if w, ok := h.windowBetween(pkey, e.start, final.start); ok {
			r.unstored[w.reason]++
			continue
		}
		if cause := e.lossCause(); e.protected && cause != "" {
			r.unstored[cause]++
			continue
		}
		r.badKeys[pkey] = true
		r.lost = append(r.lost, fmt.Sprintf("%s: the result of call %d (%s, ran at %v, stored event %v, save failed %v, lease lost %v) is gone: the final read ran the action",
			pkey, e.id, h.runKind(e), time.Duration(e.actEnd), e.stored.Load(), e.saveFailed.Load(), e.leaseLost.Load()))
		return
	}
}

// runKind describes how a call's action ran.
func (h *history) runKind(c *call) string {
	switch {
	case c.protected:
		return "reserved"
	case h.runMode(c):
		return "in-flight run"
	case h.unprotectedRun(c):
		return "unprotected"
	}
	return "did not run"
}

// extraReason returns why the docs allow effect e of pkey, which follows
// prev (and all of earlier), or false when they do not.
func (h *history) extraReason(pkey string, e, prev *call, earlier []*call) (string, bool) {
	switch {
	case h.unprotectedRun(e):
		return reasonUnprotected, h.onErrorOf(e) == coordinator.OnStorageErrorRun
	case h.runMode(e):
		return reasonRunMode, true
	}
	if w, ok := h.windowBetween(pkey, prev.start, e.actEnd); ok {
		return w.reason, true
	}
	// No loss window since prev began. A protected run is allowed only if
	// every run since the last loss window was unreserved (and so stored
	// best effort).
	// A protected run is also allowed after runs whose results the
	// coordinator reported not kept for a cause the docs allow, or that a
	// loss window since they began may have lost (a reserved run inside a
	// failover's window, followed by unprotected runs after it).
	since := h.lastWindowBefore(pkey, e.actEnd)
	reason := reasonAfterUnprot
	for _, c := range earlier {
		if !c.protected || c.start <= since {
			continue
		}
		cause := c.lossCause()
		if w, ok := h.windowBetween(pkey, c.start, e.actEnd); cause == "" && ok {
			cause = w.reason
		}
		if cause == "" {
			return "", false
		}
		reason = cause
	}
	return reason, true
}

// summary is one line of figures for the report and docs/reliability.md.
func (r *report) summary() string {
	extra := make(map[string]int, len(r.extra))
	for k, v := range r.extra {
		extra[shortReason(k)] += v
	}
	unstored := make(map[string]int, len(r.unstored))
	for k, v := range r.unstored {
		unstored[shortReason(k)] += v
	}
	return fmt.Sprintf("calls=%d [%s] keys=%d effects=%d extra=%d allowed{%s} not-allowed=%d unstored-allowed{%s} lost=%d wrong-replays=%d violations=%d overlaps{%s} linearizable=%s (%v, unproven keys %d) max-latency=%v",
		r.calls, formatCounts(r.outcomes), r.keys, r.effects, r.extraRuns(), formatCounts(extra), len(r.notAllowed), formatCounts(unstored), len(r.lost), len(r.wrong), len(r.violations),
		formatCounts(r.overlaps), r.linearizable, r.checkTime.Round(time.Millisecond), len(r.unknownKeys), r.maxLatency.Round(time.Millisecond))
}

// shortReason names a reason in one word, for the summary line.
func shortReason(reason string) string {
	switch reason {
	case reasonUnprotected:
		return "unprotected"
	case reasonRunMode:
		return "run-collision"
	case reasonAfterUnprot:
		return "after-unprotected"
	case reasonWipe:
		return "data-loss"
	case reasonFailover, reasonSentinel:
		return "failover"
	case reasonSaveGivenUp:
		return "save-given-up"
	case reasonLeaseLost:
		return "lease-lost"
	case reasonKilled:
		return "killed"
	}
	return reason
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// visualize writes porcupine's visualisation of the smallest illegal key's
// history to path.
func visualize(r *report, path string) error {
	m := model.ToModel()
	res, info := porcupine.CheckOperationsVerbose(m, r.smallestIllegal, keyTimeout)
	if res != porcupine.Illegal {
		return fmt.Errorf("the check of the smallest illegal key ended %s", res)
	}
	return porcupine.VisualizePath(m, info, path)
}

// dump describes every call of pkey, one line each in the order they began,
// with the loss windows: for a failing key.
func (h *history) dump(pkey string) string {
	var calls []*call
	for _, c := range h.calls {
		if c.pkey() == pkey {
			calls = append(calls, c)
		}
	}
	slices.SortFunc(calls, func(a, b *call) int { return cmp.Compare(a.start, b.start) })
	ms := func(t int64) string { return time.Duration(t).Round(100 * time.Microsecond).String() }
	var b strings.Builder
	fmt.Fprintf(&b, "%s:\n", pkey)
	for _, w := range h.windows {
		if w.covers(pkey) {
			fmt.Fprintf(&b, "  window %s..%s wipe=%v\n", ms(w.start), ms(w.end), w.wipe)
		}
	}
	for _, c := range calls {
		out := c.class.String()
		if c.class == okValue {
			out = "value " + c.value
		}
		fmt.Fprintf(&b, "  call %d client %d fp %s final=%v %s..%s -> %s", c.id, c.client, c.fp, c.final, ms(c.start), ms(c.end), out)
		if c.invoked {
			fmt.Fprintf(&b, "; action %s..%s ran=%v reserved=%v token=%.8s", ms(c.actStart), ms(c.actEnd), c.ran, c.protected, c.token)
		}
		fmt.Fprintf(&b, "; events %s\n", strings.Join(c.events, " "))
	}
	return b.String()
}

// checkFences checks the fences of a fenced storm: every action that ran
// under a reservation has one, and a reservation granted after another of
// its key has the greater. A call that started (Do) after another call's
// action started reserved after it, whatever the faults did in between:
// kill -9 and an empty restart, a failover that lost the fence key. So its
// fence must be greater than that of every such earlier action.
func checkFences(h *history) []string {
	byKey := map[string][]*call{}
	var fails []string
	for _, c := range h.calls {
		if !c.invoked || !c.protected {
			continue
		}
		if c.fence == 0 {
			fails = append(fails, fmt.Sprintf("call %d (%s) ran under a reservation with no fence", c.id, c.key))
			continue
		}
		byKey[c.key] = append(byKey[c.key], c)
	}
	for key, calls := range byKey {
		byAct := slices.Clone(calls)
		slices.SortFunc(byAct, func(a, b *call) int { return cmp.Compare(a.actStart, b.actStart) })
		byStart := slices.Clone(calls)
		slices.SortFunc(byStart, func(a, b *call) int { return cmp.Compare(a.start, b.start) })
		// For each call in order of start, the greatest fence of the
		// actions that started before it.
		var top *call
		i := 0
		for _, c := range byStart {
			for ; i < len(byAct) && byAct[i].actStart < c.start; i++ {
				if top == nil || byAct[i].fence > top.fence {
					top = byAct[i]
				}
			}
			if top != nil && c.fence <= top.fence {
				fails = append(fails, fmt.Sprintf("key %s: call %d reserved after call %d's action started, with fence %d, not above its %d", key, c.id, top.id, c.fence, top.fence))
			}
		}
	}
	return fails
}
