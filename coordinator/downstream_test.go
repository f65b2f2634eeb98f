package coordinator_test

import (
	"context"
	"errors"
	"regexp"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/coordinator/memstore"
)

// downstreamOf runs call on c with an action that reports its downstream
// key, and returns it.
func downstreamOf(t *testing.T, c *coordinator.Coordinator, cl coordinator.Call) string {
	t.Helper()
	var got string
	_, err := coordinator.Do(t.Context(), c, cl, func(ctx context.Context) (int, error) {
		k, ok := coordinator.DownstreamKey(ctx)
		if !ok {
			t.Error("the action's context carries no downstream key")
		}
		got = k
		return 1, nil
	})
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	if got == "" {
		t.Fatal("the action did not run")
	}
	return got
}

var hex32 = regexp.MustCompile(`^[0-9a-f]{32}$`)

// The downstream key is the same on every run of a call's action, whichever
// path runs it and in whichever coordinator: the action runs again after
// its record was lost, and sends the key it sent the first time.
func TestDownstreamKeySameOnEveryRun(t *testing.T) {
	cl := call("order-42")
	f, s := newMem(t)
	first := downstreamOf(t, f.c, cl)
	if !hex32.MatchString(first) {
		t.Fatalf("downstream key %q, want 32 lowercase hex digits", first)
	}
	// The record is lost (a failover, an operator's delete): the action
	// runs again, in another coordinator of the same store.
	s.Put(idemstore.Key{Operation: cl.Operation, Key: cl.Key}, idemstore.Record{})
	other := newFixture(t, s)
	paths := map[string]*coordinator.Coordinator{"after a lost record, another coordinator": other.c}
	paths["in-flight mode run"] = newFixture(t, memstore.New(), coordinator.WithInFlight(coordinator.InFlightRun)).c
	paths["the kill switch"] = newFixture(t, memstore.New(), coordinator.WithEnabled(false)).c
	down := faultstore.Wrap(memstore.New())
	down.Fail(idemevent.MethodReserve, errors.New("connection refused"))
	paths["a store that is down, mode run"] = newFixture(t, down, coordinator.WithOnStorageError(coordinator.OnStorageErrorRun)).c
	paths["a transaction"] = newFixture(t, newTxStore()).c
	paths["a transaction, the kill switch"] = newFixture(t, newTxStore(), coordinator.WithEnabled(false)).c
	for name, c := range paths {
		if got := downstreamOf(t, c, cl); got != first {
			t.Errorf("%s: downstream key %q, want the first run's %q", name, got, first)
		}
	}
	// A run that failed and ran again.
	f2, _ := newMem(t)
	var keys []string
	for i := range 2 {
		_, _ = coordinator.Do(t.Context(), f2.c, cl, func(ctx context.Context) (int, error) {
			k, _ := coordinator.DownstreamKey(ctx)
			keys = append(keys, k)
			if i == 0 {
				return 0, errors.New("provider timed out")
			}
			return 1, nil
		})
	}
	if len(keys) != 2 || keys[0] != first || keys[1] != first {
		t.Fatalf("a failed run and its retry sent %q, want %q twice", keys, first)
	}
}

// Two calls, two tenants' keys or two steps never share a downstream key,
// and a step's key is the same on every run.
func TestDownstreamKeyDistinct(t *testing.T) {
	f, s := newMem(t)
	seen := map[string]string{}
	add := func(name, k string) {
		t.Helper()
		if prev, dup := seen[k]; dup {
			t.Fatalf("%s and %s share the downstream key %q", prev, name, k)
		}
		seen[k] = name
	}
	add("payment.charge:order-42", downstreamOf(t, f.c, call("order-42")))
	add("payment.charge:order-43", downstreamOf(t, f.c, call("order-43")))
	add("payment.refund:order-42", downstreamOf(t, f.c, coordinator.Call{Operation: "payment.refund", Key: "order-42"}))
	// Keys that only a naive concatenation would confuse.
	add("a.b:c", downstreamOf(t, f.c, coordinator.Call{Operation: "a.b", Key: "c"}))
	add("a:b.c", downstreamOf(t, f.c, coordinator.Call{Operation: "a", Key: "b.c"}))
	// Two tenants' keys, as an adapter's key scope makes them.
	add("tenant 1", downstreamOf(t, f.c, call("0a1b:order-1")))
	add("tenant 2", downstreamOf(t, f.c, call("9f8e:order-1")))
	steps := func() []string {
		var ks []string
		_, err := coordinator.Do(t.Context(), f.c, call("checkout-7"), func(ctx context.Context) (int, error) {
			for _, step := range []string{"", "reserve-stock", "charge"} {
				k, _ := coordinator.DownstreamKey(coordinator.WithDownstreamStep(ctx, step))
				ks = append(ks, k)
			}
			return 1, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return ks
	}
	first := steps()
	for i, k := range first {
		add("checkout-7 step "+[]string{`""`, "reserve-stock", "charge"}[i], k)
	}
	s.Put(idemstore.Key{Operation: "payment.charge", Key: "checkout-7"}, idemstore.Record{}) // lost
	if again := steps(); again[0] != first[0] || again[1] != first[1] || again[2] != first[2] {
		t.Fatalf("the steps' keys changed from one run to the next: %q, then %q", first, again)
	}
}

// Outside an action there is no downstream key, and a step changes that.
func TestDownstreamKeyOutsideAnAction(t *testing.T) {
	if k, ok := coordinator.DownstreamKey(t.Context()); ok || k != "" {
		t.Fatalf("DownstreamKey outside an action = %q, %v; want \"\", false", k, ok)
	}
	if k, ok := coordinator.DownstreamKey(coordinator.WithDownstreamStep(t.Context(), "charge")); ok || k != "" {
		t.Fatalf("DownstreamKey with a step outside an action = %q, %v; want \"\", false", k, ok)
	}
}

// WithDownstream gives work done outside the action the key that the
// call's action gets, and a step named on it the step's.
func TestWithDownstreamIsTheActionsKey(t *testing.T) {
	cl := call("order-43")
	f, _ := newMem(t)
	inAction := downstreamOf(t, f.c, cl)
	ctx := coordinator.WithDownstream(t.Context(), cl)
	got, ok := coordinator.DownstreamKey(ctx)
	if !ok || got != inAction {
		t.Fatalf("DownstreamKey(WithDownstream(call)) = %q, %v; want the action's %q", got, ok, inAction)
	}
	step, _ := coordinator.DownstreamKey(coordinator.WithDownstreamStep(ctx, "charge"))
	if step == inAction || !hex32.MatchString(step) {
		t.Fatalf("the step's key %q: want 32 hex digits, other than the call's %q", step, inAction)
	}
}
