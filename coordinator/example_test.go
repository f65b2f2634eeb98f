package coordinator_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/coordinator/memstore"
)

type Charge struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

func Example() {
	// In production the store is redisrepo.New(redisClient); memstore keeps
	// this example self-contained.
	c, err := coordinator.New(memstore.New())
	if err != nil {
		panic(err)
	}
	charges := 0
	chargeCard := func(ctx context.Context) (Charge, error) {
		charges++
		return Charge{ID: fmt.Sprintf("ch_%d", charges), Amount: 1999}, nil
	}

	fp, _ := coordinator.Fingerprint("card_42", 1999)
	call := coordinator.Call{Operation: "payment.charge", Key: "order-42", Fingerprint: fp}
	first, _ := coordinator.Do(context.Background(), c, call, chargeCard)
	retry, _ := coordinator.Do(context.Background(), c, call, chargeCard) // a client retry
	fmt.Println(first.ID, retry.ID, "charges:", charges)

	// The same key for another request is refused.
	call.Fingerprint, _ = coordinator.Fingerprint("card_42", 5000)
	_, err = coordinator.Do(context.Background(), c, call, chargeCard)
	fmt.Println(errors.Is(err, coordinator.ErrKeyReuse))
	// Output:
	// ch_1 ch_1 charges: 1
	// true
}

func ExampleCoordinator_Execute() {
	c, _ := coordinator.New(memstore.New())
	action := func(context.Context) ([]byte, error) { return []byte(`{"status":201}`), nil }
	call := coordinator.Call{Operation: "order.create", Key: "k-1"}
	r1, _ := c.Execute(context.Background(), call, action)
	r2, _ := c.Execute(context.Background(), call, action)
	fmt.Println(string(r1.Value), r1.Replayed, r2.Replayed)
	// Output: {"status":201} false true
}

func ExampleWithOnStorageError() {
	// Fail closed: when the store is down, refuse (HTTP 503) rather than run
	// an effect nothing downstream deduplicates.
	store := faultstore.Wrap(memstore.New())
	c, _ := coordinator.New(store, coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise))
	store.Fail(idemevent.MethodReserve, errors.New("connection refused"))
	_, err := coordinator.Do(context.Background(), c, coordinator.Call{Operation: "payment.charge", Key: "k-1"},
		func(context.Context) (string, error) { return "charged", nil })
	fmt.Println(errors.Is(err, coordinator.ErrStorage))
	// Output: true
}

func ExampleFingerprint() {
	// Map order does not matter; values do.
	a, _ := coordinator.Fingerprint(map[string]int{"amount": 1999, "account": 42})
	b, _ := coordinator.Fingerprint(map[string]int{"account": 42, "amount": 1999})
	fmt.Println(a == b, len(a))
	// Output: true 64
}

func ExampleDoResult() {
	c, _ := coordinator.New(memstore.New())
	call := coordinator.Call{Operation: "refund.process", Key: "msg-7"}
	refund := func(context.Context) (string, error) { return "rf_1", nil }
	for range 2 { // a queue delivers the message twice
		res, err := coordinator.DoResult(context.Background(), c, call, refund)
		if err != nil {
			panic(err)
		}
		fmt.Println(res.Value, "duplicate:", res.Replayed)
	}
	// Output:
	// rf_1 duplicate: false
	// rf_1 duplicate: true
}

// An adapter that computes fingerprints checks its own before calling Do, so
// that a fingerprint it cannot use is its error, not the caller's.
func ExampleValidateFingerprint() {
	fp, _ := coordinator.Fingerprint(map[string]int{"amount": 100})
	fmt.Println(coordinator.ValidateFingerprint(fp))
	fmt.Println(coordinator.ValidateFingerprint("two words"))
	// Output:
	// <nil>
	// idempotency: invalid request: fingerprint has byte 0x20 at offset 3; only visible ASCII (0x21-0x7e) is allowed
}

func ExampleDownstreamKey() {
	store := memstore.New()
	c, err := coordinator.New(store)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	call := coordinator.Call{Operation: "order.checkout", Key: "order-42"}
	var sent []string
	provider := func(ctx context.Context) (string, error) {
		// What a provider call sends as its Idempotency-Key
		// (idemhttp.Transport does it without being asked).
		key, _ := coordinator.DownstreamKey(coordinator.WithDownstreamStep(ctx, "charge"))
		sent = append(sent, key)
		return "ch_1", nil
	}
	_, _ = coordinator.Do(context.Background(), c, call, provider)
	// The record is lost (a failover): the action runs again, and sends the
	// key it sent the first time, so the provider charges once.
	store.Put(idemstore.Key{Operation: call.Operation, Key: call.Key}, idemstore.Record{})
	_, _ = coordinator.Do(context.Background(), c, call, provider)
	fmt.Println(len(sent), sent[0] == sent[1], len(sent[0]))
	// Output: 2 true 32
}
