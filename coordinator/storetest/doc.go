// Package storetest checks that a [idemstore.Store] keeps the Store
// contract, in the spirit of testing/fstest.TestFS.
//
// Call [TestStore] from a test of your store, with a function that gives each
// subtest a [Harness]: the store, and the hooks the suite needs to make time
// pass and to plant a record the store cannot read.
//
//	func TestConformance(t *testing.T) {
//		storetest.TestStore(t, func(t *testing.T) storetest.Harness {
//			clock := memstore.NewFakeClock(time.Now())
//			s := memstore.New(memstore.WithClock(clock.Now))
//			return storetest.Harness{
//				Store:   s,
//				Advance: clock.Advance,
//				Corrupt: func(t *testing.T, key idemstore.Key) {
//					s.Put(key, idemstore.Record{State: idemstore.StateUnreadable, TTL: time.Minute})
//				},
//			}
//		})
//	}
//
// A store on a server whose clock the test cannot move (Redis) leaves
// Harness.Advance nil: the suite then sleeps, with leases of Harness.Tick
// (100ms by default). Every subtest uses keys of its own with a random
// suffix, so suites may share a server, one after another or at once; the
// suite never deletes keys it did not write, and what it writes expires
// within two minutes.
//
// The suite starts goroutines (its concurrency subtests), and waits for all
// of them before it returns.
package storetest
