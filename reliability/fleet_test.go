package reliability_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// The fleet storms: separate OS processes (reliability/fleetworker, an fx
// app with idempotency.Module configured by its IDEMPOTENCY_* environment,
// as a service is) share keys on one Redis while the driver restarts them
// one at a time with another value of a setting, the way a deploy does:
// some by SIGTERM (a graceful stop: calls in flight finish, background saves
// are waited for), some by kill -9 (calls in flight die with the process,
// their reservations expire after their holder's lease). Every call of
// every process, and every effect, goes into one history that the checker
// judges as it judges an in-process storm; a call in flight when its
// process was killed ends at the moment the process was gone (errKilled).

// fleetBinary is a built fleetworker.
type fleetBinary struct {
	path    string
	release string // what it was built from, for the log
}

var (
	fleetBuildMu sync.Mutex
	fleetBuilt   = map[string]fleetBinary{}
	fleetBinDir  string // the binaries' folder, removed after the tests
)

// removeFleetBinaries removes the worker binaries built by this test binary.
func removeFleetBinaries() {
	fleetBuildMu.Lock()
	defer fleetBuildMu.Unlock()
	if fleetBinDir != "" {
		_ = os.RemoveAll(fleetBinDir)
	}
}

// buildFleetWorker builds reliability/fleetworker from this checkout (commit
// "") or from commit of this repository's history (its files as they were,
// with the worker's source of this checkout added), once per test binary.
func buildFleetWorker(t *testing.T, commit string) fleetBinary {
	t.Helper()
	fleetBuildMu.Lock()
	defer fleetBuildMu.Unlock()
	if b, ok := fleetBuilt[commit]; ok {
		return b
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if fleetBinDir == "" {
		if fleetBinDir, err = os.MkdirTemp("", "idemkit-fleet-bin-"); err != nil {
			t.Fatal(err)
		}
	}
	src, release := root, "this checkout"
	if commit != "" {
		// The commit's files, kept between runs (a commit never changes);
		// extracted into a fresh folder and renamed into place, so that an
		// interrupted extraction is never taken for a whole one.
		src = filepath.Join(os.TempDir(), "idemkit-fleet-"+commit)
		if _, err := os.Stat(filepath.Join(src, "go.mod")); err != nil {
			tmp, err := os.MkdirTemp("", "idemkit-fleet-src-")
			if err != nil {
				t.Fatal(err)
			}
			defer os.RemoveAll(tmp)
			// git archive: the commit's files, without touching the
			// repository (no worktree, no checkout).
			archive := exec.Command("git", "-C", root, "archive", "--format=tar", commit)
			untar := exec.Command("tar", "-x", "-C", tmp)
			pipe, err := archive.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			untar.Stdin = pipe
			var aerr, uerr strings.Builder
			archive.Stderr, untar.Stderr = &aerr, &uerr
			if err := untar.Start(); err != nil {
				t.Fatal(err)
			}
			if err := archive.Run(); err != nil {
				t.Fatalf("git archive %s (the previous release, from this repository's history; a clone without it cannot run the upgrade storm): %v: %s", commit, err, aerr.String())
			}
			if err := untar.Wait(); err != nil {
				t.Fatalf("untar %s: %v: %s", commit, err, uerr.String())
			}
			_ = os.RemoveAll(src) // an interrupted extraction's leftovers
			if err := os.Rename(tmp, src); err != nil {
				t.Fatal(err)
			}
		}
		// The worker's source of this checkout, all of it: its events.go
		// names the coordinator's events as this release does, and
		// events_before_idemevent.go as the releases before issue 43 did.
		files, err := filepath.Glob(filepath.Join(root, "reliability", "fleetworker", "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("the fleet worker's source: %v (%d files)", err, len(files))
		}
		if err := os.MkdirAll(filepath.Join(src, "reliability", "fleetworker"), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(src, "reliability", "fleetworker", filepath.Base(f)), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		release = "commit " + commit
	}
	bin := filepath.Join(fleetBinDir, "fleetworker-"+cmpOr(commit, "head"))
	build := exec.Command("go", "build", "-race", "-o", bin, "./reliability/fleetworker")
	if commit != "" && !hasIdemevent(src) {
		build.Args = append(build.Args[:2], append([]string{"-tags", "idemkit_before_idemevent"}, build.Args[2:]...)...)
	}
	build.Dir = src
	if outp, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the fleet worker from %s: %v\n%s", release, err, outp)
	}
	b := fleetBinary{path: bin, release: release}
	fleetBuilt[commit] = b
	return b
}

// hasIdemevent reports whether the tree at src has coordinator/idemevent
// (issue 43), where the coordinator's events are.
func hasIdemevent(src string) bool {
	_, err := os.Stat(filepath.Join(src, "coordinator", "idemevent"))
	return err == nil
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// fleetLine is a line of a worker's output (fleetworker's line).
type fleetLine struct {
	T         string `json:"t"`
	ID        int    `json:"id"`
	At        int64  `json:"at"`
	Start     int64  `json:"start"`
	End       int64  `json:"end"`
	Value     string `json:"value"`
	Class     string `json:"class"`
	Err       string `json:"err"`
	Protected bool   `json:"protected"`
	Token     string `json:"token"`
	Fence     uint64 `json:"fence"`
	Event     string `json:"event"`
}

// worker is one running fleetworker process.
type worker struct {
	name  string
	env   map[string]string
	modes modes
	bin   fleetBinary
	cmd   *exec.Cmd
	stdin io.WriteCloser
	ready chan struct{}
	gone  chan struct{} // its output ended and its calls are settled

	mu       sync.Mutex
	open     bool // takes new calls
	killedAt int64
	graceful bool // it said bye
	inflight map[int]*fleetCall
	stderr   strings.Builder
}

// fleetCall is a call of a fleet storm, and when it has settled.
type fleetCall struct {
	*call
	maxAction time.Duration
	done      chan struct{}
}

// fleet is a storm of worker processes.
type fleet struct {
	t      *testing.T
	base   int64 // the wall clock at the storm's start, ns
	cfg    stormConfig
	common map[string]string // every worker's environment

	mu      sync.Mutex
	workers []*worker
	calls   []*call
	byID    map[int]*fleetCall
	counts  map[string]int
	nextID  int
	effects map[string]int64
}

func (f *fleet) now() int64 { return time.Now().UnixNano() - f.base }

// start starts a worker with env over the fleet's common environment, and
// waits until it is ready.
func (f *fleet) start(name string, bin fleetBinary, env map[string]string) *worker {
	t := f.t
	t.Helper()
	w := &worker{name: name, env: env, bin: bin, ready: make(chan struct{}), gone: make(chan struct{}), inflight: map[int]*fleetCall{}}
	all := map[string]string{}
	for k, v := range f.common {
		all[k] = v
	}
	for k, v := range env {
		all[k] = v
	}
	w.modes = modes{inFlight: coordinator.InFlightMode(cmpOr(all["IDEMPOTENCY_IN_FLIGHT"], "wait")),
		onError: coordinator.OnStorageErrorMode(cmpOr(all["IDEMPOTENCY_ON_STORAGE_ERROR"], "run"))}
	cmd := exec.Command(bin.path)
	cmd.Env = os.Environ()
	for k, v := range all {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = &lockedWriter{mu: &w.mu, b: &w.stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.cmd, w.stdin = cmd, stdin
	go f.read(w, stdout)
	select {
	case <-w.ready:
	case <-w.gone:
		t.Fatalf("worker %s (%s) exited before it was ready: %s", name, bin.release, w.stderrText())
	case <-time.After(30 * time.Second):
		t.Fatalf("worker %s not ready in 30s", name)
	}
	w.mu.Lock()
	w.open = true
	w.mu.Unlock()
	f.mu.Lock()
	f.workers = append(f.workers, w)
	f.mu.Unlock()
	return w
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() < 1<<16 {
		l.b.Write(p)
	}
	return len(p), nil
}

func (w *worker) stderrText() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stderr.String()
}

// read reads w's output until it ends, then settles the calls still in
// flight: killed ones end when the process was gone.
func (f *fleet) read(w *worker, r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l fleetLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			f.t.Errorf("worker %s: bad line %q: %v", w.name, sc.Text(), err)
			continue
		}
		f.apply(w, l)
	}
	_ = w.cmd.Wait()
	end := f.now()
	w.mu.Lock()
	if w.killedAt == 0 && !w.graceful {
		f.t.Errorf("worker %s (%s) exited unexpectedly: %v: %s", w.name, w.bin.release, w.cmd.ProcessState, w.stderr.String())
	}
	left := w.inflight
	w.inflight = map[int]*fleetCall{}
	w.open = false
	w.mu.Unlock()
	for _, c := range left {
		c.class, c.err, c.end = errKilled, fmt.Errorf("worker %s killed", w.name), end
		if c.invoked && !c.ran {
			c.actEnd = end
		}
		close(c.done)
	}
	close(w.gone)
}

// apply records one line of w's output.
func (f *fleet) apply(w *worker, l fleetLine) {
	switch l.T {
	case "ready":
		close(w.ready)
		return
	case "bye":
		w.mu.Lock()
		w.graceful = true
		w.mu.Unlock()
		return
	case "count":
		f.mu.Lock()
		f.counts[cmpOr(l.Event, "unknown")]++
		f.mu.Unlock()
		return
	}
	f.mu.Lock()
	c := f.byID[l.ID]
	if l.T == "event" {
		f.counts[l.Event]++
	}
	f.mu.Unlock()
	if c == nil {
		f.t.Errorf("worker %s: line for unknown call %d: %+v", w.name, l.ID, l)
		return
	}
	switch l.T {
	case "invoked":
		c.invoked, c.protected, c.token, c.fence, c.actStart = true, l.Protected, l.Token, l.Fence, l.At-f.base
	case "effect":
		c.ran, c.actEnd = true, l.At-f.base
		f.mu.Lock()
		f.effects[c.pkey()]++
		f.mu.Unlock()
	case "cancelled":
		c.actEnd = l.At - f.base
	case "event":
		switch l.Event {
		case "unprotected":
			c.unprotected.Store(true)
			err := error(fmt.Errorf("%s", l.Err))
			c.unprotectedErr.Store(&err)
		case "stored":
			c.stored.Store(true)
		case string(idemevent.ErrorStorageSave):
			c.saveFailed.Store(true)
			if strings.Contains(l.Err, "not stored") && strings.Contains(l.Err, "could have expired") {
				c.saveGivenUp.Store(true)
			}
		case string(idemevent.ErrorLeaseLost):
			c.leaseLost.Store(true)
		}
	case "done":
		c.start, c.end = l.Start-f.base, l.End-f.base
		c.class = classByName(l.Class)
		if l.Err != "" {
			c.err = fmt.Errorf("%s", l.Err)
		}
		if c.class == okValue {
			c.value = l.Value
		}
		w.mu.Lock()
		delete(w.inflight, l.ID)
		w.mu.Unlock()
		close(c.done)
	}
}

// classByName is the errClass a worker named.
func classByName(name string) errClass {
	for i, n := range errClassNames {
		if n == name {
			return errClass(i)
		}
	}
	return errOther
}

// send makes call c on an open worker, and waits until it settles. It
// returns false when no worker is open.
func (f *fleet) send(c *fleetCall, r *rand.Rand) bool {
	for attempt := 0; ; attempt++ {
		f.mu.Lock()
		var open []*worker
		for _, w := range f.workers {
			w.mu.Lock()
			if w.open {
				open = append(open, w)
			}
			w.mu.Unlock()
		}
		f.mu.Unlock()
		if len(open) == 0 {
			if attempt > 200 {
				return false
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		w := open[r.IntN(len(open))]
		w.mu.Lock()
		if !w.open {
			w.mu.Unlock()
			continue
		}
		c.modes = &w.modes
		c.start = f.now() // replaced by the worker's own reading
		w.inflight[c.id] = c
		fp := c.fp
		if fp == "" {
			fp = "-"
		}
		cancellable := 0
		if c.id%2 == 1 {
			cancellable = 1
		}
		_, err := fmt.Fprintf(w.stdin, "%d %s %s %s %d %d %s\n", c.id, c.op, c.key, fp, c.maxAction.Microseconds(), cancellable, c.own)
		w.mu.Unlock()
		if err != nil {
			// The worker is going away: settled as killed by read.
			<-c.done
			return true
		}
		<-c.done
		return true
	}
}

// newCall registers a new call.
func (f *fleet) newCall(client int, op, key, fp string, final bool) *fleetCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	id := f.nextID
	c := &fleetCall{call: &call{id: id, client: client, op: op, key: key, fp: fp, own: value(op, key, fp, id), final: final},
		maxAction: f.cfg.maxAction, done: make(chan struct{})}
	f.byID[id] = c
	f.calls = append(f.calls, c.call)
	return c
}

// caller makes calls until stop is closed, as storm.caller does; a key of
// bigEvery (if not 0) has a long name, so that its result is larger than a
// small IDEMPOTENCY_MAX_RESULT_BYTES.
func (f *fleet) caller(client int, stop <-chan struct{}, bigEvery int) {
	r := rand.New(rand.NewPCG(f.cfg.seed, uint64(client)))
	z := rand.NewZipf(r, 1.1, 1, uint64(f.cfg.ranks-1))
	for {
		select {
		case <-stop:
			return
		default:
		}
		shift := int(f.now()/int64(f.cfg.shiftEvery)) * f.cfg.shiftBy
		rank := int(z.Uint64()) + shift
		key := "k" + strconv.Itoa(rank)
		if bigEvery > 0 && rank%bigEvery == 0 {
			key += "-" + strings.Repeat("x", 120)
		}
		op, fp := opCharge, "fp-"+key
		if r.IntN(8) == 0 {
			op, fp = opReuse, []string{"fpA", "fpB"}[r.IntN(2)]
		}
		if !f.send(f.newCall(client, op, key, fp, false), r) {
			f.t.Errorf("caller %d: no worker took a call for 2s", client)
			return
		}
	}
}

// replace stops w (by SIGTERM when graceful, else kill -9) and starts its
// successor with env.
func (f *fleet) replace(w *worker, graceful bool, name string, bin fleetBinary, env map[string]string) *worker {
	t := f.t
	t.Helper()
	if graceful {
		// A graceful stop: a load balancer stops sending first.
		w.mu.Lock()
		w.open = false
		w.mu.Unlock()
		if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	} else {
		w.mu.Lock()
		// killedAt is set before the kill so that read never mistakes the
		// exit for a crash; the calls' ends are read's later clock.
		w.killedAt = f.now()
		w.mu.Unlock()
		if err := w.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-w.gone:
	case <-time.After(60 * time.Second):
		t.Fatalf("worker %s did not stop in 60s", w.name)
	}
	f.mu.Lock()
	f.workers = slices.DeleteFunc(f.workers, func(x *worker) bool { return x == w })
	f.mu.Unlock()
	return f.start(name, bin, env)
}

// fleetSpec is one fleet storm: the workers' first configurations, and what
// each is replaced with during the storm, in order.
type fleetSpec struct {
	name   string
	common map[string]string
	before []fleetConf   // the workers at the start, one each
	after  []fleetConf   // what the deploy replaces them with, in turn
	big    int           // see caller's bigEvery
	hang   time.Duration // the history's hang limit
	// readers read every key after the storm, one worker each, before this
	// release's own final reads: every completed key must replay on every
	// release.
	readers []fleetConf
	// boundary: the storm crosses a boundary the docs say a fleet must not
	// (another key prefix): runFleet reports what the checker found
	// instead of failing on it.
	boundary bool
}

// fleetConf is one worker's release and environment.
type fleetConf struct {
	bin fleetBinary
	env map[string]string
}

// runFleet runs spec against the Redis at addr and checks its history.
func runFleet(t *testing.T, lv level, spec fleetSpec, addr string) *report {
	t.Helper()
	cfg := configFor(lv)
	cfg.callers = 24
	cfg.maxAction = 20 * time.Millisecond
	t.Logf("seed %d (IDEMPOTENCY_TEST_RELIABILITY_SEED)", cfg.seed)
	prefix := "fleet:" + strconv.FormatUint(rand.Uint64()%1e9, 36) + ":"
	common := map[string]string{
		"IDEMPOTENCY_REDIS_URL":       "redis://" + addr + "/0",
		"IDEMPOTENCY_KEY_PREFIX":      prefix,
		"IDEMPOTENCY_METRICS_ENABLED": "false",
		"IDEMPOTENCY_TRACING_ENABLED": "false",
	}
	for k, v := range spec.common {
		common[k] = v
	}
	f := &fleet{t: t, base: time.Now().UnixNano(), cfg: cfg, common: common, byID: map[int]*fleetCall{}, counts: map[string]int{}, effects: map[string]int64{}}
	var live []*worker
	for i, c := range spec.before {
		live = append(live, f.start(fmt.Sprintf("w%d", i), c.bin, c.env))
	}
	defer func() {
		for _, w := range f.liveWorkers() {
			w.mu.Lock()
			if w.killedAt == 0 {
				w.killedAt = f.now()
			}
			w.mu.Unlock()
			_ = w.cmd.Process.Kill()
			<-w.gone
		}
	}()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range cfg.callers {
		wg.Go(func() { f.caller(i, stop, spec.big) })
	}
	// The deploy: one worker at a time, every restartEvery, alternately by
	// SIGTERM and by kill -9.
	restartEvery := 700 * time.Millisecond
	if lv == levelFull {
		restartEvery = 1500 * time.Millisecond
	}
	time.Sleep(restartEvery)
	for i, c := range spec.after {
		slot := i % len(live)
		live[slot] = f.replace(live[slot], i%2 == 0, fmt.Sprintf("w%d'%d", slot, i), c.bin, c.env)
		time.Sleep(restartEvery)
	}
	close(stop)
	wg.Wait()
	// Every worker stops gracefully (end of input), so that background
	// saves finish, then every key is read by a coordinator of this
	// release.
	for _, w := range f.liveWorkers() {
		w.mu.Lock()
		w.open = false
		w.mu.Unlock()
		_ = w.stdin.Close()
		<-w.gone
	}
	for _, c := range spec.readers {
		f.finalReadsVia(c)
	}
	f.finalReads(t, addr, prefix)

	h := &history{inFlight: coordinator.InFlightWait, onError: coordinator.OnStorageErrorRun, calls: f.calls, effects: f.effects, hangLimit: spec.hang}
	r := h.check()
	t.Logf("%s: %s; events %s", spec.name, r.summary(), formatCounts(f.counts))
	if spec.boundary {
		return r
	}
	for _, s := range r.failures() {
		t.Error(s)
	}
	if t.Failed() {
		for k := range r.badKeys {
			t.Log(h.dump(k))
		}
	}
	if u := r.unproven(); u != "" {
		t.Log(u)
	}
	return r
}

// finalReadsVia reads every key the storm used through a worker of its own
// (in-flight wait, on-storage-error raise).
func (f *fleet) finalReadsVia(conf fleetConf) {
	env := map[string]string{"IDEMPOTENCY_IN_FLIGHT": "wait", "IDEMPOTENCY_ON_STORAGE_ERROR": "raise"}
	for k, v := range conf.env {
		env[k] = v
	}
	w := f.start("reader", conf.bin, env)
	readAll(f.cfg.seed, f.cfg.callers+finalReaders, f.targets(), func(client int, r *rand.Rand, tg readTarget) *call {
		c := f.newCall(client, tg.op, tg.key, tg.fp, true)
		c.maxAction = 0
		f.send(c, r)
		return c.call
	})
	w.mu.Lock()
	w.open = false
	w.mu.Unlock()
	_ = w.stdin.Close()
	<-w.gone
	f.mu.Lock()
	f.workers = slices.DeleteFunc(f.workers, func(x *worker) bool { return x == w })
	f.mu.Unlock()
}

// targets returns every key the storm's calls used, once each.
func (f *fleet) targets() []readTarget {
	f.mu.Lock()
	defer f.mu.Unlock()
	return targetsOf(f.calls)
}

func (f *fleet) liveWorkers() []*worker {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.workers)
}

// finalReads reads every key the storm used with a coordinator of this
// release, in this process (in-flight wait, on-storage-error raise), as
// storm.finalReads does: a key whose action runs here had no result stored.
func (f *fleet) finalReads(t *testing.T, addr, prefix string) {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: addr})
	defer client.Close()
	// A format 1 writer's records are read by either store.
	c, err := coordinator.New(redisrepo.New(client, redisrepo.WithKeyPrefix(prefix)),
		coordinator.WithLease(3*time.Second), coordinator.WithStorageTimeout(500*time.Millisecond), coordinator.WithRenewInterval(time.Second),
		coordinator.WithWaitTimeout(3*time.Second), coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := &storm{cfg: f.cfg, base: time.Unix(0, f.base), coord: c, obs: &observer{}, effect: map[string]int64{}}
	s.calls = make([][]*call, f.cfg.callers+finalReaders)
	s.nextID.Store(int64(f.nextID))
	readAll(f.cfg.seed, f.cfg.callers, f.targets(), func(client int, r *rand.Rand, tg readTarget) *call {
		return s.do(c, client, r, tg.op, tg.key, tg.fp, true)
	})
	for _, cs := range s.calls {
		f.calls = append(f.calls, cs...)
	}
	for k, n := range s.effect {
		f.effects[k] += n
	}
}

// fleetRedis starts a redis-server of the test's own.
func fleetRedis(t *testing.T) string {
	t.Helper()
	in := redistest.Start(t)
	if in.Kind() != redistest.KindRedisServer {
		t.Skip("the fleet storms need redis-server")
	}
	return in.Addr()
}

// fleetTimings are the settings every worker of a fleet storm shares unless
// its storm changes them: the suite's short timings, or timings like the
// defaults (a 30s lease, a 1s storage timeout) with a wait bound short
// enough that a key whose holder was killed does not hold the storm up for
// a lease.
func fleetTimings(defaultLike bool) (map[string]string, time.Duration) {
	if defaultLike {
		return map[string]string{"IDEMPOTENCY_LEASE": "30s", "IDEMPOTENCY_STORAGE_TIMEOUT": "1s", "IDEMPOTENCY_WAIT_TIMEOUT": "3s"}, 10 * time.Second
	}
	// The hang limit: four wait bounds, for worker processes built with
	// -race on a machine that CI may load with busy loops.
	return map[string]string{"IDEMPOTENCY_LEASE": "2s", "IDEMPOTENCY_STORAGE_TIMEOUT": "200ms"}, 8 * time.Second
}

// settingChange is a setting an operator changes on a running fleet: the
// environment before and after.
type settingChange struct {
	name          string
	before, after map[string]string
	big           int // see caller's bigEvery
}

// settingChanges is every setting an operator can change on a running
// fleet, as docs/operations.md's table lists them.
var settingChanges = []settingChange{
	// The lease of the issue that found the second run: 2s holders and 30s
	// ones. The wait bound stays short, so that a key whose 30s holder was
	// killed does not hold the storm up.
	{name: "lease", before: map[string]string{"IDEMPOTENCY_LEASE": "2s", "IDEMPOTENCY_WAIT_TIMEOUT": "2s"}, after: map[string]string{"IDEMPOTENCY_LEASE": "30s", "IDEMPOTENCY_WAIT_TIMEOUT": "2s"}},
	{name: "renew_interval", before: map[string]string{"IDEMPOTENCY_RENEW_INTERVAL": "200ms"}, after: map[string]string{"IDEMPOTENCY_RENEW_INTERVAL": "600ms"}},
	{name: "storage_timeout", before: map[string]string{"IDEMPOTENCY_STORAGE_TIMEOUT": "200ms"}, after: map[string]string{"IDEMPOTENCY_STORAGE_TIMEOUT": "600ms"}},
	{name: "wait_timeout_poll_interval", before: map[string]string{"IDEMPOTENCY_WAIT_TIMEOUT": "500ms", "IDEMPOTENCY_POLL_INTERVAL": "5ms"},
		after: map[string]string{"IDEMPOTENCY_WAIT_TIMEOUT": "2s", "IDEMPOTENCY_POLL_INTERVAL": "50ms"}},
	{name: "in_flight_raise", before: map[string]string{"IDEMPOTENCY_IN_FLIGHT": "wait"}, after: map[string]string{"IDEMPOTENCY_IN_FLIGHT": "raise"}},
	{name: "in_flight_run", before: map[string]string{"IDEMPOTENCY_IN_FLIGHT": "wait"}, after: map[string]string{"IDEMPOTENCY_IN_FLIGHT": "run"}},
	{name: "on_storage_error", before: map[string]string{"IDEMPOTENCY_ON_STORAGE_ERROR": "run"}, after: map[string]string{"IDEMPOTENCY_ON_STORAGE_ERROR": "raise"}},
	{name: "max_result_bytes", before: map[string]string{"IDEMPOTENCY_MAX_RESULT_BYTES": "1048576"}, after: map[string]string{"IDEMPOTENCY_MAX_RESULT_BYTES": "128"}, big: 5},
	{name: "ttls", before: map[string]string{"IDEMPOTENCY_DEFAULT_TTL": "1h"},
		after: map[string]string{"IDEMPOTENCY_DEFAULT_TTL": "10m", "IDEMPOTENCY_OPERATION_TTLS": opCharge + ":30m"}},
	{name: "fenced_operations", before: map[string]string{"IDEMPOTENCY_FENCED_OPERATIONS": ""}, after: map[string]string{"IDEMPOTENCY_FENCED_OPERATIONS": opCharge}},
	{name: "auto_pipeline", before: map[string]string{"IDEMPOTENCY_REDIS_AUTO_PIPELINE": "false"}, after: map[string]string{"IDEMPOTENCY_REDIS_AUTO_PIPELINE": "true"}},
	{name: "breaker", before: map[string]string{"IDEMPOTENCY_BREAKER_FAILURES": "5", "IDEMPOTENCY_BREAKER_COOLDOWN": "1s"},
		after: map[string]string{"IDEMPOTENCY_BREAKER_FAILURES": "1", "IDEMPOTENCY_BREAKER_COOLDOWN": "100ms"}},
	{name: "record_format", before: map[string]string{"IDEMPOTENCY_RECORD_FORMAT": "2"}, after: map[string]string{"IDEMPOTENCY_RECORD_FORMAT": "1"}},
}

// mixedChange is the short suite's one fleet storm: many settings changed in
// one deploy.
var mixedChange = settingChange{name: "mixed",
	before: map[string]string{"IDEMPOTENCY_LEASE": "2s", "IDEMPOTENCY_WAIT_TIMEOUT": "2s", "IDEMPOTENCY_IN_FLIGHT": "wait", "IDEMPOTENCY_RECORD_FORMAT": "2", "IDEMPOTENCY_MAX_RESULT_BYTES": "1048576"},
	after: map[string]string{"IDEMPOTENCY_LEASE": "30s", "IDEMPOTENCY_WAIT_TIMEOUT": "2s", "IDEMPOTENCY_IN_FLIGHT": "raise", "IDEMPOTENCY_MAX_RESULT_BYTES": "128",
		"IDEMPOTENCY_REDIS_AUTO_PIPELINE": "true", "IDEMPOTENCY_FENCED_OPERATIONS": opCharge, "IDEMPOTENCY_STORAGE_TIMEOUT": "400ms", "IDEMPOTENCY_RENEW_INTERVAL": "500ms"},
	big: 5}

// fleetWorkers is how many worker processes a fleet storm runs at once.
const fleetWorkers = 3

// TestFleetSettings: for every setting an operator can change on a running
// fleet, a storm of worker processes whose deploy replaces them one at a
// time, by SIGTERM and by kill -9, from the old value to the new one; at
// the short timings, and in the full suite at default-like ones too. The
// short suite runs one storm that changes many settings at once.
func TestFleetSettings(t *testing.T) {
	lv := suiteLevel(t)
	// IDEMPOTENCY_TEST_FLEET_RELEASE=commit runs the storms on another
	// release of this repository: on 34146bc, the lease storm finds the
	// second runs that issue 30 reported.
	bin := buildFleetWorker(t, os.Getenv("IDEMPOTENCY_TEST_FLEET_RELEASE"))
	changes := []settingChange{mixedChange}
	timings := []bool{false}
	if lv == levelFull {
		changes = append(changes, settingChanges...)
		timings = append(timings, true)
	}
	for _, defaultLike := range timings {
		for _, ch := range changes {
			name := ch.name + "/short-timings"
			if defaultLike {
				name = ch.name + "/default-like-timings"
			}
			t.Run(name, func(t *testing.T) {
				common, hang := fleetTimings(defaultLike)
				spec := fleetSpec{name: name, common: common, big: ch.big, hang: hang}
				for range fleetWorkers {
					spec.before = append(spec.before, fleetConf{bin: bin, env: ch.before})
				}
				for range fleetWorkers + 1 {
					spec.after = append(spec.after, fleetConf{bin: bin, env: ch.after})
				}
				runFleet(t, lv, spec, fleetRedis(t))
			})
		}
	}
}

// previousRelease is the release the upgrade storm upgrades from and rolls
// back to: main before issue 30 (34146bc, issue 20's last commit), whose
// collisions still judged a pending record by ten of the reader's leases.
const previousRelease = "34146bc"

// TestFleetUpgrade: a rolling upgrade and its rollback. Three workers of
// the previous release (built from this repository's history) serve the
// keys; the deploy replaces them one at a time with this release (SIGTERM,
// kill -9, SIGTERM), then back with the previous release (kill -9,
// SIGTERM, kill -9), under traffic. Then a worker of each release reads
// every key: every completed key replays on both sides. Both releases run
// the same settings, the defaults but the suite's short timings, and then,
// in the full suite, with format 1 records on the old side, as an upgrade
// from a format 1 deployment.
func TestFleetUpgrade(t *testing.T) {
	lv := suiteLevel(t)
	cur := buildFleetWorker(t, "")
	old := buildFleetWorker(t, previousRelease)
	type variant struct {
		name     string
		old, cur map[string]string
	}
	variants := []variant{{name: "format2", old: map[string]string{}, cur: map[string]string{}}}
	if lv == levelFull {
		variants = append(variants, variant{name: "mixed-leases",
			// The wait bound stays short (it defaults to the lease), so that
			// a key whose 6s holder was killed does not hold the storm up.
			old: map[string]string{"IDEMPOTENCY_LEASE": "2s", "IDEMPOTENCY_WAIT_TIMEOUT": "2s"},
			cur: map[string]string{"IDEMPOTENCY_LEASE": "6s", "IDEMPOTENCY_WAIT_TIMEOUT": "2s"}})
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			common, hang := fleetTimings(false)
			spec := fleetSpec{name: "upgrade/" + v.name, common: common, hang: hang,
				readers: []fleetConf{{bin: old, env: v.old}, {bin: cur, env: v.cur}}}
			for range fleetWorkers {
				spec.before = append(spec.before, fleetConf{bin: old, env: v.old})
			}
			for range fleetWorkers {
				spec.after = append(spec.after, fleetConf{bin: cur, env: v.cur})
			}
			for range fleetWorkers {
				spec.after = append(spec.after, fleetConf{bin: old, env: v.old})
			}
			t.Logf("previous release: %s; this release: %s", old.release, cur.release)
			runFleet(t, lv, spec, fleetRedis(t))
		})
	}
}

// TestFleetKeyPrefix shows that the key prefix is a hard boundary: a deploy
// that changes IDEMPOTENCY_KEY_PREFIX makes the new processes blind to the
// records of the old ones, so keys held or completed under the old prefix
// run again under the new one (and the results of the old prefix are never
// replayed by the new processes). The storm expects those second runs: it
// fails if there are none, since then it would not show the boundary.
func TestFleetKeyPrefix(t *testing.T) {
	lv := suiteLevel(t)
	if lv != levelFull {
		t.Skip("the key prefix storm runs in the full suite")
	}
	bin := buildFleetWorker(t, "")
	common, hang := fleetTimings(false)
	spec := fleetSpec{name: "key_prefix", common: common, hang: hang, boundary: true}
	for range fleetWorkers {
		spec.before = append(spec.before, fleetConf{bin: bin})
	}
	for range fleetWorkers + 1 {
		spec.after = append(spec.after, fleetConf{bin: bin, env: map[string]string{"IDEMPOTENCY_KEY_PREFIX": "fleet:other:"}})
	}
	r := runFleet(t, lv, spec, fleetRedis(t))
	if len(r.notAllowed) == 0 && len(r.illegalKeys) == 0 {
		t.Fatalf("no key ran twice across two key prefixes: the storm did not show the boundary")
	}
	t.Logf("across the prefix change: %d keys ran a second time, %d keys' histories not linearizable", len(r.notAllowed), len(r.illegalKeys))
}
