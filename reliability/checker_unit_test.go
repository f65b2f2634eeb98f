package reliability_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemkit/idempotency/coordinator"
)

// The checker on synthetic histories: it accepts what the docs allow and
// finds what they do not. These tests need no Redis and always run.

// hcall builds a call of key k (operation storm.charge) by client id, from
// start to end (ms), returning ret; how says how it ran.
type hcall struct {
	id         int
	key        string
	start, end int64
	how        string // "reserved", "unprotected", "run", "replay", "error", "final-ran", "final-replay", "final-storage-error"
	ret        int    // the id of the call whose value is returned (0: its own)
	retKey     string // the key of that call, if another
}

const ms = int64(1e6)

func buildHistory(inFlight coordinator.InFlightMode, onError coordinator.OnStorageErrorMode, calls []hcall, windows ...lossWindow) *history {
	h := &history{inFlight: inFlight, onError: onError, windows: windows, effects: map[string]int64{}}
	for _, hc := range calls {
		c := &call{id: hc.id, client: hc.id, op: opChargeName, key: hc.key, fp: "fp-" + hc.key,
			start: hc.start * ms, end: hc.end * ms}
		c.own = value(c.op, c.key, c.fp, c.id)
		ran := func(protected bool) {
			c.invoked, c.ran, c.protected = true, true, protected
			c.actStart, c.actEnd = c.start+ms/10, c.end-ms/10
			if protected {
				c.token = "t" + c.own
			}
			h.effects[c.pkey()]++
		}
		switch hc.how {
		case "reserved":
			ran(true)
		case "unprotected":
			ran(false)
			c.unprotected.Store(true)
		case "run":
			ran(false)
		case "error":
			c.class = errInProgress
		case "final-ran":
			c.final = true
			ran(true)
		case "final-replay":
			c.final = true
		case "final-storage-error": // retried by the final reader
			c.final = true
			c.class = errStorage
		case "killed-ran": // its process was killed after the effect
			ran(true)
			c.class = errKilled
		case "killed": // its process was killed before the action ran
			c.class = errKilled
		case "not-replayable":
			c.class = errNotReplayable
		}
		c.value = c.own
		if hc.ret != 0 {
			k := hc.key
			if hc.retKey != "" {
				k = hc.retKey
			}
			c.value = value(opChargeName, k, "fp-"+k, hc.ret)
		}
		if c.class != okValue {
			c.value = ""
		}
		if c.ran && c.value == c.own && c.protected {
			c.stored.Store(true)
		}
		h.calls = append(h.calls, c)
	}
	return h
}

// opChargeName is storm.charge, which the storm files (Linux only) name
// opCharge.
const opChargeName = "storm.charge"

func TestChecker(t *testing.T) {
	const (
		wait, raise, run = coordinator.InFlightWait, coordinator.InFlightRaise, coordinator.InFlightRun
		eRun, eRaise     = coordinator.OnStorageErrorRun, coordinator.OnStorageErrorRaise
	)
	wipe := lossWindow{start: 15 * ms, end: 16 * ms, wipe: true, spans: true, reason: reasonWipe}
	for _, tt := range []struct {
		name     string
		h        *history
		ok       bool   // linearizable and nothing found
		findings string // what one of the findings says
		extra    string // a reason counted as an allowed extra run
	}{
		{"run once, replay, refuse", buildHistory(raise, eRaise, []hcall{
			{id: 1, key: "a", start: 0, end: 10, how: "reserved"},
			{id: 2, key: "a", start: 5, end: 15, how: "replay", ret: 1},
			{id: 3, key: "a", start: 1, end: 2, how: "error"},
			{id: 4, key: "a", start: 20, end: 21, how: "final-replay", ret: 1},
		}), true, "", ""},
		{"a final read retried after a storage error, in mode run", buildHistory(run, eRun, []hcall{
			{id: 1, key: "a", start: 0, end: 10, how: "run"},
			{id: 2, key: "a", start: 20, end: 21, how: "final-storage-error"},
			{id: 3, key: "a", start: 30, end: 31, how: "final-replay", ret: 1},
		}), true, "", ""},
		{"a run after its holder's process was killed", buildHistory(wait, eRun, []hcall{
			{id: 1, key: "a", start: 0, end: 10, how: "killed-ran"},
			{id: 2, key: "a", start: 2, end: 10, how: "killed"},
			{id: 3, key: "a", start: 20, end: 30, how: "reserved"},
			{id: 4, key: "a", start: 40, end: 41, how: "final-replay", ret: 3},
		}), true, "", reasonKilled},
		{"a killed holder's run while another's was committed", buildHistory(wait, eRun, []hcall{
			{id: 1, key: "a", start: 0, end: 10, how: "reserved"},
			{id: 2, key: "a", start: 20, end: 30, how: "killed-ran"},
		}), false, "not linearizable", ""},
		{"a not-replayable record after a run", buildHistory(wait, eRun, []hcall{
			{id: 1, key: "a", start: 0, end: 10, how: "reserved"},
			{id: 2, key: "a", start: 20, end: 30, how: "not-replayable"},
		}), true, "", ""},
		{"a not-replayable record before any run", buildHistory(wait, eRun, []hcall{
			{id: 1, key: "a", start: 0, end: 5, how: "not-replayable"},
			{id: 2, key: "a", start: 10, end: 20, how: "reserved"},
		}), false, "not linearizable", ""},
		{"a second reserved run", buildHistory(wait, eRaise, []hcall{
			{id: 1, key: "a", start: 0, end: 10, how: "reserved"},
			{id: 2, key: "a", start: 20, end: 30, how: "reserved"},
		}), false, "extra run not allowed", ""},
		{"a replay before the run", buildHistory(wait, eRaise, []hcall{
			{id: 1, key: "a", start: 10, end: 20, how: "reserved"},
			{id: 2, key: "a", start: 0, end: 5, how: "replay", ret: 1},
		}), false, "not linearizable", ""},
		{"an unprotected run in mode run", buildHistory(wait, eRun, []hcall{
			{id: 1, key: "a", start: 0, end: 10, how: "reserved"},
			{id: 2, key: "a", start: 20, end: 30, how: "unprotected"},
			{id: 3, key: "a", start: 40, end: 41, how: "replay", ret: 1},
		}), true, "", reasonUnprotected},
		{"an unprotected run in mode raise", buildHistory(wait, eRaise, []hcall{
			{id: 1, key: "a", start: 0, end: 10, how: "reserved"},
			{id: 2, key: "a", start: 20, end: 30, how: "unprotected"},
		}), false, "unprotected in on-storage-error mode raise", ""},
		{"a protected run after unprotected ones", buildHistory(wait, eRun, []hcall{
			{id: 1, key: "a", start: 0, end: 10, how: "unprotected"},
			{id: 2, key: "a", start: 20, end: 30, how: "reserved"},
			{id: 3, key: "a", start: 40, end: 41, how: "replay", ret: 2},
		}), true, "", reasonAfterUnprot},
		{"a run after a wipe", buildHistory(raise, eRaise, []hcall{
			{id: 1, key: "a", start: 0, end: 10, how: "reserved"},
			{id: 2, key: "a", start: 20, end: 30, how: "reserved"},
			{id: 3, key: "a", start: 40, end: 41, how: "final-replay", ret: 2},
		}, wipe), true, "", reasonWipe},
		{"a run after a wipe that lost a record written after it began", buildHistory(raise, eRaise, []hcall{
			{id: 1, key: "a", start: 16, end: 17, how: "reserved"},
			{id: 2, key: "a", start: 20, end: 30, how: "reserved"},
			{id: 3, key: "a", start: 40, end: 41, how: "final-replay", ret: 2},
		}, lossWindow{start: 15 * ms, end: 18 * ms, wipe: true, spans: true, reason: reasonWipe}), true, "", reasonWipe},
		{"a run after a record written once the wipe ended", buildHistory(raise, eRaise, []hcall{
			{id: 1, key: "a", start: 17, end: 18, how: "reserved"},
			{id: 2, key: "a", start: 20, end: 30, how: "reserved"},
		}, wipe), false, "extra run not allowed", ""},
		{"a replay of the wiped result", buildHistory(raise, eRaise, []hcall{
			{id: 1, key: "a", start: 0, end: 10, how: "reserved"},
			{id: 2, key: "a", start: 20, end: 30, how: "reserved"},
			{id: 3, key: "a", start: 40, end: 41, how: "replay", ret: 1},
		}, wipe), false, "not linearizable", reasonWipe},
		{"a run again after a write lost in a Sentinel failover", buildHistory(wait, eRaise, []hcall{
			{id: 1, key: "a", start: 10, end: 20, how: "reserved"},
			{id: 2, key: "a", start: 30, end: 35, how: "reserved"},
			{id: 3, key: "a", start: 50, end: 51, how: "final-replay", ret: 2},
		}, lossWindow{start: 5 * ms, end: 40 * ms, spans: true, reason: reasonSentinel}), true, "", reasonSentinel},
		{"a run again after a write lost in a Sentinel failover, and an unprotected run", buildHistory(wait, eRun, []hcall{
			{id: 1, key: "a", start: 10, end: 20, how: "reserved"},
			{id: 2, key: "a", start: 42, end: 45, how: "unprotected"},
			{id: 3, key: "a", start: 43, end: 50, how: "reserved"},
			{id: 4, key: "a", start: 60, end: 61, how: "final-replay", ret: 3},
		}, lossWindow{start: 5 * ms, end: 40 * ms, spans: true, reason: reasonSentinel}), true, "", reasonSentinel},
		{"a run again after a stored write and an unprotected run", buildHistory(wait, eRun, []hcall{
			{id: 1, key: "a", start: 10, end: 20, how: "reserved"},
			{id: 2, key: "a", start: 42, end: 45, how: "unprotected"},
			{id: 3, key: "a", start: 43, end: 50, how: "reserved"},
		}), false, "extra run not allowed", ""},
		{"a run again after a Sentinel failover that ended before the write", buildHistory(wait, eRaise, []hcall{
			{id: 1, key: "a", start: 10, end: 20, how: "reserved"},
			{id: 2, key: "a", start: 30, end: 35, how: "reserved"},
		}, lossWindow{start: 5 * ms, end: 8 * ms, spans: true, reason: reasonSentinel}), false, "extra run not allowed", ""},
		{"a run again after a cluster failover that began before the write", buildHistory(wait, eRaise, []hcall{
			{id: 1, key: "a", start: 10, end: 20, how: "reserved"},
			{id: 2, key: "a", start: 30, end: 35, how: "reserved"},
		}, lossWindow{start: 5 * ms, end: 40 * ms, reason: reasonFailover}), false, "extra run not allowed", ""},
		{"another key's result", buildHistory(wait, eRaise, []hcall{
			{id: 1, key: "a", start: 0, end: 10, how: "reserved"},
			{id: 2, key: "b", start: 0, end: 10, how: "reserved"},
			{id: 3, key: "a", start: 20, end: 30, how: "replay", ret: 2, retKey: "b"},
		}), false, "wrong replay", ""},
		{"a lost result", buildHistory(wait, eRaise, []hcall{
			{id: 1, key: "a", start: 0, end: 10, how: "reserved"},
			{id: 2, key: "a", start: 50, end: 60, how: "final-ran"},
		}), false, "lost result", ""},
		{"a lost result after a wipe", buildHistory(wait, eRaise, []hcall{
			{id: 1, key: "a", start: 0, end: 10, how: "reserved"},
			{id: 2, key: "a", start: 50, end: 60, how: "final-ran"},
		}, wipe), true, "", ""},
		{"run-mode collision", buildHistory(run, eRaise, []hcall{
			{id: 1, key: "a", start: 0, end: 10, how: "run"},
			{id: 2, key: "a", start: 5, end: 12, how: "run", ret: 1},
			{id: 3, key: "a", start: 6, end: 13, how: "run"}, // lost the race to a pending... or its write failed
			{id: 4, key: "a", start: 20, end: 21, how: "final-replay", ret: 1},
		}), true, "", reasonRunMode},
		{"an adopted result in mode wait", buildHistory(wait, eRaise, []hcall{
			{id: 1, key: "a", start: 0, end: 10, how: "reserved"},
			{id: 2, key: "a", start: 5, end: 12, how: "run", ret: 1},
		}), false, "not linearizable", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.h.check()
			fails := r.failures()
			if tt.ok != (len(fails) == 0) {
				t.Fatalf("failures %q; want ok=%v (%s)", fails, tt.ok, r.summary())
			}
			if tt.findings != "" && !strings.Contains(strings.Join(fails, "\n"), tt.findings) {
				t.Errorf("failures %q; want one about %q", fails, tt.findings)
			}
			if tt.extra != "" && r.extra[tt.extra] == 0 {
				t.Errorf("extra runs %v; want one for %q", r.extra, tt.extra)
			}
		})
	}
}

// TestModelStep checks step on single operations.
func TestModelStep(t *testing.T) {
	in := opInput{pkey: "k", own: "mine"}
	for _, tt := range []struct {
		name  string
		state string
		in    opInput
		out   opOutput
		want  []any
	}{
		{"error keeps the state", "v", in, opOutput{failed: true}, []any{"v"}},
		{"error after the effect", "", in, opOutput{failed: true, ran: true}, nil},
		{"replay of the state", "v", in, opOutput{value: "v"}, []any{"v"}},
		{"replay of nothing", "", in, opOutput{value: "v"}, nil},
		{"reserved run commits", "", in, opOutput{value: "mine", ran: true, protected: true}, []any{"mine"}},
		{"reserved run over a result", "v", in, opOutput{value: "mine", ran: true, protected: true}, nil},
		{"unreserved run may commit", "", in, opOutput{value: "mine", ran: true}, []any{"mine", ""}},
		{"unreserved run over a result", "v", in, opOutput{value: "mine", ran: true}, []any{"v"}},
		{"wipe", "v", opInput{kind: opWipe}, opOutput{}, []any{""}},
		{"failover", "v", opInput{kind: opMaybeLose}, opOutput{}, []any{"v", ""}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := step(tt.state, tt.in, tt.out)
			if len(got) != len(tt.want) {
				t.Fatalf("step = %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("step = %v, want %v", got, tt.want)
				}
			}
		})
	}
	if res := porcupine.CheckOperations(model.ToModel(), nil); !res {
		t.Error("an empty history is not linearizable")
	}
}

// TestConstraining checks that dropping the calls that failed before their
// action ran never changes porcupine's verdict, on random small histories of
// one key, and that a hot key with hundreds of failing calls at once across
// a failover checks at once.
func TestConstraining(t *testing.T) {
	m := model.ToModel()
	rng := rand.New(rand.NewPCG(1, 2))
	values := []string{"a", "b", "c"}
	for i := range 2000 {
		var ops []porcupine.Operation
		for j := range 2 + rng.IntN(9) {
			start := rng.Int64N(100)
			op := porcupine.Operation{ClientId: j, Call: start, Return: start + 1 + rng.Int64N(40)}
			own := values[rng.IntN(len(values))]
			in := opInput{pkey: "k", own: own}
			var out opOutput
			switch rng.IntN(6) {
			case 0:
				out = opOutput{failed: true}
			case 1:
				out = opOutput{failed: true, ran: rng.IntN(4) == 0}
			case 2:
				out = opOutput{value: values[rng.IntN(len(values))]}
			case 3:
				out = opOutput{value: own, ran: true, protected: true, mayLose: rng.IntN(3) == 0}
			case 4:
				out = opOutput{value: own, ran: true}
			default:
				in.kind = opMaybeLose
			}
			op.Input, op.Output = in, out
			ops = append(ops, op)
		}
		all := porcupine.CheckOperations(m, ops)
		if got := porcupine.CheckOperations(m, constraining(ops)); got != all {
			t.Fatalf("history %d: linearizable %v with the failed calls, %v without", i, all, got)
		}
	}

	var hot []porcupine.Operation
	hot = append(hot, porcupine.Operation{ClientId: 0, Input: opInput{pkey: "k", own: "a"}, Call: 30, Return: 40,
		Output: opOutput{value: "a", ran: true, protected: true}})
	hot = append(hot, porcupine.Operation{ClientId: 1, Input: opInput{pkey: "k", kind: opMaybeLose}, Output: opOutput{}, Call: 20, Return: 5000})
	for j := range 400 {
		start := int64(20 + j*10)
		hot = append(hot, porcupine.Operation{ClientId: 2 + j, Input: opInput{pkey: "k", own: fmt.Sprint(j)}, Call: start, Return: start + 900,
			Output: opOutput{failed: true}})
	}
	// A second run after the failover: legal only with the loss placed
	// after the first run, which porcupine finds by backtracking over
	// every order of the failing calls it linearized first.
	hot = append(hot, porcupine.Operation{ClientId: 500, Input: opInput{pkey: "k", own: "b"}, Call: 6000, Return: 6001,
		Output: opOutput{value: "b", ran: true, protected: true}})
	if res := porcupine.CheckOperationsTimeout(m, constraining(hot), 10*time.Second); res != porcupine.Ok {
		t.Fatalf("a hot key across a failover: %s, want Ok", res)
	}
}

// checkFences finds a later reservation with a fence not above an earlier
// one's, and an action under a reservation without a fence.
func TestCheckFences(t *testing.T) {
	ran := func(id int, start, actStart int64, fence uint64) *call {
		return &call{id: id, key: "k", start: start, actStart: actStart, invoked: true, protected: true, fence: fence}
	}
	good := &history{calls: []*call{ran(1, 0, 10, 5), ran(2, 20, 30, 7), ran(3, 5, 40, 9)}}
	if f := checkFences(good); len(f) != 0 {
		t.Errorf("growing fences: %q, want no failure", f)
	}
	// Call 2 started after call 1's action: its fence must be above 5.
	stale := &history{calls: []*call{ran(1, 0, 10, 5), ran(2, 20, 30, 5)}}
	if f := checkFences(stale); len(f) != 1 || !strings.Contains(f[0], "call 2 reserved after call 1's action started") {
		t.Errorf("an equal later fence: %q, want one failure naming calls 2 and 1", f)
	}
	// Overlapping calls (2 started before 1's action) may come in any order.
	overlap := &history{calls: []*call{ran(1, 0, 10, 9), ran(2, 5, 30, 7)}}
	if f := checkFences(overlap); len(f) != 0 {
		t.Errorf("overlapping calls: %q, want no failure", f)
	}
	none := &history{calls: []*call{ran(1, 0, 10, 0)}}
	if f := checkFences(none); len(f) != 1 || !strings.Contains(f[0], "no fence") {
		t.Errorf("a reservation without a fence: %q, want one failure", f)
	}
}
