package coordinator_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
)

const testLease = 60 * time.Millisecond

func TestRenewalKeepsALongActionExclusive(t *testing.T) {
	s := memstore.New()
	opts := []coordinator.Option{coordinator.WithLease(testLease), coordinator.WithRenewInterval(testLease / 4),
		coordinator.WithWaitTimeout(5 * time.Second), coordinator.WithPollInterval(time.Millisecond)}
	// Two coordinators over one store: two processes.
	a := newFixture(t, s, opts...)
	b := newFixture(t, s, opts...)
	var k counter
	long := func(ctx context.Context) (charge, error) {
		time.Sleep(3 * testLease)
		if ctx.Err() != nil {
			return charge{}, context.Cause(ctx)
		}
		return k.action("long")(ctx)
	}
	done := make(chan charge, 1)
	go func() {
		v, err := coordinator.Do(t.Context(), a.c, call("long"), long)
		if err != nil {
			t.Error(err)
		}
		done <- v
	}()
	eventually(t, time.Second, func() bool { return a.rec.count(coordinator.EventMiss, "") == 1 }, "a runs")
	v, err := coordinator.Do(t.Context(), b.c, call("long"), long)
	if err != nil {
		t.Fatal(err)
	}
	if first := <-done; v != first || k.n() != 1 {
		t.Fatalf("b got %+v, a got %+v, runs %d: want one run and one result", v, first, k.n())
	}
	if got := a.rec.count(coordinator.EventStorageCall, ""); got < 5 {
		t.Fatalf("a made %d store calls; renewals missing", got)
	}
	if a.rec.errors("") != 0 {
		t.Fatalf("errors: %+v", a.rec.all())
	}
}

func TestLostLeaseCancelsTheActionAndKeepsTheNewOwner(t *testing.T) {
	for _, name := range []string{"action honours cancellation", "action ignores cancellation"} {
		t.Run(name, func(t *testing.T) {
			s := memstore.New()
			f := newFixture(t, s, coordinator.WithLease(testLease), coordinator.WithRenewInterval(testLease/6))
			key := coordinator.Key{Operation: "payment.charge", Key: "stolen"}
			var cause error
			v, err := coordinator.Do(t.Context(), f.c, call("stolen"), func(ctx context.Context) (charge, error) {
				// Another caller takes the key over (as after a store
				// failover or a long pause past the lease).
				s.Put(key, coordinator.Record{State: coordinator.StatePending, Token: "new-owner", TTL: time.Minute})
				select {
				case <-ctx.Done():
					cause = context.Cause(ctx)
				case <-time.After(time.Second):
					t.Error("the action's context was not cancelled")
				}
				if name == "action honours cancellation" {
					return charge{}, cause
				}
				return charge{ID: "late"}, nil
			})
			if !errors.Is(cause, coordinator.ErrLeaseLost) {
				t.Fatalf("cause = %v, want ErrLeaseLost", cause)
			}
			if name == "action honours cancellation" {
				if !errors.Is(err, coordinator.ErrLeaseLost) {
					t.Fatalf("err = %v", err)
				}
			} else if err != nil || v.ID != "late" {
				t.Fatalf("Do = %+v, %v; want the action's result", v, err)
			}
			if rec := s.Snapshot(key); rec.State != coordinator.StatePending || rec.Token != "new-owner" {
				t.Fatalf("the new owner's record was touched: %+v", rec)
			}
			if got := f.rec.errors(coordinator.ErrorLeaseLost); got != 1 {
				t.Fatalf("lease_lost = %d, want 1", got)
			}
		})
	}
}

func TestCompletionAfterATakeoverDoesNotOverwrite(t *testing.T) {
	// The lease is lost between the last renewal and completion: completion
	// is refused by the owner check.
	s := memstore.New()
	f := newFixture(t, s) // renewals every 10s: none during this action
	key := coordinator.Key{Operation: "payment.charge", Key: "late"}
	v, err := coordinator.Do(t.Context(), f.c, call("late"), func(context.Context) (charge, error) {
		s.Put(key, coordinator.Record{State: coordinator.StateCompleted, Token: "winner", Result: []byte(`{"id":"winner"}`), TTL: time.Hour})
		return charge{ID: "loser"}, nil
	})
	if err != nil || v.ID != "loser" {
		t.Fatalf("Do = %+v, %v", v, err)
	}
	if rec := s.Snapshot(key); string(rec.Result) != `{"id":"winner"}` {
		t.Fatalf("winner's record overwritten: %+v", rec)
	}
	if f.rec.errors(coordinator.ErrorLeaseLost) != 1 {
		t.Fatal("lease_lost not reported")
	}
}

func TestRenewerStopsBeforeCompletion(t *testing.T) {
	s := memstore.New()
	f := newFixture(t, s, coordinator.WithLease(testLease), coordinator.WithRenewInterval(5*time.Millisecond))
	if _, err := coordinator.Do(t.Context(), f.c, call("stop"), func(context.Context) (int, error) {
		time.Sleep(30 * time.Millisecond)
		return 1, nil
	}); err != nil {
		t.Fatal(err)
	}
	n := f.rec.count(coordinator.EventStorageCall, "")
	time.Sleep(30 * time.Millisecond)
	if f.rec.count(coordinator.EventStorageCall, "") != n {
		t.Fatal("store calls after Do returned: the renewer outlived the call")
	}
	rec := s.Snapshot(coordinator.Key{Operation: "payment.charge", Key: "stop"})
	if rec.State != coordinator.StateCompleted || rec.TTL < 59*time.Minute {
		t.Fatalf("record = %v with TTL %v; a late renewal shortened it?", rec.State, rec.TTL)
	}
}
