//go:build linux

package reliability_test

import (
	"context"
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
// (DEBUG SLEEP) for as long as it sleeps, and that a call timing out then
// counts as having met it.
func TestStallProbe(t *testing.T) {
	suiteLevel(t)
	cl := redistest.NewCluster(t, 3)
	p := startStallProbe(cl)
	time.Sleep(200 * time.Millisecond) // a pinger for every node
	slept := cl.Nodes()[1]
	c := redis.NewClient(&redis.Options{Addr: slept.Addr(), MaxRetries: -1})
	defer c.Close()
	if err := c.Do(context.Background(), "DEBUG", "SLEEP", "0.6").Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	windows := p.end()
	var longest time.Duration
	for _, w := range windows {
		if w.addr == slept.Addr() {
			longest = max(longest, w.to.Sub(w.from))
		}
	}
	if longest < 500*time.Millisecond {
		t.Errorf("longest window of the sleeping node %s: %v, want 500ms or more (windows: %v)", slept.Addr(), longest, windows)
	}
	if _, ok := stalledDuring(windows, time.Now(), time.Second); !ok {
		t.Errorf("a call that timed out just now met no stall (windows: %v)", windows)
	}
}
