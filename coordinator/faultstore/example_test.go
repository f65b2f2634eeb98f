package faultstore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/coordinator/memstore"
)

func Example() {
	ctx := context.Background()
	inner := memstore.New()
	store := faultstore.Wrap(inner)
	key := idemstore.Key{Operation: "payment.charge", Key: "order-42"}
	w := idemstore.Write{State: idemstore.StatePending, Token: "tok", TTL: 30 * time.Second}

	// The first reservation fails, as if Redis were down; the retry passes.
	store.FailOnce(idemevent.MethodReserve, nil)
	_, _, err := store.Reserve(ctx, key, w)
	fmt.Println("first reserve:", err)
	fmt.Println("keys after the failed reserve:", inner.Len())

	_, written, err := store.Reserve(ctx, key, w)
	fmt.Println("second reserve:", written, err)
	fmt.Println("reserve calls:", store.Calls(idemevent.MethodReserve))

	// Output:
	// first reserve: faultstore: injected failure
	// keys after the failed reserve: 0
	// second reserve: true <nil>
	// reserve calls: 2
}

// A hook changes the inner store between two steps: here another caller
// takes the key over before the owner completes, so the owner's lease is lost.
func ExampleStore_Before() {
	ctx := context.Background()
	inner := memstore.New()
	store := faultstore.Wrap(inner)
	key := idemstore.Key{Operation: "payment.charge", Key: "order-42"}

	store.Before(idemevent.MethodComplete, func(ctx context.Context, key idemstore.Key) error {
		inner.Put(key, idemstore.Record{State: idemstore.StatePending, Token: "someone-else", TTL: time.Minute})
		return nil
	})
	_, _, _ = store.Reserve(ctx, key, idemstore.Write{State: idemstore.StatePending, Token: "tok", TTL: time.Minute})
	ok, err := store.Complete(ctx, key, "tok", idemstore.Completion{State: idemstore.StateCompleted, Result: []byte(`{"id":"ch_1"}`), TTL: time.Hour})
	fmt.Println("completed:", ok, err)
	fmt.Println("owner now:", inner.Snapshot(key).Token)

	// Output:
	// completed: false <nil>
	// owner now: someone-else
}
