package breaker_test

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idempotency/internal/breaker"
)

var errDown = errors.New("dial tcp 127.0.0.1:1: connect: connection refused")

// recorder collects a breaker's changes.
type recorder struct {
	mu      sync.Mutex
	changes []breaker.Change
}

func (r *recorder) record(c breaker.Change) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.changes = append(r.changes, c)
}

func (r *recorder) states() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var s []string
	for _, c := range r.changes {
		s = append(s, c.From.String()+">"+c.To.String())
	}
	return strings.Join(s, " ")
}

func newBreaker(t *testing.T, failures int, cooldown time.Duration) (*breaker.Breaker, *recorder) {
	t.Helper()
	r := &recorder{}
	b, err := breaker.New(breaker.Config{Failures: failures, Cooldown: cooldown, OnChange: r.record})
	if err != nil {
		t.Fatal(err)
	}
	return b, r
}

// call runs one call through b with outcome o, and returns Allow's error.
func call(b *breaker.Breaker, o breaker.Outcome) error {
	tk, err := b.Allow()
	if err != nil {
		return err
	}
	var cerr error
	if o == breaker.Failure {
		cerr = errDown
	}
	b.Done(tk, o, cerr)
	return nil
}

func TestNewRefusesInvalidConfig(t *testing.T) {
	for _, cfg := range []breaker.Config{{Failures: 0, Cooldown: time.Second}, {Failures: 1, Cooldown: 0}} {
		if _, err := breaker.New(cfg); err == nil {
			t.Errorf("New(%+v) = nil error", cfg)
		}
	}
}

func TestOpensAfterConsecutiveFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, r := newBreaker(t, 3, time.Second)
		for range 2 {
			if err := call(b, breaker.Failure); err != nil {
				t.Fatal(err)
			}
		}
		// A success resets the count; so does nothing else.
		_ = call(b, breaker.Success)
		_ = call(b, breaker.Failure)
		_ = call(b, breaker.Ignored)
		_ = call(b, breaker.Failure)
		if b.State() != breaker.Closed {
			t.Fatalf("state %v after 2 consecutive failures", b.State())
		}
		_ = call(b, breaker.Failure)
		if b.State() != breaker.Open {
			t.Fatalf("state %v after 3 consecutive failures", b.State())
		}
		err := call(b, breaker.Success)
		if !errors.Is(err, breaker.ErrOpen) || !errors.Is(err, errDown) {
			t.Fatalf("err = %v, want ErrOpen wrapping the last failure", err)
		}
		if r.states() != "closed>open" {
			t.Fatalf("changes %q", r.states())
		}
		if c := r.changes[0]; c.Failures != 3 || !errors.Is(c.Err, errDown) {
			t.Fatalf("change %+v", c)
		}
	})
}

func TestProbesAfterTheCooldown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, r := newBreaker(t, 1, time.Second)
		_ = call(b, breaker.Failure)
		time.Sleep(time.Second - time.Nanosecond)
		if _, err := b.Allow(); !errors.Is(err, breaker.ErrOpen) {
			t.Fatalf("a call 1ns before the cool-down's end: %v", err)
		}
		time.Sleep(time.Nanosecond)
		probe, err := b.Allow()
		if err != nil || !probe.Probe() || b.State() != breaker.HalfOpen {
			t.Fatalf("probe %v, err %v, state %v", probe.Probe(), err, b.State())
		}
		// One probe at a time.
		if _, err := b.Allow(); !errors.Is(err, breaker.ErrOpen) {
			t.Fatalf("a second call while probing: %v", err)
		}
		// The probe fails: open for another cool-down.
		b.Done(probe, breaker.Failure, errDown)
		if _, err := b.Allow(); !errors.Is(err, breaker.ErrOpen) {
			t.Fatalf("a call after a failed probe: %v", err)
		}
		time.Sleep(time.Second)
		probe, err = b.Allow()
		if err != nil || !probe.Probe() {
			t.Fatalf("second probe: %v", err)
		}
		b.Done(probe, breaker.Success, nil)
		if b.State() != breaker.Closed {
			t.Fatalf("state %v after a successful probe", b.State())
		}
		if tk, err := b.Allow(); err != nil || tk.Probe() {
			t.Fatalf("closed: probe %v, err %v", tk.Probe(), err)
		}
		if got, want := r.states(), "closed>open open>half-open half-open>open open>half-open half-open>closed"; got != want {
			t.Fatalf("changes %q, want %q", got, want)
		}
		if c := r.changes[4]; c.OpenFor != 2*time.Second {
			t.Fatalf("closed after %v open, want 2s", c.OpenFor)
		}
	})
}

func TestAnIgnoredProbeLetsTheNextCallProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, r := newBreaker(t, 1, time.Second)
		_ = call(b, breaker.Failure)
		time.Sleep(time.Second)
		probe, _ := b.Allow()
		b.Done(probe, breaker.Ignored, nil) // the caller gave up
		next, err := b.Allow()
		if err != nil || !next.Probe() {
			t.Fatalf("after an ignored probe: probe %v, err %v", next.Probe(), err)
		}
		b.Done(next, breaker.Success, nil)
		if got, want := r.states(), "closed>open open>half-open half-open>closed"; got != want {
			t.Fatalf("changes %q, want %q", got, want)
		}
	})
}

// Calls let through while closed that end after the breaker opened do not
// change it: the probe alone decides.
func TestLateCallsDoNotDecide(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := newBreaker(t, 1, time.Second)
		late, _ := b.Allow()
		lateFail, _ := b.Allow()
		_ = call(b, breaker.Failure)
		b.Done(late, breaker.Success, nil)
		if b.State() != breaker.Open {
			t.Fatalf("a late success changed the state to %v", b.State())
		}
		time.Sleep(time.Second)
		probe, _ := b.Allow()
		b.Done(lateFail, breaker.Failure, errDown)
		if b.State() != breaker.HalfOpen {
			t.Fatalf("a late failure changed the state to %v", b.State())
		}
		b.Done(probe, breaker.Success, nil)
		if b.State() != breaker.Closed {
			t.Fatalf("state %v", b.State())
		}
	})
}

// Concurrent calls: one probe at a time, and every change reported once, in
// order.
func TestConcurrentCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, r := newBreaker(t, 5, 10*time.Millisecond)
		var wg sync.WaitGroup
		var mu sync.Mutex
		probes, inFlight, maxInFlight := 0, 0, 0
		for range 50 {
			wg.Go(func() {
				for i := range 200 {
					tk, err := b.Allow()
					if err != nil {
						time.Sleep(time.Millisecond)
						continue
					}
					if tk.Probe() {
						mu.Lock()
						probes++
						inFlight++
						maxInFlight = max(maxInFlight, inFlight)
						mu.Unlock()
					}
					time.Sleep(time.Millisecond)
					o := breaker.Failure
					if i > 100 {
						o = breaker.Success
					}
					if tk.Probe() {
						mu.Lock()
						inFlight--
						mu.Unlock()
					}
					b.Done(tk, o, errDown)
				}
			})
		}
		wg.Wait()
		if maxInFlight != 1 || probes == 0 {
			t.Fatalf("%d probes, at most %d at a time", probes, maxInFlight)
		}
		if b.State() != breaker.Closed {
			t.Fatalf("state %v", b.State())
		}
		// Every change follows from the one before.
		prev := breaker.Closed
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, c := range r.changes {
			if c.From != prev {
				t.Fatalf("change %v>%v after %v", c.From, c.To, prev)
			}
			prev = c.To
		}
	})
}
