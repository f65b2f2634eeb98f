package memstore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator/memstore"
)

func Example() {
	ctx := context.Background()
	clock := memstore.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store := memstore.New(memstore.WithClock(clock.Now))
	key := idemstore.Key{Operation: "payment.charge", Key: "order-42"}

	_, written, _ := store.Reserve(ctx, key, idemstore.Write{
		State: idemstore.StatePending, Token: "tok", TTL: 30 * time.Second,
	})
	fmt.Println("reserved:", written)

	ok, _ := store.Complete(ctx, key, "tok", idemstore.Completion{State: idemstore.StateCompleted, Result: []byte(`{"id":"ch_1"}`), TTL: time.Hour})
	fmt.Println("completed:", ok)

	clock.Advance(59 * time.Minute)
	rec, _ := store.Get(ctx, key)
	fmt.Printf("after 59m: %s %s, %v left\n", rec.State, rec.Result, rec.TTL)

	clock.Advance(time.Minute)
	rec, _ = store.Get(ctx, key)
	fmt.Println("after 1h:", rec.State, store.Len())

	// Output:
	// reserved: true
	// completed: true
	// after 59m: completed {"id":"ch_1"}, 1m0s left
	// after 1h: absent 0
}

// Put plants a record the coordinator cannot read, to test that a key with
// corrupt bytes heals instead of failing every retry.
func ExampleStore_Put() {
	store := memstore.New()
	key := idemstore.Key{Operation: "payment.charge", Key: "order-42"}
	store.Put(key, idemstore.Record{State: idemstore.StateUnreadable, Result: []byte("\x00garbage")})

	fmt.Println(store.Snapshot(key).State)
	// Output: unreadable
}
