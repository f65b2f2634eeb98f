//go:build linux

package reliability_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/internal/redistest"
)

// TestStalledDuring checks which stalls excuse a call that timed out.
func TestStalledDuring(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	at := t0.Add(10 * time.Second) // the call timed out then: it ran from 9s
	win := func(from, to time.Duration) []stallWindow {
		return []stallWindow{{addr: "n", from: t0.Add(from), to: t0.Add(to)}}
	}
	for _, c := range []struct {
		name    string
		windows []stallWindow
		want    bool
	}{
		{"none", nil, false},
		{"across the whole call", win(8500*time.Millisecond, 10500*time.Millisecond), true},
		{"the call's first half", win(9*time.Second, 9500*time.Millisecond), true},
		{"its last half", win(9500*time.Millisecond, 10*time.Second), true},
		{"too short", win(9200*time.Millisecond, 9600*time.Millisecond), false},
		{"long, but over before the call", win(7*time.Second, 8999*time.Millisecond), false},
		{"long, but after it", win(10001*time.Millisecond, 12*time.Second), false},
	} {
		if _, got := stalledDuring(c.windows, at, time.Second); got != c.want {
			t.Errorf("%s: stalledDuring = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestStallProbe checks that the probe sees a node that answers nothing
// (DEBUG SLEEP) for as long as it sleeps, and this process frozen
// (SIGSTOP, then SIGCONT from a child) for as long as it is, and that a
// call timing out then counts as having met them.
func TestStallProbe(t *testing.T) {
	suiteLevel(t)
	cl := redistest.NewCluster(t, 3)
	p := startStallProbe(ownNodes(cl))
	time.Sleep(200 * time.Millisecond) // a pinger for every node
	slept := cl.Nodes()[1]
	c := redis.NewClient(&redis.Options{Addr: slept.Addr(), MaxRetries: -1})
	defer c.Close()
	if err := c.Do(context.Background(), "DEBUG", "SLEEP", "0.6").Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	slept0 := time.Now()
	pid := strconv.Itoa(os.Getpid())
	freeze := exec.Command("sh", "-c", "kill -STOP "+pid+"; sleep 0.6; kill -CONT "+pid)
	if out, err := freeze.CombinedOutput(); err != nil {
		t.Fatalf("freezing this process: %v: %s", err, out)
	}
	time.Sleep(100 * time.Millisecond)
	windows := p.end()
	longest := map[string]time.Duration{}
	for _, w := range windows {
		longest[w.addr] = max(longest[w.addr], w.to.Sub(w.from))
	}
	if d := longest[slept.Addr()]; d < 500*time.Millisecond {
		t.Errorf("longest window of the sleeping node %s: %v, want 500ms or more (windows: %v)", slept.Addr(), d, windows)
	}
	if d := longest[stallProcess]; d < 500*time.Millisecond {
		t.Errorf("longest window of this process, frozen for 600ms: %v, want 500ms or more (windows: %v)", d, windows)
	}
	if _, ok := stalledDuring(windows, time.Now(), time.Second); !ok {
		t.Errorf("a call that timed out just now met no stall (windows: %v)", windows)
	}
	if w, ok := stalledDuring(windows, slept0, time.Second); !ok || w.addr != slept.Addr() {
		t.Errorf("a call that timed out as the node woke met %v (%v), want the node's window (windows: %v)", w, ok, windows)
	}
}

// TestNodeTrace checks what a node trace keeps, and what a storm's failure
// logs of it.
func TestNodeTrace(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	tr := &nodeTrace{}
	tr.keep(traced{client: "plain", addr: "n1", what: "evalsha", from: t0, to: t0.Add(nodeTraceMin - time.Millisecond)})
	tr.keep(traced{client: "plain", addr: "n1", what: "evalsha", from: t0.Add(time.Second), to: t0.Add(2 * time.Second), err: context.DeadlineExceeded})
	tr.keep(traced{client: "plain", addr: "n2", what: "dial", from: t0.Add(5 * time.Second), to: t0.Add(5*time.Second + nodeTraceMin)})
	if got := len(tr.ops); got != 2 {
		t.Fatalf("kept %d operations, want 2 (the slow and the failed): %v", got, tr.ops)
	}
	if got := tr.around(t0.Add(1500*time.Millisecond), t0.Add(3*time.Second)); len(got) != 1 || got[0].what != "evalsha" {
		t.Errorf("around 1.5s-3s: %v, want the failed evalsha", got)
	}
	var lines []string
	logf := logfFunc(func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) })
	windows := []stallWindow{{addr: "n1", from: t0.Add(1200 * time.Millisecond), to: t0.Add(1400 * time.Millisecond)}}
	phases := []phase{{name: "round 0: reshard", from: t0, to: t0.Add(3 * time.Second)}}
	logAround(logf, t0, phases, windows, tr, t0.Add(time.Second), t0.Add(2*time.Second))
	want := []string{
		"around the storage errors, from 1s to 2s after the traffic began:",
		"  step 0s to 3s: round 0: reshard",
		"  probe: n1 answered no ping from 1.2s to 1.4s",
		"  node client: plain n1 evalsha from 1s to 2s (1s): context deadline exceeded",
	}
	if !slices.Equal(lines, want) {
		t.Errorf("logged\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}

// logfFunc is a Logf of a function.
type logfFunc func(format string, args ...any)

func (f logfFunc) Logf(format string, args ...any) { f(format, args...) }

// TestStealTicks checks that the machine's stolen CPU time is read (on
// Linux /proc/stat always has it) and never goes back.
func TestStealTicks(t *testing.T) {
	before := stealTicks()
	if before < 0 {
		t.Fatal("stealTicks: /proc/stat's cpu line has no steal field")
	}
	if got := stolenSince(before); !strings.HasPrefix(got, "CPU time stolen by the hypervisor meanwhile ") {
		t.Errorf("stolenSince = %q", got)
	}
	if after := stealTicks(); after < before {
		t.Errorf("steal went from %d to %d ticks", before, after)
	}
}
