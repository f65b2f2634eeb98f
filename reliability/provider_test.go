//go:build linux

package reliability_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	idempotency "github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// The provider storm (issue 41): a payment provider in a process of its own
// (reliability/chargeworker provider) deduplicates charges by their
// Idempotency-Key and counts them; services in other processes
// (chargeworker service, fx apps with idempotency.Module over a Sentinel's
// Redis) charge orders through coordinator.Do with idemhttp.Transport,
// while the driver kills a service -9 before, during and after its
// provider call, deletes completed records (a failover that lost them) and
// fails the Redis master over. Every order a service did not finish, and
// every order whose record was deleted, is sent again, as a client retries.
// With the downstream key every run of an order's action sends the same
// key, and the provider charges each order once; the control sends a fresh
// key per run, as the Transport did before, and charges some orders twice.

// providerStorm is one storm's size.
type providerStorm struct {
	orders   int // orders charged
	services int // service processes at once
	inFlight int // orders under way at once
	kills    int // kills -9 of a service, spread over the three phases
	deletes  int // completed records deleted, then their orders sent again
}

func providerStormFor(lv level) providerStorm {
	if lv == levelFull {
		return providerStorm{orders: 1000, services: 2, inFlight: 32, kills: 15, deletes: 100}
	}
	return providerStorm{orders: 300, services: 2, inFlight: 32, kills: 6, deletes: 30}
}

// providerDelay is how long the fake provider takes to charge: the window
// of a kill "during" the call.
const providerDelay = 20 * time.Millisecond

func TestProviderChargesOnce(t *testing.T) {
	lv := suiteLevel(t)
	size := providerStormFor(lv)
	bin := buildChargeWorker(t)
	s := redistest.StartSentinel(t)
	for _, tc := range []struct {
		name string
		mint bool
	}{
		{"downstream key", false},
		{"a fresh key per run (control)", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runProviderStorm(t, bin, s, size, tc.mint)
			t.Log(r.summary())
			switch {
			case !tc.mint && r.twice > 0:
				t.Errorf("%d of %d orders were charged more than once (%d charges in all)", r.twice, size.orders, r.charges)
			case !tc.mint && r.charges != size.orders:
				t.Errorf("%d charges for %d orders, want one each", r.charges, size.orders)
			case !tc.mint && r.answers > 0:
				t.Errorf("%d orders got two different charges back", r.answers)
			case tc.mint && r.twice == 0:
				t.Errorf("the control charged no order twice: the storm did not run any action again after its charge")
			}
			if r.reruns == 0 {
				t.Errorf("no order's action ran twice: the storm tested nothing")
			}
		})
	}
}

// buildChargeWorker builds reliability/chargeworker with -race.
func buildChargeWorker(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "chargeworker")
	cmd := exec.Command("go", "build", "-race", "-o", bin, "./chargeworker")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build chargeworker: %v\n%s", err, out)
	}
	return bin
}

// stormResult is what a provider storm did.
type stormResult struct {
	charges, twice, answers int // charges made; orders charged more than once; orders given two charge IDs
	reruns                  int // runs of an order's action beyond its first
	kills                   map[string]int
	deleted, retries        int
	failover                string
	took                    time.Duration
}

func (r stormResult) summary() string {
	return fmt.Sprintf("%d charges, %d orders charged more than once, %d given two charges; %d extra runs of an action; kills %v, %d records deleted, %d retries after an error; failover: %s; %v",
		r.charges, r.twice, r.answers, r.reruns, r.kills, r.deleted, r.retries, r.failover, r.took.Round(time.Millisecond))
}

// chargeLine is a line of a chargeworker's output.
type chargeLine struct {
	T      string `json:"t"`
	Addr   string `json:"addr"`
	Order  string `json:"order"`
	Charge string `json:"charge"`
	Err    string `json:"err"`
}

// chargeProc is a running chargeworker.
type chargeProc struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	gone  chan struct{} // closed once it has exited and its output is read
}

// startCharge starts bin with args and env, sends each of its lines to
// lines (tagged with p), and waits for its "ready" line, which it returns.
func startCharge(t *testing.T, name, bin string, env []string, lines chan<- procLine, args ...string) (*chargeProc, chargeLine) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
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
	p := &chargeProc{name: name, cmd: cmd, stdin: stdin, gone: make(chan struct{})}
	ready := make(chan chargeLine, 1)
	go func() {
		defer close(p.gone)
		sc := bufio.NewScanner(stdout)
		first := true
		for sc.Scan() {
			var l chargeLine
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				continue
			}
			if first {
				first = false
				ready <- l
				continue
			}
			if lines != nil {
				lines <- procLine{p: p, l: l}
			}
		}
		_ = cmd.Wait()
		if first {
			close(ready)
		}
	}()
	select {
	case l, ok := <-ready:
		if !ok || l.T != "ready" {
			t.Fatalf("%s did not start: %s", name, stderr.String())
		}
		return p, l
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("%s did not start within a minute: %s", name, stderr.String())
	}
	return nil, chargeLine{}
}

// procLine is a line of a service, with the service.
type procLine struct {
	p *chargeProc
	l chargeLine
}

// order is the driver's state of one order.
type order struct {
	id      string
	on      *chargeProc // the service it is under way on; nil when not
	queued  bool        // waiting to be sent
	done    bool
	charge  string // the first charge it got back
	answers map[string]bool
	runs    int // "calling" lines: runs of its action that reached the provider call
}

// runProviderStorm runs one storm and returns what it did.
func runProviderStorm(t *testing.T, bin string, s *redistest.Sentinel, size providerStorm, mint bool) stormResult {
	t.Helper()
	start := time.Now()
	rng := rand.New(rand.NewPCG(uint64(start.UnixNano()), 41))
	prov, ready := startCharge(t, "provider", bin, nil, nil, "provider", "-delay", providerDelay.String())
	defer func() {
		_ = prov.cmd.Process.Kill()
		<-prov.gone
	}()
	base := "http://" + ready.Addr
	prefix := fmt.Sprintf("provider-storm:%d:", rng.Uint32())
	env := []string{
		"IDEMPOTENCY_REDIS_SENTINEL_MASTER=" + redistest.SentinelMaster,
		"IDEMPOTENCY_REDIS_SENTINEL_ADDRS=" + strings.Join(s.Addrs(), ","),
		"IDEMPOTENCY_KEY_PREFIX=" + prefix,
		"IDEMPOTENCY_LEASE=2s",
		"IDEMPOTENCY_IN_FLIGHT=wait",
		"IDEMPOTENCY_WAIT_TIMEOUT=10s",
		"IDEMPOTENCY_ON_STORAGE_ERROR=raise",
		"IDEMPOTENCY_METRICS_ENABLED=false",
		"IDEMPOTENCY_TRACING_ENABLED=false",
	}
	args := []string{"service", "-provider", base}
	if mint {
		args = append(args, "-mint")
	}

	// The driver's store client: it deletes completed records as a
	// failover that lost them would.
	settings := idempotency.DefaultSettings()
	settings.RedisSentinelMaster = redistest.SentinelMaster
	settings.RedisSentinelAddrs = s.Addrs()
	rc, err := idempotency.NewRedisClient(settings)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	store := redisrepo.New(rc, redisrepo.WithKeyPrefix(prefix))

	lines := make(chan procLine, 1<<16) // never full: a reader of a killed service must not block
	var live []*chargeProc
	spawned := 0
	spawn := func() *chargeProc {
		spawned++
		p, _ := startCharge(t, fmt.Sprintf("service %d", spawned), bin, env, lines, args...)
		return p
	}
	for range size.services {
		live = append(live, spawn())
	}
	defer func() {
		for _, p := range live {
			_ = p.stdin.Close()
		}
		for _, p := range live {
			select {
			case <-p.gone:
			case <-time.After(30 * time.Second):
				_ = p.cmd.Process.Kill()
				<-p.gone
			}
		}
	}()

	orders := make([]*order, size.orders)
	byID := map[string]*order{}
	for i := range orders {
		orders[i] = &order{id: fmt.Sprintf("o-%d", i), answers: map[string]bool{}}
		byID[orders[i].id] = orders[i]
	}
	var queue []*order // orders to send, each at most once, none under way
	enqueue := func(os ...*order) {
		for _, o := range os {
			if !o.queued && o.on == nil {
				o.queued = true
				queue = append(queue, o)
			}
		}
	}
	enqueue(orders...)
	underWay := 0
	send := func(o *order) {
		o.queued = false
		p := live[rng.IntN(len(live))]
		o.on = p
		underWay++
		if _, err := io.WriteString(p.stdin, o.id+"\n"); err != nil {
			t.Fatalf("send %s to %s: %v", o.id, p.name, err)
		}
	}
	res := stormResult{kills: map[string]int{}}

	// The kills, spread over the storm: each waits for its moment (the
	// next "calling" or "called" line) once enough orders are done.
	phases := []string{"before", "during", "after"}
	type killPlan struct {
		phase string
		at    int // orders done when it is armed
	}
	var kills []killPlan
	for i := range size.kills {
		kills = append(kills, killPlan{phase: phases[i%3], at: (i + 1) * size.orders / (size.kills + 2)})
	}
	deletesAt := map[int]int{} // orders done -> records to delete then
	for i := range 10 {
		deletesAt[(i+1)*size.orders/12] += size.deletes / 10
	}
	failoverAt := size.orders / 2
	failoverDone := make(chan string, 1)
	failoverStarted := false

	kill := func(p *chargeProc, phase string) {
		_ = p.cmd.Process.Kill()
		<-p.gone
		res.kills[phase]++
		i := slices.Index(live, p)
		live[i] = spawn()
		for _, o := range orders {
			if o.on == p {
				o.on = nil
				underWay--
				enqueue(o) // the client retries
			}
		}
	}

	doneCount := func() int {
		n := 0
		for _, o := range orders {
			if o.done {
				n++
			}
		}
		return n
	}
	finalPass := false
	deadline := time.After(8 * time.Minute)
	progress := time.NewTicker(10 * time.Second)
	defer progress.Stop()
	for {
		for len(queue) > 0 && underWay < size.inFlight {
			o := queue[0]
			queue = queue[1:]
			send(o)
		}
		done := doneCount()
		if !failoverStarted && done >= failoverAt {
			failoverStarted = true
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				began := time.Now()
				r, err := s.Failover(ctx)
				if err != nil {
					failoverDone <- "failed: " + err.Error()
					return
				}
				failoverDone <- fmt.Sprintf("to %s, announced after %v", r.Master, r.Announced.Sub(began).Round(time.Millisecond))
			}()
		}
		if n, ok := deletesAt[done]; ok && n > 0 {
			delete(deletesAt, done)
			var keys []idemstore.Key
			var picked []*order
			for _, i := range rng.Perm(len(orders)) {
				if o := orders[i]; o.done && o.on == nil && !o.queued && len(picked) < n {
					picked = append(picked, o)
					keys = append(keys, idemstore.Key{Operation: "order.charge", Key: o.id})
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			m, err := store.Forget(ctx, keys...)
			cancel()
			if err == nil {
				res.deleted += m
				enqueue(picked...) // a client whose answer was lost retries
			}
		}
		if underWay == 0 && len(queue) == 0 && done == len(orders) && failoverStarted {
			if res.failover == "" {
				res.failover = <-failoverDone
			}
			if !finalPass {
				// Every order once more: a retry after everything.
				finalPass = true
				enqueue(orders...)
				continue
			}
			break
		}
		var armed *killPlan
		if len(kills) > 0 && done >= kills[0].at {
			armed = &kills[0]
		}
		select {
		case pl := <-lines:
			o := byID[pl.l.Order]
			if o == nil || o.on != pl.p {
				continue // a line of a call the driver already gave up on
			}
			switch pl.l.T {
			case "calling":
				o.runs++
				if armed != nil && armed.phase != "after" {
					if armed.phase == "during" {
						time.Sleep(providerDelay / 2)
					}
					kills = kills[1:]
					kill(pl.p, armed.phase)
				}
			case "called":
				if armed != nil && armed.phase == "after" {
					kills = kills[1:]
					kill(pl.p, armed.phase)
				}
			case "done":
				o.on = nil
				underWay--
				if pl.l.Err != "" {
					res.retries++
					enqueue(o)
					continue
				}
				o.done = true
				o.answers[pl.l.Charge] = true
				if o.charge == "" {
					o.charge = pl.l.Charge
				}
			}
		case r := <-failoverDone:
			res.failover = r
		case <-progress.C:
			t.Logf("%v: %d of %d orders done, %d under way, %d queued; kills %v, %d deleted, %d retries",
				time.Since(start).Round(time.Second), doneCount(), len(orders), underWay, len(queue), res.kills, res.deleted, res.retries)
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatalf("the storm did not end within 8 minutes: %d of %d orders done, %d under way, %d queued", doneCount(), len(orders), underWay, len(queue))
		}
	}
	res.took = time.Since(start)

	resp, err := http.Get(base + "/v1/counts")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var counts map[string]int
	if err := json.NewDecoder(resp.Body).Decode(&counts); err != nil {
		t.Fatal(err)
	}
	for _, o := range orders {
		n := counts[o.id]
		res.charges += n
		if n > 1 {
			res.twice++
		}
		if n == 0 {
			t.Errorf("order %s was never charged, yet done with %q", o.id, o.charge)
		}
		if len(o.answers) > 1 {
			res.answers++
		}
		res.reruns += max(o.runs-1, 0)
	}
	return res
}
