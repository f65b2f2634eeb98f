package idemevent_test

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/memstore"
)

// An observer that counts runs and replays: the first call runs the
// action (a miss), the two retries replay its result (hits).
func ExampleObserverFunc() {
	var misses, hits atomic.Int64
	count := idemevent.ObserverFunc(func(_ context.Context, e idemevent.Event) {
		switch e.Kind {
		case idemevent.Miss:
			misses.Add(1)
		case idemevent.Hit:
			hits.Add(1)
		}
	})
	c, err := coordinator.New(memstore.New(), coordinator.WithObserver(count))
	if err != nil {
		panic(err)
	}
	defer c.Close()

	call := coordinator.Call{Operation: "order.create", Key: "order-42"}
	for range 3 {
		id, err := coordinator.Do(context.Background(), c, call, func(context.Context) (string, error) {
			return "ord_1", nil
		})
		fmt.Println(id, err)
	}
	fmt.Println("misses:", misses.Load(), "hits:", hits.Load())
	// Output:
	// ord_1 <nil>
	// ord_1 <nil>
	// ord_1 <nil>
	// misses: 1 hits: 2
}
