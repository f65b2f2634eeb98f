package coordinator_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
)

// Plan follows the settings exactly as Do does: the operator's TTL over the
// call's over the default, the wait timeout (a lease when unset), and a
// fresh token per plan.
func TestPlan(t *testing.T) {
	store := memstore.New()
	c, err := coordinator.New(store,
		coordinator.WithInFlight(coordinator.InFlightRaise),
		coordinator.WithLease(20*time.Second),
		coordinator.WithPollInterval(7*time.Millisecond),
		coordinator.WithMaxResultBytes(99),
		coordinator.WithOperationTTLs(map[string]time.Duration{"op.fixed": 2 * time.Minute}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Store() != coordinator.Store(store) {
		t.Errorf("Store() = %v, want the store New got", c.Store())
	}
	p, err := c.Plan(coordinator.Call{Operation: "op.free", Key: "k", Fingerprint: "fp", TTL: 90 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	want := coordinator.Plan{Key: coordinator.Key{Operation: "op.free", Key: "k"}, Fingerprint: "fp", TTL: 90 * time.Second,
		Token: p.Token, InFlight: coordinator.InFlightRaise, WaitTimeout: 20 * time.Second, PollInterval: 7 * time.Millisecond,
		MaxResultBytes: 99}
	if p != want {
		t.Errorf("Plan = %+v, want %+v", p, want)
	}
	if len(p.Token) != 16 {
		t.Errorf("token %q: want 16 hex digits", p.Token)
	}
	p2, _ := c.Plan(coordinator.Call{Operation: "op.fixed", Key: "k", TTL: time.Hour})
	if p2.TTL != 2*time.Minute || p2.Token == p.Token {
		t.Errorf("second plan: TTL %v token %q; want the operator's 2m and a new token", p2.TTL, p2.Token)
	}
	p3, _ := c.Plan(coordinator.Call{Operation: "op.free", Key: "k"})
	if p3.TTL != coordinator.DefaultTTL {
		t.Errorf("plan without a TTL: %v, want the default", p3.TTL)
	}
	for _, bad := range []coordinator.Call{{Operation: "op", Key: ""}, {Operation: "op", Key: "k", TTL: -time.Second}, {Operation: "op", Key: "k", TTL: time.Millisecond}} {
		if _, err := c.Plan(bad); !errors.Is(err, coordinator.ErrInvalidRequest) {
			t.Errorf("Plan(%+v) = %v, want ErrInvalidRequest", bad, err)
		}
	}
}

// Report reaches the observer, and does not with the kill switch off.
func TestReport(t *testing.T) {
	for _, enabled := range []bool{true, false} {
		var got []coordinator.Event
		c, err := coordinator.New(memstore.New(), coordinator.WithEnabled(enabled),
			coordinator.WithObserver(coordinator.ObserverFunc(func(_ context.Context, e coordinator.Event) { got = append(got, e) })))
		if err != nil {
			t.Fatal(err)
		}
		e := coordinator.Event{Kind: coordinator.EventHit, Key: coordinator.Key{Operation: "op", Key: "k"}}
		c.Report(t.Context(), e)
		if enabled && (len(got) != 1 || got[0] != e) {
			t.Errorf("enabled: observed %+v, want [%+v]", got, e)
		}
		if !enabled && len(got) != 0 {
			t.Errorf("kill switch off: observed %+v, want nothing", got)
		}
	}
}
