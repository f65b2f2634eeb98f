package observability_test

import (
	"context"
	"fmt"
	"os"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"go.uber.org/zap"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/observability"
)

// A coordinator that reports to an Observer: the first call with a key runs
// the action (a miss), the second replays its result (a hit).
func Example() {
	reg := prometheus.NewRegistry() // in an app: the registry you expose
	obs, err := observability.New(
		observability.WithRegisterer(reg),
		observability.WithNamespace("shop"),
		observability.WithLogger(zap.NewExample(zap.IncreaseLevel(zap.InfoLevel))),
		observability.WithOperations("payment.charge"),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	c, err := coordinator.New(memstore.New(), coordinator.WithObserver(obs))
	if err != nil {
		fmt.Println(err)
		return
	}
	call := coordinator.Call{Operation: "payment.charge", Key: "order-42"}
	for range 2 {
		_, err := coordinator.Do(context.Background(), c, call, func(context.Context) (string, error) {
			return "ch_1", nil
		})
		if err != nil {
			fmt.Println(err)
			return
		}
	}

	scrape, err := testutil.GatherAndFormat(reg, expfmt.TypeTextPlain, "shop_idempotency_requests_total")
	if err != nil {
		fmt.Println(err)
		return
	}
	os.Stdout.Write(scrape)
	// Output:
	// # HELP shop_idempotency_requests_total Outcomes of idempotent calls looking up their key: hit (a stored result was replayed), miss (the action runs), in_flight (another caller held the key), not_replayable (the key completed but its result was not kept: the call got ErrNotReplayable).
	// # TYPE shop_idempotency_requests_total counter
	// shop_idempotency_requests_total{operation="payment.charge",outcome="hit"} 1
	// shop_idempotency_requests_total{operation="payment.charge",outcome="in_flight"} 0
	// shop_idempotency_requests_total{operation="payment.charge",outcome="miss"} 1
	// shop_idempotency_requests_total{operation="payment.charge",outcome="not_replayable"} 0
}

// Log lines carry the operation and, by default, a hash of the key rather
// than the key itself.
func ExampleWithLogKeys() {
	for _, mode := range []observability.LogKeysMode{observability.LogKeysHashed, observability.LogKeysPlain, observability.LogKeysOmitted} {
		obs, err := observability.New(
			observability.WithLogger(zap.NewExample()),
			observability.WithLogKeys(mode),
		)
		if err != nil {
			fmt.Println(err)
			return
		}
		obs.Observe(context.Background(), idemevent.Event{
			Kind:      idemevent.Error,
			Key:       idemstore.Key{Operation: "payment.charge", Key: "order-42"},
			ErrorType: idemevent.ErrorStorageReserve,
			Method:    idemevent.MethodReserve,
			Err:       &coordinator.StorageError{Method: idemevent.MethodReserve, Err: fmt.Errorf("dial tcp: connection refused")},
		})
	}
	// Output:
	// {"level":"error","logger":"idempotency","msg":"storage call failed","operation":"payment.charge","key_hash":"3bf8b157c4238eef","error_type":"storage_reserve_error","method":"reserve","error":"idempotency: storage reserve: dial tcp: connection refused"}
	// {"level":"error","logger":"idempotency","msg":"storage call failed","operation":"payment.charge","key":"order-42","error_type":"storage_reserve_error","method":"reserve","error":"idempotency: storage reserve: dial tcp: connection refused"}
	// {"level":"error","logger":"idempotency","msg":"storage call failed","operation":"payment.charge","error_type":"storage_reserve_error","method":"reserve","error":"idempotency: storage reserve: dial tcp: connection refused"}
}

// Multi lets an application's own Observer see the events too.
func ExampleMulti() {
	obs, err := observability.New(observability.WithRegisterer(prometheus.NewRegistry()))
	if err != nil {
		fmt.Println(err)
		return
	}
	replays := 0
	mine := idemevent.ObserverFunc(func(_ context.Context, e idemevent.Event) {
		if e.Kind == idemevent.Hit {
			replays++
		}
	})
	c, err := coordinator.New(memstore.New(), coordinator.WithObserver(observability.Multi(obs, mine)))
	if err != nil {
		fmt.Println(err)
		return
	}
	for range 3 {
		_, _ = coordinator.Do(context.Background(), c, coordinator.Call{Operation: "order.create", Key: "cart-7"},
			func(context.Context) (int, error) { return 7, nil })
	}
	fmt.Println("replays:", replays)
	// Output:
	// replays: 2
}
