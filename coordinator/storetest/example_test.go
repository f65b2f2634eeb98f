package storetest_test

import (
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/coordinator/storetest"
)

// A store whose clock the test controls passes Advance; this is how the
// in-memory store runs the suite. TestStore needs the *testing.T of a test
// function, so this example is compiled but not run.
func ExampleTestStore() {
	testConformance := func(t *testing.T) {
		storetest.TestStore(t, func(t *testing.T) storetest.Harness {
			clock := memstore.NewFakeClock(time.Now())
			store := memstore.New(memstore.WithClock(clock.Now))
			return storetest.Harness{
				Store:   store,
				Advance: clock.Advance,
				Corrupt: func(t *testing.T, key idemstore.Key) {
					store.Put(key, idemstore.Record{State: idemstore.StateUnreadable, TTL: time.Minute})
				},
			}
		})
	}
	_ = testConformance // func TestConformance(t *testing.T) in your store's tests
}

// A store on a server with its own clock, such as Redis, leaves Advance nil:
// the suite sleeps, with leases of Tick. Corrupt writes bytes the store
// cannot parse straight to the server.
func ExampleHarness_realServer() {
	var (
		newStore  func(t *testing.T) idemstore.Store              // e.g. redisrepo.New on a client of the test server
		writeJunk func(t *testing.T, key idemstore.Key, v string) // e.g. client.Set(ctx, prefix+op+":"+key, v, time.Minute)
	)
	testConformance := func(t *testing.T) {
		storetest.TestStore(t, func(t *testing.T) storetest.Harness {
			return storetest.Harness{
				Store: newStore(t),
				Tick:  100 * time.Millisecond,
				Corrupt: func(t *testing.T, key idemstore.Key) {
					writeJunk(t, key, "not a record")
				},
			}
		})
	}
	_ = testConformance
}
