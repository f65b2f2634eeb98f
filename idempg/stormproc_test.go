package idempg_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency/coordinator"
)

// The environment of a child process of TestStormProcessKilled: when
// stormChildEnv is set, TestMain runs stormChild instead of the tests.
const (
	stormChildEnv    = "IDEMPG_STORM_CHILD_DSN"
	stormChildSchema = "IDEMPG_STORM_CHILD_SCHEMA"
)

// stormLine is a line that a storm child prints, as JSON: "S" when a call
// starts (At, before Do), "A" when its action is called (Value: the
// action's value, before the ledger row is written), "H" when a holding
// action has written its ledger row and blocks (the parent kills the
// process then), "R" when Do returned (At, after it; Class, Value,
// Replayed, Effect, Err).
type stormLine struct {
	T        string `json:"t"`
	ID       int    `json:"id"`
	At       int64  `json:"at,omitempty"`
	Value    string `json:"v,omitempty"`
	Class    string `json:"c,omitempty"`
	Replayed bool   `json:"r,omitempty"`
	Effect   bool   `json:"e,omitempty"`
	Err      string `json:"err,omitempty"`
}

// stormChild is a client process of a storm: it reads commands "C <id>
// <key> <hold>" on stdin and makes each call concurrently, printing
// stormLines; at the end of stdin it waits for its calls and exits. An
// action inserts its ledger row; with hold set it then prints "H" and
// blocks, for the parent to kill the process between the effect and the
// commit; otherwise it holds its transaction for a few milliseconds.
func stormChild() int {
	ctx := context.Background()
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "storm child:", err)
		return 2
	}
	pool, err := childPool(ctx, stormChildEnv, stormChildSchema, 8)
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	c, err := stormCoordinator(pool, coordinator.InFlightWait, time.Minute)
	if err != nil {
		return fail(err)
	}
	defer c.Close()

	var mu sync.Mutex
	enc := json.NewEncoder(os.Stdout) // one write per line
	emit := func(l stormLine) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(l)
	}
	var attempts atomic.Int64
	var wg sync.WaitGroup
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var (
			id   int
			key  string
			hold bool
		)
		if _, err := fmt.Sscanf(in.Text(), "C %d %s %t", &id, &key, &hold); err != nil {
			return fail(fmt.Errorf("command %q: %w", in.Text(), err))
		}
		wg.Go(func() {
			var actErr error
			effect := false
			emit(stormLine{T: "S", ID: id, At: clockNow()})
			res, err := stormDo(ctx, c, key, func(ctx context.Context, tx pgx.Tx) (string, error) {
				own := stormValue(key, attempts.Add(1))
				emit(stormLine{T: "A", ID: id, Value: own})
				if err := insertLedger(ctx, tx, key, own); err != nil {
					actErr = fmt.Errorf("storm action: %w", err)
					return "", actErr
				}
				if hold {
					emit(stormLine{T: "H", ID: id})
					t := time.NewTimer(2 * time.Minute) // the parent kills the process before
					<-t.C
					actErr = errors.New("storm action: held for two minutes and not killed")
					return "", actErr
				}
				if _, err := tx.Exec(ctx, sleepSQL(3*time.Millisecond)); err != nil {
					actErr = fmt.Errorf("storm action: %w", err)
					return "", actErr
				}
				effect = true
				return own, nil
			})
			l := stormLine{T: "R", ID: id, At: clockNow(), Class: classify(res, err, actErr).String(),
				Replayed: res.Replayed, Effect: effect}
			if err != nil {
				l.Err = err.Error()
			} else {
				l.Value = res.Value
			}
			emit(l)
		})
	}
	wg.Wait()
	if err := in.Err(); err != nil {
		return fail(err)
	}
	return 0
}

// childPool is the pool of a child process: on the connection string in
// the variable dsnEnv, with search_path from schemaEnv.
func childPool(ctx context.Context, dsnEnv, schemaEnv string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(os.Getenv(dsnEnv))
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = os.Getenv(schemaEnv)
	cfg.ConnConfig.RuntimeParams["application_name"] = "idempg-storm-child"
	cfg.MaxConns = maxConns
	return pgxpool.NewWithConfig(ctx, cfg)
}

// TestStormProcessKilled: client processes killed with SIGKILL. Child
// processes of the test binary (stormChild) make the calls, each key's
// three callers in three different processes at once. A third of the keys
// have a holding first caller: its action writes the ledger row, tells the
// parent and blocks, and the parent kills its process there, between the
// effect and the commit, and only then sends the key's two other callers
// (which wait for the row's lock until the killed transaction is gone).
// Besides, when a process's action starts, the parent kills that process
// one time in five, at whatever point it has got to by then (eight such
// kills at most). Every killed process is replaced at once. A call of a
// killed process has no answer: its outcome is unknown if its action was
// called. The kill between the effect and the commit must leave neither
// the ledger row nor the record.
func TestStormProcessKilled(t *testing.T) {
	db := newDB(t, 8)
	st := newStorm(t, "process-killed")
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed>>32))
	keys := stormKeys("proc", 30)
	const (
		alive      = 4 // processes running calls
		activeKeys = 4 // keys whose calls run at once
		callers    = 3 // per key, in different processes
		maxRandom  = 8 // random kills
	)

	type child struct {
		n      int
		cmd    *exec.Cmd
		stdin  io.WriteCloser
		killed bool // by the parent
		gone   bool // its output ended and it was reaped
	}
	type event struct {
		ch   *child
		line *stormLine
		eof  error // when line is nil: how the process ended
	}
	type dispatched struct {
		ch   *child
		key  string
		hold bool
		rec  *stormCall // from its "S" line
	}
	type keyState struct {
		pending   int  // calls dispatched and not yet settled
		followers bool // the callers after a holding one were sent
		holder    *child
	}

	events := make(chan event)
	quit := make(chan struct{}) // closed when the test ends: the readers stop sending
	var readers sync.WaitGroup
	var children []*child
	startChild := func() *child {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), stormChildEnv+"="+server.DSN, stormChildSchema+"="+db.schema)
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with the test
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ch := &child{n: len(children), cmd: cmd, stdin: stdin}
		children = append(children, ch)
		readers.Go(func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				var l stormLine
				if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
					t.Errorf("child %d printed %q: %v", ch.n, sc.Text(), err)
					continue
				}
				select {
				case events <- event{ch: ch, line: &l}:
				case <-quit:
				}
			}
			select {
			case events <- event{ch: ch, eof: cmd.Wait()}:
			case <-quit:
			}
		})
		return ch
	}
	// The test's end kills what is left, should the test fail half-way.
	t.Cleanup(func() {
		for _, ch := range children {
			if !ch.gone {
				_ = ch.cmd.Process.Kill()
			}
		}
		close(quit)
		readers.Wait()
	})
	for range alive {
		startChild()
	}

	var (
		nextKey   = 0
		calls     = map[int]*dispatched{}
		active    = map[string]*keyState{}
		held      []string // values of actions killed between the effect and the commit
		holdKills int
		random    int
		closing   bool
	)
	liveChildren := func(not *child) []*child {
		var out []*child
		for _, ch := range children {
			if !ch.killed && !ch.gone && ch != not {
				out = append(out, ch)
			}
		}
		rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
		return out
	}
	send := func(ch *child, key string, hold bool) {
		id := int(st.ids.Add(1))
		calls[id] = &dispatched{ch: ch, key: key, hold: hold}
		active[key].pending++
		// A write to a process that died meanwhile fails or is lost: the
		// call then never starts ("S"), and settles with the process.
		_, _ = fmt.Fprintf(ch.stdin, "C %d %s %t\n", id, key, hold)
	}
	sendFollowers := func(key string) {
		ks := active[key]
		if ks == nil || ks.followers {
			return
		}
		ks.followers = true
		live := liveChildren(ks.holder)
		for _, ch := range live[:min(callers-1, len(live))] {
			send(ch, key, false)
		}
	}
	activate := func() {
		for len(active) < activeKeys && nextKey < len(keys) {
			key := keys[nextKey]
			hold := nextKey%3 == 0
			nextKey++
			ks := &keyState{}
			active[key] = ks
			live := liveChildren(nil)
			if len(live) == 0 {
				t.Fatalf("no child process to call")
			}
			if hold {
				ks.holder = live[0]
				send(live[0], key, true)
				continue
			}
			ks.followers = true
			for _, ch := range live[:min(callers, len(live))] {
				send(ch, key, false)
			}
		}
		if nextKey == len(keys) && len(active) == 0 && !closing {
			closing = true
			for _, ch := range children {
				if !ch.gone {
					_ = ch.stdin.Close()
				}
			}
		}
	}
	kill := func(ch *child) {
		if ch.killed || ch.gone {
			return
		}
		ch.killed = true
		_ = ch.cmd.Process.Kill()
		st.kills.Add(1)
		if !closing {
			startChild()
		}
	}
	settle := func(id int) {
		d := calls[id]
		delete(calls, id)
		if d.hold {
			sendFollowers(d.key)
		}
		if ks := active[d.key]; ks != nil {
			if ks.pending--; ks.pending == 0 {
				delete(active, d.key)
			}
		}
	}

	deadline := time.NewTimer(2 * time.Minute) // a bound on a hung storm, not a pace
	defer deadline.Stop()
	activate()
	for slices.ContainsFunc(children, func(ch *child) bool { return !ch.gone }) {
		var ev event
		select {
		case ev = <-events:
		case <-deadline.C:
			t.Fatalf("the storm did not end within two minutes: %d keys active, %d calls unanswered", len(active), len(calls))
		}
		ch := ev.ch
		if ev.line == nil { // the process ended
			ch.gone = true
			switch {
			case !ch.killed && !closing:
				t.Errorf("child %d exited on its own: %v", ch.n, ev.eof)
				startChild()
			case !ch.killed && ev.eof != nil:
				t.Errorf("child %d: %v", ch.n, ev.eof)
			}
			for _, id := range slices.Sorted(maps.Keys(calls)) {
				d := calls[id]
				if d.ch != ch {
					continue
				}
				if d.rec != nil { // it started: no answer
					d.rec.class = classKilled
					d.rec.end = never
					d.rec.effect = d.rec.own != ""
					d.rec.err = "process killed"
					st.h.add(d.rec)
				}
				settle(id)
			}
			activate()
			continue
		}
		l := ev.line
		d := calls[l.ID]
		if d == nil {
			t.Errorf("child %d: line for call %d, which is not running: %+v", ch.n, l.ID, *l)
			continue
		}
		if l.T != "S" && d.rec == nil {
			t.Errorf("child %d: line %+v before the call's start", ch.n, *l)
			continue
		}
		switch l.T {
		case "S":
			d.rec = &stormCall{id: l.ID, client: l.ID, key: d.key, start: l.At}
		case "A":
			d.rec.own = l.Value
			d.rec.actions++
			if d.hold {
				sendFollowers(d.key)
			} else if random < maxRandom && !ch.killed && rng.IntN(5) == 0 {
				random++
				kill(ch)
			}
		case "H":
			held = append(held, d.rec.own)
			holdKills++
			kill(ch)
		case "R":
			class, ok := parseClass(l.Class)
			if !ok {
				t.Errorf("child %d: class %q", ch.n, l.Class)
			}
			d.rec.end, d.rec.class, d.rec.value, d.rec.replayed, d.rec.effect, d.rec.err = l.At, class, l.Value, l.Replayed, l.Effect, l.Err
			st.h.add(d.rec)
			settle(l.ID)
			activate()
		default:
			t.Errorf("child %d: line %+v", ch.n, *l)
		}
	}
	readers.Wait()
	t.Logf("processes: %d started, %d killed between the effect and the commit, %d at random moments", len(children), holdKills, random)
	if holdKills == 0 {
		t.Errorf("no process was killed between the effect and the commit")
	}
	l := st.finish(t.Context(), db.pool, keys)
	// The kills between the effect and the commit left neither the ledger
	// row nor the record.
	for _, v := range held {
		for k, vals := range l.ledger {
			if slices.Contains(vals, v) {
				t.Errorf("key %s: the ledger holds %q, written by an action killed before its commit", k, v)
			}
		}
		for k, c := range l.committed {
			if c == v {
				t.Errorf("key %s: the record holds %q, the result of an action killed before its commit", k, v)
			}
		}
	}
}
