package idempg_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemhttp"
	"github.com/idemkit/idempotency/idempg"
)

// The checkout storm (TestCheckoutStorm): a three-phase checkout through
// idempg.Steps, in child processes that are killed -9 at every boundary
// of its steps and inside each of them.

// The environment of a checkout child: when checkoutChildEnv is set,
// TestMain runs checkoutChild instead of the tests.
const (
	checkoutChildEnv      = "IDEMPG_CHECKOUT_CHILD_DSN"
	checkoutChildSchema   = "IDEMPG_CHECKOUT_CHILD_SCHEMA"
	checkoutChildProvider = "IDEMPG_CHECKOUT_CHILD_PROVIDER"
	checkoutChildMint     = "IDEMPG_CHECKOUT_CHILD_MINT" // "1": send a new key on every charge (the control)
)

// checkoutOp is the checkout's operation.
const checkoutOp = "shop.checkout"

// The points at which a checkout child kills itself, on the first call of
// a key: before, inside and after each step, inside a statement of a
// phase, and after the call returned. pointNone kills nothing.
var checkoutPoints = []string{
	"before-reserve", "in-reserve", "in-reserve-statement", "after-reserve",
	"in-charge", "after-charge",
	"in-order", "in-order-statement", "after-order", "after-complete",
}

const pointNone = "none"

// checkoutTables are the shop's tables: the stock of one item, its
// movements and the orders, one of each per checkout.
const checkoutTables = `CREATE TABLE stock (item text PRIMARY KEY, qty integer NOT NULL);
INSERT INTO stock VALUES ('widget', 1000000);
CREATE TABLE stock_movements (key text NOT NULL, item text NOT NULL, delta integer NOT NULL);
CREATE TABLE orders (key text NOT NULL, charge text NOT NULL, value text NOT NULL)`

// A checkout child prints stormLines: "S" when a call starts, "E" when it
// enters a phase's function (Value: the phase), "O" with the value its
// order phase is about to write, "K" with the point at which it kills its
// process, and "R" when Steps returned (Class, Value, Replayed, Err).

// checkoutChild reads "C <id> <key> <point>" lines and runs each checkout
// concurrently, killing itself at point on the way; it exits at the end of
// stdin once its calls are done.
func checkoutChild() int {
	ctx := context.Background()
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "checkout child:", err)
		return 2
	}
	pool, err := childPool(ctx, checkoutChildEnv, checkoutChildSchema, 6)
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	s, err := idempg.New(pool)
	if err != nil {
		return fail(err)
	}
	c, err := coordinator.New(s, coordinator.WithInFlight(coordinator.InFlightWait), coordinator.WithWaitTimeout(20*time.Second))
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	tr, err := idemhttp.NewTransport(nil)
	if err != nil {
		return fail(err)
	}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	provider, mint := os.Getenv(checkoutChildProvider), os.Getenv(checkoutChildMint) == "1"

	var mu sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	emit := func(l stormLine) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(l)
	}
	die := func() {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
	var wg sync.WaitGroup
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var (
			id         int
			key, point string
		)
		if _, err := fmt.Sscanf(in.Text(), "C %d %s %s", &id, &key, &point); err != nil {
			return fail(fmt.Errorf("command %q: %w", in.Text(), err))
		}
		at := func(p string) {
			if p == point {
				emit(stormLine{T: "K", ID: id, Value: p})
				die()
			}
		}
		// inStatement kills the process while the database runs a
		// statement of the phase's transaction.
		inStatement := func(ctx context.Context, tx pgx.Tx, p string) error {
			if p != point {
				return nil
			}
			emit(stormLine{T: "K", ID: id, Value: p})
			time.AfterFunc(50*time.Millisecond, die)
			_, err := tx.Exec(ctx, "SELECT pg_sleep(5)")
			return err
		}
		wg.Go(func() {
			emit(stormLine{T: "S", ID: id, At: clockNow()})
			res, err := idempg.StepsWithCodec(ctx, c, s, coordinator.Call{Operation: checkoutOp, Key: key}, coordinator.JSONCodec[string]{},
				func(ctx context.Context, r *idempg.Run) (string, error) {
					at("before-reserve")
					if _, err := idempg.Phase(r, "reserve", func(ctx context.Context, tx pgx.Tx) (int, error) {
						emit(stormLine{T: "E", ID: id, Value: "reserve"})
						if _, err := tx.Exec(ctx, "UPDATE stock SET qty = qty - 1 WHERE item = 'widget'"); err != nil {
							return 0, err
						}
						if _, err := tx.Exec(ctx, "INSERT INTO stock_movements VALUES ($1, 'widget', -1)", key); err != nil {
							return 0, err
						}
						at("in-reserve")
						return 1, inStatement(ctx, tx, "in-reserve-statement")
					}); err != nil {
						return "", err
					}
					at("after-reserve")
					charge, err := idempg.Outside(r, "charge", func(ctx context.Context) (string, error) {
						req, err := http.NewRequestWithContext(ctx, http.MethodPost, provider, strings.NewReader(key))
						if err != nil {
							return "", err
						}
						if mint {
							req.Header.Set("Idempotency-Key", fmt.Sprintf("mint-%d-%d", os.Getpid(), id))
						}
						resp, err := client.Do(req)
						if err != nil {
							return "", err
						}
						defer resp.Body.Close()
						b, err := io.ReadAll(resp.Body)
						if err != nil || resp.StatusCode != http.StatusOK {
							return "", fmt.Errorf("provider: %s %q %v", resp.Status, b, err)
						}
						at("in-charge")
						return string(b), nil
					})
					if err != nil {
						return "", err
					}
					at("after-charge")
					order, err := idempg.Phase(r, "order", func(ctx context.Context, tx pgx.Tx) (string, error) {
						emit(stormLine{T: "E", ID: id, Value: "order"})
						v := fmt.Sprintf("%s by call %d with %s", key, id, charge)
						emit(stormLine{T: "O", ID: id, Value: v})
						if _, err := tx.Exec(ctx, "INSERT INTO orders VALUES ($1, $2, $3)", key, charge, v); err != nil {
							return "", err
						}
						at("in-order")
						return v, inStatement(ctx, tx, "in-order-statement")
					})
					if err != nil {
						return "", err
					}
					at("after-order")
					return order, nil
				})
			at("after-complete")
			l := stormLine{T: "R", ID: id, At: clockNow(), Class: classify(res, err, nil).String(), Replayed: res.Replayed, Value: res.Value}
			if err != nil {
				l.Err, l.Value = err.Error(), ""
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

// provider is a fake payment provider that deduplicates by
// Idempotency-Key: a key it has seen gets its charge back. It counts the
// charges it made per order (the request's body), and the keys it got.
type provider struct {
	mu      sync.Mutex
	byKey   map[string]string              // Idempotency-Key -> charge
	charges map[string]int                 // order -> charges made
	keys    map[string]map[string]struct{} // order -> keys sent
	n       int
}

func newProvider() *provider {
	return &provider{byKey: map[string]string{}, charges: map[string]int{}, keys: map[string]map[string]struct{}{}}
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	order, key := string(body), r.Header.Get("Idempotency-Key")
	time.Sleep(5 * time.Millisecond) // a provider takes its time
	p.mu.Lock()
	defer p.mu.Unlock()
	if key == "" {
		http.Error(w, "no Idempotency-Key", http.StatusBadRequest)
		return
	}
	if p.keys[order] == nil {
		p.keys[order] = map[string]struct{}{}
	}
	p.keys[order][key] = struct{}{}
	ch, ok := p.byKey[key]
	if !ok {
		p.n++
		ch = fmt.Sprintf("ch_%d", p.n)
		p.byKey[key] = ch
		p.charges[order]++
	}
	_, _ = io.WriteString(w, ch)
}

// checkoutCall is one call of the storm, as its child reported it.
type checkoutCall struct {
	id         int
	key, point string
	child      int
	start, end int64 // end: never when its process was killed first
	class      stormClass
	value, own string // own: what its order phase was about to write
	replayed   bool
	err        string
	entered    []string // the phases whose functions it entered
	done       bool     // its "R" line came, or its process is gone
}

// checkoutResult is what a storm found.
type checkoutResult struct {
	calls, kills, twice, repeated int
	problems                      []string
	verdict                       porcupine.CheckResult
}

// runCheckout runs the storm over keys, each key's first call killing its
// process at checkoutPoints[i%len]; mint sends a new key on every charge.
func runCheckout(t *testing.T, nkeys int, mint bool) checkoutResult {
	db := newDB(t, 8)
	if _, err := db.pool.Exec(t.Context(), checkoutTables); err != nil {
		t.Fatal(err)
	}
	prov := newProvider()
	srv := httptest.NewServer(prov)
	t.Cleanup(srv.Close)

	type child struct {
		n     int
		cmd   *exec.Cmd
		stdin io.WriteCloser
		gone  bool
		calls map[int]*checkoutCall
	}
	type event struct {
		ch   *child
		line *stormLine
		eof  bool
	}
	events := make(chan event)
	quit := make(chan struct{})
	var readers sync.WaitGroup
	var children []*child
	mintEnv := "0"
	if mint {
		mintEnv = "1"
	}
	start := func() *child {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), checkoutChildEnv+"="+server.DSN, checkoutChildSchema+"="+db.schema,
			checkoutChildProvider+"="+srv.URL, checkoutChildMint+"="+mintEnv)
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
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
		ch := &child{n: len(children), cmd: cmd, stdin: stdin, calls: map[int]*checkoutCall{}}
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
					return
				}
			}
			_ = cmd.Wait()
			select {
			case events <- event{ch: ch, eof: true}:
			case <-quit:
			}
		})
		return ch
	}
	t.Cleanup(func() {
		for _, ch := range children {
			if !ch.gone {
				_ = ch.cmd.Process.Kill()
			}
		}
		close(quit)
		readers.Wait()
	})
	const alive = 3
	for range alive {
		start()
	}

	var (
		all      []*checkoutCall
		nextID   int
		resolved = map[string]string{} // key -> value of a call that returned one
		kills    int
	)
	keys := stormKeys("checkout", nkeys)
	live := func() []*child {
		var out []*child
		for _, ch := range children {
			if !ch.gone {
				out = append(out, ch)
			}
		}
		return out
	}
	send := func(ch *child, key, point string) {
		nextID++
		c := &checkoutCall{id: nextID, key: key, point: point, child: ch.n, end: never}
		ch.calls[c.id] = c
		all = append(all, c)
		_, _ = fmt.Fprintf(ch.stdin, "C %d %s %s\n", c.id, key, point)
	}
	// wave sends each call and waits until every one has settled: it
	// returned, or its process died (and was replaced).
	var settle func()
	wave := func(sends func(i int) (key, point string, twice bool), n, perWave int) {
		for from := 0; from < n; from += perWave {
			for i := from; i < min(from+perWave, n); i++ {
				key, point, twice := sends(i)
				ls := live()
				send(ls[i%len(ls)], key, point)
				if twice {
					send(ls[(i+1)%len(ls)], key, pointNone)
				}
			}
			settle()
		}
	}
	hit := map[string]bool{}
	settle = func() {
		deadline := time.After(2 * time.Minute)
		for {
			open := 0
			for _, ch := range children {
				open += len(ch.calls)
			}
			if open == 0 {
				return
			}
			select {
			case e := <-events:
				if e.eof {
					e.ch.gone = true
					kills++
					for _, c := range e.ch.calls {
						c.class, c.done = classKilled, true
					}
					clear(e.ch.calls)
					start()
					continue
				}
				c := e.ch.calls[e.line.ID]
				if c == nil {
					t.Errorf("child %d: a line of an unknown call %d", e.ch.n, e.line.ID)
					continue
				}
				switch e.line.T {
				case "S":
					c.start = e.line.At
				case "E":
					c.entered = append(c.entered, e.line.Value)
				case "O":
					c.own = e.line.Value
				case "K":
					hit[e.line.Value] = true
				case "R":
					class, _ := parseClass(e.line.Class)
					c.end, c.class, c.value, c.replayed, c.err, c.done = e.line.At, class, e.line.Value, e.line.Replayed, e.line.Err, true
					delete(e.ch.calls, c.id)
					if c.ok() {
						resolved[c.key] = c.value
					}
				}
			case <-deadline:
				t.Fatalf("calls still open after two minutes")
			}
		}
	}
	// The first calls, each killing its process at its point; then
	// retries, a third of them twice at once in two processes, until
	// every key has returned a value; then a final call of each key.
	wave(func(i int) (string, string, bool) { return keys[i], checkoutPoints[i%len(checkoutPoints)], false }, len(keys), alive)
	for round := 0; len(resolved) < len(keys); round++ {
		if round == 5 {
			t.Fatalf("after 5 rounds of retries, %d of %d keys returned a value", len(resolved), len(keys))
		}
		var open []string
		for _, k := range keys {
			if _, ok := resolved[k]; !ok {
				open = append(open, k)
			}
		}
		wave(func(i int) (string, string, bool) { return open[i], pointNone, i%3 == 0 }, len(open), len(open))
	}
	finalFrom := len(all)
	wave(func(i int) (string, string, bool) { return keys[i], pointNone, false }, len(keys), len(keys))
	for _, ch := range live() {
		_ = ch.stdin.Close()
	}

	// What committed.
	res := checkoutResult{calls: len(all), kills: kills}
	problem := func(format string, args ...any) { res.problems = append(res.problems, fmt.Sprintf(format, args...)) }
	for _, p := range checkoutPoints {
		if !hit[p] && len(keys) >= len(checkoutPoints) {
			problem("no process was killed at %s", p)
		}
	}
	ctx := t.Context()
	count := func(sql string) map[string]int {
		rows, err := db.pool.Query(ctx, sql)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]int{}
		for rows.Next() {
			var (
				k string
				n int
			)
			if err := rows.Scan(&k, &n); err != nil {
				t.Fatal(err)
			}
			m[k] = n
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return m
	}
	movements := count("SELECT key, count(*) FROM stock_movements GROUP BY key")
	orders := count("SELECT key, count(*) FROM orders GROUP BY key")
	committed := map[string]string{}
	rows, err := db.pool.Query(ctx, "SELECT key, min(value) FROM orders GROUP BY key")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		committed[k] = v
	}
	readAt := clockNow()
	var qty int
	if err := db.pool.QueryRow(ctx, "SELECT qty FROM stock").Scan(&qty); err != nil {
		t.Fatal(err)
	}
	if qty != 1000000-len(keys) {
		problem("stock is %d, want %d: %d checkouts moved it", qty, 1000000-len(keys), 1000000-qty)
	}
	prov.mu.Lock()
	for _, k := range keys {
		if movements[k] != 1 || orders[k] != 1 {
			problem("%s: %d stock movements and %d orders, want 1 and 1", k, movements[k], orders[k])
		}
		switch n := prov.charges[k]; {
		case n > 1:
			res.twice++
		case n == 0:
			problem("%s: never charged", k)
		}
		if len(prov.keys[k]) != 1 && !mint {
			problem("%s: the provider got %d keys for it, want 1", k, len(prov.keys[k]))
		}
	}
	prov.mu.Unlock()
	// No phase ran again after it committed: of each key's entries into a
	// phase's function, only calls that died or failed may have entered it
	// before the one whose writes committed.
	byKey := map[string][]*checkoutCall{}
	for i, c := range all {
		byKey[c.key] = append(byKey[c.key], c)
		if i >= finalFrom && (c.class != classReplay || c.value != committed[c.key]) {
			problem("final call %d of %s: %s %q %s, want a replay of %q", c.id, c.key, c.class, c.value, c.err, committed[c.key])
		}
		if c.class == classOther {
			problem("call %d of %s: unexpected error: %s", c.id, c.key, c.err)
		}
	}
	for _, k := range keys {
		for _, phase := range []string{"reserve", "order"} {
			ok := 0
			for _, c := range byKey[k] {
				if slices.Contains(c.entered, phase) && c.ok() {
					ok++
				}
			}
			if ok > 1 {
				res.repeated++
				problem("%s: %d calls that returned a value entered phase %s", k, ok, phase)
			}
		}
	}

	// porcupine: per key, the order is a write-once register, written by
	// the order phase that committed. A call that returned a value read it,
	// or wrote its own (stepsRun); a call that was killed, or failed, after it entered
	// the order phase may have written its own at any time after it
	// started; the read after the storm must find what committed.
	var ops []porcupine.Operation
	for _, c := range all {
		if c.start == 0 {
			continue // its process died before it started
		}
		var out regOutput
		end := c.end
		switch {
		case c.ok():
			// Replayed or not: a call whose own order phase committed may
			// still get its value back as a replay, when a concurrent call
			// of the key completed the record first.
			out = regOutput{kind: stepsRun, value: c.value}
		case c.own != "":
			out, end = regOutput{kind: regMaybe}, never
		default:
			continue // it failed, or died, before its order phase: nothing to check
		}
		ops = append(ops, porcupine.Operation{ClientId: c.child, Input: regInput{key: c.key, own: c.own}, Call: c.start, Output: out, Return: end})
	}
	for i, k := range keys {
		ops = append(ops, porcupine.Operation{ClientId: 1000 + i, Input: regInput{key: k}, Call: readAt, Output: regOutput{kind: regRead, value: committed[k]}, Return: readAt + 1})
	}
	model := regModel
	model.Step = stepsRegStep
	verdict := porcupine.CheckOperationsTimeout(model.ToModel(), ops, time.Minute)
	res.verdict = verdict
	if verdict != porcupine.Ok {
		problem("porcupine: %s", verdict)
		for _, part := range model.Partition(ops) {
			if porcupine.CheckOperationsTimeout(model.ToModel(), part, 10*time.Second) == porcupine.Ok {
				continue
			}
			k := part[0].Input.(regInput).key
			var lines []string
			for _, c := range byKey[k] {
				lines = append(lines, fmt.Sprintf("call %d child %d point %s start %d end %d %s replayed=%t value %q own %q entered %v err %q",
					c.id, c.child, c.point, c.start, c.end, c.class, c.replayed, c.value, c.own, c.entered, c.err))
			}
			problem("not linearizable: %s, committed %q:\n%s", k, committed[k], strings.Join(lines, "\n"))
		}
	}
	return res
}

// stepsRun is a Steps call that returned a value: its own order (which
// its order phase wrote), or one that another call's order phase
// committed, which it resumed after or replayed from the record.
const stepsRun = regKind(100)

// stepsRegStep is regStep with stepsRun.
func stepsRegStep(state, input, output any) []any {
	s, in, out := state.(string), input.(regInput), output.(regOutput)
	if out.kind != stepsRun {
		return regStep(state, input, output)
	}
	switch {
	case s == "" && out.value != "" && out.value == in.own:
		return []any{out.value}
	case s != "" && out.value == s:
		return []any{s}
	}
	return nil
}

// TestCheckoutStorm: a three-phase checkout (reserve stock, charge through
// the HTTP client Transport, record the order) through idempg.Steps, in
// three child processes. Each key's first call kills its process with
// SIGKILL at one of checkoutPoints (the other calls of that process die
// with it, wherever they are); killed calls are retried, some twice at
// once, until every key has an answer; then each key is called once more.
// Every key must have 1 charge, 1 order row and 1 stock movement, its
// final call must replay what committed, and porcupine must find the
// history linearizable. The control sends a new key on every charge: the
// same storm then charges some orders twice. IDEMPG_CHECKOUT_KEYS sets the
// number of keys (60; 30 with -short).
func TestCheckoutStorm(t *testing.T) {
	nkeys := 60
	if testing.Short() {
		nkeys = 30
	}
	if v := os.Getenv("IDEMPG_CHECKOUT_KEYS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("IDEMPG_CHECKOUT_KEYS=%q: want a number of keys", v)
		}
		nkeys = n
	}
	r := runCheckout(t, nkeys, false)
	t.Logf("checkout storm: %d keys, %d calls, %d processes killed, %d orders charged twice, porcupine %s", nkeys, r.calls, r.kills, r.twice, r.verdict)
	for _, p := range r.problems {
		t.Error(p)
	}
	if r.twice != 0 {
		t.Errorf("%d orders charged twice", r.twice)
	}
	t.Run("control: a new key on every charge", func(t *testing.T) {
		r := runCheckout(t, nkeys, true)
		t.Logf("control: %d keys, %d calls, %d processes killed, %d orders charged twice", nkeys, r.calls, r.kills, r.twice)
		if r.twice == 0 {
			t.Errorf("without the downstream key no order was charged twice: the storm does not reach the charge's window")
		}
	})
}

// ok reports whether the call returned a value.
func (c *checkoutCall) ok() bool { return c.class == classRun || c.class == classReplay }

// The checkout checker rejects two different orders for one key, a replay
// of an order that never committed, and an order that differs from what
// committed.
func TestCheckoutCheckerRejects(t *testing.T) {
	model := regModel
	model.Step = stepsRegStep
	op := func(client int, start, end int64, own string, kind regKind, value string) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: regInput{key: "k", own: own}, Call: start, Output: regOutput{kind: kind, value: value}, Return: end}
	}
	for name, ops := range map[string][]porcupine.Operation{
		"two orders":                               {op(0, 1, 2, "A", stepsRun, "A"), op(1, 3, 4, "B", stepsRun, "B")},
		"a replay of nothing":                      {op(0, 1, 2, "", regReplay, "A"), op(1, 3, 4, "", regRead, "")},
		"another committed":                        {op(0, 1, 2, "A", stepsRun, "A"), op(1, 3, 4, "", regRead, "B")},
		"a resumed call's order that nobody wrote": {op(0, 1, 2, "", stepsRun, "A"), op(1, 3, 4, "", regRead, "A")},
	} {
		if got := porcupine.CheckOperations(model.ToModel(), ops); got {
			t.Errorf("%s: linearizable, want rejected", name)
		}
	}
	// A call whose order phase committed, and which got its own order back
	// as a replay: a concurrent call resumed after its phase and completed
	// the record first (a history that the first model refused).
	ownReplay := []porcupine.Operation{
		op(0, 1, 10, "A", stepsRun, "A"), // replayed, its own order
		op(1, 2, 5, "", stepsRun, "A"),   // resumed after it, completed the record
		op(2, 11, 12, "", regRead, "A"),
	}
	if !porcupine.CheckOperations(model.ToModel(), ownReplay) {
		t.Error("a call that replayed its own order: rejected, want linearizable")
	}
	ok := []porcupine.Operation{
		op(0, 1, never, "A", regMaybe, ""), // killed in its order phase
		op(1, 2, 5, "", stepsRun, "A"),     // resumed after it
		op(2, 6, 7, "", regReplay, "A"),    // replayed
		op(3, 8, 9, "", regRead, "A"),      // what committed
	}
	if !porcupine.CheckOperations(model.ToModel(), ok) {
		t.Error("a resumed history: rejected, want linearizable")
	}
}
