// The test is in package main because a main package cannot be imported. It
// builds the example, runs its producer and its consumer as processes
// against a redis-server, and kills the consumer with SIGKILL in the middle
// of the stream.
package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }

// The consumer is SIGKILLed three times while its four workers are in the
// middle of orders, and restarted: under the same name (it takes its
// pending entries back at once) or under a new name (it claims the dead
// one's entries with XCLAIM once they are idle). A fourth consumer kills
// itself in the crash window, between a credit and the completion of its
// record; a last one drains the stream. Every order is credited exactly
// once: the idempotency records stop the producer's copies and the
// redeliveries, and the ledger's own condition on the key refuses the one
// second credit that the crash window lets through.
func TestKilledMidStream(t *testing.T) {
	const (
		messages   = 300
		duplicates = 60
		workers    = 4
	)
	rdb := redistest.Server(t)
	opts := redistest.ServerOptions(t)
	prefix := redistest.Prefix(t)
	bin := build(t)
	env := []string{
		"IDEMPOTENCY_REDIS_URL=redis://" + opts.Addr + "/" + strconv.Itoa(opts.DB),
		"IDEMPOTENCY_KEY_PREFIX=idem:", // after -prefix: the records are under prefix+"idem:"
		// A killed consumer's reservations outlive it by a lease: keep it short.
		"IDEMPOTENCY_LEASE=3s",
	}
	n := (&options{prefix: prefix}).names()

	out := runExample(t, bin, env, "produce", "-prefix", prefix, "-messages", strconv.Itoa(messages), "-duplicates", strconv.Itoa(duplicates))
	if err := out.wait(30 * time.Second); err != nil {
		t.Fatalf("produce: %v\n%s", err, out)
	}

	consumeArgs := func(name string, extra ...string) []string {
		args := []string{"consume", "-prefix", prefix, "-workers", strconv.Itoa(workers), "-work", "15ms",
			"-min-idle", "2s", "-claim-interval", "200ms", "-quiet",
			// Each kill is a delivery of the entries its workers held: allow
			// for three kills and the claims of entries still in progress.
			"-max-deliveries", "10"}
		if name != "" {
			args = append(args, "-name", name)
		}
		return append(args, extra...)
	}
	credits := func() int64 {
		v, err := rdb.LLen(context.Background(), n.log).Result()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	// inFlight counts the orders whose idempotency record is pending: a
	// handler holds the key, in the middle of its work.
	records := redisrepo.New(rdb, redisrepo.WithKeyPrefix(prefix+"idem:"))
	var keys []idemstore.Key
	for i := range messages {
		keys = append(keys, idemstore.Key{Operation: "billing.credit", Key: "order-" + strconv.Itoa(i)})
	}
	// held is the set of orders reserved at the previous kill: a dead
	// consumer's reservations outlive it by up to a lease.
	held := make(map[string]bool)
	inFlight := func() int {
		infos, err := records.Inspect(context.Background(), keys...)
		if err != nil {
			t.Fatal(err)
		}
		n, now := 0, make(map[string]bool)
		for i, in := range infos {
			if in.State == idemstore.StatePending {
				now[keys[i].Key] = true
				if !held[keys[i].Key] {
					n++
				}
			}
		}
		held = now
		return n
	}

	kills, killedMidHandler := 0, 0
	for _, k := range []struct {
		name  string
		after int64 // kill once the ledger has this many credits
	}{{"pod-a", messages / 5}, {"pod-a", messages * 2 / 5}, {"pod-b", messages * 3 / 5}} {
		p := runExample(t, bin, env, consumeArgs(k.name)...)
		deadline := time.Now().Add(60 * time.Second)
		for credits() < k.after {
			if time.Now().After(deadline) {
				t.Fatalf("after 60s the ledger has %d credits, want %d\n%s", credits(), k.after, p)
			}
			time.Sleep(2 * time.Millisecond)
		}
		p.kill()
		kills++
		pending, err := rdb.XPending(context.Background(), n.stream, n.group).Result()
		if err != nil {
			t.Fatal(err)
		}
		mid := inFlight()
		killedMidHandler += mid
		t.Logf("kill %d: SIGKILLed consumer %s at %d credits, leaving %d entries pending (read, not acknowledged) and %d orders reserved by its handlers mid-work",
			kills, k.name, credits(), pending.Count, mid)
	}

	// The fourth kill lands in the window on purpose: the consumer kills
	// itself right after its fifth credit, before the coordinator completes
	// that order's record.
	crash := runExample(t, bin, env, consumeArgs("pod-c", "-crash-after-credits", "5")...)
	if err := crash.wait(60 * time.Second); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("the consumer that crashes itself: %v\n%s", err, crash)
	}
	kills++
	mid := inFlight()
	killedMidHandler += mid
	t.Logf("kill %d: consumer pod-c killed itself after a credit, before completing its record, at %d credits, with %d orders reserved mid-work",
		kills, credits(), mid)

	last := runExample(t, bin, env, consumeArgs("", "-exit-when-drained")...)
	if err := last.wait(90 * time.Second); err != nil {
		t.Fatalf("the last consumer: %v\n%s", err, last)
	}
	t.Logf("the last consumer:\n%s", last.tail(4))

	// Count the ledger: every order exactly once, nothing else.
	log, err := rdb.LRange(context.Background(), n.log, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	seen := make(map[string]int)
	for _, k := range log {
		seen[k]++
	}
	for i := range messages {
		if k := "order-" + strconv.Itoa(i); seen[k] != 1 {
			t.Errorf("%s credited %d times, want 1", k, seen[k])
		}
	}
	if len(log) != messages {
		t.Errorf("%d credits, want %d", len(log), messages)
	}
	want := make(map[string]string)
	for a := range 5 {
		sum := 0
		for i := a; i < messages; i += 5 {
			sum += i + 1
		}
		want["acct-"+strconv.Itoa(a)] = strconv.Itoa(sum)
	}
	if got, err := rdb.HGetAll(context.Background(), n.balances).Result(); err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("balances %v, %v; want %v", got, err, want)
	}

	// The ledger's own fence refuses a second credit only when a consumer
	// died between a credit and the completion of its record: at most once
	// per worker per kill. The producer's copies and the redeliveries after
	// lost acknowledgements are stopped by the idempotency records before
	// they reach the ledger.
	fenced, _ := rdb.Get(context.Background(), n.fenced).Int()
	if fenced == 0 {
		t.Error("the ledger refused no second credit: the kill in the crash window did not lead to a second run, or it was not in the window")
	}
	if fenced > kills*workers {
		t.Errorf("the ledger refused %d second credits; at most %d (kills × workers) can come from the crash window", fenced, kills*workers)
	}
	dead, err := rdb.XRange(context.Background(), n.dead, "-", "+").Result()
	if err != nil || len(dead) == 0 {
		t.Errorf("dead letters %v, %v; want the poison order", dead, err)
	}
	for _, d := range dead {
		if d.Values["idempotency-key"] != "order-poison" {
			t.Errorf("dead letter %v", d.Values)
		}
	}
	if ok, err := drained(context.Background(), rdb, n); !ok || err != nil {
		t.Errorf("drained: %v, %v", ok, err)
	}
	if killedMidHandler == 0 {
		t.Error("no kill landed in the middle of a handler")
	}
	t.Logf("%d entries (%d orders, %d copies, 1 poison), %d kills (%d handlers killed mid-work): %d credits, %d refused by the ledger's fence, %d dead letters",
		messages+duplicates+1, messages, duplicates, kills, killedMidHandler, len(log), fenced, len(dead))
}

// build builds the example into a temporary directory.
func build(t *testing.T) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to build the example")
	}
	bin := filepath.Join(t.TempDir(), "streams")
	cmd := exec.Command(gobin, "build", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// process is a running example.
type process struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan error
	once sync.Once
	err  error
}

// runExample starts the example with args, with env in place of every
// IDEMPOTENCY_* variable of the test's environment.
func runExample(t *testing.T, bin string, env []string, args ...string) *process {
	t.Helper()
	cmd := exec.Command(bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEMPOTENCY_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	p := &process{cmd: cmd, out: &syncBuffer{}, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(p.kill)
	return p
}

// wait waits for the process to exit, for at most d.
func (p *process) wait(d time.Duration) error {
	select {
	case err := <-p.done:
		p.once.Do(func() { p.err = err })
		return err
	case <-time.After(d):
		p.kill()
		return fmt.Errorf("still running after %v", d)
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *process) kill() {
	p.once.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		p.err = <-p.done
	})
}

func (p *process) String() string { return p.out.String() }

// tail returns the last n lines of the output.
func (p *process) tail(n int) string {
	lines := strings.Split(strings.TrimRight(p.out.String(), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// syncBuffer is a bytes.Buffer safe for the writes of exec's copying
// goroutine and the test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
